"""How switches route one colour toward one group, and their loop-free backup next hops:
the switch-local tier of failover.

Routes: a switch on some source's path of the colour follows the colour's tree. A switch
that no path of the colour crosses (no tree child, no hosts of its own: in a two-tier Clos,
the spines of the other colour) carries that colour only when a neighbour's backup sends
it there, so its route simply descends toward the destination (a neighbour of a lower BFS
level, the nearest along the routes). No tree path passes through such a switch, and each
descent lowers the level, so these routes cannot loop either; they are what makes a
leaf's backup through the other colour's spine possible at all.

For a switch `v` and one colour's tree toward a destination group, the backup is a
neighbour `u`, over another alive link, that is strictly closer to the destination along
that same tree (`dist[u] < dist[v]`): RFC 5286's "downstream path" condition. Forwarding
from `u` only ever moves to switches closer still, so it can never come back to `v`; and
when several backups are active at once (a whole switch failed), every step still lowers
the distance, so no combination of activated backups can loop. The price is coverage: a
switch that has no closer neighbour but its primary (a spine's last hop down to a leaf in
a two-tier Clos) gets no backup, and that is reported as a local risk, never patched with
an alternate that might loop. Those failures are repaired by the source flip instead.

Where no downstream neighbour exists (a spine's last hop down to a leaf in a two-tier Clos),
a U-turn alternate may (draft-atlas-ip-local-protect-uturn): a neighbour `u` whose own
primary comes straight back to `v` over that very link, and which has a downstream backup
`b` of its own. Every switch agent installs the U-turn rule, derived from its own routes
alone: a packet that arrives on the port its primary route would send it out of takes that
route's backup instead (an `ip rule iif PORT` table per port). In normal forwarding no
packet ever arrives that way, so the rule changes nothing until a neighbour relies on it.
Then `v -> u -> b -> ...` is loop-free: `dist[b] <= dist[v]` and `b != v`, and from `b`
the walk descends strictly, so it never reaches `v` or the failed link. It is chosen only
where it also protects against the primary switch `w` failing (the walk from `b` never
passes `w`), or where `w` is the group's only attachment switch (if `w` dies, nothing
reaches the group anyway); a U-turn through `w` could otherwise bounce between two
switches that both lost `w`.

Among the candidates, a neighbour other than the primary's is preferred: it protects
against the primary switch failing too (node protection). Such a `u` has `dist[u] <=
dist[w]` for the primary next hop `w`, so its own walk cannot pass through `w` either.
A parallel link to `w` protects the link only. Among equally near candidates, a weight
per (destination, link) decides, as the trees' own choices do (`fast._weights`): the
backups toward different destinations spread over the uplinks instead of all piling onto
the lowest-numbered one, and every replica picks the same.

Computed with arrays over the graph's CSR (`fast.csr`) for every switch of a group at
once, and kept with the group's trees per graph state (`GroupTrees.derived`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thorn.model import Colour
from thorn_pathcomp.fast import Csr, Ints, _ranges, _weights, csr
from thorn_pathcomp.graph import FabricGraph
from thorn_pathcomp.trees import (
    COLOUR_AT,
    COLOURS,
    HOST,
    INF,
    ColourIndex,
    GroupTrees,
    NextHop,
    group_seed,
)

__all__ = [
    "ColourRouting",
    "backup_hops",
    "carry_routing",
    "gained_link_moves",
    "local_repair",
    "routing",
]


@dataclass(frozen=True)
class ColourRouting:
    """Every switch's route of one colour toward one group, and its backup."""

    next: list[NextHop | None]  # None: no route of this colour
    dist: list[int]  # hops to an attachment switch along `next`
    backup: dict[int, NextHop]  # switch -> loop-free alternate (absent: none)
    uturn: frozenset[int] = frozenset()  # switches whose backup is a U-turn alternate


def routing(graph: FabricGraph, trees: GroupTrees, colour: ColourIndex) -> ColourRouting:
    """The switches' routes of `colour` toward `trees.group` in `graph` (kept with the
    trees, per graph state)."""
    key = (id(graph.adjacency), int(colour))
    hit = trees.derived.get(key)
    if hit is not None and hit[0] is graph.adjacency:
        assert isinstance(hit[1], ColourRouting)
        return hit[1]
    nexts, dist = _descend_idle(graph, trees, colour)
    backups, uturns = backup_hops(graph, nexts, dist, group_seed(trees.group), trees.group)
    found = ColourRouting(nexts, dist, backups, uturns)
    _remember(trees, graph, int(colour), found)
    return found


