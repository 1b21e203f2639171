"""Path computation: every host pair gets a red and a blue route that share nothing the
topology lets them avoid, and what they do share is reported, never hidden."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from random_fabrics import biconnected, two_edge_connected

from thorn.fabric import Fabric
from thorn.generators import dual_plane, fat_tree, leaf_spine, rail_optimized
from thorn.model import (
    AdminState,
    FabricDocument,
    LinkUpdate,
    NodeUpdate,
)
from thorn_pathcomp import fast
from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.plan import PairPlan, Plan, UnknownHost
from thorn_pathcomp.trees import compute_group


def pairs(plan: Plan) -> Iterator[PairPlan]:
    hosts = sorted(plan.graph.attachments)
    for src, dst in itertools.permutations(hosts, 2):
        yield plan.pair(src, dst)


def check_route_is_real(fabric: Fabric, pair: PairPlan) -> None:
    """Each route runs from src to dst over up links joining its consecutive nodes, no loops."""
    for route in (pair.red, pair.blue):
        assert route is not None, f"{pair.src}->{pair.dst} has no route"
        assert route.nodes[0] == pair.src and route.nodes[-1] == pair.dst
        assert len(set(route.nodes)) == len(route.nodes), f"loop in {route.nodes}"
        for (a, b), link_id in zip(itertools.pairwise(route.nodes), route.links, strict=True):
            link = fabric.links[link_id]
            assert {link.a.node, link.b.node} == {a, b}
            assert link.admin_state is AdminState.up


def actual_sharing(fabric: Fabric, pair: PairPlan) -> tuple[set[int], set[str], set[str]]:
    assert pair.red is not None and pair.blue is not None
    links = set(pair.red.links) & set(pair.blue.links)
    switches = set(pair.red.nodes[1:-1]) & set(pair.blue.nodes[1:-1])
    srlgs = {s for lk in pair.red.links for s in fabric.links[lk].srlgs} & {
        s for lk in pair.blue.links for s in fabric.links[lk].srlgs
    }
    return links, switches, srlgs


def check_pair(fabric: Fabric, pair: PairPlan) -> None:
    check_route_is_real(fabric, pair)
    links, switches, srlgs = actual_sharing(fabric, pair)
    assert set(pair.shared.links) == links, "reported shared links must be the real ones"
    assert set(pair.shared.switches) == switches
    assert set(pair.shared.srlgs) == srlgs


def host_links(fabric: Fabric, *hosts: str) -> set[int]:
    return {lk.id for lk in fabric.links.values() if {lk.a.node, lk.b.node} & set(hosts)}


GENERATED = {
    "leaf-spine": leaf_spine(4, 4, 2),
    "leaf-spine dual-homed": leaf_spine(4, 4, 2, dual_homed=True),
    "fat-tree k=4": fat_tree(4),
    "rail-optimized": rail_optimized(4, 2, 2, 2),
    "dual-plane": dual_plane(2, 2, 2),
}


@pytest.mark.parametrize("name", GENERATED)
def test_every_generated_fabric_gets_two_real_routes_per_pair_sharing_no_fabric_link(
    name: str,
) -> None:
    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert not set(pair.shared.links) - host_links(fabric, pair.src, pair.dst)
    assert plan.summary.unprotected_pairs == 0


@pytest.mark.parametrize("name", ["leaf-spine", "leaf-spine dual-homed", "fat-tree k=4"])
def test_on_leaf_spine_and_fat_tree_both_colours_are_shortest_paths(name: str) -> None:
    plan = Plan.compute(Fabric.from_document(GENERATED[name]))
    for pair in pairs(plan):
        assert pair.red is not None and pair.blue is not None
        # Where both ends hang off the same switch, disjointness needs a detour for one colour.
        same_switch = plan.graph.group_of(pair.src) == plan.graph.group_of(pair.dst)
        if not same_switch:
            assert pair.red.hops == pair.blue.hops == pair.shortest, pair
    assert plan.summary.stretch["red"].max == 0 or name == "leaf-spine dual-homed"


def test_a_fat_tree_pair_uses_different_aggregation_and_core_switches() -> None:
    fabric = Fabric.from_document(fat_tree(4))
    plan = Plan.compute(fabric)
    pair = plan.pair("host1-1-1", "host4-2-2")
    assert pair.red is not None and pair.blue is not None
    assert pair.red.hops == pair.blue.hops == 6
    assert set(pair.red.nodes[2:-2]).isdisjoint(pair.blue.nodes[2:-2])
    assert pair.shared.switches == ("edge1-1", "edge4-2")  # the single-homed ends' switches


def test_a_single_homed_host_link_is_reported_as_a_shared_risk() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 1))
    plan = Plan.compute(fabric)
    pair = plan.pair("host1", "host2")
    assert set(pair.shared.links) == host_links(fabric, "host1", "host2")
    assert set(pair.shared.switches) == {"leaf1", "leaf2"}
    assert plan.summary.pairs_sharing_host_links == plan.summary.pairs == 2
    assert plan.summary.unprotected_pairs == 0


def test_dual_homed_hosts_are_fully_disjoint() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 4, 1, dual_homed=True))
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        assert not pair.shared, pair
        assert pair.egress[0] != pair.egress[1]


def _with_srlg(doc: FabricDocument, leaf: str, spines: tuple[str, ...], srlg: str) -> Fabric:
    fabric = Fabric.from_document(doc)
    for link in list(fabric.links.values()):
        if {link.a.node, link.b.node} & {leaf} and {link.a.node, link.b.node} & set(spines):
            fabric.update_link(link.id, LinkUpdate(srlgs=[srlg]))
    return fabric


def test_an_srlg_across_two_spines_is_avoided_when_a_third_spine_allows_it() -> None:
    # Both uplinks of leaf1 to spine1 and spine2 run in one conduit.
    fabric = _with_srlg(leaf_spine(4, 2, 1), "leaf1", ("spine1", "spine2"), "conduit-7")
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert not pair.shared.srlgs, pair
    assert plan.summary.pairs_sharing_srlgs == 0


def test_an_srlg_on_every_path_is_reported() -> None:
    fabric = _with_srlg(leaf_spine(2, 2, 1), "leaf1", ("spine1", "spine2"), "conduit-7")
    plan = Plan.compute(fabric)
    pair = plan.pair("host1", "host2")
    check_pair(fabric, pair)
    assert pair.shared.srlgs == ("conduit-7",)
    assert plan.summary.pairs_sharing_srlgs == 2


def test_a_drained_spine_carries_no_path_and_the_rest_stay_protected() -> None:
    fabric = Fabric.from_document(leaf_spine(3, 2, 1))
    fabric.update_node("spine2", NodeUpdate(admin_state=AdminState.drained))
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert pair.red is not None and pair.blue is not None
        assert "spine2" not in pair.red.nodes + pair.blue.nodes
    assert plan.summary.unprotected_pairs == 0


def test_a_drained_link_carries_no_path() -> None:
    fabric = Fabric.from_document(leaf_spine(3, 2, 1))
    drained = next(lk.id for lk in fabric.links.values() if lk.a.node == "leaf1")
    fabric.update_link(drained, LinkUpdate(admin_state=AdminState.drained))
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert pair.red is not None and pair.blue is not None
        assert drained not in pair.red.links + pair.blue.links


def test_two_spines_with_one_drained_leave_pairs_unprotected_and_say_so() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 1))
    fabric.update_node("spine2", NodeUpdate(admin_state=AdminState.drained))
    plan = Plan.compute(fabric)
    pair = plan.pair("host1", "host2")
    check_pair(fabric, pair)
    assert pair.shared.switches == ("leaf1", "leaf2", "spine1")
    assert plan.summary.unprotected_pairs == 2


def test_unknown_hosts_are_refused_and_unreachable_ones_reported() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 1))
    plan = Plan.compute(fabric)
    with pytest.raises(UnknownHost):
        plan.pair("host1", "nosuchhost")
    for link in [lk for lk in fabric.links.values() if "host2" in (lk.a.node, lk.b.node)]:
        fabric.update_link(link.id, LinkUpdate(admin_state=AdminState.down))
    cut = Plan.compute(fabric)
    pair = cut.pair("host1", "host2")
    assert pair.red is None and pair.blue is None
    assert cut.summary.unreachable_pairs == 2


def test_the_plan_is_deterministic() -> None:
    doc = fat_tree(4)
    first = Plan.compute(Fabric.from_document(doc))
    second = Plan.compute(Fabric.from_document(doc))
    assert [(p.red, p.blue) for p in pairs(first)] == [(p.red, p.blue) for p in pairs(second)]


# --- random topologies ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(biconnected())
def test_on_biconnected_fabrics_dual_homed_pairs_share_nothing(fabric: Fabric) -> None:
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert not pair.shared, pair


@settings(max_examples=150, deadline=None)
@given(two_edge_connected())
def test_on_two_edge_connected_fabrics_no_fabric_link_is_shared(fabric: Fabric) -> None:
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)
        assert not set(pair.shared.links) - host_links(fabric, pair.src, pair.dst), pair
    assert plan.summary.unprotected_pairs == 0


# --- incremental re-protection ---------------------------------------------------------------


def same_trees(a: Plan, b: Plan) -> bool:
    def state(plan: Plan) -> dict[object, object]:
        return {g: (t.next, t.dist, t.method) for g, t in plan.trees.items()}

    return state(a) == state(b)


link_events = st.lists(st.tuples(st.integers(0, 10_000), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["fat-tree k=4", "leaf-spine dual-homed", "dual-plane"]), link_events)
def test_an_incremental_update_equals_a_full_recompute(
    name: str, events: list[tuple[int, bool]]
) -> None:
    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    ids = sorted(fabric.links)
    for pick, up in events:
        link_id = ids[pick % len(ids)]
        state = AdminState.up if up else AdminState.down
        fabric.update_link(link_id, LinkUpdate(admin_state=state))
        plan, _ = plan.update_links({link_id: up}, fabric.revision)
        assert same_trees(plan, Plan.compute(fabric, summarise=False))


@settings(max_examples=60, deadline=None)
@given(two_edge_connected(), link_events)
def test_incremental_equals_full_on_random_fabrics(
    fabric: Fabric, events: list[tuple[int, bool]]
) -> None:
    plan = Plan.compute(fabric)
    ids = sorted(fabric.links)
    for pick, up in events:
        link_id = ids[pick % len(ids)]
        state = AdminState.up if up else AdminState.drained
        fabric.update_link(link_id, LinkUpdate(admin_state=state))
        plan, _ = plan.update(fabric)  # the general path: from the whole fabric
        assert same_trees(plan, Plan.compute(fabric, summarise=False))


@settings(max_examples=40, deadline=None)
@given(two_edge_connected(), link_events, st.lists(st.integers(0, 10_000), max_size=3))
def test_an_update_with_links_held_out_equals_a_full_recompute_with_them_out(
    fabric: Fabric, events: list[tuple[int, bool]], held: list[int]
) -> None:
    """Health's overlay (links it holds out, whatever their admin state) is applied in the
    same update as the topology change: the plan is the full one with those links out."""
    plan = Plan.compute(fabric)
    ids = sorted(fabric.links)
    held_out = {ids[pick % len(ids)] for pick in held}
    for pick, up in events:
        link_id = ids[pick % len(ids)]
        state = AdminState.up if up else AdminState.drained
        fabric.update_link(link_id, LinkUpdate(admin_state=state))
        plan, _ = plan.update(fabric, held_out=held_out)
        full, _ = Plan.compute(fabric, summarise=False).update_links(
            dict.fromkeys(held_out, False), fabric.revision
        )
        assert same_trees(plan, full)


def test_a_failure_recomputes_only_the_destinations_whose_trees_it_touches() -> None:
    fabric = Fabric.from_document(fat_tree(8))
    plan = Plan.compute(fabric)
    link = next(
        lk for lk in fabric.links.values() if {lk.a.node, lk.b.node} == {"edge1-1", "agg1-1"}
    )
    edge = plan.graph.edge_of_link[link.id]
    users = {g for g, trees in plan.trees.items() if edge in trees.uses()}
    before = dict(plan.trees)
    fabric.update_link(link.id, LinkUpdate(admin_state=AdminState.down))
    plan, update = plan.update_links({link.id: False}, fabric.revision)
    assert not update.full
    # Only destinations whose trees took the link, or whose distances it carried (the
    # destination right behind it), are touched; every other tree is the very same object.
    own_group = plan.graph.group_of("host1-1-1")
    assert update.recomputed <= users | {own_group}
    assert all(plan.trees[g] is before[g] for g in set(before) - update.recomputed)
    assert same_trees(plan, Plan.compute(fabric, summarise=False))
    for pair in pairs(plan):
        check_pair(fabric, pair)


# --- verified against the per-pair explicit mode ----------------------------------------------


@pytest.mark.parametrize(
    "name", ["leaf-spine", "leaf-spine dual-homed", "fat-tree k=4", "dual-plane"]
)
def test_the_trees_match_suurballe_on_sharing_and_on_total_length(name: str) -> None:
    """Per pair, the destination-based trees share no more than Suurballe's optimal pair and,
    on these fabrics, are exactly as short in total."""
    from thorn_pathcomp.explicit import disjoint_pair

    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        best = disjoint_pair(plan.graph, pair.src, pair.dst)
        assert pair.red is not None and pair.blue is not None
        assert len(pair.shared.links) <= len(best.shared.links)
        assert len(pair.shared.switches) <= len(best.shared.switches)
        assert pair.red.hops + pair.blue.hops == best.total_hops, pair


generated_fabrics = st.one_of(
    st.builds(leaf_spine, st.integers(2, 4), st.integers(2, 4), st.integers(1, 3)),
    st.builds(
        lambda s, p, h: leaf_spine(s, 2 * p, h, dual_homed=True),
        st.integers(2, 3), st.integers(1, 2), st.integers(1, 2),
    ),
    st.builds(fat_tree, st.sampled_from([2, 4])),
    st.builds(rail_optimized, st.integers(1, 3), st.integers(1, 3), st.integers(1, 2),
              st.integers(1, 3)),
    st.builds(dual_plane, st.integers(1, 2), st.integers(1, 3), st.integers(1, 2)),
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(generated_fabrics)
def test_every_generator_gives_covered_loop_free_pairs_that_hide_no_risk(
    doc: FabricDocument,
) -> None:
    fabric = Fabric.from_document(doc)
    plan = Plan.compute(fabric)
    for pair in pairs(plan):
        check_pair(fabric, pair)  # both routes exist, are real and loop-free; risks are exact
    assert plan.summary.unreachable_pairs == 0


# --- the array path (fast.py) gives exactly the Python path's trees ----------------------------


def assert_fast_equals_python(fabric: Fabric) -> int:
    """Every group the array path takes: the same GroupTrees as trees.compute_group."""
    graph = FabricGraph.from_fabric(fabric)
    sources, taken = graph.sources, 0
    for group in (g for g in graph.groups if g):
        prefer = fast.intact_colours(graph, group)  # None unless links are out
        quick = fast.compute_group(graph, group, sources, prefer)
        if quick is not None:
            taken += 1
            assert quick == compute_group(graph, group, sources, prefer), group
    return taken


@pytest.mark.parametrize(
    ("doc", "clos"),
    [(leaf_spine(4, 8, 2), True), (leaf_spine(3, 6, 2, dual_homed=True), True),
     (fat_tree(4), True), (fat_tree(8), True), (rail_optimized(), True),
     (dual_plane(), False)],
    ids=["leaf-spine", "leaf-spine-dual", "fat-tree-4", "fat-tree-8", "rail", "dual-plane"],
)  # fmt: skip
def test_the_array_path_computes_the_same_trees_on_every_generator(
    doc: FabricDocument, clos: bool
) -> None:
    taken = assert_fast_equals_python(Fabric.from_document(doc))
    if clos:  # Clos fabrics always take the array path
        assert taken > 0


@settings(max_examples=150, deadline=None)
@given(st.one_of(biconnected(), two_edge_connected()))
def test_the_array_path_computes_the_same_trees_on_random_fabrics(fabric: Fabric) -> None:
    assert_fast_equals_python(fabric)


def test_a_failed_link_is_seen_the_same_by_both_paths() -> None:
    fabric = Fabric.from_document(fat_tree(4))
    plan = Plan.compute(fabric)
    some = plan.graph.edges[len(plan.graph.edges) // 2].link_id
    after, _ = plan.update_links({some: False}, 2)
    graph = after.graph
    for group in (g for g in graph.groups if g):
        prefer = fast.intact_colours(graph, group)
        assert prefer is not None
        quick = fast.compute_group(graph, group, graph.sources, prefer)
        assert quick is None or quick == compute_group(graph, group, graph.sources, prefer)


def test_the_colours_a_failure_prefers_are_those_of_the_intact_fabric() -> None:
    """Whether kept from the intact plan (`keep_intact_colours`) or made on demand."""
    fabric = Fabric.from_document(fat_tree(4))
    plan = Plan.compute(fabric)
    degraded = plan.graph.with_link_states({plan.graph.edges[0].link_id: False})
    every_edge = fast.Csr(degraded, every_edge=True)
    for group in plan.trees:
        prefer = fast.intact_colours(degraded, group)
        assert prefer is not None
        intact = fast.layers_and_colours(degraded, group, every_edge)[1]
        assert prefer.tolist() == intact.tolist() == plan.trees[group].colour


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(biconnected(), two_edge_connected()),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=4),
)
def test_the_array_path_computes_the_same_trees_with_links_out(
    fabric: Fabric, picks: list[int]
) -> None:
    ids = sorted(fabric.links)
    for pick in picks:
        fabric.update_link(ids[pick % len(ids)], LinkUpdate(admin_state=AdminState.down))
    assert_fast_equals_python(fabric)


@pytest.mark.parametrize(
    "doc", [fat_tree(8), leaf_spine(4, 8, 2)], ids=["fat-tree-8", "leaf-spine"]
)
def test_a_link_going_out_recolours_no_switch_whose_distance_stays(doc: FabricDocument) -> None:
    """A switch free to choose its colour keeps the one it has in the intact fabric: one
    link's loss once shifted every later chooser's colour (2,688 switch colours moved over
    fat_tree(8)'s single-link failures), and with them nearly every switch's routes."""
    plan = Plan.compute(Fabric.from_document(doc), summarise=False)
    for edge in plan.graph.edges:
        after, _ = plan.update_links({edge.link_id: False}, 2)
        for group, trees in after.trees.items():
            before = plan.trees[group]
            recoloured = [v for v, (a, b) in enumerate(zip(before.colour, trees.colour,
                                                           strict=True))
                          if a != b and before.level[v] == trees.level[v]]  # fmt: skip
            assert not recoloured, (edge.link_id, group, recoloured)


@pytest.mark.parametrize("name", GENERATED)
def test_every_pair_is_counted_once_as_protected_shared_risk_or_unprotected(name: str) -> None:
    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    counted = {"protected": 0, "shared risk": 0, "unprotected": 0}
    for pair in pairs(plan):
        ends = host_links(fabric, pair.src, pair.dst)
        if pair.red is None or pair.blue is None or set(pair.shared.links) - ends:
            counted["unprotected"] += 1
        elif pair.shared:
            counted["shared risk"] += 1
        else:
            counted["protected"] += 1
    s = plan.summary
    assert (s.protected_pairs, s.shared_risk_pairs, s.unprotected_pairs) == tuple(counted.values())
    assert s.protected_pairs + s.shared_risk_pairs + s.unprotected_pairs == s.pairs


def test_a_summary_gives_way_between_destination_groups_when_asked() -> None:
    plan = Plan.compute(Fabric.from_document(fat_tree(4)), summarise=False)
    asked: list[int] = []

    def after_two_groups() -> bool:
        asked.append(1)
        return len(asked) > 2

    assert plan.summarise_unless(after_two_groups) is None
    assert len(asked) == 3  # asked before each destination group, stopped at the third
    never_asked = plan.summarise_unless(lambda: False)
    assert never_asked == plan.summarise()
    assert never_asked is not None and never_asked.pairs == 16 * 15
