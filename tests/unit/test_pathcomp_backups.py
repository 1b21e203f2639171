"""Switch-local repair: every switch route's backup next hop is loop-free, under any single
link or switch failure and with every backup that failure activates at once; where no
loop-free backup exists, the plan says so and installs none.

Forwarding is simulated the way a switch's kernel does it from the documents pathcomp
writes (longest prefix match; the primary route while its link and neighbour are alive,
else the backup, else the packet is dropped), plus the same walk over the planner's own
trees on random fabrics.
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
from thorn_pathcomp.desired import DesiredStates
from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.trees import HOST, Colour, GroupTrees

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

    def step(self, node: str, route: dict[str, Any], failure: Failure) -> tuple[str, bool] | None:
        """(next node, by the backup) or None: dropped here."""
        for choice, backup in ((route, False), (route.get("backup"), True)):
            if choice is None:
                continue
            if self.link_at[(node, choice["port"])] in failure.links:
                continue
            if choice["neighbour"] == failure.switch:
                continue
            return str(choice["neighbour"]), backup
        return None


def walk(tables: Tables, start: str, address: IPAddress, failure: Failure) -> str:
    """Forward from `start` toward `address`: the host reached, or "drop@<switch>"."""
    seen: list[str] = []
    node = start
    while node in tables.routes:
        assert node not in seen, f"loop toward {address}: {' -> '.join([*seen, node])}"
        seen.append(node)
        route = tables.lookup(node, address)
        if route is None:
            return f"drop@{node}"
        step = tables.step(node, route, failure)
        if step is None:
            return f"drop@{node}"
        node = step[0]
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
    none = Failure(frozenset())
    checked = 0
    for routes in tables.routes.values():
        for net, route in routes:
            backup = route.get("backup")
            if backup is None:
                continue
            assert backup["port"] != route["port"]
            hosts = [t for t in fabric.teps.values() if t.address in net]
            for tep in hosts:
                # From the backup's neighbour, primaries alone reach the host, never `node`.
                path = walk(tables, backup["neighbour"], tep.address, none)
                assert path == tep.node
                checked += 1
    assert checked > 0


def test_a_leaf_backs_up_its_uplink_through_another_spine_and_a_spine_has_no_way_down() -> None:
    """Two-tier Clos: a leaf's route up to spine1 falls back to spine2 (closer to the
    destination on the same colour); spine1's last hop down to a leaf has no loop-free
    alternative (every other neighbour is a leaf that would send the packet back)."""
    fabric = Fabric.from_document(leaf_spine(2, 4, 1))
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, revision=1)
    leaf = orjson.loads(states.document("leaf1"))["routes"]
    up = [r for r in leaf if r["neighbour"].startswith("spine")]
    assert up and all(r["backup"]["neighbour"].startswith("spine") for r in up)
    assert all(r["backup"]["neighbour"] != r["neighbour"] for r in up)
    spine = orjson.loads(states.document("spine1"))["routes"]
    down = [r for r in spine if r["neighbour"].startswith("leaf")]
    assert down and all("backup" not in r for r in down)
    risks = reported_risks(plan)
    assert any(s == "spine1" for s, _, _ in risks)
    assert not any(s.startswith("leaf") for s, _, _ in risks)


def _graph_walk(
    graph: FabricGraph, trees: GroupTrees, colour: Colour, start: int, dead: set[int]
) -> str:
    """The same walk over the planner's routes and backups; `dead`: edge indices down."""
    routes = routing(graph, trees, colour)
    seen: set[int] = set()
    v = start
    while True:
        assert v not in seen, f"loop at switch {v}"
        seen.add(v)
        hop = routes.next[v]
        if hop is None:
            return "unreachable"
        if hop.switch == HOST:
            return "delivered"
        if hop.edge in dead:
            alternate = routes.backup.get(v)
            if alternate is None or alternate.edge in dead:
                return "dropped"
            hop = alternate
        v = hop.switch


def _check_random(fabric: Fabric) -> None:
    plan = Plan.compute(fabric)
    graph = plan.graph
    for trees in plan.trees.values():
        for colour in (Colour.red, Colour.blue):
            routes = routing(graph, trees, colour)
            for v, alternate in routes.backup.items():
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