DERIVED_KEPT = 4  # routings kept per group: both colours of the last two graph states


def _remember(trees: GroupTrees, graph: FabricGraph, colour: int, found: ColourRouting) -> None:
    """Keep `found` with the trees for `graph`'s state, dropping the oldest beyond
    DERIVED_KEPT (the dict keeps insertion order)."""
    trees.derived[(id(graph.adjacency), colour)] = (graph.adjacency, found)
    while len(trees.derived) > DERIVED_KEPT:
        del trees.derived[next(iter(trees.derived))]


def carry_routing(
    old_graph: FabricGraph,
    before: GroupTrees,
    graph: FabricGraph,
    trees: GroupTrees,
    *,
    known_only: bool = False,
) -> None:
    """Keep the routing of `before` in `old_graph` as that of `trees` (equal to `before`)
    in `graph`: for a caller that established no change between the two can move it (a
    link that failed or came back where this group neither used nor takes it). The next
    event then starts from it instead of computing it again. With `known_only`, only a
    routing already computed is carried (none is computed for it)."""
    for colour in COLOURS:
        if known_only:
            hit = before.derived.get((id(old_graph.adjacency), int(colour)))
            if hit is None or hit[0] is not old_graph.adjacency:
                continue
        _remember(trees, graph, int(colour), routing(old_graph, before, colour))


def _descend_idle(
    graph: FabricGraph, trees: GroupTrees, colour: ColourIndex
) -> tuple[list[NextHop | None], list[int]]:
    """The tree's next hops, with idle switches (no tree child, no hosts) descending:
    level by level from the destination, each takes the neighbour of a lower level that is
    nearest along the routes (arrays: this runs for every group and colour)."""
    c = csr(graph)
    hops = list(trees.next[colour])
    dist = np.array(trees.dist[colour], dtype=np.int64)
    level = np.array(trees.level, dtype=np.int64)
    nxt = np.array([h.switch if h is not None else -1 for h in hops], dtype=np.int64)
    routed = nxt >= 0  # a route to another switch (HOST and None are negative)
    children = np.bincount(nxt[routed], minlength=len(hops))
    idle = routed & (children == 0)
    if graph.groups:
        idle[list(graph.sources)] = False
    candidates = np.flatnonzero(idle)
    for depth in np.unique(level[candidates]).tolist():
        at = candidates[level[candidates] == depth]
        entries = _ranges(c.indptr[at], c.indptr[at + 1])
        nbr = c.nbr[entries]
        ok = (level[nbr] < depth) & (dist[nbr] < INF)
        entries, nbr = entries[ok], nbr[ok]
        if not entries.size:
            continue
        src = c.src[entries]
        # The nearest neighbour, then the lowest edge index (a neighbour's edges are unique).
        best = _segment_best(
            src, (MAX_DIST - np.minimum(dist[nbr], MAX_DIST)) * EDGES - c.eid[entries]
        )
        v, k = src[best], entries[best]
        shorter = dist[c.nbr[k]] + 1 < dist[v]
        v, k = v[shorter], k[shorter]
        dist[v] = dist[c.nbr[k]] + 1
        hop = c.hop
        for switch, entry in zip(v.tolist(), k.tolist(), strict=True):
            hops[switch] = hop[entry]
    return hops, dist.tolist()


def backup_hops(
    graph: FabricGraph,
    hops: list[NextHop | None],
    dist_of: list[int],
    seed: int,
    group: tuple[int, ...] = (),
) -> tuple[dict[int, NextHop], frozenset[int]]:
    """(switch -> its backup next hop, the switches whose backup is a U-turn), given every
    switch's route (`hops`) toward `group` and distance along the routes (`dist_of`);
    switches with none, or with no route, are absent."""
    c = csr(graph)
    n = len(graph.switches)
    dist = np.asarray(dist_of, dtype=np.int64)
    primary_switch = np.full(n, -1, dtype=np.int64)
    primary_edge = np.full(n, -1, dtype=np.int64)
    rows_of: list[int] = []
    for v, hop in enumerate(hops):
        if hop is None or hop.switch == HOST:  # no route, or the last hop to the host
            continue
        primary_switch[v], primary_edge[v] = hop.switch, hop.edge
        rows_of.append(v)
    if not rows_of:
        return {}, frozenset()
    sources: Ints = np.array(rows_of, dtype=np.int64)
    found = _choose(c, dist, primary_switch, primary_edge, sources, seed)
    uncovered = sources[~np.isin(sources, np.fromiter(found, np.int64, len(found)))]
    only = group[0] if len(group) == 1 else -1
    uturns = _uturns(c, dist, primary_switch, primary_edge, uncovered, found, only, seed)
    found.update(uturns)
    return found, frozenset(uturns)


