"""Drain reports: how many host-pair routes cross a link or switch, and when an element
out of service carries no more traffic."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from thorn.fabric import Fabric
from thorn.generators import fat_tree, leaf_spine
from thorn.model import AdminState, FabricDocument, NodeUpdate
from thorn_pathcomp.drains import DrainReport, pending_agents, route_load
from thorn_pathcomp.plan import Plan


def counted_pair_by_pair(plan: Plan) -> tuple[Counter[tuple[int, int]], Counter[tuple[str, int]]]:
    """The slow, obvious count: walk every host pair's routes from `Plan.pair`."""
    links: Counter[tuple[int, int]] = Counter()
    switches: Counter[tuple[str, int]] = Counter()
    hosts = sorted(h for hs in plan.graph.groups.values() for h in hs)
    for src, dst in itertools.permutations(hosts, 2):
        pair = plan.pair(src, dst)
        for colour, route in enumerate((pair.red, pair.blue)):
            if route is None:
                continue
            links.update((link, colour) for link in route.links)
            switches.update((node, colour) for node in route.nodes[1:-1])
    return links, switches


@pytest.mark.parametrize(
    "doc",
    [leaf_spine(2, 3, 2), leaf_spine(2, 4, 2, dual_homed=True), fat_tree(4)],
    ids=["leaf-spine", "dual-homed", "fat-tree-4"],
)
def test_route_load_counts_exactly_the_routes_pairs_take(doc: FabricDocument) -> None:
    plan = Plan.compute(Fabric.from_document(doc))
    load = route_load(plan)
    links, switches = counted_pair_by_pair(plan)
    for link_id in Fabric.from_document(doc).links:
        assert load.link(link_id) == (links[(link_id, 0)], links[(link_id, 1)]), link_id
    for name in plan.graph.switches:
        assert load.switch(name) == (switches[(name, 0)], switches[(name, 1)]), name


def test_a_drained_spine_is_crossed_by_no_route_of_the_next_plan() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 3, 2))
    before = route_load(Plan.compute(fabric))
    assert sum(before.switch("spine1")) > 0
    fabric.update_node("spine1", NodeUpdate(admin_state=AdminState.drained))
    after = route_load(Plan.compute(fabric))
    assert after.switch("spine1") == (0, 0)
    spine1_links = [i for i, lk in fabric.links.items() if "spine1" in (lk.a.node, lk.b.node)]
    assert all(after.link(i) == (0, 0) for i in spine1_links)
    # Every route now crosses spine2 (both colours: single-homed hosts on a 2-spine fabric).
    assert sum(after.switch("spine2")) > sum(before.switch("spine2"))


def report(**kw: object) -> DrainReport:
    base: dict[str, object] = dict(
        kind="link", element="7", admin_state="drained", in_service=False, routes=(0, 0),
        plan_revision=3, topology_revision=9, out_of_service_plan=3, since=None,
        agents_pending=(), agents_silent=(), hosts_cut_off=(), replanning=False,
    )  # fmt: skip
    base.update(kw)
    return DrainReport(**base)  # type: ignore[arg-type]


def test_only_an_out_of_service_element_no_route_crosses_and_agents_applied_is_empty() -> None:
    assert report().carries_traffic is False
    assert report(in_service=True).carries_traffic is True  # up: the next plan may use it
    assert report(routes=(0, 1)).carries_traffic is True
    assert report(agents_pending=("leaf1",)).carries_traffic is True
    # A silent agent is listed for the operator, but does not hold the answer forever.
    assert report(agents_silent=("leaf9",)).carries_traffic is False


def test_pending_agents_are_the_live_ones_behind_what_was_written_for_them() -> None:
    written = {"leaf1": 10, "leaf2": 11, "leaf3": 12, "host1": 13}
    applied = {"leaf1": 10, "leaf2": 9, "leaf3": 20}
    live = {"leaf1", "leaf2", "leaf3"}
    pending, silent = pending_agents(written, applied, live)
    assert pending == ("leaf2",)
    assert silent == ("host1",)
