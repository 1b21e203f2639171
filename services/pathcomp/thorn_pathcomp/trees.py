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
BOTH = -2  # colour of a single attachment switch: both trees end there
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
        lv = level[v]
        if lv == 0:
            continue
        seen = 0  # bit c: a shortest-path neighbour has colour c
        for u, _ in adjacency[v]:
            if level[u] == lv - 1 and colour[u] >= 0:
                seen |= 1 << colour[u]
                if seen == 3:
                    break
        if (single and lv == 1) or seen not in (1, 2):
            colour[v] = alternate % 2
            alternate += 1
        else:
            colour[v] = seen - 1  # 1 -> red, 2 -> blue
    if single:
        colour[group[0]] = BOTH  # the one attachment switch ends both colours
    # 3: next hops per colour; own colour down the layers, the other colour sideways.
    nexts: tuple[list[NextHop | None], list[NextHop | None]] = ([None] * n, [None] * n)
    dists = ([INF] * n, [INF] * n)
    empty: frozenset[str] = frozenset()
    srlgs: tuple[list[frozenset[str]], list[frozenset[str]]] = ([empty] * n, [empty] * n)
    to_host = NextHop(HOST, -1)
    for c in (Colour.red, Colour.blue):
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        for v in order:  # own colour: the first shortest-path neighbour of that colour
            lv = level[v]
            if lv == 0:
                if single or colour[v] == c:
                    nh_c[v], dist_c[v] = to_host, 0
                continue
            if colour[v] != c:
                continue
            for u, e in adjacency[v]:
                if level[u] == lv - 1 and (colour[u] == c or colour[u] == BOTH):
                    nh_c[v], dist_c[v] = NextHop(u, e), lv
                    link_srlgs = edges[e].srlgs
                    srlg_c[v] = srlg_c[u] | link_srlgs if link_srlgs else srlg_c[u]
                    break
    fallback = False
    for c in (Colour.red, Colour.blue):
        nh_c, dist_c, srlg_c = nexts[c], dists[c], srlgs[c]
        own_hops, own_srlgs = nexts[c.other], srlgs[c.other]
        for v in order:  # the other colour: the nearest neighbour of that colour
            if nh_c[v] is not None:
                continue
            own = own_hops[v]
            taken = own.edge if own is not None else None  # never share the own colour's link
            avoid = own_srlgs[v]
            best_d, best_conflict, choice = INF, 2, None
            for u, e in adjacency[v]:
                d = dist_c[u]
                if d >= INF or d > best_d or e == taken or (colour[u] != c and colour[u] != BOTH):
                    continue
                if d == best_d and best_conflict == 0:
                    continue  # an equally short, SRLG-clean choice came earlier in number order
                conflict = 1 if avoid and (edges[e].srlgs | srlg_c[u]) & avoid else 0
                if d < best_d or conflict < best_conflict:  # ties: first in number order
                    best_d, best_conflict, choice = d, conflict, NextHop(u, e)
            if choice is not None:
                nh_c[v], dist_c[v] = choice, best_d + 1
                link_srlgs = edges[choice.edge].srlgs
                base = srlg_c[choice.switch]
                srlg_c[v] = base | link_srlgs if link_srlgs else base
        # Switches with no neighbour of colour c: extend c's tree outwards (nearest first).
        missing = [v for v in order if nh_c[v] is None]
        if missing:
            # Only a source switch matters: transit switches carry one colour anyway.
            fallback = fallback or not sources.isdisjoint(missing)
            _extend(missing, nh_c, dist_c, srlg_c, adjacency, edges)
    return GroupTrees(group, level, colour, nexts, dists, srlgs, fallback)


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