def _uturns(
    c: Csr,
    dist: Ints,
    primary_switch: Ints,
    primary_edge: Ints,
    sources: Ints,
    downstream: dict[int, NextHop],
    only_attachment: int,
    seed: int,
) -> dict[int, NextHop]:
    """U-turn alternates for `sources` (switches with no downstream backup): a neighbour
    `u` over another link whose primary is the link back to `v`, with a downstream backup
    `b` not `v` whose walk never passes `v`'s primary switch `w` (unless `w` is the group's
    only attachment switch, `only_attachment`)."""
    if not sources.size or not downstream:
        return {}
    entries = _ranges(c.indptr[sources], c.indptr[sources + 1])
    if not entries.size:
        return {}
    n = len(dist)
    backup_switch = np.full(n, -1, dtype=np.int64)
    for u, alternate in downstream.items():
        backup_switch[u] = alternate.switch
    src, nbr, eid = c.src[entries], c.nbr[entries], c.eid[entries]
    w, b = primary_switch[src], backup_switch[nbr]
    ok = (eid != primary_edge[src]) & (nbr != w) & (primary_edge[nbr] == eid)
    ok &= (b >= 0) & (b != src) & (b != w)
    # Node protection: follow the primaries from `b` (strictly descending, so at most
    # max-distance steps) and refuse candidates whose walk meets `w`.
    passes = np.zeros(entries.size, dtype=bool)
    at = np.where(ok, b, -1)
    steps = int(dist[dist < INF].max(initial=0)) + 1
    for _ in range(steps):
        live = at >= 0
        if not live.any():
            break
        passes |= live & (at == w)
        at = np.where(live, primary_switch[np.maximum(at, 0)], -1)
    ok &= ~passes | (w == only_attachment)
    entries, src, eid = entries[ok], src[ok], eid[ok]
    if not entries.size:
        return {}
    best = _segment_best(src, (_weights(seed, eid) >> np.uint64(12)).astype(np.int64))
    hop = c.hop
    return {v: hop[k] for v, k in zip(src[best].tolist(), entries[best].tolist(), strict=True)}


def _choose(
    c: Csr, dist: Ints, primary_switch: Ints, primary_edge: Ints, sources: Ints, seed: int
) -> dict[int, NextHop]:
    entries = _ranges(c.indptr[sources], c.indptr[sources + 1])
    if not entries.size:
        return {}
    src, nbr, eid = c.src[entries], c.nbr[entries], c.eid[entries]
    ok = (dist[nbr] < dist[src]) & (eid != primary_edge[src]) & (dist[src] < INF)
    entries, src, nbr, eid = entries[ok], src[ok], nbr[ok], eid[ok]
    if not entries.size:
        return {}
    best = _segment_best(src, _backup_keys(nbr, primary_switch[src], dist[nbr], eid, seed))
    hop = c.hop  # one NextHop per CSR entry, shared by every group of this graph
    return {v: hop[k] for v, k in zip(src[best].tolist(), entries[best].tolist(), strict=True)}


def _backup_keys(nbr: Ints, primary: Ints, dist_nbr: Ints, eid: Ints, seed: int) -> Ints:
    """A downstream backup candidate's rank (the largest wins): node protection first, then
    the nearest neighbour, then the highest weight; one int64 (1 bit, 10 bits of distance,
    the weight's top 52 bits)."""
    key: Ints = (nbr != primary).astype(np.int64) << 62
    key |= (MAX_DIST - np.minimum(dist_nbr, MAX_DIST)) << 52
    key |= (_weights(seed, eid) >> np.uint64(12)).astype(np.int64)
    return key


