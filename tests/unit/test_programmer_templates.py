"""Stamped messages are exactly what a full encoding gives (the flower driver's fast path)."""

from __future__ import annotations

from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.kernel import Change, EncapRule, TunnelAction
from thorn_programmer.netlink import action_add, filter_add


def driver() -> FlowerDriver:
    d = FlowerDriver.__new__(FlowerDriver)
    FlowerDriver.__init__(d, None, None, None)  # type: ignore[arg-type]  # no sockets needed
    d.ifindex = {"vf0_rep": 5, "vf1_rep": 9, "thorn-vx": 6}
    return d


def test_stamped_tunnel_actions_equal_their_full_encoding() -> None:
    d = driver()
    for n, (src, dst, vni) in enumerate([("10.224.0.1", "10.240.3.4", 1000),
                                         ("10.0.0.9", "10.255.255.254", 16777215)]):  # fmt: skip
        action = TunnelAction(f"h{n}", vni, src, dst)
        stamped = d._message(Change("add", action, None))
        index = d._index[(f"h{n}", vni)]
        full = action_add(d._tunnel_key(action, index), skip_hw=True)
        assert stamped == full


def test_stamped_encap_rules_equal_their_full_encoding() -> None:
    d = driver()
    d._message(Change("add", TunnelAction("h2", 1000, "10.224.0.1", "10.224.0.2"), None))
    for dev, mac in (("vf0_rep", "06:00:00:00:00:02"), ("vf1_rep", "fe:dc:ba:98:76:54")):
        rule = EncapRule(dev, mac, "h2", 1000)
        stamped = d._message(Change("add", rule, None))
        full = filter_add(d._spec(rule, 0))
        assert stamped == full


def test_allocated_action_indexes_are_distinct_and_never_the_placeholder() -> None:
    d = driver()
    for n in range(50):
        d._message(Change("add", TunnelAction(f"h{n}", 1000, "10.224.0.1", "10.224.0.2"), None))
    assert len(set(d._index.values())) == 50
