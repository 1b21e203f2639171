"""A path plan: red and blue trees for every attachment group, with risks and stretch.

Hosts with the same attachment switches share their trees' switch part, so the work scales
with the number of switches and groups, not with host pairs. Pair-level answers (egress
ports, shared risks, stretch) are derived per (source group, destination group) and weighted
by the hosts in each group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import Literal

from thorn.fabric import Fabric
from thorn_pathcomp import fast
from thorn_pathcomp.graph import Attachment, FabricGraph, Group, SwitchId
from thorn_pathcomp.stnumber import st_next_hops
from thorn_pathcomp.trees import (
    BLUE,
    BOTH,
    COLOURS,
    HOST,
    INF,
    RED,
    ColourIndex,
    GroupTrees,
    NextHop,
    compute_group,
    extend,
    group_seed,
    other_choice,
    other_colour,
    own_choice,
)


def repair(
    graph: FabricGraph,
    trees: GroupTrees,
    lost: set[int],
    gained: set[int],
    sources: set[SwitchId],
) -> tuple[GroupTrees, set[SwitchId]] | None:
    """Re-choose only the next hops at the ends of lost or gained links, when distances and
    colours stand.

    Gives exactly what `compute_group` would (tests compare them): own-colour choices are
    rendezvous-hashed, so only a switch that lost its chosen link changes its mind, and the
    other colour's distances are own-colour distances, which do not move. Returns None when
    that is not enough (a source loses a colour: the group needs the general method).
    Also returns the switches whose next hops changed.
    """
    level, colour = trees.level, trees.colour
    nexts = (list(trees.next[0]), list(trees.next[1]))
    dists = (list(trees.dist[0]), list(trees.dist[1]))
    seed = group_seed(trees.group)
    adjacency, edges = graph.adjacency, graph.edges
    own_changed: set[SwitchId] = set()
    # A next hop takes a link at its own switch: only the ends of changed links can change.
    ends = sorted({end for i in lost | gained for end in (edges[i].u, edges[i].v)})
    new_choice = {end for i in gained for end in (edges[i].u, edges[i].v)}
    for c in COLOURS:  # own colours first: the other colour avoids them
        hops = nexts[c]
        for v in ends:
            hop = hops[v]
            if hop is None or colour[v] != c or hop.switch == HOST:
                continue
            if hop.edge in lost or v in new_choice:
                choice = own_choice(v, c, level, colour, adjacency, seed)
                if choice is None:
                    return None
                if choice != hop:
                    hops[v] = choice
                    own_changed.add(v)
    missing: list[frozenset[SwitchId]] = []
    touched = set(own_changed)
    for c in COLOURS:
        hops, dist_c, srlg_c = nexts[c], dists[c], trees.srlgs[c]
        gone = set(trees.missing[c])
        # The extension over switches without colour c must be redone when it lost or gained
        # a link, or a distance it grew from moved.
        redo = any(
            v in gone and (getattr(hops[v], "edge", -1) in lost or v in new_choice) for v in ends
        )
        for v in ends:
            hop = hops[v]
            if v in gone or colour[v] == c or hop is None or hop.switch == HOST:
                continue
            if hop.edge in lost or v in own_changed or v in new_choice:
                own = nexts[other_colour(c)][v]
                choice = other_choice(
                    v, c, colour, dist_c, srlg_c, adjacency, edges, own, frozenset(), seed
                )
                touched.add(v)
                if choice is None:
                    gone.add(v)
                    redo = True
                else:
                    before = dist_c[v]
                    hops[v], dist_c[v] = choice, dist_c[choice.switch] + 1
                    redo = redo or dist_c[v] != before
        if not sources.isdisjoint(gone):
            return None
        if gone and redo:
            extend(frozenset(gone), hops, dist_c, srlg_c, adjacency, edges)
            touched |= gone
        missing.append(frozenset(gone))
    repaired = GroupTrees(
        trees.group,
        level,
        colour,
        nexts,
        dists,
        trees.srlgs,
        False,
        "partition",
        (missing[0], missing[1]),
    )
    return repaired, touched


def relayer(
    graph: FabricGraph, trees: GroupTrees, changed: set[int], sources: set[SwitchId]
) -> tuple[GroupTrees, set[SwitchId]] | None:
    """For a group whose distances or colours move: redo the layers and colours (the cheap
    part of `compute_group`, the very same code) and re-choose next hops only at switches
    whose level or colour moved, their neighbours and the ends of changed links. Every other
    switch sees the same candidates with the same distances, so its choice stands: the result
    is what `compute_group` gives (tests compare them). None when too much moved."""
    group = trees.group
    # The array layering (fast.py): the same levels and colours, without a Python loop over
    # every edge (this is most of an aggregation-core failure's cost).
    prefer = fast.intact_colours(graph, group)
    levels, colours, _ = fast.layers_and_colours(graph, group, fast.csr(graph), prefer)
    level, colour = levels.tolist(), colours.tolist()
    n = len(level)
    moved = {v for v in range(n) if level[v] != trees.level[v] or colour[v] != trees.colour[v]}
    if len(moved) > n // 8:
        return None
    adjacency, edges = graph.adjacency, graph.edges
    redo = moved | {end for i in changed for end in (edges[i].u, edges[i].v)}
    redo |= {u for v in moved for u, _ in adjacency[v]}
    seed = group_seed(group)
    single = len(group) == 1
    nexts = (list(trees.next[0]), list(trees.next[1]))
    dists = (list(trees.dist[0]), list(trees.dist[1]))
    for c in COLOURS:  # own colours (and the ends of the trees) first
        hops, dist_c = nexts[c], dists[c]
        for v in redo:
            hops[v], dist_c[v] = None, INF
            if level[v] >= INF:
                continue
            if level[v] == 0:
                if single or colour[v] == c:
                    hops[v], dist_c[v] = NextHop(HOST, -1), 0
            elif colour[v] == c:
                hops[v] = own_choice(v, c, level, colour, adjacency, seed)
                if hops[v] is None:
                    return None
                dist_c[v] = level[v]
    missing: list[frozenset[SwitchId]] = []
    for c in COLOURS:
        hops, dist_c, srlg_c = nexts[c], dists[c], trees.srlgs[c]
        gone = set(trees.missing[c]) - redo
        for v in sorted(redo):
            if level[v] >= INF or hops[v] is not None:
                continue
            own = nexts[other_colour(c)][v]
            choice = other_choice(
                v, c, colour, dist_c, srlg_c, adjacency, edges, own, frozenset(), seed
            )
            if choice is None:
                gone.add(v)
            else:
                hops[v], dist_c[v] = choice, dist_c[choice.switch] + 1
        if not sources.isdisjoint(gone):
            return None
        if gone:
            seeds = fast.extension_seeds(graph, gone, dist_c)
            extend(frozenset(gone), hops, dist_c, srlg_c, adjacency, edges, seeds)
        missing.append(frozenset(gone))
    relayered = GroupTrees(
        group, level, colour, nexts, dists, trees.srlgs, False, "partition",
        (missing[0], missing[1]),
    )  # fmt: skip
    return relayered, redo | missing[0] | missing[1] | trees.missing[0] | trees.missing[1]


def group_trees(graph: FabricGraph, group: Group, sources: set[SwitchId]) -> GroupTrees:
    """The colour partition (shortest on Clos fabrics), or st-numberings where it falls short."""
    prefer = fast.intact_colours(graph, group)
    trees = fast.compute_group(graph, group, sources, prefer) or compute_group(
        graph, group, sources, prefer
    )
    if prefer is None:  # `graph` is the intact fabric: these are the colours to prefer
        fast.keep_intact_colours(graph, group, trees.colour)
    if not trees.fallback:
        return trees
    red, blue = st_next_hops(graph, group)
    st = GroupTrees.from_next_hops(graph, group, trees.level, red, blue, "st")
    st.missing = trees.missing  # what made the partition fall short, for incremental updates
    return st


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
    # Every pair is exactly one of: protected (shares nothing), shared risk (shares only what
    # no path choice avoids here: a single-homed end, a switch, an SRLG), unprotected.
    protected_pairs: int = 0
    shared_risk_pairs: int = 0
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


@dataclass(frozen=True)
class PlanUpdate:
    """What an incremental update recomputed (`full`: everything, the structure changed)."""

    recomputed: frozenset[Group]
    dropped: frozenset[Group]
    full: bool
    seconds: float


# GET /paths' words; "degraded" is a shared risk: only what no path choice avoids here is
# shared (a single-homed end's host link and switch, a switch, an SRLG).
Protection = Literal["protected", "degraded", "unprotected", "unreachable"]


def _protection(choice: _Choice, src: Group, dst: Group) -> Protection:
    if choice.starts is None:
        return "unreachable"
    if choice.shared_edges:
        return "unprotected"
    if choice.shared_switches or choice.shared_srlgs or len(src) == 1 or len(dst) == 1:
        return "degraded"
    return "protected"


class Plan:
    def __init__(self, graph: FabricGraph, trees: dict[Group, GroupTrees], revision: int) -> None:
        self.graph = graph
        self.trees = trees
        self.topology_revision = revision
        self.summary = PlanSummary()
        self.sources = graph.sources
        # edge index -> groups whose trees take it: what a failing link touches
        self.users: dict[int, set[Group]] = {}
        # Edges whose set this plan may change in place; None: all of them. A plan made by
        # an update shares the sets of its predecessor, which keeps serving (urgent flips
        # read it while the update runs), and copies a set before its first change.
        self._owned: set[int] | None = None
        for group, group_trees_ in trees.items():
            self._index(group, group_trees_)

    def _users_of(self, edge: int) -> set[Group]:
        """The set of groups using `edge`, this plan's own to change."""
        found = self.users.get(edge)
        if found is None:
            found = self.users[edge] = set()
        elif self._owned is not None and edge not in self._owned:
            found = self.users[edge] = set(found)
        if self._owned is not None:
            self._owned.add(edge)
        return found

    def _index(self, group: Group, trees: GroupTrees) -> None:
        for edge in trees.uses():
            self._users_of(edge).add(group)

    def _unindex(self, group: Group, trees: GroupTrees) -> None:
        for edge in trees.uses():
            self._users_of(edge).discard(group)

    def _reindex(
        self, group: Group, old: GroupTrees, new: GroupTrees, switches: set[SwitchId]
    ) -> None:
        """Update the index for next hops that changed at `switches` only."""
        edges = {
            h.edge
            for t in (old, new)
            for v in switches
            for h in (t.next[0][v], t.next[1][v])
            if h is not None and h.edge >= 0
        }
        for edge in edges:
            e = self.graph.edges[edge]
            used = any(
                h is not None and h.edge == edge
                for v in (e.u, e.v)
                for h in (new.next[0][v], new.next[1][v])
            )
            if used:
                self._users_of(edge).add(group)
            elif edge in self.users:
                self._users_of(edge).discard(group)

    @classmethod
    def compute(cls, fabric: Fabric, *, summarise: bool = True) -> Plan:
        start = time.perf_counter()
        graph = FabricGraph.from_fabric(fabric)
        sources = graph.sources
        trees = {g: group_trees(graph, g, sources) for g in graph.groups if g}
        plan = cls(graph, trees, fabric.revision)
        if summarise:
            plan.summary = plan.summarise()
        plan.summary.compute_seconds = time.perf_counter() - start
        return plan

    # --- incremental re-protection ----------------------------------------------------------

    def update(
        self, fabric: Fabric, hosts: set[str] | None = None, held_out: Set[int] = frozenset()
    ) -> tuple[Plan, PlanUpdate]:
        """The plan for `fabric`, recomputing only the groups a change can touch; `hosts`:
        only these hosts changed (nothing of the switches), the graph is patched for them;
        `held_out`: links of `fabric` to plan as out of service whatever their admin state
        (health's view), taken out in the same step: an undrained switch whose links health
        still holds out changes nothing, where first putting its links back and then taking
        them out again recomputed every group twice.

        The result equals `Plan.compute(fabric)` followed by `update_links` of `held_out`
        (tests hold it to that). A change of switches, of the set of switch-to-switch links
        or of SRLGs recomputes everything.
        """
        start = time.perf_counter()
        out = dict.fromkeys(held_out, False)
        if hosts is not None:
            graph = self.graph.with_hosts(fabric, hosts)
            graph = graph.with_link_states(out) if out else graph
            return self._update_to(graph, fabric.revision, start)
        graph = FabricGraph.from_fabric(fabric)
        if not graph.same_structure(self.graph) or any(
            a.srlgs != b.srlgs for a, b in zip(graph.edges, self.graph.edges, strict=True)
        ):
            plan = Plan.compute(fabric, summarise=False)
            if out:
                plan, _ = plan.update_links(out, fabric.revision)
            elapsed = time.perf_counter() - start
            return plan, PlanUpdate(frozenset(plan.trees), frozenset(), True, elapsed)
        graph = graph.with_link_states(out) if out else graph
        return self._update_to(graph, fabric.revision, start)

    def update_links(self, states: dict[int, bool], revision: int) -> tuple[Plan, PlanUpdate]:
        """The fast path for health events and drains: links going out of service or back."""
        start = time.perf_counter()
        return self._update_to(self.graph.with_link_states(states), revision, start)

    def _update_to(
        self, graph: FabricGraph, revision: int, start: float
    ) -> tuple[Plan, PlanUpdate]:
        """Move to `graph` (same structure), keeping every group no change can touch.

        A group is kept only when no changed link is in its trees, changes its distance
        layers or colours, or could become one of its choices. This plan stays whole: the
        urgent flips of links failing meanwhile are read from it.
        """
        changed = [
            i
            for i, (now, before) in enumerate(zip(graph.alive, self.graph.alive, strict=True))
            if now != before
        ]
        sources = graph.sources
        flipped_sources = sources ^ self.sources
        groups = {g for g in graph.groups if g}
        affected = {g for g in groups if g not in self.trees}
        repairable: set[Group] = set()
        relayerable: set[Group] = set()
        for group in groups - affected:
            trees = self.trees[group]
            # st-numbered groups depend on the whole block structure: any change redoes them.
            method_flips = bool(flipped_sources) and (
                (not sources.isdisjoint(trees.missing[0] | trees.missing[1]))
                != (trees.method == "st")
            )
            if (trees.method == "st" and changed) or method_flips:
                affected.add(group)
                continue
            reasons = {self._touches(graph, group, trees, i) for i in changed}
            if "structure" in reasons:
                affected.add(group)
                if not graph.has_srlgs:
                    relayerable.add(group)
            elif "used" in reasons:
                affected.add(group)
                if not graph.has_srlgs:
                    repairable.add(group)
        new_trees = {g: self.trees[g] for g in groups - affected}
        lost = {i for i in changed if not graph.alive[i]}
        gained = {i for i in changed if graph.alive[i]}
        repaired_at: dict[Group, set[SwitchId]] = {}
        for group in affected:
            result = None
            if group in repairable:
                result = repair(graph, self.trees[group], lost, gained, sources)
            elif group in relayerable and self.trees[group].method == "partition":
                result = relayer(graph, self.trees[group], lost | gained, sources)
            if result is not None:
                new_trees[group], repaired_at[group] = result
            else:
                new_trees[group] = group_trees(graph, group, sources)
        plan = Plan.__new__(Plan)
        plan.graph, plan.trees, plan.topology_revision = graph, new_trees, revision
        plan.summary, plan.sources = PlanSummary(), sources
        # The index is shared and copied per edge on change: this plan keeps serving.
        plan.users, plan._owned = dict(self.users), set()
        dropped = frozenset(set(self.trees) - groups)
        for group in dropped | (affected & set(self.trees)) - set(repaired_at):
            plan._unindex(group, self.trees[group])
        for group in affected - set(repaired_at):
            plan._index(group, new_trees[group])
        for group, switches in repaired_at.items():
            plan._reindex(group, self.trees[group], new_trees[group], switches)
        elapsed = time.perf_counter() - start
        return plan, PlanUpdate(frozenset(affected), dropped, False, elapsed)

    def _touches(self, graph: FabricGraph, group: Group, trees: GroupTrees, edge: int) -> str:
        """What edge `edge` going down (or up) in `graph` does to this group's trees:
        "none"; "used" (a next hop took it: re-choose those hops); "structure" (distances,
        colours or choices elsewhere may move: recompute the group)."""
        e = graph.edges[edge]
        level, colour = trees.level, trees.colour
        lu, lv = level[e.u], level[e.v]
        if not graph.alive[edge]:
            on_shortest_path = abs(lu - lv) == 1 and lu < INF and lv < INF
            if on_shortest_path:
                low, high = (e.u, e.v) if lu < lv else (e.v, e.u)
                # Does the farther end keep its distance and its view of the colours below?
                others = [w for w, _ in graph.adjacency[high] if level[w] == level[low]]
                if not others or colour[low] not in {colour[w] for w in others}:
                    return "structure"
            return "used" if group in self.users.get(edge, ()) else "none"
        if lu >= INF and lv >= INF:
            return "none"
        if lu >= INF or lv >= INF or abs(lu - lv) >= 2:
            return "structure"  # a shortcut: distances move
        for c in COLOURS:
            for end, other in ((e.u, e.v), (e.v, e.u)):
                if end in trees.missing[c] and colour[other] in (c, BOTH):
                    return "structure"  # a switch gains its first neighbour of a colour
        if lu != lv:
            low, high = (e.u, e.v) if lu < lv else (e.v, e.u)
            others = [w for w, i in graph.adjacency[high] if i != edge and level[w] == level[low]]
            if colour[low] not in {colour[w] for w in others}:
                return "structure"  # the farther end sees a new colour below: colours move
        return "used"  # only the two ends may choose differently: re-choose there

    # --- pairs ------------------------------------------------------------------------------

    def _choice(self, src: Group, dst: Group) -> _Choice:
        """Pick each colour's egress switch in `src` so the two paths share the least."""
        trees = self.trees[dst]
        shortest = min((trees.level[s] for s in src), default=INF)
        options = [(a, b) for a in src for b in src if a != b] or [(src[0], src[0])]
        best: tuple[tuple[int, ...], _Choice] | None = None
        for red_start, blue_start in options:
            red = trees.path(red_start, RED)
            blue = trees.path(blue_start, BLUE)
            if not red or not blue:
                continue
            red_nodes = {v for v, _ in red}
            blue_nodes = {v for v, _ in blue}
            shared_switches = red_nodes & blue_nodes
            red_edges = {e for _, e in red if e >= 0}
            shared_edges = red_edges & {e for _, e in blue if e >= 0}
            shared_srlgs = trees.srlgs[RED][red_start] & trees.srlgs[BLUE][blue_start]
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

    def protection(self, src: Group, dst: Group) -> Protection:
        """How the pairs from group `src` to group `dst` are protected."""
        if not src or not dst or dst not in self.trees:
            return "unreachable"
        return _protection(self._choice(src, dst), src, dst)

    def egress(self, src: Group, dst: Group) -> tuple[SwitchId, SwitchId] | None:
        """The switch each colour leaves a source group by, toward a destination group."""
        return self._choice(src, dst).starts if src and dst in self.trees else None

    def reachable(self, src: Group, dst: Group, colour: ColourIndex) -> bool:
        """Whether a host of `src` has a path of `colour` to `dst`."""
        trees = self.trees.get(dst)
        return trees is not None and any(trees.dist[colour][s] < INF for s in src)

    def blue_only(self, src: Group, dst: Group) -> bool:
        """Reachable by blue but not by red: the source must send blue."""
        return self.reachable(src, dst, BLUE) and not self.reachable(src, dst, RED)

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
        for colour, start in zip(COLOURS, choice.starts, strict=True):
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
        summary = self.summarise_unless(lambda: False)
        assert summary is not None
        return summary

    def summarise_unless(self, give_way: Callable[[], bool]) -> PlanSummary | None:
        """`summarise`, giving way (None) as soon as `give_way()` says so: it is asked once
        per destination group, so a summary of k=32 (~2 s, 512 groups) stops within a few
        ms for work that must not wait behind it."""
        summary = PlanSummary(groups=len(self.trees))
        groups = {g: hosts for g, hosts in self.graph.groups.items()}
        summary.hosts = sum(len(h) for h in groups.values())
        host_srlgs = self._host_link_srlgs()
        for dst, dst_hosts in groups.items():
            if give_way():
                return None
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
                status = _protection(choice, src, dst)
                if status == "unprotected":
                    summary.unprotected_pairs += weight
                elif status == "degraded":
                    summary.shared_risk_pairs += weight
                else:
                    summary.protected_pairs += weight
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


__all__ = [
    "HOST",
    "PairPlan",
    "Plan",
    "PlanSummary",
    "Protection",
    "Route",
    "SharedRisks",
    "UnknownHost",
]
