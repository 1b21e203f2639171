"""Does a drained element still carry traffic? The pure part of the answer.

Two things must be true before a cable can be pulled:

1. **The served plan sends nothing over it.** `route_load` counts, for every link and
   switch, the host-pair routes of a plan that cross it, per colour (the same routes
   `Plan.pair` gives, counted per pair of attachment groups and weighted by their hosts).
2. **The agents installed that plan.** Written is not installed: every node whose desired
   state changed since the plan that took the element out of service must have reported
   (`agent.applied.<node>`) the key revision written for it. Agents that have not reported
   for a while are not waited for (the same rule as the staged writes, `acks.py`); they are
   listed apart, so an operator sees them.

`DrainReport.carries_traffic` is False only when both hold. An element in service always
answers True: the next plan may route over it at any moment.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.trees import COLOURS

ElementKind = str  # "link" or "node"


@dataclass
class RouteLoad:
    """Host-pair routes of one plan crossing each link (by id) and switch (by name),
    as [red, blue] counts. Links and switches no route crosses are absent."""

    links: dict[int, list[int]] = field(default_factory=dict)
    switches: dict[str, list[int]] = field(default_factory=dict)

    def link(self, link_id: int) -> tuple[int, int]:
        red, blue = self.links.get(link_id, (0, 0))
        return red, blue

    def switch(self, name: str) -> tuple[int, int]:
        red, blue = self.switches.get(name, (0, 0))
        return red, blue


def route_load(plan: Plan) -> RouteLoad:
    """Count every host pair's red and blue route over the links and switches it crosses.

    Work is per (source group, destination group), like `Plan.summarise`: a route's switch
    part is shared by all the pairs of two groups, and each host adds its own host link.
    """
    graph = plan.graph
    links: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])
    switches: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    groups = {g: hosts for g, hosts in graph.groups.items() if g}
    for dst, dst_hosts in groups.items():
        trees = plan.trees.get(dst)
        if trees is None:
            continue
        for src, src_hosts in groups.items():
            same = src == dst
            per_src = len(dst_hosts) - (1 if same else 0)  # destinations of each source host
            per_dst = len(src_hosts) - (1 if same else 0)  # sources of each destination host
            weight = len(src_hosts) * per_src
            if weight <= 0:
                continue
            starts = plan.egress(src, dst)
            if starts is None:
                continue  # unreachable: no route crosses anything
            for colour, start in zip(COLOURS, starts, strict=True):
                hops = trees.path(start, colour)
                for switch, edge in hops:
                    switches[graph.switches[switch]][colour] += weight
                    if edge >= 0:
                        links[graph.edges[edge].link_id][colour] += weight
                last = hops[-1][0]
                for host in src_hosts:
                    links[_attachment(graph, host, start)][colour] += per_src
                for host in dst_hosts:
                    links[_attachment(graph, host, last)][colour] += per_dst
    return RouteLoad(dict(links), dict(switches))


def _attachment(graph: FabricGraph, host: str, switch: int) -> int:
    """The link a host uses toward `switch` (the first by link id, as `Plan.pair` picks)."""
    return next(a.link_id for a in graph.attachments[host] if a.switch == switch)


@dataclass(frozen=True)
class DrainReport:
    """What pathcomp knows about one link or node and the traffic on it."""

    kind: ElementKind
    element: str
    admin_state: str
    in_service: bool  # the plan may route over it (admin up, ends up, health not down)
    routes: tuple[int, int]  # host-pair routes of the served plan crossing it: red, blue
    plan_revision: int
    topology_revision: int
    out_of_service_plan: int | None  # the first served plan that left it out
    since: datetime | None  # when that plan was adopted
    agents_pending: tuple[str, ...]  # live agents that have not applied what was written since
    agents_silent: tuple[str, ...]  # written since, but their agents are not reporting
    hosts_cut_off: tuple[str, ...]  # hosts left with no usable link because of it
    replanning: bool  # a plan is being computed or written right now

    @property
    def carries_traffic(self) -> bool:
        return self.in_service or sum(self.routes) > 0 or bool(self.agents_pending)


def pending_agents(
    written: dict[str, int], applied: dict[str, int], live: set[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split the nodes written for (node -> key revision) into live agents that have not
    applied it yet, and nodes whose agents are not reporting (not waited for)."""
    pending = sorted(n for n, rev in written.items() if n in live and applied.get(n, 0) < rev)
    silent = sorted(n for n in written if n not in live)
    return tuple(pending), tuple(silent)


__all__ = ["DrainReport", "RouteLoad", "pending_agents", "route_load"]
