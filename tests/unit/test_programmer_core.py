"""The programmer's pure core: desired documents -> intent -> kernel objects -> changes."""

from __future__ import annotations

import pytest

from thorn.desired import HostState, LocalWorkload, Route, SwitchState, VniMember, VniState
from thorn_programmer.intent import host_intent, members, switch_intent
from thorn_programmer.kernel import (
    PRIO_ENCAP,
    ZERO_MAC,
    Clsact,
    Device,
    EncapRule,
    Fdb,
    FloodRule,
    Redirect,
    TunnelAction,
    diff,
    index,
)
from thorn_programmer.render import (
    FLOOD_TARGETS_PER_RULE,
    emulation_objects,
    flower_objects,
    held,
    switch_objects,
)

VNI = 1000


def member(n: int, host: str, *, red: bool = True) -> VniMember:
    """Workload n on `host` ("h<k>"), whose TEPs are 10.224.0.k (red) and 10.240.0.k."""
    k = int(host[1:])
    return VniMember(
        name=f"w{n}", mac=f"06:00:00:00:00:{n:02x}", ip=f"100.64.0.{n}", host=host,
        red=f"10.224.0.{k}" if red else None, blue=f"10.240.0.{k}",
    )  # fmt: skip


def chunk(members_: list[VniMember], n: int = 0, of: int = 1, revision: int = 7) -> VniState:
    return VniState(vni=VNI, chunk=n, chunks=of, topology_revision=revision, members=members_)


def host_state(node: str = "h1", blue_peers: tuple[str, ...] = ()) -> HostState:
    return HostState(
        node=node, plan_revision=3, topology_revision=7,
        teps={"red": "10.224.0.1", "blue": "10.240.0.1"},
        routes=[Route(prefix="0.0.0.0/0", colour=None, port="eth1", neighbour="leaf1",
                      via="10.0.0.1", stage=1000)],
        local=[LocalWorkload(name="w1", vni=VNI, vf="vf0", mac="06:00:00:00:00:01",
                             ip="100.64.0.1")],
        vnis=[VNI], blue_peers=list(blue_peers),
    )  # fmt: skip


ALL = [member(1, "h1"), member(2, "h2"), member(3, "h3"), member(4, "h3")]


def test_a_host_sees_every_other_member_of_its_vnis_on_red_by_default() -> None:
    intent = host_intent(host_state(), [chunk(ALL)])
    assert [(p.name, p.host, p.colour, p.tep) for p in intent.peers] == [
        ("w2", "h2", "red", "10.224.0.2"),
        ("w3", "h3", "red", "10.224.0.3"),
        ("w4", "h3", "red", "10.224.0.3"),
    ]
    assert intent.local[0].rep == "vf0_rep"


def test_blue_peers_overrides_and_missing_red_teps_choose_blue() -> None:
    members_ = [member(1, "h1"), member(2, "h2"), member(3, "h3", red=False), member(5, "h5")]
    intent = host_intent(host_state(blue_peers=("h2",)), [chunk(members_)], {"h5": "blue"})
    assert {p.host: p.colour for p in intent.peers} == {"h2": "blue", "h3": "blue", "h5": "blue"}


def test_a_vni_whose_chunks_are_missing_or_from_two_revisions_is_incomplete() -> None:
    assert members([chunk(ALL[:2], 0, 2)]) == {VNI: None}
    assert members([chunk(ALL[:2], 0, 2, revision=7), chunk(ALL[2:], 1, 2, revision=8)]) == {
        VNI: None
    }
    assert members([chunk(ALL[:2], 0, 2), chunk(ALL[2:], 1, 2)]) == {VNI: ALL}
    intent = host_intent(host_state(), [chunk(ALL[:2], 0, 2)])
    assert intent.incomplete == {VNI} and intent.peers == ()


def test_objects_of_an_incomplete_vni_are_held_not_deleted() -> None:
    intent = host_intent(host_state(), [chunk(ALL[:2], 0, 2)])
    kernel = [Fdb("thv1000", "06:00:00:00:00:02", "10.224.0.2")]
    desired = emulation_objects(intent)
    assert all(held(intent, o) for o in kernel)
    assert diff(desired, [o for o in kernel if not held(intent, o)]) != []
    assert not any(c.op == "delete" for c in diff(desired, []))


def test_emulation_renders_a_vxlan_per_vni_an_fdb_per_peer_mac_and_a_flood_entry_per_host() -> None:
    objects = emulation_objects(host_intent(host_state(), [chunk(ALL)]))
    assert Device("thv1000", "vxlan", vni=VNI, local="10.224.0.1") in objects
    assert Redirect("vf0_rep", PRIO_ENCAP, None, "thv1000") in objects
    fdb = sorted((o.mac, o.dst) for o in objects if isinstance(o, Fdb))
    assert fdb == [
        ("00:00:00:00:00:00", "10.224.0.2"),
        ("00:00:00:00:00:00", "10.224.0.3"),
        ("06:00:00:00:00:02", "10.224.0.2"),
        ("06:00:00:00:00:03", "10.224.0.3"),
        ("06:00:00:00:00:04", "10.224.0.3"),
    ]


