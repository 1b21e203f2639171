"""Observed beside declared: refusals, mismatches and cabling verdicts (pure).

The fabric is leaf_spine(2, 2, 2): host1:eth1-leaf1:swp1 (link 1), ..., leaf1:swp3-spine1:swp1
(link 5), leaf1:swp4-spine2:swp1 (6), leaf2:swp3-spine1:swp2 (7), leaf2:swp4-spine2:swp2 (8);
host1..4 each run workload `<host>-vf0` on VF vf0.
"""

from __future__ import annotations

import pytest
from observations import hears, host1, rdma_on

from thorn.fabric import Fabric, NotFound
from thorn.generators import leaf_spine
from thorn.observed import (
    HeardNeighbour,
    NodeObservation,
    ObservedPort,
    ObservedVf,
    RdmaObservation,
)
from thorn.registration import cabling, mismatches, next_miscabled, refusal
from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.plan import Plan


@pytest.fixture
def fabric() -> Fabric:
    return Fabric.from_document(leaf_spine(2, 2, 2))


def on(node: str, observed: NodeObservation) -> dict[str, NodeObservation]:
    return {node: observed}


# --- refusals (bad input) ---------------------------------------------------------------------


def test_a_node_as_declared_is_taken_and_matches(fabric: Fabric) -> None:
    observed = host1(rdma=rdma_on("vf0"))
    assert refusal(fabric, "host1", observed) is None
    assert mismatches(fabric, "host1", observed) == []


def test_a_registration_from_a_node_not_in_the_topology_is_refused(fabric: Fabric) -> None:
    why = refusal(fabric, "host99", host1())
    assert why is not None and "'host99' is not in the topology" in why


def test_a_vf_naming_no_existing_device_is_refused_naming_the_field(fabric: Fabric) -> None:
    observed = host1(vfs=[ObservedVf(name="vf0", representor="vf9_rep")])
    why = refusal(fabric, "host1", observed)
    assert why is not None and why.startswith("vfs[0].representor:")
    assert "'vf9_rep'" in why
    parentless = host1(vfs=[ObservedVf(name="vf0", parent="ens9")])
    assert (refusal(fabric, "host1", parentless) or "").startswith("vfs[0].parent:")


def test_an_rdma_device_on_a_netdev_the_topology_does_not_know_is_refused(
    fabric: Fabric,
) -> None:
    why = refusal(fabric, "host1", host1(rdma=rdma_on("eth9")))
    assert why is not None and why.startswith("rdma.devices[0].netdev:")
    assert "'rxe0'" in why and "'eth9'" in why


def test_an_rdma_device_on_a_declared_port_or_a_workloads_vf_is_taken(fabric: Fabric) -> None:
    assert refusal(fabric, "host1", host1(rdma=rdma_on("eth1"))) is None
    assert refusal(fabric, "host1", host1(rdma=rdma_on("vf0_rep"))) is None
    # host2's VF is not host1's: a netdev is known per node
    assert refusal(fabric, "host2", host1(rdma=rdma_on("vf0"))) is None
    fabric.delete_workload("host2-vf0")
    assert refusal(fabric, "host2", host1(rdma=rdma_on("vf0"))) is not None


def test_rdma_unavailable_is_not_bad_input(fabric: Fabric) -> None:
    observed = host1(rdma=RdmaObservation(unavailable="RDMA unavailable: no"))
    assert refusal(fabric, "host1", observed) is None


# --- mismatches -------------------------------------------------------------------------------


