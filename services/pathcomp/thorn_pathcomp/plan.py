"""A path plan: red and blue trees for every attachment group, with risks and stretch.

Hosts with the same attachment switches share their trees' switch part, so the work scales
with the number of switches and groups, not with host pairs. Pair-level answers (egress
ports, shared risks, stretch) are derived per (source group, destination group) and weighted
by the hosts in each group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from thorn.fabric import Fabric
from thorn_pathcomp.graph import Attachment, FabricGraph, Group, SwitchId
from thorn_pathcomp.stnumber import st_next_hops
from thorn_pathcomp.trees import HOST, INF, Colour, GroupTrees, compute_group


def group_trees(graph: FabricGraph, group: Group, sources: set[SwitchId]) -> GroupTrees:
    """The colour partition (shortest on Clos fabrics), or st-numberings where it falls short."""
    trees = compute_group(graph, group, sources)
    if not trees.fallback:
        return trees
    red, blue = st_next_hops(graph, group)
    return GroupTrees.from_next_hops(graph, group, trees.level, red, blue, "st")


class UnknownHost(LookupError):
    """A query names a host that is not in the fabric."""


@dataclass(frozen=True)
class SharedRisks:
    """What a pair's red and blue paths have in common (empty: fully disjoint)."""

    links: tuple[int, ...] = ()
    switches: tuple[str, ...] = ()
    srlgs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.links or self.switches or self.srlgs)


@dataclass(frozen=True)
class Route:
    """One colour's path: node names from source host to destination host, and link ids."""

    nodes: tuple[str, ...]
    links: tuple[int, ...]

    @property
    def hops(self) -> int:
        return len(self.links)


@dataclass(frozen=True)
class PairPlan:
    src: str
    dst: str
    red: Route | None
    blue: Route | None
    shortest: int | None  # hops of the shortest path between the two hosts
    shared: SharedRisks
    egress: tuple[str | None, str | None]  # the source's host port per colour

    @property
    def protected(self) -> bool:
        return self.red is not None and self.blue is not None and not self.shared.links


@dataclass
class ColourStretch:
    max: int = 0
    total: int = 0  # summed over pairs, for the mean
    pairs: int = 0

    def add(self, extra: int, weight: int) -> None:
        self.max = max(self.max, extra)
        self.total += extra * weight
        self.pairs += weight

    @property
    def mean(self) -> float:
        return self.total / self.pairs if self.pairs else 0.0


@dataclass
class PlanSummary:
    hosts: int = 0
    groups: int = 0
    pairs: int = 0
    # A colour is missing, or red and blue share a switch-to-switch link.
    unprotected_pairs: int = 0
    # A single-homed end: both colours cross its one host link (no topology avoids that).
    pairs_sharing_host_links: int = 0
    pairs_sharing_switches: int = 0
    pairs_sharing_srlgs: int = 0
    unreachable_pairs: int = 0
    stretch: dict[str, ColourStretch] = field(
        default_factory=lambda: {"red": ColourStretch(), "blue": ColourStretch()}
    )
    compute_seconds: float = 0.0


@dataclass(frozen=True)
class _Choice:
    """The switch part of a (source group, destination group) pair."""

    starts: tuple[SwitchId, SwitchId] | None  # egress switch per colour; None: unreachable
    shared_switches: frozenset[SwitchId]
    shared_edges: frozenset[int]
    shared_srlgs: frozenset[str]
    hops: tuple[int, int]  # switch hops per colour, attachment to attachment
    shortest: int