def test_flower_shares_one_tunnel_action_per_peer_host_and_vni() -> None:
    objects = flower_objects(host_intent(host_state(), [chunk(ALL)]))
    tunnels = [o for o in objects if isinstance(o, TunnelAction)]
    assert [(t.peer, t.src, t.dst) for t in tunnels] == [
        ("h2", "10.224.0.1", "10.224.0.2"),
        ("h3", "10.224.0.1", "10.224.0.3"),  # one action for both of h3's workloads
    ]
    encap = [(o.mac, o.peer) for o in objects if isinstance(o, EncapRule)]
    assert encap == [("06:00:00:00:00:02", "h2"), ("06:00:00:00:00:03", "h3"),
                     ("06:00:00:00:00:04", "h3")]  # fmt: skip


def test_flipping_a_peer_is_one_tunnel_action_replace_for_unicast_and_flood_alike() -> None:
    red = flower_objects(host_intent(host_state(), [chunk(ALL)]))
    blue = flower_objects(host_intent(host_state(), [chunk(ALL)], {"h2": "blue"}))
    changes = diff(blue, red)
    assert [(c.op, type(c.obj).__name__) for c in changes] == [("replace", "TunnelAction")]
    new = changes[0].new
    assert isinstance(new, TunnelAction) and (new.peer, new.dst) == ("h2", "10.240.0.2")


def test_flood_rules_hold_at_most_fifteen_peer_hosts_each() -> None:
    many = [member(1, "h1"), *(member(n, f"h{n}") for n in range(2, 40))]
    objects = flower_objects(host_intent(host_state(), [chunk(many)]))
    parts = [o for o in objects if isinstance(o, FloodRule)]
    assert [len(p.peers) for p in parts] == [15, 15, 8]
    assert [p.last for p in parts] == [False, False, True]
    assert max(len(p.peers) for p in parts) == FLOOD_TARGETS_PER_RULE


def test_a_host_with_two_workloads_in_a_vni_copies_bum_to_the_other_in_a_rule_of_its_own() -> None:
    state = host_state()
    two = state.model_copy(update={"local": [
        *state.local, LocalWorkload(name="w9", vni=VNI, vf="vf1", mac="06:00:00:00:00:09",
                                    ip="100.64.0.9")]})  # fmt: skip
    objects = flower_objects(host_intent(two, [chunk(ALL)]))
    floods = [o for o in objects if isinstance(o, FloodRule) and o.dev == "vf0_rep"]
    assert [(f.part, f.mirrors, f.peers, f.last) for f in floods] == [
        (0, ("vf1_rep",), (), False),
        (1, (), ("h2", "h3"), True),
    ]
    hairpin = [o for o in objects if isinstance(o, Redirect) and o.dev == "vf0_rep"]
    assert [(r.dst_mac, r.to) for r in hairpin] == [("06:00:00:00:00:09", "vf1_rep")]


def test_a_switch_renders_its_routes_only() -> None:
    state = SwitchState(
        node="leaf1", plan_revision=3, topology_revision=7,
        routes=[Route(prefix="10.224.0.0/28", colour="red", port="swp5", neighbour="spine1",
                      via="10.0.0.33", stage=2)],
    )  # fmt: skip
    [route] = switch_objects(switch_intent(state))
    assert (route.prefix, route.dev, route.via) == ("10.224.0.0/28", "swp5", "10.0.0.33")


def test_diff_creates_in_rank_order_and_deletes_in_reverse() -> None:
    desired = [Redirect("r", PRIO_ENCAP, None, "thv1"), Device("thv1", "vxlan", vni=1)]
    actual = [Fdb("thv9", ZERO_MAC, "10.0.0.9"), Device("thv9", "vxlan", vni=9), Clsact("r")]
    changes = diff(desired, actual)
    assert [(c.op, type(c.obj).__name__) for c in changes] == [
        ("add", "Device"),
        ("add", "Redirect"),
        ("delete", "Fdb"),
        ("delete", "Device"),  # the clsact stays: it may carry other owners' filters
    ]


def test_diff_ignores_kernel_assigned_numbers() -> None:
    mine = TunnelAction("h2", VNI, "10.224.0.1", "10.224.0.2")
    theirs = TunnelAction("h2", VNI, "10.224.0.1", "10.224.0.2", index=0x54480007)
    assert diff([mine], [theirs]) == []


def test_two_objects_with_one_identity_are_refused() -> None:
    with pytest.raises(ValueError, match="share the key"):
        index([Fdb("thv1", "06:00:00:00:00:01", "10.0.0.1"),
               Fdb("thv1", "06:00:00:00:00:01", "10.0.0.2")])  # fmt: skip
