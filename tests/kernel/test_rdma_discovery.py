"""RDMA discovery through pyverbs on a real Soft-RoCE device (kernel lane).

An rxe device on a veth in the guest's root namespace (rxe in 6.1 works only there); the
agent's discovery must return the device, its port's state, its RoCE v2 GID for the
netdev's IPv4 address with the kernel's index, and the netdev, as sysfs shows them
(/sys/class/infiniband/<dev>/ports/1/gids, gid_attrs/types, gid_attrs/ndevs).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from netlab import ip
from roce import ipv4_gid_index

from thorn.observed import RdmaDevice
from thorn_programmer.rdma import discover, gid_text

ADDRESS = "198.51.100.7"


@pytest.fixture
def soft_roce() -> Iterator[tuple[str, str]]:
    """(rdma device, netdev): rxe on a veth of the root namespace, up, with an address."""
    tag = uuid.uuid4().hex[:4]
    netdev, peer, device = f"vfd{tag}", f"vfd{tag}_rep", f"rxed{tag}"
    ip(None, f"link add {netdev} type veth peer name {peer}")
    try:
        ip(None, f"addr add {ADDRESS}/32 dev {netdev}")
        ip(None, f"link set {peer} up")
        ip(None, f"link set {netdev} up")
        subprocess.run(["rdma", "link", "add", device, "type", "rxe", "netdev", netdev],
                       check=True, capture_output=True, text=True)  # fmt: skip
        try:
            yield device, netdev
        finally:
            subprocess.run(["rdma", "link", "delete", device], check=False)
    finally:
        ip(None, f"link del {netdev}", check=False)


def found(device: str, within: float = 20.0) -> RdmaDevice:
    deadline = time.monotonic() + within
    while True:
        seen = discover()
        assert seen.unavailable is None, seen.unavailable
        match = [d for d in seen.devices if d.name == device]
        port = match[0].ports[0] if match and match[0].ports else None
        if port is not None and port.state == "active":
            return match[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"{device} not discovered active: {seen}")
        time.sleep(0.5)


def test_discovery_returns_the_device_its_port_state_roce_v2_gid_and_netdev(
    soft_roce: tuple[str, str],
) -> None:
    device, netdev = soft_roce
    index = ipv4_gid_index(device, ADDRESS)
    rxe = found(device)
    assert rxe.netdev == netdev
    (port,) = rxe.ports
    assert (port.port, port.state, port.link_layer) == (1, "active", "ethernet")
    v2 = [g for g in port.gids if g.gid == f"::ffff:{ADDRESS}" and g.type == "RoCE v2"]
    assert [g.index for g in v2] == [index]
    assert v2[0].netdev == netdev
    sysfs = Path(f"/sys/class/infiniband/{device}/ports/1")
    for gid in port.gids:  # every entry as the kernel shows it
        assert gid_text((sysfs / "gids" / str(gid.index)).read_text().strip()) == gid.gid
        attrs = sysfs / "gid_attrs"
        assert (attrs / "types" / str(gid.index)).read_text().strip() == gid.type
        assert (attrs / "ndevs" / str(gid.index)).read_text().strip() == gid.netdev
