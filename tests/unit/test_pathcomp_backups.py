"""Switch-local repair: every switch route's backup next hop is loop-free, under any single
link or switch failure and with every backup that failure activates at once; where no
loop-free backup exists, the plan says so and installs none.

Forwarding is simulated the way a switch's kernel does it from the documents pathcomp
writes (longest prefix match; the primary route while its link and neighbour are alive,
else the backup, else the packet is dropped; and the agents' U-turn rule: a packet that
arrives over the link its primary would send it back by takes the backup while that is
alive), plus the same walk over the planner's own trees on random fabrics.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from random_fabrics import biconnected, two_edge_connected

from thorn.fabric import Fabric
from thorn.generators import dual_plane, fat_tree, leaf_spine, rail_optimized
from thorn.model import FabricDocument
from thorn_pathcomp.backups import local_repair, routing
from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.node_documents import DesiredStates, _may_move, _moved, _same_trees
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.trees import COLOURS, HOST, ColourIndex, GroupTrees

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

GENERATED: dict[str, FabricDocument] = {
    "leaf-spine": leaf_spine(2, 4, 2),
    "leaf-spine 4 spines": leaf_spine(4, 4, 1),
    "leaf-spine dual-homed": leaf_spine(2, 4, 2, dual_homed=True),
    "fat-tree k=4": fat_tree(4),
    "rail-optimized": rail_optimized(4, 2, 2, 2),
    "dual-plane": dual_plane(2, 2, 2),
}


@dataclass(frozen=True)
class Failure:
    links: frozenset[int]
    switch: str | None = None


def failures(fabric: Fabric) -> list[Failure]:
    """Every single switch-to-switch link failure and every single switch failure."""
    switches = {n for n, node in fabric.nodes.items() if node.role.value == "switch"}
    out = [
        Failure(frozenset({i}))
        for i, lk in fabric.links.items()
        if lk.a.node in switches and lk.b.node in switches
    ]
    for s in sorted(switches):
        touching = {i for i, lk in fabric.links.items() if s in (lk.a.node, lk.b.node)}
        out.append(Failure(frozenset(touching), s))
    return out


class Tables:
    """The switches' routing tables, as the documents pathcomp writes give them."""

    def __init__(self, fabric: Fabric, states: DesiredStates) -> None:
        self.link_at = {(end.node, end.port): i for i, lk in fabric.links.items()
                        for end in (lk.a, lk.b)}  # fmt: skip
        self.routes: dict[str, list[tuple[IPNetwork, dict[str, Any]]]] = {}
        for node in states.switch_routes:
            doc = orjson.loads(states.document(node))
            self.routes[node] = sorted(
                ((ipaddress.ip_network(r["prefix"]), r) for r in doc["routes"]),
                key=lambda item: -item[0].prefixlen,
            )

    def lookup(self, node: str, address: IPAddress) -> dict[str, Any] | None:
        return next((r for net, r in self.routes[node] if address in net), None)

    def alive(self, node: str, choice: dict[str, Any], failure: Failure) -> bool:
        return (
            self.link_at[(node, choice["port"])] not in failure.links
            and choice["neighbour"] != failure.switch
        )

    def step(
        self, node: str, route: dict[str, Any], failure: Failure, came_by: int | None = None
    ) -> tuple[str, int] | None:
        """(next node, the link it goes over) or None: dropped here. `came_by`: the link
        the packet arrived over (None: it starts here)."""
        backup = route.get("backup")
        if (
            backup is not None
            and came_by == self.link_at[(node, route["port"])]
            and self.alive(node, backup, failure)
        ):  # the U-turn rule of that port's table
            return str(backup["neighbour"]), self.link_at[(node, backup["port"])]
        for choice in (route, backup):
            if choice is not None and self.alive(node, choice, failure):
                return str(choice["neighbour"]), self.link_at[(node, choice["port"])]
        return None


def walk(
    tables: Tables,
    start: str,
    address: IPAddress,
    failure: Failure,
    came_by: int | None = None,
    seen: list[tuple[str, int | None]] | None = None,
) -> str:
    """Forward from `start` (reached over link `came_by`) toward `address`: the host
    reached, or "drop@<switch>"; `seen` collects (switch, incoming link) on the way."""
    # A switch's forwarding depends on the packet's incoming link too (the U-turn rule): a
    # loop is a (switch, incoming link) seen twice; a U-turn passes its sender twice.
    seen = [] if seen is None else seen
    node = start
    while node in tables.routes:
        path = " -> ".join(n for n, _ in [*seen, (node, came_by)])
        assert (node, came_by) not in seen, f"loop toward {address}: {path}"
        seen.append((node, came_by))
        route = tables.lookup(node, address)
        if route is None:
            return f"drop@{node}"
        step = tables.step(node, route, failure, came_by)
        if step is None:
            return f"drop@{node}"
        node, came_by = step
    return node