def test_a_missing_port_a_wrong_mac_and_an_absent_vf_are_each_reported(fabric: Fabric) -> None:
    observed = NodeObservation(ports=[
        ObservedPort(name="eth1", mac="02:00:00:00:00:99", admin_up=True, carrier=True,
                     addresses=["10.0.0.0/31"]),  # type: ignore[list-item]
    ])  # fmt: skip
    found = {(m.kind, m.subject): m for m in mismatches(fabric, "host1", observed)}
    assert set(found) == {("wrong_mac", "eth1"), ("vf_absent", "vf0")}
    assert found[("wrong_mac", "eth1")].declared == "02:00:00:00:00:01"
    assert found[("wrong_mac", "eth1")].observed == "02:00:00:00:00:99"
    gone = mismatches(fabric, "host1", NodeObservation(vfs=[ObservedVf(name="vf0")]))
    assert [(m.kind, m.subject) for m in gone] == [("port_missing", "eth1")]


def test_a_port_without_its_declared_address_is_reported(fabric: Fabric) -> None:
    observed = host1(ports=[
        ObservedPort(name="eth1", mac="02:00:00:00:00:01", admin_up=True, carrier=True),
        ObservedPort(name="vf0_rep", admin_up=True, carrier=True),
    ])  # fmt: skip
    assert [(m.kind, m.declared) for m in mismatches(fabric, "host1", observed)] == [
        ("address_missing", "10.0.0.0/31")
    ]


def test_a_vf_seen_only_by_its_representor_is_present(fabric: Fabric) -> None:
    observed = host1(vfs=[])  # vf0_rep is still among the ports
    assert mismatches(fabric, "host1", observed) == []


def test_a_neighbour_heard_on_a_port_in_no_link_is_reported(fabric: Fabric) -> None:
    observed = host1(neighbours=[
        HeardNeighbour(port="vf0_rep", chassis="host2", port_id="eth1"),
    ])  # fmt: skip
    assert [(m.kind, m.observed) for m in mismatches(fabric, "host1", observed)] == [
        ("unexpected_neighbour", "host2:eth1")
    ]


# --- cabling ------------------------------------------------------------------------------------


def verdicts_by_link(fabric: Fabric, observations: dict[str, NodeObservation]) -> dict[int, str]:
    return {v.link_id: v.state for v in cabling(fabric, observations)}


def test_links_nobody_heard_are_unverified_and_stay_usable(fabric: Fabric) -> None:
    verdicts = cabling(fabric, {})
    assert {v.state for v in verdicts} == {"unverified"}
    assert next_miscabled({}, verdicts) == {}


def test_one_end_hearing_the_declared_peer_verifies_the_link(fabric: Fabric) -> None:
    states = verdicts_by_link(fabric, on("leaf1", hears("swp3", "spine1", "swp1")))
    assert states[5] == "verified"
    assert {s for i, s in states.items() if i != 5} == {"unverified"}


def test_swapped_cables_mark_both_links_miscabled_with_what_was_heard(fabric: Fabric) -> None:
    # spine1's swp1 and swp2 swapped: leaf1:swp3 hears spine1:swp2, leaf2:swp3 spine1:swp1
    observations = {
        "leaf1": NodeObservation(neighbours=[
            HeardNeighbour(port="swp3", chassis="spine1", port_id="swp2")]),
        "leaf2": NodeObservation(neighbours=[
            HeardNeighbour(port="swp3", chassis="spine1", port_id="swp1")]),
    }  # fmt: skip
    verdicts = {v.link_id: v for v in cabling(fabric, observations)}
    assert verdicts[5].state == verdicts[7].state == "miscabled"
    assert verdicts[5].reason == "leaf1:swp3 hears spine1:swp2, not spine1:swp1"
    assert next_miscabled({}, list(verdicts.values())) == {
        5: verdicts[5].reason, 7: verdicts[7].reason,
    }  # fmt: skip


def test_a_contradiction_at_either_end_outweighs_a_match_at_the_other(fabric: Fabric) -> None:
    observations = on("leaf1", hears("swp3", "spine1", "swp1")) | on(
        "spine1", hears("swp1", "leaf2", "swp3")
    )
    assert verdicts_by_link(fabric, observations)[5] == "miscabled"


