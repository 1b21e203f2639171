"""The BFD runtime with sessions inside named namespaces, on this kernel (root).

    a --(va/ra)-- r --(rb/vb)-- b        a 10.79.0.1, b 10.79.1.1, r routes between them
    a --(wa/wb)-- b                      a 10.79.2.1 / fd79:2::1, b 10.79.2.2 / fd79:2::2

One manager holds sessions in several namespaces at once (each session's sockets are made
inside its namespace). Over the direct link: IPv4 and IPv6 sessions come Up and detect a cut;
a session pinned to another interface drops what arrives elsewhere. Through the router r the
TTL is 254 on arrival: a single-hop session drops it (RFC 5881 §5), a multihop one takes it.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from thorn_lab.rtnl import Rtnl
from thorn_programmer.bfd import BfdEvent, BfdManager, Diag, SessionConfig, State


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@dataclass
class Net:
    a: str
    b: str
    r: str


@pytest.fixture
def net() -> Iterator[Net]:
    tag = uuid.uuid4().hex[:6]
    n = Net(f"bfd{tag}-a", f"bfd{tag}-b", f"bfd{tag}-r")
    made: list[str] = []
    try:
        for ns in (n.a, n.b, n.r):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", n.r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for x, dx, y, dy in (
            (n.a, "va", n.r, "ra"),
            (n.b, "vb", n.r, "rb"),
            (n.a, "wa", n.b, "wb"),
        ):
            sh("ip", "-n", x, "link", "add", dx, "type", "veth", "peer", "name", dy, "netns", y)
        for ns, dev, cidr in (
            (n.a, "va", "10.79.0.1/24"), (n.r, "ra", "10.79.0.2/24"),
            (n.b, "vb", "10.79.1.1/24"), (n.r, "rb", "10.79.1.2/24"),
            (n.a, "wa", "10.79.2.1/24"), (n.b, "wb", "10.79.2.2/24"),
        ):  # fmt: skip
            sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
        for ns, dev, cidr in ((n.a, "wa", "fd79:2::1/64"), (n.b, "wb", "fd79:2::2/64")):
            sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev, "nodad")
        for ns, dev in ((n.a, "va"), (n.r, "ra"), (n.b, "vb"), (n.r, "rb"), (n.a, "wa"),
                        (n.b, "wb")):  # fmt: skip
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", n.a, "route", "add", "10.79.1.0/24", "via", "10.79.0.2")
        sh("ip", "-n", n.b, "route", "add", "10.79.0.0/24", "via", "10.79.1.2")
        yield n
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Recorder:
    def __init__(self) -> None:
        self.events: list[BfdEvent] = []

    def __call__(self, event: BfdEvent) -> None:
        self.events.append(event)


@pytest.fixture
def manager() -> Iterator[tuple[BfdManager, Recorder]]:
    recorder = Recorder()
    made = BfdManager(recorder, name=f"netns-{uuid.uuid4().hex[:6]}")
    made.start()
    try:
        yield made, recorder
    finally:
        made.close(admin_down=False)


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def config(disc: int, peer: str, local: str, multihop: bool = False) -> SessionConfig:
    return SessionConfig(disc, peer, local, 10_000, 10_000, 3, multihop=multihop)


def all_up(manager: BfdManager) -> bool:
    return all(
        s.state == State.UP and s.tx_interval_us == 10_000 and s.detection_time_us == 30_000
        for s in manager.sessions()
    )


@pytest.mark.parametrize(("near", "far"), [("10.79.2.1", "10.79.2.2"), ("fd79:2::1", "fd79:2::2")])
def test_sessions_in_two_namespaces_come_up_and_detect_a_cut(
    net: Net, manager: tuple[BfdManager, Recorder], near: str, far: str
) -> None:
    bfd, recorder = manager
    bfd.add(config(1, far, near), ifname="wa", netns=net.a)
    bfd.add(config(2, near, far), ifname="wb", netns=net.b)
    wait_until(lambda: all_up(bfd))
    status = {s.local_discriminator: s for s in bfd.sessions()}
    assert (status[1].netns, status[1].ifname, status[1].remote_discriminator) == (net.a, "wa", 2)
    with Rtnl.open(net.b) as rtnl:
        index = rtnl.links()["wb"].index
        t0 = time.monotonic()
        rtnl.set_admin(index, False)  # b's end down: a hears nothing more
    wait_until(lambda: any(e.new == State.DOWN for e in recorder.events))
    down = next(e for e in recorder.events if e.new == State.DOWN)
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    assert down.monotonic - t0 <= 0.030 + 0.030
    assert bfd.counters().dropped == {}


def test_a_session_pinned_to_an_interface_drops_packets_from_another(
    net: Net, manager: tuple[BfdManager, Recorder]
) -> None:
    bfd, _recorder = manager
    # a's session to b's wb address, pinned to va (the routed link): b's packets come in on wa.
    bfd.add(config(1, "10.79.2.2", "10.79.2.1"), ifname="va", netns=net.a)
    bfd.add(config(2, "10.79.2.1", "10.79.2.2"), netns=net.b)
    wait_until(lambda: bfd.counters().dropped.get("wrong_interface", 0) >= 2)
    assert {s.state for s in bfd.sessions()} == {State.DOWN}


def test_ttl_through_a_router_single_hop_refused_multihop_taken(
    net: Net, manager: tuple[BfdManager, Recorder]
) -> None:
    bfd, _recorder = manager
    bfd.add(config(1, "10.79.1.1", "10.79.0.1"), netns=net.a)
    bfd.add(config(2, "10.79.0.1", "10.79.1.1"), netns=net.b)
    bfd.add(config(3, "10.79.1.1", "10.79.0.1", multihop=True), netns=net.a)
    bfd.add(config(4, "10.79.0.1", "10.79.1.1", multihop=True), netns=net.b)
    wait_until(
        lambda: (
            all(s.state == State.UP for s in bfd.sessions() if s.multihop)
            and bfd.counters().dropped.get("ttl", 0) >= 2
        )
    )
    status = {s.local_discriminator: s.state for s in bfd.sessions()}
    assert status[1] == status[2] == State.DOWN
