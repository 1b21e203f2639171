"""Each injected failure is observable where it should be, recorded, and undone by restore.

One lab serves the module; every test restores what it injected (a fixture makes sure).
Drops are probed with UDP over one directly connected /31 (leaf1:swp1 <-> host1:eth1):
no routes are needed, and each probe either arrives or does not.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Iterator

import pytest

from thorn_lab import build, faults
from thorn_lab.handle import Lab, UnknownName
from thorn_lab.rtnl import set_admin_at_once
from thorn_lab.status import EndStatus, collect

PROBES = 2000


@pytest.fixture
def lab(shared_lab: Lab) -> Iterator[Lab]:
    yield shared_lab
    faults.restore(shared_lab)  # whatever the test left
    assert collect(shared_lab).healthy


def _ends(lab: Lab, link: str) -> tuple[EndStatus, EndStatus]:
    """The link's ends as `status` reports them, near end first."""
    ends = lab.link(link)
    (row,) = [lk for lk in collect(lab).links if lk.name == ends.name]
    return (row.a, row.b) if row.a.node == ends.near.node else (row.b, row.a)


def _state(end: EndStatus) -> tuple[bool, bool, str]:
    return (end.admin_up, end.carrier, end.operstate)


def _probe(lab: Lab, count: int = PROBES) -> int:
    """Send `count` datagrams host1 -> leaf1 over their link; return how many arrived."""
    host_ip = lab.link("host1:eth1").near.addresses[0].split("/")[0]
    leaf_ip = lab.link("host1:eth1").far.addresses[0].split("/")[0]
    with lab.entered("leaf1"):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with lab.entered("host1"):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.bind((leaf_ip, 7777))
        rx.settimeout(0.2)
        tx.bind((host_ip, 0))
        got = 0
        for start in range(0, count, 100):  # in bursts the receive buffer can hold
            for _ in range(min(100, count - start)):
                tx.sendto(b"probe", (leaf_ip, 7777))
            try:
                while True:
                    rx.recv(64)
                    got += 1
            except TimeoutError:
                pass
        return got


def test_link_down_takes_both_ends_admin_down(lab: Lab) -> None:
    record = faults.link_down(lab, "leaf1:swp3")
    near, far = _ends(lab, "leaf1:swp3")
    assert _state(near) == (False, False, "DOWN")
    assert _state(far) == (False, False, "DOWN")
    assert [f.id for f in collect(lab).faults] == [record.id]
    faults.restore(lab, record.id)  # returns once both ends are operationally up again
    near, far = _ends(lab, "leaf1:swp3")
    assert _state(near) == _state(far) == (True, True, "UP")


def test_carrier_loss_leaves_the_near_end_admin_up_without_carrier(lab: Lab) -> None:
    record = faults.carrier_loss(lab, "leaf1:swp3")
    near, far = _ends(lab, "leaf1:swp3")
    assert _state(near) == (True, False, "DOWN")  # NO-CARRIER: the peer is gone
    assert _state(far) == (False, False, "DOWN")  # the far end is administratively down
    assert "carrier lost" in record.sees["leaf1:swp3"]
    assert "admin down" in record.sees[f"{far.node}:{far.port}"]


def test_node_down_is_carrier_loss_at_every_neighbour(lab: Lab) -> None:
    faults.node_down(lab, "spine1")
    for link in lab.node_links("spine1"):
        spine_end, neighbour = _ends(lab, f"{link.near.node}:{link.near.port}")
        assert _state(spine_end) == (False, False, "DOWN")
        assert _state(neighbour) == (True, False, "DOWN")
    untouched, _ = _ends(lab, "spine2:swp1")
    assert _state(untouched) == (True, True, "UP")


