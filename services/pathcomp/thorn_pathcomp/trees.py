"""Red and blue trees toward one attachment group: the heart of THORN's path computation.

Method (colour partition by distance layers):

1. Layer the switches by hop distance to the destination's attachment switches (BFS).
2. Colour every switch red or blue, from the destination outward: attachment switches of a
   multi-homed group alternate red/blue; the neighbours of a single attachment switch
   alternate; every farther switch takes the colour of its shortest-path neighbours, and a
   switch that has shortest-path neighbours of both colours alternates, so the layer above
   it again sees both colours. A switch free to choose takes the colour it has with every
   link of the fabric in service (`fast.intact_colours`): counting the choosers afresh made
   one link's loss shift the count, and so the colour, of every chooser after it (a single
   edge-aggregation failure recoloured 183 of k=16's 320 switches and rewrote nearly every
   switch's routes).
3. The red tree routes only through red switches, the blue tree only through blue ones: a
   switch's own colour follows a shortest-path neighbour of that colour, the other colour
   leaves through the nearest neighbour of the other colour.

A source's red path is the source plus red switches, its blue path the source plus blue
switches, so the two are node- (hence link-) disjoint by construction. On leaf-spine and
fat-tree fabrics every source switch has shortest-path neighbours of both colours, so both
paths are shortest. Where a switch has no neighbour of one colour (odd topologies) that colour
falls back to the nearest switch that has a path of that colour; the plan then checks the two
paths and reports what they share instead of hiding it.

SRLGs: among equally short choices the other colour prefers a next hop whose path shares no
SRLG with the first colour's path. Ties always break by switch number, then link id.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, SupportsInt

from thorn.model import Colour
from thorn_pathcomp.graph import Edge, FabricGraph, Group, SwitchId

INF = 1 << 30
BOTH = -2  # colour of a single attachment switch: both trees end there
HOST = -1  # next hop "the destination host itself" (an attachment switch's last hop)


# Per-colour data sits in pairs indexed by `thorn.model.Colour.position`: THORN has one colour
# type, and its trees read the index in their inner loops.
ColourIndex = int
RED: ColourIndex = Colour.red.position
BLUE: ColourIndex = Colour.blue.position
COLOURS: tuple[ColourIndex, ColourIndex] = (RED, BLUE)
COLOUR_AT: tuple[Colour, Colour] = (Colour.red, Colour.blue)  # index -> the colour itself


class Colouring(Protocol):
    """A colour per switch number (a list, or fast.py's array)."""

    def __getitem__(self, v: int, /) -> SupportsInt: ...


def other_colour(c: ColourIndex) -> ColourIndex:
    return 1 - c


class NextHop(NamedTuple):
    """A tree's step from a switch. A NamedTuple: a plan holds millions of them (made 3x
    faster than a frozen dataclass, and compact to pickle)."""

    switch: SwitchId  # HOST when the next hop is the destination host
    edge: int  # edge index in graph.edges; -1 for the host link


@dataclass
class GroupTrees:
    """Both trees toward one attachment group, for every switch that can reach it."""

    group: Group
    level: list[int]  # hops to the nearest attachment switch (INF: unreachable)
    colour: list[int]  # Colour of each switch in this group's partition; -1 unreachable
    next: tuple[list[NextHop | None], list[NextHop | None]]  # per colour, per switch
    dist: tuple[list[int], list[int]]  # per colour: hops to an attachment switch
    srlgs: tuple[list[frozenset[str]], list[frozenset[str]]]  # SRLGs on each path
    fallback: bool  # some source switch lacks a neighbour of one colour
    method: str = "partition"  # or "st": the general method of stnumber.py
    # Per colour, the switches that had no neighbour of that colour (decides `fallback`).
    missing: tuple[frozenset[SwitchId], frozenset[SwitchId]] = (frozenset(), frozenset())
    # backups.routing's results per (graph state, colour): derived, not part of the trees.
    derived: dict[tuple[int, int], tuple[object, object]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Per colour, the switches whose next hop each switch is, as (offsets, switches) arrays:
    # flips.py's, built ahead of a failure. Arrays, not a list per switch: the collector does
    # not walk them (1.3 M lists at k=32 made its young collections take 50-190 ms). Apart
    # from `derived`, which backups.routing empties as graph states pass.
    children: dict[int, tuple[array[int], array[int]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_next_hops(
        cls,
        graph: FabricGraph,
        group: Group,
        level: list[int],
        red: list[NextHop | None],
        blue: list[NextHop | None],
        method: str,
    ) -> GroupTrees:
        """Trees given by their next hops: derive each switch's distance and path SRLGs."""
        n = len(graph.switches)
        dists = ([INF] * n, [INF] * n)
        srlgs: tuple[list[frozenset[str]], list[frozenset[str]]] = (
            [frozenset()] * n,
            [frozenset()] * n,
        )
        for colour, hops in ((0, red), (1, blue)):
            for start in range(n):
                chain: list[int] = []
                v = start
                while dists[colour][v] >= INF and hops[v] is not None and len(chain) <= n:
                    chain.append(v)
                    nh = hops[v]
                    assert nh is not None
                    if nh.switch == HOST:
                        dists[colour][v] = 0
                        break
                    v = nh.switch
                for w in reversed(chain):
                    nh = hops[w]
                    if nh is None or nh.switch == HOST:
                        continue
                    base = dists[colour][nh.switch]
                    if base < INF:
                        dists[colour][w] = base + 1
                        srlgs[colour][w] = graph.edges[nh.edge].srlgs | srlgs[colour][nh.switch]
        return cls(group, level, [-1] * n, (red, blue), dists, srlgs, False, method)

    def uses(self) -> set[int]:
        """Edge indices any next hop of either tree takes."""
        return {h.edge for hops in self.next for h in hops if h is not None and h.edge >= 0}

    def path(self, start: SwitchId, colour: ColourIndex) -> list[tuple[SwitchId, int]]:
        """(switch, edge taken from it) along `colour`'s tree; the last edge is -1 (host)."""
        hops: list[tuple[SwitchId, int]] = []
        node = start
        for _ in range(len(self.level) + 1):
            nh = self.next[colour][node]
            if nh is None:
                return []
            hops.append((node, nh.edge))
            if nh.switch == HOST:
                return hops
            node = nh.switch
        raise AssertionError("a tree has a loop")  # distances strictly fall: cannot happen


def layers_and_colours(
    graph: FabricGraph, group: Group, prefer: Colouring | None = None
) -> tuple[list[int], list[int], list[SwitchId]]:
    """Steps 1 and 2: each switch's distance to the group and its colour, and the order
    (layer by layer, by switch number) in which the colours were given. A switch free to
    choose takes `prefer[v]`, or with None alternates with the choosers before it (which
    is how `prefer` itself is made, on the intact fabric)."""
    n = len(graph.switches)
    adjacency = graph.adjacency
    level = [INF] * n
    colour = [-1] * n
    single = len(group) == 1
    if not single:
        for i, s in enumerate(group):
            colour[s] = i % 2
    # Breadth first, a layer at a time; `below[v]`: v's neighbours one layer nearer (each
    # edge is looked at once, from its nearer end: the colouring then reads only these).
    below: list[list[SwitchId]] = [[] for _ in range(n)]
    frontier = sorted(group)
    for s in frontier:
        level[s] = 0
    order: list[SwitchId] = []
    depth = 0
    while frontier:
        depth += 1
        nxt: list[SwitchId] = []
        for v in frontier:
            for u, _ in adjacency[v]:
                lu = level[u]
                if lu == INF:
                    level[u] = depth
                    nxt.append(u)
                    below[u].append(v)
                elif lu == depth:
                    below[u].append(v)
        # Each layer in switch number order: the order depends on distances only, so a
        # link that changes no distance changes no colour (what incremental updates rely on).
        nxt.sort()
        order.extend(nxt)
        frontier = nxt
    order = [*sorted(group), *order]
    alternate = 0
    for v in order:
        if level[v] == 0:
            continue
        seen = 0  # bit c: a shortest-path neighbour has colour c
        for u in below[v]:
            cu = colour[u]
            if cu >= 0:
                seen |= 1 << cu
                if seen == 3:
                    break
        if (single and level[v] == 1) or seen not in (1, 2):
            if prefer is None:
                colour[v] = alternate % 2
                alternate += 1
            else:
                colour[v] = int(prefer[v])
        else:
            colour[v] = seen - 1  # 1 -> red, 2 -> blue
    if single:
        colour[group[0]] = BOTH  # the one attachment switch ends both colours
    return level, colour, order


def compute_group(
    graph: FabricGraph, group: Group, sources: set[SwitchId], prefer: Colouring | None = None
) -> GroupTrees:
    """Both trees toward `group`; `sources` are the switches with hosts (graph.sources);
    `prefer`: the colours of switches free to choose (`layers_and_colours`)."""
    n = len(graph.switches)
    adjacency, edges = graph.adjacency, graph.edges
    single = len(group) == 1
    level, colour, order = layers_and_colours(graph, group, prefer)
    seed = group_seed(group)
    # 3: next hops per colour; own colour down the layers, the other colour sideways.
    nexts: tuple[list[NextHop | None], list[NextHop | None]] = ([None] * n, [None] * n)
    dists = ([INF] * n, [INF] * n)
    empty: frozenset[str] = frozenset()
    srlgs: tuple[list[frozenset[str]], list[frozenset[str]]] = ([empty] * n, [empty] * n)
    to_host = NextHop(HOST, -1)
    for c in COLOURS:
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        for v in order:  # own colour: a shortest-path neighbour of that colour
            lv = level[v]
            if lv == 0:
                if single or colour[v] == c:
                    nh_c[v], dist_c[v] = to_host, 0
                continue
            if colour[v] == c:
                choice = own_choice(v, c, level, colour, adjacency, seed)
                if choice is not None:
                    nh_c[v], dist_c[v] = choice, lv
                    link_srlgs = edges[choice.edge].srlgs
                    base = srlg_c[choice.switch]
                    srlg_c[v] = base | link_srlgs if link_srlgs else base
    fallback = False
    missing_sets: list[frozenset[SwitchId]] = []
    for c in COLOURS:
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        own_hops, own_srlgs = nexts[other_colour(c)], srlgs[other_colour(c)]
        for v in order:  # the other colour: the nearest neighbour of that colour
            if nh_c[v] is not None:
                continue
            own = own_hops[v]
            choice = other_choice(
                v, c, colour, dist_c, srlg_c, adjacency, edges, own, own_srlgs[v], seed
            )
            if choice is not None:
                nh_c[v], dist_c[v] = choice, dist_c[choice.switch] + 1
                link_srlgs = edges[choice.edge].srlgs
                base = srlg_c[choice.switch]
                srlg_c[v] = base | link_srlgs if link_srlgs else base
        # Switches with no neighbour of colour c: extend c's tree outwards (nearest first).
        missing = [v for v in order if nh_c[v] is None]
        missing_sets.append(frozenset(missing))
        if missing:
            # Only a source switch matters: transit switches carry one colour anyway.
            fallback = fallback or not sources.isdisjoint(missing)
            extend(missing, nh_c, dist_c, srlg_c, adjacency, edges)
    missing_pair = (missing_sets[0], missing_sets[1])
    return GroupTrees(
        group, level, colour, nexts, dists, srlgs, fallback, "partition", missing_pair
    )


MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: link weights per destination seed


def group_seed(group: Group) -> int:
    return _mix(sum((s + 1) * 0x9E3779B1 for s in group))


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def own_choice(
    v: SwitchId,
    c: ColourIndex,
    level: list[int],
    colour: list[int],
    adjacency: list[list[tuple[SwitchId, int]]],
    seed: int,
) -> NextHop | None:
    """Among v's shortest-path neighbours of colour c, the one with the highest rendezvous
    weight for this destination: destinations spread over equal links (like ECMP), and
    losing a link that was not chosen never changes the choice. (Weights hash the edge's
    index, which stays fixed while links go down and up.)"""
    want = level[v] - 1
    best_weight, best_u, best_e = -1, -1, -1
    for u, e in adjacency[v]:
        if level[u] == want and (colour[u] == c or colour[u] == BOTH):
            weight = ((seed ^ e) * GOLDEN) & MASK64
            if weight > best_weight:
                best_weight, best_u, best_e = weight, u, e
    return NextHop(best_u, best_e) if best_e >= 0 else None


def other_choice(
    v: SwitchId,
    c: ColourIndex,
    colour: list[int],
    dist_c: list[int],
    srlg_c: list[frozenset[str]],
    adjacency: list[list[tuple[SwitchId, int]]],
    edges: list[Edge],
    own: NextHop | None,
    avoid: frozenset[str],
    seed: int,
) -> NextHop | None:
    """v's next hop for the colour it is not: the nearest neighbour of colour c, preferring
    one whose path shares no SRLG with v's own-colour path, then the highest rendezvous
    weight (spreads destinations; a lost link that was not chosen changes nothing). Never
    the link v's own colour takes."""
    taken = own.edge if own is not None else -1
    best_d, best_conflict, best_weight, best_u, best_e = INF, 2, -1, -1, -1
    for u, e in adjacency[v]:
        d = dist_c[u]
        if d > best_d or d >= INF or e == taken or (colour[u] != c and colour[u] != BOTH):
            continue
        conflict = 1 if avoid and (edges[e].srlgs | srlg_c[u]) & avoid else 0
        if d == best_d and conflict > best_conflict:
            continue
        weight = ((seed ^ e) * GOLDEN) & MASK64
        if d < best_d or conflict < best_conflict or weight > best_weight:
            best_d, best_conflict, best_weight, best_u, best_e = d, conflict, weight, u, e
    return NextHop(best_u, best_e) if best_e >= 0 else None


def extend(
    missing: frozenset[SwitchId] | list[SwitchId],
    nh_c: list[NextHop | None],
    dist_c: list[int],
    srlg_c: list[frozenset[str]],
    adjacency: list[list[tuple[SwitchId, int]]],
    edges: list[Edge],
    seeds: list[tuple[int, SwitchId]] | None = None,
) -> None:
    """Give every switch still without colour c a next hop towards c's tree.

    A multi-source Dijkstra (unit weights) from the switches next to them that have a c
    path: nearest first, ties by switch number then link id, so the result is deterministic
    and distances strictly fall along every next hop (no loops). `seeds`: those starting
    (distance, switch) pairs when the caller has them already (fast.py computes them).
    """
    todo = set(missing)
    for v in todo:  # (re)build: forget what an earlier extension chose
        nh_c[v], dist_c[v] = None, INF
    if seeds is None:
        seeds = list({(dist_c[u], u) for v in todo for u, _ in adjacency[v] if dist_c[u] < INF})
    heap = list(seeds)
    heapq.heapify(heap)
    while heap and todo:
        d, u = heapq.heappop(heap)
        for v, e in adjacency[u]:
            if v in todo:
                todo.discard(v)
                nh_c[v], dist_c[v] = NextHop(u, e), d + 1
                link_srlgs = edges[e].srlgs
                srlg_c[v] = srlg_c[u] | link_srlgs if link_srlgs else srlg_c[u]
                heapq.heappush(heap, (d + 1, v))