def gained_link_moves(
    old_graph: FabricGraph, trees: GroupTrees, colour: ColourIndex, r: ColourRouting, edge: int
) -> bool:
    """Whether link `edge`, back in service while `trees` stayed as they were, changes any
    route or backup of `r` (the routing in `old_graph`, before it came back). With the trees
    and so every distance unchanged, only an end of the link can take it: as an idle
    switch's descent (it beats that end's best lower neighbour and shortens its route) or
    as a downstream backup (it outranks the end's present one, or the end had none or only
    a U-turn). If neither end takes it, nothing else can change either: other switches'
    candidates, distances and U-turn partners are the same. Mirrors `_descend_idle` and
    `_choose`; `True` only means "compute it" (`routing` decides)."""
    e = old_graph.edges[edge]
    dist = r.dist
    for x, y in ((e.u, e.v), (e.v, e.u)):
        if dist[y] >= INF:
            continue
        if _descent_beaten(old_graph, trees, colour, dist, x, y, edge):
            return True
        hop = r.next[x]
        if hop is None or hop.switch == HOST or dist[y] >= dist[x]:
            continue  # no switch primary, or `y` is not downstream of `x`
        present = r.backup.get(x)
        if present is None or x in r.uturn:
            return True  # a downstream backup now exists: it replaces none or a U-turn
        keys = _backup_keys(
            np.array([y, present.switch], dtype=np.int64),
            np.array([hop.switch, hop.switch], dtype=np.int64),
            np.array([dist[y], dist[present.switch]], dtype=np.int64),
            np.array([edge, present.edge], dtype=np.int64),
            group_seed(trees.group),
        )
        if keys[0] > keys[1]:
            return True
    return False


def _descent_beaten(
    old_graph: FabricGraph, trees: GroupTrees, colour: ColourIndex, dist: list[int],
    x: int, y: int, edge: int,
) -> bool:  # fmt: skip
    """Whether idle switch `x` would descend over the new `edge` to `y` (`_descend_idle`:
    the lower-level neighbour nearest along the routes, then the lowest edge index, taken
    only if it shortens the tree's route). Its rivals are the links alive before (other
    links coming back are checked on their own: whichever wins, one of them says so)."""
    level = trees.level
    tree_hop = trees.next[colour][x]
    if level[y] >= level[x] or tree_hop is None or tree_hop.switch == HOST:
        return False
    if dist[y] + 1 >= trees.dist[colour][x]:
        return False  # not shorter than the tree's own route: never taken
    rank = (-min(dist[y], MAX_DIST), -edge)
    for w, i in old_graph.adjacency[x]:
        if level[w] < level[x] and dist[w] < INF and (-min(dist[w], MAX_DIST), -i) > rank:
            return False  # an old neighbour still wins
    # Idle: routed to a switch, no tree child, no hosts of its own.
    if x in old_graph.sources:
        return False
    return not any(h is not None and h.switch == x for h in trees.next[colour])


MAX_DIST = 1023  # distances beyond count as equal in the keys (no fabric is that deep)
EDGES = 1 << 40  # room for any edge index in a key


def _segment_best(rows: Ints, key: Ints) -> Ints:
    """For each run of equal `rows` (ascending, as CSR entries come), the position of its
    largest `key` (the first one on a tie). No sort: a reduction per run."""
    starts: Ints = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    lengths = np.diff(np.append(starts, rows.size))
    top = np.repeat(np.maximum.reduceat(key, starts), lengths)
    hits: Ints = np.flatnonzero(key == top)
    first = np.concatenate(([True], rows[hits][1:] != rows[hits][:-1]))
    found: Ints = hits[first]
    return found


def local_repair(graph: FabricGraph, trees: GroupTrees) -> tuple[int, list[tuple[int, Colour]]]:
    """(routes with a backup, [(switch, colour) of switch-to-switch routes without one])
    toward one group: what the plan reports as switch-local coverage and risks."""
    covered = 0
    missing: list[tuple[int, Colour]] = []
    for colour in COLOURS:
        r = routing(graph, trees, colour)
        covered += len(r.backup)
        for v, hop in enumerate(r.next):
            if hop is not None and hop.switch != HOST and v not in r.backup:
                missing.append((v, COLOUR_AT[colour]))
    return covered, missing