def reported_risks(plan: Plan) -> set[tuple[str, str, tuple[int, ...]]]:
    """(switch, colour, group) where pathcomp reports no loop-free backup."""
    out = set()
    for group, trees in plan.trees.items():
        for v, colour in local_repair(plan.graph, trees)[1]:
            out.add((plan.graph.switches[v], colour.name, group))
    return out


@pytest.mark.parametrize("name", GENERATED)
def test_no_single_failure_makes_a_walk_loop_and_every_drop_is_a_reported_risk(name: str) -> None:
    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    tables = Tables(fabric, states)
    risks = reported_risks(plan)
    teps = {(t.node, t.colour.value): t.address for t in fabric.teps.values()}
    repaired_by_backup = 0
    for failure in failures(fabric):
        for (host, colour), address in teps.items():
            group = plan.graph.group_of(host)
            if all(plan.graph.switches[s] == failure.switch for s in group):
                continue  # its only switch died: nothing can reach it
            for start in tables.routes:
                if start == failure.switch or tables.lookup(start, address) is None:
                    continue
                end = walk(tables, start, address, failure)
                if end.startswith("drop@"):
                    at = end.removeprefix("drop@")
                    route = tables.lookup(at, address)
                    assert route is not None
                    backup = route.get("backup")
                    # Dropped only where no backup exists (reported), or where the backup,
                    # protecting the link only, goes to the switch that failed.
                    assert (at, colour, group) in risks or (
                        backup is not None and backup["neighbour"] == failure.switch
                    ), f"{failure}: {host}/{colour} dropped at {at} despite a backup"
                else:
                    assert end == host
                    if failure.links:
                        repaired_by_backup += 1
    assert repaired_by_backup > 0


@pytest.mark.parametrize("name", GENERATED)
def test_every_installed_backup_leads_to_the_destination_without_coming_back(name: str) -> None:
    fabric = Fabric.from_document(GENERATED[name])
    plan = Plan.compute(fabric)
    tables = Tables(fabric, DesiredStates.build(fabric, plan, revision=1))
    checked = uturns = 0
    for node, routes in tables.routes.items():
        for net, route in routes:
            backup = route.get("backup")
            if backup is None:
                continue
            assert backup["port"] != route["port"]
            # The primary's link failed: from the backup's neighbour (reached over the
            # backup's link), the packet reaches the host and never comes back to `node`.
            failed = Failure(frozenset({tables.link_at[(node, route["port"])]}))
            hosts = [t for t in fabric.teps.values() if t.address in net]
            for tep in hosts:
                seen: list[tuple[str, int | None]] = []
                came_by = tables.link_at[(node, backup["port"])]
                path = walk(tables, backup["neighbour"], tep.address, failed, came_by, seen)
                assert path == tep.node
                assert node not in {n for n, _ in seen}
                checked += 1
                back = tables.lookup(backup["neighbour"], tep.address)
                uturns += back is not None and back["neighbour"] == node
    assert checked > 0
    if name.startswith("leaf-spine") and "dual" not in name:
        assert uturns > 0  # spines' last hops down are protected by U-turns


