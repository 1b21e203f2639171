"""Red and blue trees toward one attachment group: the heart of THORN's path computation.

Method (colour partition by distance layers):

1. Layer the switches by hop distance to the destination's attachment switches (BFS).
2. Colour every switch red or blue, from the destination outward: attachment switches of a
   multi-homed group alternate red/blue; the neighbours of a single attachment switch
   alternate; every farther switch takes the colour of its shortest-path neighbours, and a
   switch that has shortest-path neighbours of both colours alternates, so the layer above
   it again sees both colours.
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
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

from thorn_pathcomp.graph import Edge, FabricGraph, Group, SwitchId

INF = 1 << 30
HOST = -1  # next hop "the destination host itself" (an attachment switch's last hop)


class Colour(IntEnum):
    red = 0
    blue = 1

    @property
    def other(self) -> Colour:
        return Colour(1 - self)


@dataclass(frozen=True)
class NextHop:
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

    def used_edges(self) -> set[int]:
        return {h.edge for hops in self.next for h in hops if h is not None and h.edge >= 0}

    def path(self, start: SwitchId, colour: Colour) -> list[tuple[SwitchId, int]]:
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


def compute_group(graph: FabricGraph, group: Group, sources: set[SwitchId]) -> GroupTrees:
    """Both trees toward `group`; `sources` are the switches with hosts (graph.sources)."""
    n = len(graph.switches)
    adjacency, edges = graph.adjacency, graph.edges
    level = [INF] * n
    colour = [-1] * n
    queue: deque[SwitchId] = deque()
    for s in group:
        level[s] = 0
        queue.append(s)
    single = len(group) == 1
    if not single:
        for i, s in enumerate(group):
            colour[s] = i % 2
    # 1 + 2: BFS layers, colouring each switch from its shortest-path neighbours.
    order: list[SwitchId] = []
    while queue:
        v = queue.popleft()
        order.append(v)
        for u, _ in adjacency[v]:
            if level[u] == INF:
                level[u] = level[v] + 1
                queue.append(u)
    alternate = 0
    for v in order:
        if level[v] == 0:
            continue
        below = {colour[u] for u, _ in adjacency[v] if level[u] == level[v] - 1}
        if single and level[v] == 1:
            colour[v] = alternate % 2
            alternate += 1
        elif len(below - {-1}) == 1:
            colour[v] = next(iter(below - {-1}))
        else:
            colour[v] = alternate % 2
            alternate += 1
    if single:
        colour[group[0]] = -2  # the one attachment switch ends both colours
    # 3: next hops per colour; own colour down the layers, the other colour sideways.
    nexts: tuple[list[NextHop | None], list[NextHop | None]] = ([None] * n, [None] * n)
    dists = ([INF] * n, [INF] * n)
    srlgs: tuple[list[frozenset[str]], list[frozenset[str]]] = (
        [frozenset()] * n,
        [frozenset()] * n,
    )
    fallback = False
    for c in (Colour.red, Colour.blue):
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        for v in order:  # own colour and attachments first: they only look downwards
            if level[v] == 0 and (single or colour[v] == c):
                nh_c[v], dist_c[v] = NextHop(HOST, -1), 0
            elif colour[v] == c:
                best = _best(
                    v, c, level, colour, dist_c, srlg_c, adjacency, edges, None, below=True
                )
                if best is not None:
                    nh_c[v] = best
                    dist_c[v] = level[v]
                    srlg_c[v] = edges[best.edge].srlgs | srlg_c[best.switch]
    for c in (Colour.red, Colour.blue):
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        other_srlg = srlgs[c.other]
        for v in order:
            if nh_c[v] is not None or level[v] == INF:
                continue
            own = nexts[c.other][v]
            best = _best(
                v,
                c,
                level,
                colour,
                dist_c,
                srlg_c,
                adjacency,
                edges,
                other_srlg[v],
                below=False,
                taken=own.edge if own is not None else None,
            )
            if best is not None:
                nh_c[v] = best
                dist_c[v] = 1 + dist_c[best.switch]
                srlg_c[v] = edges[best.edge].srlgs | srlg_c[best.switch]
        # Switches with no neighbour of colour c: extend c's tree outwards (nearest first).
        missing = [v for v in order if nh_c[v] is None]
        if missing:
            # Only a source switch matters: transit switches carry one colour anyway.
            fallback = fallback or not sources.isdisjoint(missing)
            _extend(missing, nh_c, dist_c, srlg_c, adjacency, edges)
    return GroupTrees(group, level, colour, nexts, dists, srlgs, fallback)


def _best(
    v: SwitchId,
    c: Colour,
    level: list[int],
    colour: list[int],
    dist_c: list[int],
    srlg_c: list[frozenset[str]],
    adjacency: list[list[tuple[SwitchId, int]]],
    edges: list[Edge],
    avoid: frozenset[str] | None,
    *,
    below: bool,
    taken: int | None = None,
) -> NextHop | None:
    """The best neighbour of colour c: shortest, then SRLG-clean, then lowest number/link."""
    best: tuple[int, int, int, int] | None = None
    choice: NextHop | None = None
    for u, e in adjacency[v]:
        if (below and level[u] != level[v] - 1) or e == taken:
            continue  # `taken`: the other colour's link; never let both colours share it
        if not (colour[u] == c or colour[u] == -2) or dist_c[u] >= INF:
            continue
        conflict = 0
        if avoid:
            conflict = 1 if (edges[e].srlgs | srlg_c[u]) & avoid else 0
        key = (dist_c[u], conflict, u, edges[e].link_id)
        if best is None or key < best:
            best, choice = key, NextHop(u, e)
    return choice


def _extend(
    missing: list[SwitchId],
    nh_c: list[NextHop | None],
    dist_c: list[int],
    srlg_c: list[frozenset[str]],
    adjacency: list[list[tuple[SwitchId, int]]],
    edges: list[Edge],
) -> None:
    """Give every switch still without colour c a next hop towards c's tree.

    A multi-source Dijkstra (unit weights) seeded with every switch that has a c path:
    nearest first, ties by switch number then link id, so the result is deterministic and
    distances strictly fall along every next hop (no loops).
    """
    todo = set(missing)
    heap = [(dist_c[u], u) for u in range(len(dist_c)) if dist_c[u] < INF]
    heapq.heapify(heap)
    while heap and todo:
        d, u = heapq.heappop(heap)
        if d != dist_c[u]:
            continue
        for v, e in adjacency[u]:
            if v in todo and dist_c[v] > d + 1:
                nh_c[v] = NextHop(u, e)
                dist_c[v] = d + 1
                srlg_c[v] = edges[e].srlgs | srlg_c[u]
                heapq.heappush(heap, (d + 1, v))
        todo -= {v for v, _ in adjacency[u] if dist_c[v] == d + 1}
