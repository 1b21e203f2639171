"""The fabric's cross-entity rules, and the all-or-nothing contract of every operation.

Every rejected operation is checked twice: the issue's location and kind (what the API turns
into its error body), and that the fabric, its private indexes included, is exactly as it was.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thorn.fabric import Change, Fabric, FabricError, Issue, NotFound
from thorn.model import (
    Colour,
    FabricDocument,
    LinkSpec,
    LinkUpdate,
    NodeSpec,
    NodeUpdate,
    PortSpec,
    PortUpdate,
    Tenant,
    TenantUpdate,
    Tep,
    Vni,
    Workload,
)

# --- helpers -------------------------------------------------------------------------------


def port(name: str, address: str | None = None, mac: str | None = None) -> PortSpec:
    return PortSpec(name=name, address=address, mac=mac)


def switch(name: str, *ports: PortSpec, mgmt: str | None = None) -> NodeSpec:
    return NodeSpec(name=name, role="switch", mgmt_address=mgmt, ports=list(ports))


def host(name: str, *ports: PortSpec, mgmt: str | None = None) -> NodeSpec:
    return NodeSpec(name=name, role="host", mgmt_address=mgmt, ports=list(ports))


def link(a: str, b: str, **kw: Any) -> LinkSpec:
    return LinkSpec(a=a, b=b, **kw)


def tep(node: str, colour: str, address: str) -> Tep:
    return Tep(node=node, colour=colour, address=address)


def workload(
    name: str, node: str, vni: int, ip: str, mac: str = "06:00:00:00:00:01", vf: str = "vf0"
) -> Workload:
    return Workload(name=name, node=node, vni=vni, ip=ip, mac=mac, vf=vf)


def build(*nodes: NodeSpec, links: tuple[LinkSpec, ...] = ()) -> Fabric:
    fabric = Fabric()
    for node in nodes:
        fabric.add_node(node)
    for lk in links:
        fabric.add_link(lk)
    return fabric


def linked_pair() -> Fabric:
    """leaf1:e1 (10.0.0.0/31) -- spine1:e1 (10.0.0.1/31), link 1."""
    return build(
        switch("leaf1", port("e1", "10.0.0.0/31", "02:00:00:00:01:01"), mgmt="172.16.0.1"),
        switch("spine1", port("e1", "10.0.0.1/31", "02:00:00:00:02:01"), mgmt="172.16.0.2"),
        links=(link("leaf1:e1", "spine1:e1"),),
    )


def overlay() -> Fabric:
    """Hosts h1, h2 (one port each), switch s1; tenant t1 owning VNIs 100 and 200."""
    fabric = build(
        host("h1", port("eth1", "10.0.0.0/31")),
        host("h2", port("eth1", "10.0.0.2/31")),
        switch("s1", port("swp1", "10.0.0.1/31"), port("swp2", "10.0.0.3/31")),
        links=(link("h1:eth1", "s1:swp1"), link("h2:eth1", "s1:swp2")),
    )
    fabric.add_tenant(Tenant(name="t1"))
    fabric.add_vni(Vni(vni=100, name="blue-net", tenant="t1"))
    fabric.add_vni(Vni(vni=200, name="red-net", tenant="t1"))
    return fabric


def _intervals(fabric: Fabric) -> dict[int, list[tuple[int, int, list[tuple[str, str]]]]]:
    # The users of one network are a set (their order only shows in error messages), so they
    # are compared sorted; see test_a_failed_port_update_keeps_the_order_of_network_users.
    return {
        version: [
            (s, e, sorted(u))
            for s, e, u in zip(ranges.starts, ranges.ends, ranges.users, strict=True)
        ]
        for version, ranges in fabric._nets.items()
    }


def rule_state(fabric: Fabric) -> dict[str, Any]:
    """The indexes behind the rules that do not depend on link ids."""
    return copy.deepcopy(
        {
            "address_owner": fabric._address_owner,
            "mac_owner": fabric._mac_owner,
            "nets": _intervals(fabric),
            "tep_points": fabric._tep_points,
            "overlay_ip": fabric._overlay_ip,
            "overlay_mac": fabric._overlay_mac,
            "vf": fabric._vf,
        }
    )


def snapshot(fabric: Fabric) -> dict[str, Any]:
    """Everything observable about a fabric, private indexes included (deep-copied)."""
    return {
        "document": fabric.to_document().model_dump(),
        "links": [lk.model_dump() for lk in fabric.links.values()],  # with their ids
        "revision": fabric.revision,
        "next_link_id": fabric.next_link_id,
        "ports": list(fabric.ports.items()),
        "node_ports": copy.deepcopy(fabric.node_ports),
        "link_of_port": dict(fabric.link_of_port),
        "teps": list(fabric.teps.items()),
        **rule_state(fabric),
    }


def rejected(
    fabric: Fabric, operation: Callable[[], object], error: type[Exception] = FabricError
) -> list[tuple[tuple[str | int, ...], str]]:
    """Run an operation that must fail; check it changed nothing; return (loc, kind) pairs."""
    before = snapshot(fabric)
    with pytest.raises(error) as exc:
        operation()
    assert snapshot(fabric) == before, "a failed operation changed the fabric"
    if isinstance(exc.value, FabricError):
        assert exc.value.issues, "a FabricError must carry at least one issue"
        return [(i.loc, i.kind) for i in exc.value.issues]
    return []


def changes(result: list[Change]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.op, c.key) for c in result]


# --- nodes and ports ---------------------------------------------------------------------


def test_adding_a_node_creates_the_node_then_its_ports() -> None:
    fabric = Fabric()
    result = fabric.add_node(switch("leaf1", port("e1"), port("e2")))
    assert changes(result) == [
        ("node", "create", "leaf1"),
        ("port", "create", "leaf1:e1"),
        ("port", "create", "leaf1:e2"),
    ]
    assert fabric.node_ports["leaf1"] == ["e1", "e2"]
    assert fabric.port("leaf1", "e2").node == "leaf1"


def test_node_names_are_unique() -> None:
    fabric = build(switch("leaf1"))
    assert rejected(fabric, lambda: fabric.add_node(host("leaf1"))) == [(("name",), "conflict")]


def test_port_names_are_unique_per_node() -> None:
    fabric = build(switch("leaf1", port("e1")), switch("leaf2"))
    assert rejected(fabric, lambda: fabric.add_port("leaf1", port("e1"))) == [
        (("name",), "conflict")
    ]
    fabric.add_port("leaf2", port("e1"))  # the same name on another node is fine


def test_a_node_spec_may_not_repeat_a_port_name() -> None:
    fabric = Fabric()
    spec = switch("leaf1", port("e1"), port("e2"), port("e1"))
    assert rejected(fabric, lambda: fabric.add_node(spec)) == [(("ports", 2, "name"), "conflict")]


def test_a_node_with_a_bad_port_is_not_added_at_all() -> None:
    fabric = build(switch("leaf1", port("e1", "10.0.0.0/31")))
    spec = switch("leaf2", port("e1", "10.0.1.0/31"), port("e2", "10.0.0.0/31"), mgmt="172.16.0.9")
    assert rejected(fabric, lambda: fabric.add_node(spec)) == [
        (("ports", 1, "address"), "conflict")
    ]
    assert "leaf2" not in fabric.nodes
    # nothing of the refused node stayed behind: its mgmt address and good port are free
    fabric.add_node(switch("leaf3", port("e1", "10.0.1.0/31"), mgmt="172.16.0.9"))


def test_adding_a_port_to_a_missing_node_is_not_found() -> None:
    fabric = Fabric()
    rejected(fabric, lambda: fabric.add_port("ghost", port("e1")), NotFound)


def test_reading_missing_entities_is_not_found() -> None:
    fabric = build(switch("leaf1"))
    for read in [
        lambda: fabric.node("ghost"),
        lambda: fabric.port("leaf1", "ghost"),
        lambda: fabric.port("ghost", "e1"),
        lambda: fabric.link(1),
        lambda: fabric.tenant("ghost"),
        lambda: fabric.vni(7),
        lambda: fabric.workload("ghost"),
        lambda: fabric.tep("leaf1", Colour.red),
    ]:
        with pytest.raises(NotFound):
            read()


def test_a_mac_is_used_by_at_most_one_port() -> None:
    fabric = build(switch("leaf1", port("e1", mac="02:00:00:00:00:01")), switch("leaf2"))
    assert rejected(
        fabric, lambda: fabric.add_port("leaf2", port("e1", mac="02-00-00-00-00-01"))
    ) == [(("mac",), "conflict")]
    assert rejected(
        fabric, lambda: fabric.add_node(switch("leaf3", port("e1", mac="02:00:00:00:00:01")))
    ) == [(("ports", 0, "mac"), "conflict")]


def test_a_node_spec_may_not_give_two_of_its_ports_the_same_mac() -> None:
    fabric = Fabric()
    spec = switch("leaf1", port("e1", mac="02:00:00:00:00:01"), port("e2", mac="02:00:00:00:00:01"))
    assert rejected(fabric, lambda: fabric.add_node(spec)) == [(("ports", 1, "mac"), "conflict")]


# --- addresses -----------------------------------------------------------------------------


def test_a_management_address_is_used_once() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"))
    assert rejected(fabric, lambda: fabric.add_node(switch("leaf2", mgmt="172.16.0.1"))) == [
        (("mgmt_address",), "conflict")
    ]


def test_a_port_address_may_not_be_a_management_address() -> None:
    fabric = build(switch("leaf1", mgmt="10.0.0.0"), switch("leaf2"))
    assert rejected(fabric, lambda: fabric.add_port("leaf2", port("e1", "10.0.0.0/31"))) == [
        (("address",), "conflict")
    ]


def test_a_management_address_may_not_be_a_port_address() -> None:
    fabric = build(switch("leaf1", port("e1", "10.0.0.0/31")))
    assert rejected(fabric, lambda: fabric.add_node(switch("leaf2", mgmt="10.0.0.0"))) == [
        (("mgmt_address",), "conflict")
    ]


def test_a_node_may_not_reuse_its_own_management_address_on_a_port() -> None:
    fabric = Fabric()
    spec = switch("leaf1", port("e1", "10.0.0.0/31"), mgmt="10.0.0.0")
    assert rejected(fabric, lambda: fabric.add_node(spec)) == [
        (("ports", 0, "address"), "conflict")
    ]


def test_a_tep_address_may_not_be_a_management_address_and_vice_versa() -> None:
    fabric = build(host("h1", mgmt="172.16.0.1"))
    assert rejected(fabric, lambda: fabric.add_tep(tep("h1", "red", "172.16.0.1"))) == [
        (("address",), "conflict")
    ]
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    assert rejected(fabric, lambda: fabric.add_node(host("h2", mgmt="10.224.0.1"))) == [
        (("mgmt_address",), "conflict")
    ]


def test_a_tep_address_may_not_be_a_port_address() -> None:
    fabric = build(host("h1", port("eth1", "10.0.0.1/32")))
    # the same address, and (a /32 being a network of its own) inside the port's network
    assert rejected(fabric, lambda: fabric.add_tep(tep("h1", "red", "10.0.0.1"))) == [
        (("address",), "conflict"),
        (("address",), "conflict"),
    ]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("10.0.0.1/30", "10.0.0.2/31"),
        ("10.0.0.2/31", "10.0.0.1/30"),
        ("10.0.0.1/24", "10.0.0.77/32"),
        ("2001:db8::1/64", "2001:db8::7/127"),
    ],
)
def test_port_networks_may_not_overlap(first: str, second: str) -> None:
    fabric = build(switch("leaf1", port("e1", first)), switch("leaf2"))
    assert rejected(fabric, lambda: fabric.add_port("leaf2", port("e1", second))) == [
        (("address",), "conflict")
    ]


def test_ipv4_and_ipv6_port_networks_do_not_interfere() -> None:
    fabric = build(switch("leaf1", port("e1", "10.0.0.0/31")))
    fabric.add_port("leaf1", port("e2", "::a00:0/127"))  # the same integers, another family


def test_a_point_to_point_network_holds_at_most_two_ports() -> None:
    fabric = build(
        switch("a", port("e1", "10.0.0.1/29")),
        switch("b", port("e1", "10.0.0.2/29")),
        switch("c"),
    )
    assert rejected(fabric, lambda: fabric.add_port("c", port("e1", "10.0.0.3/29"))) == [
        (("address",), "conflict")
    ]


def test_three_ports_in_one_slash_31_are_refused() -> None:
    fabric = build(
        switch("a", port("e1", "10.0.0.0/31")),
        switch("b", port("e1", "10.0.0.1/31")),
        switch("c"),
    )
    # a /31 has two addresses: the third port both reuses an address and crowds the network
    issues = rejected(fabric, lambda: fabric.add_port("c", port("e1", "10.0.0.0/31")))
    assert issues == [(("address",), "conflict"), (("address",), "conflict")]
    with pytest.raises(FabricError, match="already used by the two ports"):
        fabric.add_port("c", port("e1", "10.0.0.1/31"))


def test_a_tep_may_not_lie_inside_a_port_network() -> None:
    fabric = build(host("h1", port("eth1", "10.0.0.1/29")))
    assert rejected(fabric, lambda: fabric.add_tep(tep("h1", "red", "10.0.0.6"))) == [
        (("address",), "conflict")
    ]
    fabric.add_tep(tep("h1", "red", "10.0.0.8"))  # just outside 10.0.0.0/29


def test_a_port_network_may_not_contain_a_tep() -> None:
    fabric = build(host("h1"))
    fabric.add_tep(tep("h1", "red", "10.0.0.6"))
    assert rejected(fabric, lambda: fabric.add_port("h1", port("eth1", "10.0.0.1/29"))) == [
        (("address",), "conflict")
    ]
    fabric.add_port("h1", port("eth1", "10.0.0.9/29"))  # 10.0.0.8/29 does not contain it


def test_a_port_update_into_a_network_containing_a_tep_is_refused() -> None:
    fabric = build(host("h1", port("eth1", "10.0.1.0/31")))
    fabric.add_tep(tep("h1", "blue", "10.0.0.6"))
    assert rejected(
        fabric, lambda: fabric.update_port("h1", "eth1", PortUpdate(address="10.0.0.1/29"))
    ) == [(("address",), "conflict")]


# --- links ---------------------------------------------------------------------------------


def test_a_link_joins_two_existing_ports() -> None:
    fabric = linked_pair()
    assert fabric.links[1].a.node == "leaf1"
    assert fabric.link_of_port == {("leaf1", "e1"): 1, ("spine1", "e1"): 1}
    assert fabric.next_link_id == 2


def test_link_ids_are_assigned_in_sequence_and_never_reused() -> None:
    fabric = build(switch("a", port("e1"), port("e2")), switch("b", port("e1"), port("e2")))
    assert changes(fabric.add_link(link("a:e1", "b:e1"))) == [("link", "create", "1")]
    fabric.delete_link(1)
    assert changes(fabric.add_link(link("a:e1", "b:e1"))) == [("link", "create", "2")]
    assert changes(fabric.add_link(link("a:e2", "b:e2"))) == [("link", "create", "3")]


def test_a_link_to_a_missing_node_is_not_found() -> None:
    fabric = build(switch("leaf1", port("e1")))
    assert rejected(fabric, lambda: fabric.add_link(link("ghost:e1", "leaf1:e1"))) == [
        (("a", "node"), "not_found")
    ]
    assert rejected(fabric, lambda: fabric.add_link(link("leaf1:e1", "ghost:e1"))) == [
        (("b", "node"), "not_found")
    ]


def test_a_link_to_a_missing_port_is_not_found() -> None:
    fabric = build(switch("leaf1", port("e1")), switch("spine1", port("e1")))
    assert rejected(fabric, lambda: fabric.add_link(link("leaf1:e9", "spine1:e1"))) == [
        (("a", "port"), "not_found")
    ]
    assert rejected(fabric, lambda: fabric.add_link(link("leaf1:e1", "spine1:e9"))) == [
        (("b", "port"), "not_found")
    ]


def test_a_link_reports_both_missing_ends_at_once() -> None:
    fabric = build(switch("leaf1"))
    assert rejected(fabric, lambda: fabric.add_link(link("leaf1:e1", "ghost:e1"))) == [
        (("a", "port"), "not_found"),
        (("b", "node"), "not_found"),
    ]


def test_a_port_can_be_in_at_most_one_link() -> None:
    fabric = linked_pair()
    fabric.add_node(switch("spine2", port("e1")))
    fabric.add_node(switch("leaf2", port("e1")))
    assert rejected(fabric, lambda: fabric.add_link(link("leaf1:e1", "spine2:e1"))) == [
        (("a", "port"), "conflict")
    ]
    assert rejected(fabric, lambda: fabric.add_link(link("leaf2:e1", "spine1:e1"))) == [
        (("b", "port"), "conflict")
    ]
    assert rejected(fabric, lambda: fabric.add_link(link("spine1:e1", "leaf1:e1"))) == [
        (("a", "port"), "conflict"),
        (("b", "port"), "conflict"),
    ]


def test_link_ends_must_be_in_the_same_network() -> None:
    fabric = build(switch("a", port("e1", "10.0.0.0/31")), switch("b", port("e1", "10.0.0.2/31")))
    assert rejected(fabric, lambda: fabric.add_link(link("a:e1", "b:e1"))) == [
        (("b", "port"), "invalid")
    ]


def test_a_link_end_without_an_address_is_not_checked_for_its_network() -> None:
    fabric = build(switch("a", port("e1", "10.0.0.0/31")), switch("b", port("e1")))
    fabric.add_link(link("a:e1", "b:e1"))


def test_a_stored_link_keeps_its_id_and_an_id_is_used_once() -> None:
    fabric = build(switch("a", port("e1"), port("e2")), switch("b", port("e1"), port("e2")))
    fabric.add_link(link("a:e1", "b:e1"), link_id=7)
    assert fabric.next_link_id == 8
    assert rejected(fabric, lambda: fabric.add_link(link("a:e2", "b:e2"), link_id=7)) == [
        (("id",), "conflict")
    ]


def test_updating_a_link_changes_only_the_given_fields() -> None:
    fabric = linked_pair()
    fabric.update_link(1, LinkUpdate(srlgs=["duct-2", "duct-1", "duct-2"]))
    fabric.update_link(1, LinkUpdate(admin_state="drained"))
    assert fabric.links[1].srlgs == ["duct-1", "duct-2"]
    assert fabric.links[1].admin_state == "drained"
    rejected(fabric, lambda: fabric.update_link(9, LinkUpdate(admin_state="down")), NotFound)


# --- updates -------------------------------------------------------------------------------


def test_a_port_update_that_breaks_its_links_network_is_refused_and_keeps_the_old_port() -> None:
    fabric = linked_pair()
    old = fabric.port("leaf1", "e1")
    update = PortUpdate(address="10.0.1.0/31")
    assert rejected(fabric, lambda: fabric.update_port("leaf1", "e1", update)) == [
        (("address",), "invalid")
    ]
    assert fabric.port("leaf1", "e1") == old
    # the old port is still indexed: its address, network and MAC are still taken
    fabric.add_node(switch("leaf2"))
    assert rejected(fabric, lambda: fabric.add_port("leaf2", port("e1", "10.0.0.0/31"))) == [
        (("address",), "conflict"),
        (("address",), "conflict"),
    ]
    assert rejected(fabric, lambda: fabric.add_port("leaf2", port("e1", mac=old.mac))) == [
        (("mac",), "conflict")
    ]
    # and the address the refused update asked for was not taken
    fabric.add_port("leaf2", port("e1", "10.0.1.0/31"))


def test_a_port_update_within_its_links_network_is_applied() -> None:
    fabric = build(
        switch("a", port("e1", "10.0.0.1/30")),
        switch("b", port("e1", "10.0.0.2/30")),
        links=(link("a:e1", "b:e1"),),
    )
    result = fabric.update_port("a", "e1", PortUpdate(address="10.0.0.1/30", speed_mbps=400_000))
    assert changes(result) == [("port", "update", "a:e1")]
    assert fabric.port("a", "e1").speed_mbps == 400_000


def test_a_port_update_frees_its_old_address_and_mac() -> None:
    fabric = build(switch("a", port("e1", "10.0.0.0/31", "02:00:00:00:00:01")), switch("b"))
    fabric.update_port("a", "e1", PortUpdate(address="10.0.1.0/31", mac="02:00:00:00:00:02"))
    fabric.add_port("b", port("e1", "10.0.0.0/31", "02:00:00:00:00:01"))
    assert rejected(fabric, lambda: fabric.add_port("b", port("e2", "10.0.1.0/31"))) == [
        (("address",), "conflict")
    ]


def test_a_port_update_to_another_ports_mac_or_address_is_refused() -> None:
    fabric = build(
        switch("a", port("e1", "10.0.0.0/31", "02:00:00:00:00:01")),
        switch("b", port("e1", "10.0.2.0/31", "02:00:00:00:00:02")),
    )
    assert rejected(
        fabric, lambda: fabric.update_port("b", "e1", PortUpdate(mac="02:00:00:00:00:01"))
    ) == [(("mac",), "conflict")]
    assert rejected(
        fabric, lambda: fabric.update_port("b", "e1", PortUpdate(address="10.0.0.0/31"))
    ) == [(("address",), "conflict")]
    rejected(fabric, lambda: fabric.update_port("b", "e9", PortUpdate()), NotFound)


def test_a_port_update_may_clear_the_address_of_a_linked_port() -> None:
    fabric = linked_pair()
    fabric.update_port("leaf1", "e1", PortUpdate(address=None))
    assert fabric.port("leaf1", "e1").address is None
    assert fabric.port("leaf1", "e1").mac == "02:00:00:00:01:01"  # not given: kept
    fabric.add_node(switch("leaf2", port("e1", "10.0.0.0/31")))  # the address is free again


def test_a_node_update_changing_the_management_address_frees_the_old_one() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"))
    result = fabric.update_node("leaf1", NodeUpdate(mgmt_address="172.16.0.2"))
    assert changes(result) == [("node", "update", "leaf1")]
    assert str(fabric.node("leaf1").mgmt_address) == "172.16.0.2"
    fabric.add_node(switch("leaf2", mgmt="172.16.0.1"))
    assert rejected(fabric, lambda: fabric.add_node(switch("leaf3", mgmt="172.16.0.2"))) == [
        (("mgmt_address",), "conflict")
    ]


def test_a_node_update_clearing_the_management_address_frees_it() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"))
    fabric.update_node("leaf1", NodeUpdate(mgmt_address=None))
    assert fabric.node("leaf1").mgmt_address is None
    fabric.add_node(switch("leaf2", mgmt="172.16.0.1"))


def test_a_node_update_to_a_used_address_is_refused() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"), switch("leaf2", port("e1", "10.0.0.0/31")))
    for taken in ["10.0.0.0", "172.16.0.1"]:
        target = "leaf2" if taken == "172.16.0.1" else "leaf1"
        assert rejected(
            fabric, lambda t=taken, n=target: fabric.update_node(n, NodeUpdate(mgmt_address=t))
        ) == [(("mgmt_address",), "conflict")]


def test_a_node_update_keeping_its_own_management_address_is_allowed() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"))
    fabric.update_node("leaf1", NodeUpdate(mgmt_address="172.16.0.1", admin_state="drained"))
    assert fabric.node("leaf1").admin_state == "drained"
    assert fabric._address_owner == {
        fabric.node("leaf1").mgmt_address: "management address of node 'leaf1'"
    }


def test_a_node_update_changes_only_the_given_fields() -> None:
    fabric = build(switch("leaf1", mgmt="172.16.0.1"))
    fabric.update_node("leaf1", NodeUpdate(labels={"tier": "leaf"}))
    node = fabric.node("leaf1")
    assert (str(node.mgmt_address), node.labels, node.admin_state) == (
        "172.16.0.1",
        {"tier": "leaf"},
        "up",
    )
    rejected(fabric, lambda: fabric.update_node("ghost", NodeUpdate()), NotFound)


# --- deletions -----------------------------------------------------------------------------


def test_deleting_a_node_with_links_needs_cascade() -> None:
    fabric = linked_pair()
    assert rejected(fabric, lambda: fabric.delete_node("leaf1")) == [(("name",), "conflict")]


def test_deleting_a_node_with_workloads_or_teps_needs_cascade() -> None:
    fabric = build(host("h1"), host("h2"))
    fabric.add_tenant(Tenant(name="t1"))
    fabric.add_vni(Vni(vni=100, name="v", tenant="t1"))
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    fabric.add_workload(workload("w", "h2", 100, "100.64.0.1"))
    assert rejected(fabric, lambda: fabric.delete_node("h1")) == [(("name",), "conflict")]
    assert rejected(fabric, lambda: fabric.delete_node("h2")) == [(("name",), "conflict")]


def test_deleting_a_node_without_links_deletes_its_ports_too() -> None:
    fabric = build(switch("leaf1", port("e1", "10.0.0.0/31"), port("e2")))
    assert changes(fabric.delete_node("leaf1")) == [
        ("port", "delete", "leaf1:e1"),
        ("port", "delete", "leaf1:e2"),
        ("node", "delete", "leaf1"),
    ]
    assert fabric.ports == {}
    assert fabric.node_ports == {}


def test_deleting_a_missing_node_is_not_found() -> None:
    fabric = Fabric()
    rejected(fabric, lambda: fabric.delete_node("ghost", cascade=True), NotFound)


def test_a_cascading_node_delete_removes_links_workloads_teps_and_ports_in_that_order() -> None:
    fabric = overlay()
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    fabric.add_tep(tep("h1", "blue", "10.224.0.2"))
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    result = fabric.delete_node("h1", cascade=True)
    assert changes(result) == [
        ("link", "delete", "1"),
        ("workload", "delete", "w1"),
        ("tep", "delete", "h1/red"),
        ("tep", "delete", "h1/blue"),
        ("port", "delete", "h1:eth1"),
        ("node", "delete", "h1"),
    ]
    assert "h1" not in fabric.nodes
    assert list(fabric.links) == [2]
    assert ("s1", "swp1") not in fabric.link_of_port
    assert fabric.workloads == {}
    assert fabric.teps == {}


def test_a_cascading_node_delete_frees_every_address_mac_and_peer_port() -> None:
    fabric = overlay()
    fabric.update_node("h1", NodeUpdate(mgmt_address="172.16.0.1"))
    fabric.update_port("h1", "eth1", PortUpdate(mac="02:00:00:00:00:01"))
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1", mac="06:00:00:00:00:01"))
    fabric.delete_node("h1", cascade=True)
    # everything h1 held can be taken again, by a node of the same name
    fabric.add_node(host("h1", port("eth1", "10.0.0.0/31", "02:00:00:00:00:01"), mgmt="172.16.0.1"))
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1", mac="06:00:00:00:00:01"))
    fabric.add_link(link("h1:eth1", "s1:swp1"))  # the peer port is free again


def test_a_cascading_delete_leaves_no_trace_in_the_indexes() -> None:
    fabric = overlay()
    before = rule_state(fabric)
    fabric.add_node(host("h3", port("eth1", "10.0.0.4/31", "02:00:00:00:00:03"), mgmt="172.16.0.3"))
    fabric.add_node(switch("s3", port("swp1", "10.0.0.5/31")))
    fabric.add_link(link("h3:eth1", "s3:swp1"))
    fabric.add_tep(tep("h3", "red", "10.224.0.3"))
    fabric.add_workload(workload("w3", "h3", 200, "100.64.0.3"))
    fabric.delete_node("h3", cascade=True)
    fabric.delete_node("s3")
    assert rule_state(fabric) == before


def test_a_linked_port_cannot_be_deleted() -> None:
    fabric = linked_pair()
    assert rejected(fabric, lambda: fabric.delete_port("leaf1", "e1")) == [(("name",), "conflict")]
    fabric.delete_link(1)
    assert changes(fabric.delete_port("leaf1", "e1")) == [("port", "delete", "leaf1:e1")]
    fabric.add_port("leaf1", port("e2", "10.0.0.0/31", "02:00:00:00:01:01"))  # freed


def test_deleting_a_missing_link_or_port_is_not_found() -> None:
    fabric = linked_pair()
    rejected(fabric, lambda: fabric.delete_link(2), NotFound)
    rejected(fabric, lambda: fabric.delete_port("leaf1", "e9"), NotFound)
    rejected(fabric, lambda: fabric.delete_port("ghost", "e1"), NotFound)


def test_deleting_a_link_frees_both_ports() -> None:
    fabric = linked_pair()
    assert changes(fabric.delete_link(1)) == [("link", "delete", "1")]
    assert fabric.link_of_port == {}
    fabric.add_link(link("spine1:e1", "leaf1:e1"))


# --- tenants and VNIs ----------------------------------------------------------------------


def test_tenant_names_are_unique() -> None:
    fabric = Fabric()
    fabric.add_tenant(Tenant(name="t1"))
    assert rejected(fabric, lambda: fabric.add_tenant(Tenant(name="t1", description="x"))) == [
        (("name",), "conflict")
    ]


def test_a_tenant_update_changes_its_description() -> None:
    fabric = Fabric()
    fabric.add_tenant(Tenant(name="t1"))
    fabric.update_tenant("t1", TenantUpdate(description="research"))
    assert fabric.tenant("t1").description == "research"
    rejected(fabric, lambda: fabric.update_tenant("t2", TenantUpdate(description="")), NotFound)


def test_a_tenant_that_owns_vnis_cannot_be_deleted() -> None:
    fabric = overlay()
    assert rejected(fabric, lambda: fabric.delete_tenant("t1")) == [(("name",), "conflict")]
    fabric.delete_vni(100)
    fabric.delete_vni(200)
    assert changes(fabric.delete_tenant("t1")) == [("tenant", "delete", "t1")]
    rejected(fabric, lambda: fabric.delete_tenant("t1"), NotFound)


def test_vni_numbers_and_names_are_unique_and_the_tenant_must_exist() -> None:
    fabric = overlay()
    assert rejected(fabric, lambda: fabric.add_vni(Vni(vni=100, name="other", tenant="t1"))) == [
        (("vni",), "conflict")
    ]
    assert rejected(fabric, lambda: fabric.add_vni(Vni(vni=300, name="blue-net", tenant="t1"))) == [
        (("name",), "conflict")
    ]
    assert rejected(fabric, lambda: fabric.add_vni(Vni(vni=300, name="x", tenant="ghost"))) == [
        (("tenant",), "not_found")
    ]
    assert rejected(fabric, lambda: fabric.add_vni(Vni(vni=100, name="red-net", tenant="no"))) == [
        (("vni",), "conflict"),
        (("name",), "conflict"),
        (("tenant",), "not_found"),
    ]


def test_a_vni_in_use_by_workloads_cannot_be_deleted() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    assert rejected(fabric, lambda: fabric.delete_vni(100)) == [(("vni",), "conflict")]
    fabric.delete_workload("w1")
    assert changes(fabric.delete_vni(100)) == [("vni", "delete", "100")]
    rejected(fabric, lambda: fabric.delete_vni(100), NotFound)


# --- workloads and TEPs --------------------------------------------------------------------


def test_workload_names_are_unique() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    assert rejected(
        fabric,
        lambda: fabric.add_workload(workload("w1", "h2", 200, "100.64.0.2", "06:00:00:00:00:02")),
    ) == [(("name",), "conflict")]


def test_a_workload_lives_on_an_existing_host_in_an_existing_vni() -> None:
    fabric = overlay()
    assert rejected(
        fabric, lambda: fabric.add_workload(workload("w", "s1", 100, "100.64.0.1"))
    ) == [(("node",), "invalid")]
    assert rejected(
        fabric, lambda: fabric.add_workload(workload("w", "hx", 100, "100.64.0.1"))
    ) == [(("node",), "not_found")]
    assert rejected(
        fabric, lambda: fabric.add_workload(workload("w", "h1", 999, "100.64.0.1"))
    ) == [(("vni",), "not_found")]


def test_a_workload_ip_is_unique_within_its_vni_only() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1", "06:00:00:00:00:01"))
    assert rejected(
        fabric,
        lambda: fabric.add_workload(workload("w2", "h2", 100, "100.64.0.1", "06:00:00:00:00:02")),
    ) == [(("ip",), "conflict")]
    fabric.add_workload(workload("w2", "h2", 200, "100.64.0.1", "06:00:00:00:00:02"))


def test_a_workload_mac_is_unique_within_its_vni_only() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1", "06:00:00:00:00:01"))
    assert rejected(
        fabric,
        lambda: fabric.add_workload(workload("w2", "h2", 100, "100.64.0.2", "06:00:00:00:00:01")),
    ) == [(("mac",), "conflict")]
    fabric.add_workload(workload("w2", "h2", 200, "100.64.0.2", "06:00:00:00:00:01"))


def test_a_vf_is_used_by_at_most_one_workload_per_node() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1", "06:00:00:00:00:01", vf="vf3"))
    assert rejected(
        fabric,
        lambda: fabric.add_workload(
            workload("w2", "h1", 200, "100.64.0.2", "06:00:00:00:00:02", vf="vf3")
        ),
    ) == [(("vf",), "conflict")]
    fabric.add_workload(workload("w2", "h2", 200, "100.64.0.2", "06:00:00:00:00:02", vf="vf3"))


def test_a_deleted_workload_frees_its_vf_ip_and_mac() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    assert changes(fabric.delete_workload("w1")) == [("workload", "delete", "w1")]
    fabric.add_workload(workload("w2", "h1", 100, "100.64.0.1"))
    rejected(fabric, lambda: fabric.delete_workload("w1"), NotFound)


def test_a_workload_reports_every_broken_rule_at_once() -> None:
    fabric = overlay()
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    assert rejected(
        fabric, lambda: fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    ) == [
        (("name",), "conflict"),
        (("vf",), "conflict"),
        (("ip",), "conflict"),
        (("mac",), "conflict"),
    ]


def test_a_tep_lives_on_an_existing_host() -> None:
    fabric = overlay()
    assert rejected(fabric, lambda: fabric.add_tep(tep("s1", "red", "10.224.0.1"))) == [
        (("node",), "invalid")
    ]
    assert rejected(fabric, lambda: fabric.add_tep(tep("hx", "red", "10.224.0.1"))) == [
        (("node",), "not_found")
    ]


def test_a_host_has_at_most_one_tep_per_colour() -> None:
    fabric = overlay()
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    assert rejected(fabric, lambda: fabric.add_tep(tep("h1", "red", "10.224.0.2"))) == [
        (("colour",), "conflict")
    ]
    fabric.add_tep(tep("h1", "blue", "10.224.0.2"))


def test_tep_addresses_are_unique() -> None:
    fabric = overlay()
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    assert rejected(fabric, lambda: fabric.add_tep(tep("h2", "red", "10.224.0.1"))) == [
        (("address",), "conflict")
    ]


def test_a_deleted_tep_frees_its_address() -> None:
    fabric = overlay()
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    assert changes(fabric.delete_tep("h1", Colour.red)) == [("tep", "delete", "h1/red")]
    fabric.add_port("s1", port("swp9", "10.224.0.1/31"))  # neither the address nor a TEP point
    rejected(fabric, lambda: fabric.delete_tep("h1", Colour.red), NotFound)


# --- whole documents -----------------------------------------------------------------------


def test_a_fabric_rebuilds_from_its_own_document() -> None:
    fabric = overlay()
    fabric.add_tep(tep("h1", "red", "10.224.0.1"))
    fabric.add_workload(workload("w1", "h1", 100, "100.64.0.1"))
    rebuilt = Fabric.from_document(fabric.to_document())
    assert snapshot(rebuilt) == snapshot(fabric)
    assert changes(rebuilt.all_changes()) == changes(fabric.all_changes())


def test_a_document_is_loaded_with_fresh_link_ids_from_next_link_id() -> None:
    doc = FabricDocument.model_validate(
        {
            "nodes": [
                {"name": "a", "role": "switch", "ports": [{"name": "e1"}]},
                {"name": "b", "role": "switch", "ports": [{"name": "e1"}]},
            ],
            "links": [{"id": 3, "a": "a:e1", "b": "b:e1"}],
        }
    )
    fabric = Fabric.from_document(doc, revision=5, next_link_id=40)
    assert list(fabric.links) == [40]
    assert (fabric.revision, fabric.next_link_id) == (5, 41)


def test_a_document_lists_every_broken_rule_with_its_location() -> None:
    doc = FabricDocument.model_validate(
        {
            "tenants": [{"name": "t1"}, {"name": "t1"}],
            "vnis": [{"vni": 100, "name": "v", "tenant": "ghost"}],
            "nodes": [
                {
                    "name": "a",
                    "role": "switch",
                    "ports": [{"name": "e1", "address": "10.0.0.0/31"}],
                },
                {
                    "name": "b",
                    "role": "switch",
                    "ports": [{"name": "e1", "address": "10.0.0.0/31"}],
                },
                {
                    "name": "c",
                    "role": "switch",
                    "ports": [{"name": "e1", "address": "10.0.1.0/31"}],
                },
                {"name": "a", "role": "host"},
            ],
            "links": [
                {"a": "a:e1", "b": "c:e1"},
                {"a": "c:e1", "b": "ghost:e1"},
                {"a": "a:e9", "b": "c:e1"},
            ],
            "teps": [{"node": "c", "colour": "red", "address": "10.0.1.1"}],
            "workloads": [
                {"name": "w", "node": "a", "vni": 100, "mac": "06:00:00:00:00:01", "ip": "1.1.1.1"}
            ],
        }
    )
    with pytest.raises(FabricError) as exc:
        Fabric.from_document(doc)
    assert [(i.loc, i.kind) for i in exc.value.issues] == [
        (("tenants", 1, "name"), "conflict"),
        (("vnis", 0, "tenant"), "not_found"),
        (("nodes", 1, "ports", 0, "address"), "conflict"),
        (("nodes", 3, "name"), "conflict"),
        (("links", 0, "b", "port"), "invalid"),
        (("links", 1, "b", "node"), "not_found"),
        (("links", 2, "a", "port"), "not_found"),
        (("teps", 0, "node"), "invalid"),
        (("teps", 0, "address"), "conflict"),
        (("workloads", 0, "node"), "invalid"),
        (("workloads", 0, "vni"), "not_found"),
    ]
    assert str(exc.value.issues[6]) == "links.2.a.port: port 'e9' not found on node 'a'"


def test_a_document_stops_collecting_after_max_issues() -> None:
    doc = FabricDocument(tenants=[Tenant(name="t")] * 150)
    with pytest.raises(FabricError) as exc:
        Fabric.from_document(doc)
    assert len(exc.value.issues) == 100
    assert exc.value.issues[0].loc == ("tenants", 1, "name")


def test_an_issue_prints_its_location() -> None:
    assert str(Issue(("links", 2, "a", "port"), "port 'x' not found")) == (
        "links.2.a.port: port 'x' not found"
    )
    assert str(Issue((), "whole request")) == "whole request"


def test_the_exported_document_carries_link_ids() -> None:
    fabric = linked_pair()
    exported = fabric.to_document().model_dump(mode="json")
    assert exported["links"][0]["id"] == 1
    # and the importer still ignores it
    rebuilt = Fabric.from_document(FabricDocument.model_validate(exported), next_link_id=5)
    assert list(rebuilt.links) == [5]


# --- all or nothing ------------------------------------------------------------------------


def test_a_failed_port_update_keeps_the_order_of_network_users() -> None:
    fabric = linked_pair()
    before = [list(u) for u in fabric._nets[4].users]
    with pytest.raises(FabricError):
        fabric.update_port("leaf1", "e1", PortUpdate(address="10.0.1.0/31"))
    assert [list(u) for u in fabric._nets[4].users] == before


NODE_NAMES = ["n1", "n2", "n3"]
PORT_NAMES = ["e1", "e2"]
# Interfaces that collide often: same addresses, same /31s, nested networks, a TEP-sized /32.
INTERFACES = [
    None,
    "10.0.0.0/31",
    "10.0.0.1/31",
    "10.0.0.3/31",
    "10.0.0.5/31",
    "10.0.0.1/29",
    "10.0.1.2/29",
    "10.0.1.0/31",
    "10.0.0.9/32",
    "2001:db8::1/127",
]
POINTS = ["10.0.0.1", "10.0.0.6", "10.0.0.9", "10.0.1.3", "10.0.2.1", "172.16.0.1", "2001:db8::1"]
MACS = [None, "02:00:00:00:00:01", "02:00:00:00:00:02"]

names = st.sampled_from(NODE_NAMES)
port_names = st.sampled_from(PORT_NAMES)
interfaces = st.sampled_from(INTERFACES)
macs = st.sampled_from(MACS)
points = st.sampled_from(POINTS)
colours = st.sampled_from(["red", "blue"])

port_lists = st.lists(st.tuples(port_names, interfaces, macs), max_size=2)
add_node = st.tuples(
    st.just("add_node"), names, st.sampled_from(["host", "switch"]), st.none() | points, port_lists
)
add_port = st.tuples(st.just("add_port"), names, port_names, interfaces, macs)
add_link = st.tuples(st.just("add_link"), names, port_names, names, port_names)
add_tep = st.tuples(st.just("add_tep"), names, colours, points)
update_port = st.tuples(
    st.just("update_port"),
    names,
    port_names,
    st.fixed_dictionaries({}, optional={"address": interfaces, "mac": macs}),
)
add_workload = st.tuples(
    st.just("add_workload"),
    st.sampled_from(["w1", "w2"]),
    names,
    st.sampled_from([100, 200]),
    st.sampled_from(["vf0", "vf1"]),
    st.sampled_from(["06:00:00:00:00:01", "06:00:00:00:00:02"]),
    st.sampled_from(["100.64.0.1", "100.64.0.2"]),
)
# Branches are drawn about evenly, so the interesting ones are listed more than once.
operations = st.one_of(
    add_node,
    add_port,
    add_link,
    add_link,
    add_link,
    add_tep,
    add_tep,
    update_port,
    update_port,
    add_workload,
    add_workload,
    st.tuples(st.just("delete_link"), st.integers(1, 4)),
    st.tuples(st.just("delete_node"), names, st.booleans()),
    st.tuples(st.just("delete_port"), names, port_names),
    st.tuples(st.just("delete_tep"), names, colours),
    st.tuples(st.just("update_node"), names, st.none() | points),
    st.tuples(st.just("add_tenant"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("delete_tenant"), st.sampled_from(["t1", "t2"])),
    st.tuples(
        st.just("add_vni"),
        st.sampled_from([100, 200]),
        st.sampled_from(["v1", "v2"]),
        st.sampled_from(["t1", "t2"]),
    ),
    st.tuples(st.just("delete_vni"), st.sampled_from([100, 200])),
    st.tuples(st.just("delete_workload"), st.sampled_from(["w1", "w2"])),
)
# Address pairs for the two ends of a link: mostly one network, sometimes not (refused).
link_nets = st.sampled_from(
    [
        (None, None),
        ("10.0.0.0/31", "10.0.0.1/31"),
        ("10.0.0.2/31", "10.0.0.3/31"),
        ("10.0.1.1/29", "10.0.1.6/29"),
        ("2001:db8::/127", "2001:db8::1/127"),
        ("10.0.0.4/31", None),
        ("10.0.0.6/31", "10.0.0.9/31"),
    ]
)


def _prelude_mac(i: int) -> st.SearchStrategy[str | None]:
    return st.sampled_from([None, f"02:00:00:00:01:0{i}", MACS[1]])


preludes = st.tuples(
    st.lists(link_nets, min_size=2, max_size=2, unique=True),
    st.tuples(*(_prelude_mac(i) for i in range(4))),
    points,
).map(
    lambda drawn: [
        ("add_tenant", "t1"),
        ("add_vni", 100, "v1", "t1"),
        ("add_node", "n1", "host", None, [("e1", drawn[0][0][0], drawn[1][0])]),
        (
            "add_node",
            "n2",
            "switch",
            None,
            [("e1", drawn[0][0][1], drawn[1][1]), ("e2", drawn[0][1][0], drawn[1][2])],
        ),
        ("add_node", "n3", "host", None, [("e1", drawn[0][1][1], drawn[1][3])]),
        ("add_link", "n1", "e1", "n2", "e1"),
        ("add_link", "n3", "e1", "n2", "e2"),
        ("add_tep", "n1", "red", drawn[2]),
        ("add_workload", "w1", "n3", 100, "vf0", "06:00:00:00:00:01", "100.64.0.1"),
    ]
)


def apply(fabric: Fabric, op: tuple[Any, ...]) -> list[Change] | None:
    """Run one generated operation; None when it is not even a valid request (a self-loop)."""
    match op:
        case ("add_node", name, role, mgmt, ports):
            spec = NodeSpec(
                name=name,
                role=role,
                mgmt_address=mgmt,
                ports=[PortSpec(name=p, address=a, mac=m) for p, a, m in ports],
            )
            return fabric.add_node(spec)
        case ("add_port", node, name, address, mac):
            return fabric.add_port(node, PortSpec(name=name, address=address, mac=mac))
        case ("add_link", a_node, a_port, b_node, b_port):
            if a_node == b_node:
                return None
            return fabric.add_link(link(f"{a_node}:{a_port}", f"{b_node}:{b_port}"))
        case ("add_tep", node, colour, address):
            return fabric.add_tep(tep(node, colour, address))
        case ("delete_link", link_id):
            return fabric.delete_link(link_id)
        case ("delete_node", name, cascade):
            return fabric.delete_node(name, cascade=cascade)
        case ("delete_port", node, name):
            return fabric.delete_port(node, name)
        case ("delete_tep", node, colour):
            return fabric.delete_tep(node, Colour(colour))
        case ("update_port", node, name, fields):
            return fabric.update_port(node, name, PortUpdate(**fields))
        case ("update_node", name, mgmt):
            return fabric.update_node(name, NodeUpdate(mgmt_address=mgmt))
        case ("add_tenant", name):
            return fabric.add_tenant(Tenant(name=name))
        case ("delete_tenant", name):
            return fabric.delete_tenant(name)
        case ("add_vni", number, name, tenant):
            return fabric.add_vni(Vni(vni=number, name=name, tenant=tenant))
        case ("delete_vni", number):
            return fabric.delete_vni(number)
        case ("add_workload", name, node, vni, vf, mac, ip):
            return fabric.add_workload(workload(name, node, vni, ip, mac, vf))
        case ("delete_workload", name):
            return fabric.delete_workload(name)
    raise AssertionError(f"unknown operation {op!r}")  # pragma: no cover


def _refs(kind: str, value: Any) -> list[tuple[str, str]]:
    """The rows a row of this kind refers to (what the store's foreign keys enforce)."""
    if kind == "port":
        return [("node", value.node)]
    if kind == "link":
        return [("port", str(value.a)), ("port", str(value.b))]
    if kind == "tep":
        return [("node", value.node)]
    if kind == "workload":
        return [("node", value.node), ("vni", str(value.vni))]
    if kind == "vni":
        return [("tenant", value.tenant)]
    return []


def replay(rows: dict[tuple[str, str], Any], result: list[Change]) -> None:
    """Apply changes as the store would, checking each is possible in the order given."""
    for change in result:
        key = (change.kind, change.key)
        if change.op == "create":
            assert key not in rows, f"{key} created twice"
            for ref in _refs(change.kind, change.value):
                assert ref in rows, f"{key} created before {ref}"
            rows[key] = change.value
        elif change.op == "update":
            assert key in rows, f"{key} updated but does not exist"
            rows[key] = change.value
        else:
            assert key in rows, f"{key} deleted but does not exist"
            del rows[key]
            dangling = [k for k, v in rows.items() if key in _refs(k[0], v)]
            assert not dangling, f"{key} deleted while {dangling} refer to it"


@settings(max_examples=100, deadline=None)
@given(preludes, st.lists(operations, min_size=5, max_size=30))
def test_every_operation_is_all_or_nothing_and_agrees_with_whole_document_validation(
    prelude: list[tuple[Any, ...]], ops: list[tuple[Any, ...]]
) -> None:
    fabric = Fabric()
    rows: dict[tuple[str, str], Any] = {}
    for op in [*prelude, *ops]:
        before = snapshot(fabric)
        try:
            result = apply(fabric, op)
        except (FabricError, NotFound):
            assert snapshot(fabric) == before, f"refused {op!r} changed the fabric"
            continue
        if result is not None:
            # Only an update to the current values may change nothing (and then commits nothing).
            assert result or op[0].startswith("update_"), f"{op!r} succeeded without a change"
            replay(rows, result)
    # the changes, applied in order, give exactly the fabric's rows
    assert rows == {(c.kind, c.key): c.value for c in fabric.all_changes()}
    # what the incremental rules built, the whole-document rules accept and rebuild equal
    exported = fabric.to_document()
    rebuilt = Fabric.from_document(FabricDocument.model_validate_json(exported.model_dump_json()))
    # An import numbers links afresh; everything else must come back identical.
    without_ids = {"links": {"__all__": {"id"}}}
    assert rebuilt.to_document().model_dump(exclude=without_ids) == exported.model_dump(
        exclude=without_ids
    )
    assert rule_state(rebuilt) == rule_state(fabric)


def test_a_fabric_error_keeps_its_issues_across_a_process_boundary() -> None:
    error = FabricError([Issue(["links", 0, "a"], "port taken", "conflict"), Issue(["nodes"], "x")])
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, FabricError) and again.issues == error.issues
    assert str(again) == str(error)