class Plan:
    def __init__(self, graph: FabricGraph, trees: dict[Group, GroupTrees], revision: int) -> None:
        self.graph = graph
        self.trees = trees
        self.topology_revision = revision
        self.summary = PlanSummary()

    @classmethod
    def compute(cls, fabric: Fabric) -> Plan:
        start = time.perf_counter()
        graph = FabricGraph.from_fabric(fabric)
        sources = graph.sources
        trees = {g: group_trees(graph, g, sources) for g in graph.groups if g}
        plan = cls(graph, trees, fabric.revision)
        plan.summary = plan.summarise()
        plan.summary.compute_seconds = time.perf_counter() - start
        return plan

    # --- pairs ------------------------------------------------------------------------------

    def _choice(self, src: Group, dst: Group) -> _Choice:
        """Pick each colour's egress switch in `src` so the two paths share the least."""
        trees = self.trees[dst]
        shortest = min((trees.level[s] for s in src), default=INF)
        options = [(a, b) for a in src for b in src if a != b] or [(src[0], src[0])]
        best: tuple[tuple[int, ...], _Choice] | None = None
        for red_start, blue_start in options:
            red = trees.path(red_start, Colour.red)
            blue = trees.path(blue_start, Colour.blue)
            if not red or not blue:
                continue
            red_nodes = {v for v, _ in red}
            blue_nodes = {v for v, _ in blue}
            shared_switches = red_nodes & blue_nodes
            red_edges = {e for _, e in red if e >= 0}
            shared_edges = red_edges & {e for _, e in blue if e >= 0}
            shared_srlgs = trees.srlgs[Colour.red][red_start] & trees.srlgs[Colour.blue][blue_start]
            hops = (len(red) - 1, len(blue) - 1)
            choice = _Choice(
                (red_start, blue_start),
                frozenset(shared_switches),
                frozenset(shared_edges),
                shared_srlgs,
                hops,
                shortest,
            )
            key = (
                len(shared_edges),
                len(shared_switches),
                len(shared_srlgs),
                sum(hops),
                red_start,
                blue_start,
            )
            if best is None or key < best[0]:
                best = (key, choice)
        if best is None:
            return _Choice(None, frozenset(), frozenset(), frozenset(), (INF, INF), shortest)
        return best[1]

    def pair(self, src: str, dst: str) -> PairPlan:
        """The red and blue routes between two hosts, with what they share."""
        for host in (src, dst):
            if host not in self.graph.attachments and not any(
                host in hosts for hosts in self.graph.groups.values()
            ):
                raise UnknownHost(host)
        src_group, dst_group = self.graph.group_of(src), self.graph.group_of(dst)
        if not src_group or not dst_group or dst_group not in self.trees:
            return PairPlan(src, dst, None, None, None, SharedRisks(), (None, None))
        choice = self._choice(src_group, dst_group)
        if choice.starts is None:
            return PairPlan(src, dst, None, None, None, SharedRisks(), (None, None))
        trees = self.trees[dst_group]
        routes: list[Route] = []
        egress: list[str | None] = []
        used_links: list[set[int]] = []
        for colour, start in zip((Colour.red, Colour.blue), choice.starts, strict=True):
            first = self._attachment(src, start)
            hops = trees.path(start, colour)
            last = self._attachment(dst, hops[-1][0])
            nodes = [src] + [self.graph.switches[v] for v, _ in hops] + [dst]
            links = [first.link_id] + [self.graph.edges[e].link_id for _, e in hops[:-1]]
            links.append(last.link_id)
            routes.append(Route(tuple(nodes), tuple(links)))
            egress.append(first.host_port)
            used_links.append(set(links))
        srlg_of = self._link_srlgs()
        shared_links = used_links[0] & used_links[1]
        shared_srlgs = {s for lk in used_links[0] for s in srlg_of.get(lk, ())} & {
            s for lk in used_links[1] for s in srlg_of.get(lk, ())
        }
        switches = sorted(self.graph.switches[v] for v in choice.shared_switches)
        shared = SharedRisks(
            tuple(sorted(shared_links)), tuple(switches), tuple(sorted(shared_srlgs))
        )
        shortest = choice.shortest + 2 if choice.shortest < INF else None
        return PairPlan(src, dst, routes[0], routes[1], shortest, shared, (egress[0], egress[1]))

    def _attachment(self, host: str, switch: SwitchId) -> Attachment:
        return next(a for a in self.graph.attachments[host] if a.switch == switch)

    def _link_srlgs(self) -> dict[int, frozenset[str]]:
        out = {e.link_id: e.srlgs for e in self.graph.edges if e.srlgs}
        for attachments in self.graph.attachments.values():
            out.update({a.link_id: a.srlgs for a in attachments if a.srlgs})
        return out

    # --- the whole plan -------------------------------------------------------------------

    def summarise(self) -> PlanSummary:
        """Risks and stretch over every host pair, computed per pair of groups."""
        summary = PlanSummary(groups=len(self.trees))
        groups = {g: hosts for g, hosts in self.graph.groups.items()}
        summary.hosts = sum(len(h) for h in groups.values())
        host_srlgs = self._host_link_srlgs()
        for dst, dst_hosts in groups.items():
            for src, src_hosts in groups.items():
                weight = len(src_hosts) * len(dst_hosts) - (len(src_hosts) if src == dst else 0)
                if weight <= 0:
                    continue
                summary.pairs += weight
                if not src or not dst:
                    summary.unreachable_pairs += weight
                    summary.unprotected_pairs += weight
                    continue
                choice = self._choice(src, dst)
                if choice.starts is None:
                    summary.unreachable_pairs += weight
                    summary.unprotected_pairs += weight
                    continue
                if choice.shared_edges:
                    summary.unprotected_pairs += weight
                if len(src) == 1 or len(dst) == 1:
                    summary.pairs_sharing_host_links += weight
                if choice.shared_switches:
                    summary.pairs_sharing_switches += weight
                if choice.shared_srlgs or (host_srlgs & {src, dst}):
                    summary.pairs_sharing_srlgs += weight
                for colour, name in ((0, "red"), (1, "blue")):
                    summary.stretch[name].add(choice.hops[colour] - choice.shortest, weight)
        return summary

    def _host_link_srlgs(self) -> set[Group]:
        """Groups whose single host link carries an SRLG (shared by both colours)."""
        out: set[Group] = set()
        for host, attachments in self.graph.attachments.items():
            if len({a.switch for a in attachments}) == 1 and any(a.srlgs for a in attachments):
                out.add(self.graph.group_of(host))
        return out


__all__ = ["HOST", "PairPlan", "Plan", "PlanSummary", "Route", "SharedRisks", "UnknownHost"]
