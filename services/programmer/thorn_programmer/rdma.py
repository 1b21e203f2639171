"""RDMA device discovery through pyverbs (rdma-core's Python bindings).

`read_devices()` is the shell: it imports pyverbs and reads every device, its ports and
their state, and each port's GID table (index, GID, type, the netdev behind it). It returns
plain values; `describe()` (pure) turns them into the registration's `RdmaObservation`.
Where pyverbs does not import, or the kernel has no RDMA, the observation says
"RDMA unavailable: <reason>" and lists no devices.

pyverbs is loaded by `thorn.rdma.verbs.load()` (Debian's `python3-pyverbs`, or a build from
rdma-core), which says why when it cannot be.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from thorn.observed import RdmaDevice, RdmaGid, RdmaObservation, RdmaPort
from thorn.rdma.verbs import RdmaUnavailable, gid_table, load

# enum ibv_port_state and ibv_gid_type (infiniband/verbs.h); the GID type words are the
# kernel's own (/sys/class/infiniband/<dev>/ports/<n>/gid_attrs/types/<index>).
PORT_STATES = {0: "nop", 1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}
GID_TYPES = {0: "IB", 1: "IB/RoCE v1", 2: "RoCE v2"}
LINK_LAYERS = {0: "unspecified", 1: "infiniband", 2: "ethernet"}
UNAVAILABLE = "RDMA unavailable"


@dataclass(frozen=True)
class RawGid:
    index: int
    gid: str
    gid_type: int
    ifindex: int  # 0: no netdev (InfiniBand)


@dataclass(frozen=True)
class RawPort:
    port: int
    state: int
    link_layer: int
    gids: list[RawGid] = field(default_factory=list)


@dataclass(frozen=True)
class RawDevice:
    name: str
    node_guid: str
    ports: list[RawPort] = field(default_factory=list)


def describe(devices: list[RawDevice], ifname: Callable[[int], str | None]) -> RdmaObservation:
    """The registration's view of what pyverbs read; `ifname` names an ifindex (None when
    it names nothing here). A device is bound to the netdev of its first port's GIDs."""
    out = []
    for device in sorted(devices, key=lambda d: d.name):
        ports = []
        for port in sorted(device.ports, key=lambda p: p.port):
            gids = [
                RdmaGid(index=g.index, gid=gid_text(g.gid),
                        type=GID_TYPES.get(g.gid_type, str(g.gid_type)),
                        netdev=ifname(g.ifindex) if g.ifindex else None)
                for g in sorted(port.gids, key=lambda g: g.index)
            ]  # fmt: skip
            state = PORT_STATES.get(port.state, str(port.state))
            layer = LINK_LAYERS.get(port.link_layer, str(port.link_layer))
            ports.append(RdmaPort(port=port.port, state=state, link_layer=layer, gids=gids))
        netdev = next((g.netdev for p in ports for g in p.gids if g.netdev), None)
        out.append(RdmaDevice(name=device.name, node_guid=device.node_guid, netdev=netdev,
                              ports=ports))  # fmt: skip
    return RdmaObservation(devices=out)


def gid_text(text: str) -> str:
    """A GID as IPv6 text, shortened (pyverbs and sysfs spell out every group); a RoCE v2
    GID of an IPv4 address as ::ffff:a.b.c.d."""
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return text
    return f"::ffff:{address.ipv4_mapped}" if address.ipv4_mapped else str(address)


def unavailable(reason: str) -> RdmaObservation:
    return RdmaObservation(unavailable=f"{UNAVAILABLE}: {reason}"[:200])


def _ifname(index: int) -> str | None:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None


def read_devices() -> list[RawDevice]:
    """Every RDMA device with its ports and GID tables, through pyverbs (blocking; raises
    what pyverbs raises)."""
    verbs = load().device
    found = []
    for dev in verbs.get_device_list():
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        with verbs.Context(name=name) as ctx:
            attr = ctx.query_device()
            numbers = range(1, attr.phys_port_cnt + 1)
            attrs = {n: ctx.query_port(n) for n in numbers}
            table = gid_table(ctx)
            ports = [
                RawPort(n, attrs[n].state, attrs[n].link_layer, [
                    RawGid(index=e.gid_index, gid=_gid_text(e), gid_type=e.gid_type,
                           ifindex=e.ndev_ifindex)
                    for e in table if e.port_num == n
                ])
                for n in numbers
            ]  # fmt: skip
            found.append(RawDevice(name, verbs.guid_format(attr.node_guid), ports))
    return found


def _gid_text(entry: object) -> str:
    text = entry.gid_str()  # type: ignore[attr-defined]
    return text.decode() if isinstance(text, bytes) else str(text)


def discover() -> RdmaObservation:
    """The node's RDMA devices, or why they cannot be read (blocking: run off the loop)."""
    try:
        devices = read_devices()
    except RdmaUnavailable as exc:
        return unavailable(str(exc))
    except Exception as exc:  # pyverbs' own errors: PyverbsRDMAError, PyverbsError
        return unavailable(str(exc) or type(exc).__name__)
    return describe(devices, _ifname)


__all__ = [
    "RawDevice",
    "RawGid",
    "RawPort",
    "describe",
    "discover",
    "gid_text",
    "read_devices",
    "unavailable",
]