def test_a_leaf_backs_up_its_uplink_through_another_spine_and_a_spine_by_a_u_turn() -> None:
    """Two-tier Clos: a leaf's route up to spine1 falls back to spine2 (closer to the
    destination on the same colour). spine1's last hop down to a leaf has no downstream
    alternative; its backup is a U-turn: another leaf, whose own route goes straight back
    up to spine1 and whose backup goes up to spine2. The spine of the other colour, which
    no leaf routes that colour through, has no backup at all (a reported risk)."""
    fabric = Fabric.from_document(leaf_spine(2, 4, 1))
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    leaf = orjson.loads(states.document("leaf1"))["routes"]
    up = [r for r in leaf if r["neighbour"].startswith("spine")]
    assert up and all(r["backup"]["neighbour"].startswith("spine") for r in up)
    assert all(r["backup"]["neighbour"] != r["neighbour"] for r in up)
    spine = orjson.loads(states.document("spine1"))["routes"]
    tables = Tables(fabric, states)
    down = [r for r in spine if r["neighbour"].startswith("leaf")]
    by_uturn = [r for r in down if "backup" in r]
    assert by_uturn and all(r["backup"]["neighbour"].startswith("leaf") for r in by_uturn)
    for r in by_uturn:
        via = r["backup"]["neighbour"]
        back = tables.lookup(via, ipaddress.ip_network(r["prefix"]).network_address)
        assert back is not None and back["neighbour"] == "spine1"
        assert back["backup"]["neighbour"].startswith("spine")
        assert back["backup"]["neighbour"] != "spine1"
    risks = reported_risks(plan)
    assert not any(s.startswith("leaf") for s, _, _ in risks)
    uncovered = {r["colour"] for r in down if "backup" not in r}
    assert len(uncovered) == 1 and any(s == "spine1" for s, _, _ in risks)


def _graph_walk(
    graph: FabricGraph, trees: GroupTrees, colour: ColourIndex, start: int, dead: set[int]
) -> str:
    """The same walk over the planner's routes and backups; `dead`: edge indices down."""
    routes = routing(graph, trees, colour)
    seen: set[tuple[int, int]] = set()
    v, came_by = start, -1
    while True:
        assert (v, came_by) not in seen, f"loop at switch {v}"
        seen.add((v, came_by))
        hop = routes.next[v]
        if hop is None:
            return "unreachable"
        if hop.switch == HOST:
            return "delivered"
        alternate = routes.backup.get(v)
        if hop.edge in dead or hop.edge == came_by:  # failed, or the U-turn rule
            if alternate is None or alternate.edge in dead:
                if hop.edge in dead:
                    return "dropped"
            else:
                hop = alternate
        v, came_by = hop.switch, hop.edge


def _check_random(fabric: Fabric) -> None:
    plan = Plan.compute(fabric)
    graph = plan.graph
    for trees in plan.trees.values():
        for colour in COLOURS:
            routes = routing(graph, trees, colour)
            for v, alternate in routes.backup.items():
                if v in routes.uturn:  # the neighbour's own route comes back over that link
                    u = alternate.switch
                    assert routes.next[u] is not None and routes.next[u].edge == alternate.edge
                    assert u in routes.backup and u not in routes.uturn
                else:
                    assert routes.dist[alternate.switch] < routes.dist[v]
            links = [{i} for i in range(len(graph.edges))]
            switches = [set(graph.incident[s]) for s in range(len(graph.switches))]
            for dead in links + switches:
                for start in range(len(graph.switches)):
                    if trees.next[colour][start] is not None:
                        _graph_walk(graph, trees, colour, start, dead)


@settings(max_examples=80, deadline=None)
@given(biconnected())
def test_on_biconnected_fabrics_activated_backups_never_loop(fabric: Fabric) -> None:
    _check_random(fabric)


@settings(max_examples=80, deadline=None)
@given(two_edge_connected())
def test_on_two_edge_connected_fabrics_activated_backups_never_loop(fabric: Fabric) -> None:
    _check_random(fabric)


@pytest.mark.parametrize(
    "document", [fat_tree(8), leaf_spine(4, 4, 2, dual_homed=True)], ids=["fat-tree k=8", "ls"]
)
def test_a_link_coming_back_is_said_to_move_a_kept_group_exactly_when_it_does(
    document: FabricDocument,
) -> None:
    """For every link that fails and comes back, and every group whose trees come out as
    they were: `gained_link_moves` (through node_documents' check) says a route or backup
    moves exactly when recomputing the group's routing finds one that did."""
    fabric = Fabric.from_document(document)
    plan = Plan.compute(fabric, summarise=False)
    found = 0
    for link_id in sorted(fabric.links):
        down, _ = plan.update_links({link_id: False}, 1)
        up, _ = down.update_links({link_id: True}, 1)
        changed = [i for i, (a, b) in enumerate(zip(up.graph.alive, down.graph.alive,
                                                     strict=True)) if a != b]  # fmt: skip
        for group in _same_trees(down, up, set(up.trees)):
            says = _may_move(down.graph, down.trees[group], up.graph, changed)
            moves = bool(_moved(down.graph, down.trees[group], up.graph, up.trees[group]))
            assert says == moves, (link_id, group)
            found += moves
    assert found > 0  # the fabric has such groups: the check was put to work
