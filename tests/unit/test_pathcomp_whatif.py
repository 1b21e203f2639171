"""What-if: failing links or nodes on paper tells, for every host pair, whether its active
path flips, its backup is lost or both are cut, and what re-protection would then give;
the served plan is left exactly as it was.

The oracle is brute force: every host pair's routes from `Plan.pair`, and a full
`Plan.compute` of the fabric with those links really taken down."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from thorn.fabric import Fabric
from thorn.generators import fat_tree, leaf_spine
from thorn.model import AdminState, FabricDocument, LinkUpdate
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.whatif import UnknownElement, what_if


def status_of(plan: Plan, src: str, dst: str) -> str:
    """The pair's protection as GET /paths words it."""
    pair = plan.pair(src, dst)
    if pair.red is None or pair.blue is None:
        return "unreachable"
    host_links = {a.link_id for h in (src, dst) for a in plan.graph.host_links.values()
                  if a.host == h}  # fmt: skip
    if set(pair.shared.links) - host_links:
        return "unprotected"
    return "degraded" if pair.shared else "protected"


def brute_force(
    doc: FabricDocument, links: set[int], switches: set[str]
) -> tuple[Counter[str], Counter[str]]:
    fabric = Fabric.from_document(doc)
    plan = Plan.compute(fabric)
    for link in fabric.links.values():
        if {link.a.node, link.b.node} & switches:
            links.add(link.id)
    failed_fabric = Fabric.from_document(doc)
    for link_id in links:
        failed_fabric.update_link(link_id, LinkUpdate(admin_state=AdminState.down))
    after = Plan.compute(failed_fabric)
    impact: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for src, dst in itertools.permutations(sorted(plan.graph.attachments), 2):
        pair = plan.pair(src, dst)
        if pair.red is None or pair.blue is None:
            continue
        hit = [bool(set(r.links) & links or set(r.nodes) & switches) for r in (pair.red, pair.blue)]
        if not any(hit):
            continue
        impact["cut" if all(hit) else "flip" if hit[0] else "lose_protection"] += 1
        statuses[status_of(after, src, dst)] += 1
    return impact, statuses


def links_between(doc: FabricDocument, a: str, b: str) -> set[int]:
    fabric = Fabric.from_document(doc)
    return {lk.id for lk in fabric.links.values() if {lk.a.node, lk.b.node} == {a, b}}


FABRICS = {
    "leaf-spine": leaf_spine(4, 4, 2),
    "leaf-spine dual-homed": leaf_spine(4, 4, 2, dual_homed=True),
    "fat-tree k=4": fat_tree(4),
}


@pytest.mark.parametrize("name", FABRICS)
def test_a_fabric_link_failure_counts_every_pair_as_brute_force_does(name: str) -> None:
    doc = FABRICS[name]
    fabric = Fabric.from_document(doc)
    plan = Plan.compute(fabric)
    for edge in plan.graph.edges[:6]:
        result = what_if(plan, links=[edge.link_id])
        impact, statuses = brute_force(doc, {edge.link_id}, set())
        assert result.impact == impact, f"link {edge.link_id}"
        assert result.after == statuses, f"link {edge.link_id}"
        assert result.links == [edge.link_id]


@pytest.mark.parametrize("name", FABRICS)
def test_a_switch_failure_takes_its_links_and_is_counted_as_brute_force_does(name: str) -> None:
    doc = FABRICS[name]
    plan = Plan.compute(Fabric.from_document(doc))
    for switch in ("spine1", "leaf1") if "leaf-spine" in name else ("core1", "agg1-1", "edge2-1"):
        result = what_if(plan, nodes=[switch])
        impact, statuses = brute_force(doc, set(), {switch})
        assert result.impact == impact, switch
        assert result.after == statuses, switch
        assert result.nodes == [switch]


def test_a_host_link_failure_flips_or_cuts_only_that_hosts_pairs() -> None:
    doc = FABRICS["leaf-spine dual-homed"]
    plan = Plan.compute(Fabric.from_document(doc))
    host_link = next(lid for lid, a in plan.graph.host_links.items() if a.host == "host1")
    result = what_if(plan, links=[host_link])
    impact, statuses = brute_force(doc, {host_link}, set())
    assert result.impact == impact and result.after == statuses
    assert sum(impact.values()) > 0
    assert all("host1" in (e.src, e.dst) for e in result.examples)


def test_losing_both_of_a_single_homed_hosts_paths_is_a_cut_and_leaves_it_unreachable() -> None:
    doc = leaf_spine(2, 2, 1)
    plan = Plan.compute(Fabric.from_document(doc))
    result = what_if(plan, nodes=["host1"])
    others = len(plan.graph.attachments) - 1
    assert result.impact == Counter({"cut": 2 * others})
    assert result.after == Counter({"unreachable": 2 * others})


def test_a_spine_failure_on_a_two_spine_fabric_leaves_pairs_unprotected_not_cut() -> None:
    doc = leaf_spine(2, 3, 1)
    plan = Plan.compute(Fabric.from_document(doc))
    result = what_if(plan, nodes=["spine1"])
    assert result.impact["cut"] == 0
    assert result.impact["flip"] + result.impact["lose_protection"] > 0
    # One spine left: every cross-leaf pair shares it, so re-protection can only degrade.
    assert result.after["protected"] == 0


def test_the_served_plan_is_left_exactly_as_it_was() -> None:
    doc = fat_tree(4)
    plan = Plan.compute(Fabric.from_document(doc))
    before_users = {e: set(g) for e, g in plan.users.items()}
    before_alive = list(plan.graph.alive)
    before_pair = plan.pair("host1-1-1", "host4-2-2")
    what_if(plan, nodes=["core1", "agg1-1"], links=[plan.graph.edges[-1].link_id])
    assert plan.graph.alive == before_alive
    assert {e: set(g) for e, g in plan.users.items()} == before_users
    assert plan.pair("host1-1-1", "host4-2-2") == before_pair


def test_unknown_links_and_nodes_are_named() -> None:
    plan = Plan.compute(Fabric.from_document(leaf_spine(2, 2, 1)))
    with pytest.raises(UnknownElement, match="link '999'"):
        what_if(plan, links=[999])
    with pytest.raises(UnknownElement, match="node 'nosuch'"):
        what_if(plan, nodes=["nosuch"])


def test_nothing_routed_over_an_element_means_no_impact() -> None:
    doc = leaf_spine(2, 2, 1)
    plan = Plan.compute(Fabric.from_document(doc))
    result = what_if(plan, links=[])
    assert result.impact == Counter() and result.after == Counter()
    hosts = len(plan.graph.attachments)
    assert result.pairs == hosts * (hosts - 1)
