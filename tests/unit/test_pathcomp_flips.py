"""The central fast path: a failed link flips exactly the (source, peer) pairs whose active
colour crosses it and whose other colour does not, one message per source host.

The oracle is the plan's own per-pair paths (`Plan.pair`), computed independently of the
index the flips are found with."""

from __future__ import annotations

import pytest

from thorn.fabric import Fabric
from thorn.generators import fat_tree, leaf_spine
from thorn.model import FabricDocument
from thorn_pathcomp.flips import link_flips
from thorn_pathcomp.node_documents import DesiredStates
from thorn_pathcomp.plan import Plan

FABRICS: dict[str, FabricDocument] = {
    "leaf-spine": leaf_spine(2, 4, 2),
    "leaf-spine dual-homed": leaf_spine(2, 4, 2, dual_homed=True),
    "fat-tree k=4": fat_tree(4),
}


def expected(plan: Plan, states: DesiredStates, link_id: int) -> set[tuple[str, str, str]]:
    """(source, peer, colour to use) for every pair exactly one of whose colours crosses the
    link: whichever it is on now (the plan's choice, or an agent's own flip)."""
    out = set()
    for src in sorted(states.hosts):
        for peer in sorted(states.peers_of(src)):
            pair = plan.pair(src, peer)
            if pair.red is None or pair.blue is None:
                continue
            on_red, on_blue = link_id in pair.red.links, link_id in pair.blue.links
            if on_red != on_blue:
                out.add((src, peer, "blue" if on_red else "red"))
    return out


@pytest.mark.parametrize("name", FABRICS)
def test_each_link_moves_every_pair_off_the_one_colour_of_it_that_crosses_it(name: str) -> None:
    fabric = Fabric.from_document(FABRICS[name])
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    moved_somewhere = 0
    for link_id in sorted(fabric.links):
        flips = link_flips(states, link_id)
        got = {(f.node, p, f.colour) for f in flips for p in f.peers}
        assert got == expected(plan, states, link_id), f"link {link_id}"
        assert len({(f.node, f.colour) for f in flips}) == len(flips)  # one message each
        moved_somewhere += len(got)
    assert moved_somewhere > 0


def test_a_red_spine_link_moves_every_source_behind_it_to_blue() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 4, 2))
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    red = plan.pair("host1", "host3").red
    assert red is not None
    spine_link = red.links[1]  # leaf1 -> spine
    flips = link_flips(states, spine_link)
    host1 = [f for f in flips if f.node == "host1"]
    assert host1 and host1[0].colour == "blue" and "host3" in host1[0].peers


def test_the_served_plan_still_flips_while_an_update_for_another_link_runs() -> None:
    """A failing spine's links reach pathcomp one after another: the second link's urgent
    flips are read from the served plan while the first link's update is computed, so an
    update must leave the plan it started from whole."""
    fabric = Fabric.from_document(leaf_spine(2, 4, 2))
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    red_uplink = {src: plan.pair(src, "host3").red for src in ("host1", "host7")}
    first, second = (path.links[1] for path in red_uplink.values() if path is not None)
    before = {lid: link_flips(states, lid) for lid in (first, second)}
    updated, _ = plan.update_links({first: False}, fabric.revision)
    assert {lid: link_flips(states, lid) for lid in (first, second)} == before
    assert before[second]
    assert updated.users != plan.users  # the update has its own index


def test_a_single_homed_hosts_own_link_flips_nothing() -> None:
    """Both colours cross it: no flip helps (the plan reports it as a shared risk)."""
    fabric = Fabric.from_document(leaf_spine(2, 4, 2))
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    host_link = next(iter(plan.graph.attachments["host1"])).link_id
    assert link_flips(states, host_link) == []


def test_an_unknown_link_flips_nothing() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 1))
    states = DesiredStates.build(fabric, Plan.compute(fabric), revision=1)
    assert link_flips(states, 10_000) == []