def test_a_miscabled_link_stays_out_while_silent_and_returns_once_heard_right(
    fabric: Fabric,
) -> None:
    current = {5: "leaf1:swp3 hears spine1:swp2, not spine1:swp1"}
    assert next_miscabled(current, cabling(fabric, {})) == {}  # silence changes nothing
    fixed = cabling(fabric, on("leaf1", hears("swp3", "spine1", "swp1")))
    assert next_miscabled(current, fixed) == {5: None}


def test_port_names_that_are_not_interface_names_match_by_their_netdev() -> None:
    doc = leaf_spine(1, 1, 1).model_dump()
    for node in doc["nodes"]:
        for port in node["ports"]:
            if node["name"] == "spine1":
                port["name"] = "Ethernet1/1"
    for link in doc["links"]:
        for end in ("a", "b"):
            if link[end]["node"] == "spine1":
                link[end]["port"] = "Ethernet1/1"
    fabric = Fabric.from_document(type(leaf_spine(1, 1, 1)).model_validate(doc))
    uplink = next(i for i, lk in fabric.links.items() if lk.b.node == "spine1")
    states = verdicts_by_link(fabric, on("leaf1", hears("swp2", "spine1", "Ethernet1_1")))
    assert states[uplink] == "verified"


# --- the fabric keeps the verdict; path computation leaves the link out ---------------------


def test_marking_a_link_miscabled_is_one_change_and_idempotent(fabric: Fabric) -> None:
    changes = fabric.set_miscabled(5, "leaf1:swp3 hears spine1:swp2")
    assert [(c.kind, c.op, c.key) for c in changes] == [("cabling", "create", "5")]
    assert fabric.set_miscabled(5, "leaf1:swp3 hears spine1:swp2") == []
    assert [c.op for c in fabric.set_miscabled(5, "another reason")] == ["update"]
    assert [c.op for c in fabric.set_miscabled(5, None)] == ["delete"]
    assert fabric.set_miscabled(5, None) == []
    with pytest.raises(NotFound):
        fabric.set_miscabled(99, "x")


def test_a_deleted_link_takes_its_verdict_with_it(fabric: Fabric) -> None:
    fabric.set_miscabled(5, "x")
    fabric.delete_link(5)
    assert 5 not in fabric.miscabled


def test_the_export_document_carries_no_verdict(fabric: Fabric) -> None:
    fabric.set_miscabled(5, "x")
    assert "miscabled" not in fabric.to_document().model_dump_json()
    assert Fabric.from_document(fabric.to_document()).miscabled == {}


def test_path_computation_leaves_a_miscabled_link_out_as_a_drained_one(fabric: Fabric) -> None:
    fabric.set_miscabled(5, "leaf1:swp3 hears spine1:swp2, not spine1:swp1")
    graph = FabricGraph.from_fabric(fabric)
    assert graph.excluded[5].startswith("link is miscabled: leaf1:swp3 hears")
    plan = Plan.compute(fabric)
    pair = plan.pair("host1", "host3")
    assert pair is not None and pair.red is not None and pair.blue is not None
    assert 5 not in pair.red.links + pair.blue.links


def test_clearing_the_verdict_gives_the_link_back_to_the_plan_incrementally(
    fabric: Fabric,
) -> None:
    fabric.set_miscabled(5, "x")
    plan = Plan.compute(fabric)
    fabric.set_miscabled(5, None)
    updated, _ = plan.update(fabric)
    assert 5 not in updated.graph.excluded
    full = Plan.compute(fabric)
    assert updated.pair("host1", "host3") == full.pair("host1", "host3")


def test_a_marked_link_heard_wrong_in_another_way_is_not_written_again(fabric: Fabric) -> None:
    current = {5: "spine1:swp1 hears leaf2:swp3, not leaf1:swp3"}
    other = cabling(fabric, on("leaf1", hears("swp3", "spine1", "swp2")))
    assert next(v for v in other if v.link_id == 5).state == "miscabled"
    assert next_miscabled(current, other) == {}
