"""pyverbs, where this machine has it, and the RoCE endpoint that carries an IP address.

pyverbs comes with rdma-core, not from PyPI: Debian's `python3-pyverbs` installs it for the
system's Python 3.11 under /usr/lib/python3/dist-packages, a build from rdma-core wherever
its prefix says (THORN_PYVERBS_PATH names further folders, ':'-separated). `load()` imports
it from the environment first, then from those folders, which are only on `sys.path` for the
import: the package's own modules are found through its `__path__` afterwards, and nothing
else of the system's Python shadows the venv. Anything that stops it (no package, a Python
it was not built for, no RDMA device in this kernel) is `RdmaUnavailable` with the reason.

A RoCE v2 GID is the interface's IP address (IPv4 as ::ffff:a.b.c.d), so the device, port
and GID index that send as an address are found by reading the GID tables.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "RdmaUnavailable",
    "RoceEndpoint",
    "gid_of",
    "gid_table",
    "load",
    "roce_endpoint",
]

SYSTEM_PATHS = ("/usr/lib/python3/dist-packages",)
ROCE_V2 = 2  # enum ibv_gid_type_sysfs... IBV_GID_TYPE_ROCE_V2 in struct ibv_gid_entry


class RdmaUnavailable(RuntimeError):
    """RDMA cannot be used here; the message says why."""


@dataclass(frozen=True)
class Verbs:
    """The pyverbs modules THORN uses."""

    device: Any
    pd: Any
    cq: Any
    qp: Any
    mr: Any
    addr: Any
    wr: Any
    enums: Any
    error: type[Exception]  # pyverbs' own errors all derive from it


_loaded: Verbs | None = None


def _candidates() -> list[str]:
    extra = [p for p in os.environ.get("THORN_PYVERBS_PATH", "").split(":") if p]
    return [*extra, *SYSTEM_PATHS]


def _import_pyverbs() -> ModuleType:
    try:
        return importlib.import_module("pyverbs")
    except ImportError:
        pass
    tried: list[str] = []
    for folder in _candidates():
        if not os.path.isdir(os.path.join(folder, "pyverbs")):
            continue
        sys.path.append(folder)
        try:
            return importlib.import_module("pyverbs")
        except ImportError as exc:
            tried.append(f"{folder}: {exc}")
        finally:
            sys.path.remove(folder)
    if tried:
        raise RdmaUnavailable(f"pyverbs does not import ({'; '.join(tried)})")
    raise RdmaUnavailable(
        "pyverbs is not installed (Debian: apt-get install python3-pyverbs; or set "
        "THORN_PYVERBS_PATH to an rdma-core build's python folder)"
    )


def load() -> Verbs:
    """The pyverbs modules, imported once; RdmaUnavailable with the reason if they cannot be."""
    global _loaded
    if _loaded is None:
        _import_pyverbs()
        names = ("device", "pd", "cq", "qp", "mr", "addr", "wr", "enums")
        try:
            modules = {n: importlib.import_module(f"pyverbs.{n}") for n in names}
        except ImportError as exc:  # built for another Python: its extension modules fail
            raise RdmaUnavailable(f"pyverbs does not import: {exc}") from None
        error = importlib.import_module("pyverbs.pyverbs_error").PyverbsError
        _loaded = Verbs(**modules, error=error)
    return _loaded


def device_names() -> list[str]:
    """The RDMA devices of this kernel; RdmaUnavailable when there are none or no RDMA."""
    verbs = load()
    try:
        devices = verbs.device.get_device_list()
    except verbs.device.PyverbsRDMAError as exc:
        raise RdmaUnavailable(f"no RDMA devices: {exc}") from None
    if not devices:
        raise RdmaUnavailable("no RDMA devices")
    return sorted(d.name.decode() if isinstance(d.name, bytes) else d.name for d in devices)


def gid_of(address: str) -> str:
    """The RoCE v2 GID that carries `address`, as verbs writes GIDs (8 groups of 4 digits)."""
    ip = ipaddress.ip_address(address)
    v6 = ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip
    assert isinstance(v6, ipaddress.IPv6Address)
    return v6.exploded


@dataclass(frozen=True)
class RoceEndpoint:
    """Where an address sends RoCE v2 from: device, port, GID index and the GID itself."""

    address: str
    device: str
    port: int
    gid_index: int
    gid: str


def gid_table(context: Any) -> list[Any]:
    """Every valid GID entry of an open device `context`, all ports, in one read
    (ibv_query_gid_table): entries carry gid_index, port_num, gid_type, ndev_ifindex and
    gid_str(). One call, not one per index: rxe's tables are 1,024 entries long."""
    attr = context.query_device()
    length = sum(context.query_port(n).gid_tbl_len for n in range(1, attr.phys_port_cnt + 1))
    return list(context.query_gid_table(max(length, 1)))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def roce_endpoint(address: str) -> RoceEndpoint:
    """The local RDMA device port whose RoCE v2 GID is `address`; RdmaUnavailable if none."""
    verbs = load()
    wanted = gid_of(address)
    for name in device_names():
        with verbs.device.Context(name=name) as context:
            for entry in gid_table(context):
                if entry.gid_type == ROCE_V2 and _text(entry.gid_str()) == wanted:
                    return RoceEndpoint(address, name, entry.port_num, entry.gid_index, wanted)
    raise RdmaUnavailable(f"no RDMA device here has a RoCE v2 GID for {address}")