def test_a_dead_node_drops_at_every_port_and_restore_takes_the_drops_away(lab: Lab) -> None:
    """A node that dies forwards nothing from one instant: every port drops at ingress in
    the same batch that takes the ports down (port by port, a flow through the node lost a
    packet at each port's turn), and restore removes every drop."""
    record = faults.node_down(lab, "spine1")
    ports = {str(d) for d in record.filters}
    assert ports == {f"spine1:{e.near.port}" for e in lab.node_links("spine1")}
    assert ports == {str(d) for d in record.admin_down}
    with lab.rtnl("spine1") as handle:
        links = handle.links()
        indexes = [links[d.ifname].index for d in record.filters]
        assert not any(links[d.ifname].admin_up for d in record.filters)
        # Each port has the drop (taken away here, by the same call restore makes).
        assert [handle.detach_ingress_bpf(i) for i in indexes] == [True] * len(indexes)
    faults.restore(lab, record.id)  # a drop already gone is no error
    assert faults.faults(lab) == []


def test_a_silent_drop_keeps_carrier_up_and_loses_every_packet(lab: Lab) -> None:
    assert _probe(lab, 200) == 200
    record = faults.silent_drop(lab, "host1:eth1", faults.Direction.out)
    near, far = _ends(lab, "host1:eth1")
    assert _state(near) == _state(far) == (True, True, "UP")
    assert _probe(lab, 200) == 0
    _, far = _ends(lab, "host1:eth1")
    assert far.ingress_drops >= 200  # counted where they vanished: leaf1's ingress
    faults.restore(lab, record.id)
    assert _probe(lab, 200) == 200


def test_a_drop_in_the_other_direction_does_not_touch_this_one(lab: Lab) -> None:
    faults.silent_drop(lab, "host1:eth1", faults.Direction.into)
    assert _probe(lab, 200) == 200


def test_packet_loss_drops_about_the_given_share(lab: Lab) -> None:
    _, before = _ends(lab, "host1:eth1")
    faults.packet_loss(lab, "leaf1:swp1", 30)
    arrived = _probe(lab)
    # Binomial(2000, 0.3): sd ~20 packets; 0.24..0.36 is a 6-sigma window.
    assert 0.24 < 1 - arrived / PROBES < 0.36
    _, after = _ends(lab, "host1:eth1")
    # The port's drop counter is cumulative: it grew by exactly the missing probes.
    assert after.ingress_drops - before.ingress_drops == PROBES - arrived


def test_two_faults_on_one_port_are_refused(lab: Lab) -> None:
    faults.silent_drop(lab, "leaf1:swp3")
    with pytest.raises(faults.FaultConflict, match="already affected by fault"):
        faults.node_down(lab, "leaf1")


def test_up_keeps_a_recorded_fault_and_restore_undoes_it(lab: Lab) -> None:
    record = faults.link_down(lab, "leaf2:swp3")
    result = build.up(lab.fabric, lab.prefix)
    assert result.held_down == 2 and result.repairs == []
    near, far = _ends(lab, "leaf2:swp3")
    assert not near.admin_up and not far.admin_up
    (undone,) = faults.restore(lab, "leaf2:swp3")  # by link as well as by id
    assert undone.id == record.id
    assert faults.faults(lab) == []


def test_unknown_links_nodes_and_faults_are_named(lab: Lab) -> None:
    with pytest.raises(UnknownName, match="leaf1:swp42"):
        faults.link_down(lab, "leaf1:swp42")
    with pytest.raises(UnknownName, match="core9"):
        faults.node_down(lab, "core9")
    with pytest.raises(UnknownName, match="f999"):
        faults.restore(lab, "f999")


def test_links_set_at_once_name_the_kernels_refusal(lab: Lab) -> None:
    """One batch per namespace: a link the kernel does not have fails the call with its
    errno, and the links the batch named before it are changed as asked."""
    namespace = lab.namespace("spine1")
    with lab.rtnl("spine1") as handle:
        index = handle.links()[lab.ifname("spine1", "swp1")].index
    try:
        with pytest.raises(OSError) as refused:
            set_admin_at_once({namespace: [index, 999_999]}, up=False)
        assert refused.value.errno == errno.ENODEV
        near, far = _ends(lab, "spine1:swp1")
        assert (near.admin_up, far.carrier) == (False, False)
    finally:
        set_admin_at_once({namespace: [index]}, up=True)
    deadline = time.monotonic() + 5
    while _ends(lab, "spine1:swp1")[1].operstate != "UP":
        assert time.monotonic() < deadline, "spine1:swp1's peer did not come back up"
        time.sleep(0.01)
