"""The colour partition of one group with arrays (numpy): the same trees as `trees.py`.

`trees.compute_group` walks every switch's neighbours in Python: at k=32 that is 512 groups
x 1,280 switches x ~26 neighbours, three times over (layers, own colour, other colour).
Here each step is a handful of array operations over the graph's edge list (CSR). It is
used only where it gives exactly the Python result:

- no SRLGs in the fabric (the conflict rule of `other_choice` needs set arithmetic);
- every switch of a colour found a next hop of its own colour (then the other colour's
  choices depend on own-colour distances only, with no order between them); otherwise
  (`None`) the caller takes the Python path for that group. Switches with no neighbour of
  a colour at all are extended by `trees.extend` itself, in the same order as there.

Choices match `own_choice`/`other_choice`: weights are the same 64-bit products (numpy's
uint64 arithmetic wraps like the Python code's mask), the multiplier is odd, so two edges
never tie, and the other colour takes the nearest neighbour first, then the highest weight.
Tests hold the two paths equal on every generator and on random fabrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from thorn_pathcomp.graph import FabricGraph, Group, SwitchId
from thorn_pathcomp.trees import (
    BOTH,
    COLOURS,
    GOLDEN,
    HOST,
    INF,
    GroupTrees,
    NextHop,
    extend,
    group_seed,
    other_colour,
)

Ints = npt.NDArray[np.int64]


class Csr:
    """The alive adjacency as arrays: entry k goes from src[k] to nbr[k] over edge eid[k];
    a switch's entries are indptr[s]:indptr[s + 1]."""

    def __init__(self, graph: FabricGraph, every_edge: bool = False) -> None:
        # From the edge list and the alive flags (not the adjacency lists): a few array
        # operations, so that each incremental update's new graph gets its CSR cheaply.
        ends = _edge_ends(graph)
        flags = np.ones(len(graph.edges), dtype=bool) if every_edge else np.array(graph.alive)
        alive = np.flatnonzero(flags)
        self.intact = alive.size == len(graph.edges)  # every switch-to-switch link in service
        src = np.concatenate([ends[0][alive], ends[1][alive]])
        order = np.argsort(src, kind="stable")
        self.src: Ints = src[order]
        self.nbr: Ints = np.concatenate([ends[1][alive], ends[0][alive]])[order]
        self.eid: Ints = np.concatenate([alive, alive])[order]
        counts = np.bincount(self.src, minlength=len(graph.switches))
        self.indptr: Ints = np.zeros(len(graph.switches) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.indptr[1:])
        self._hop: list[NextHop] | None = None

    @property
    def hop(self) -> list[NextHop]:
        """hop[k] = NextHop(nbr[k], eid[k]): made once per graph, shared by all its groups
        (only full plans need them: an incremental update only re-layers)."""
        if self._hop is None:
            self._hop = [NextHop(u, e) for u, e in
                         zip(self.nbr.tolist(), self.eid.tolist(), strict=True)]  # fmt: skip
        return self._hop


_ends_cache: dict[int, tuple[object, tuple[Ints, Ints], bytes]] = {}


def _ends_entry(graph: FabricGraph) -> tuple[object, tuple[Ints, Ints], bytes]:
    hit = _ends_cache.get(id(graph.edges))
    if hit is not None and hit[0] is graph.edges:
        return hit
    ends = (np.array([e.u for e in graph.edges], dtype=np.int64),
            np.array([e.v for e in graph.edges], dtype=np.int64))  # fmt: skip
    if len(_ends_cache) > 4:
        _ends_cache.clear()
    key = len(graph.switches).to_bytes(8, "little") + ends[0].tobytes() + ends[1].tobytes()
    entry = (graph.edges, ends, key)
    _ends_cache[id(graph.edges)] = entry
    return entry


def _edge_ends(graph: FabricGraph) -> tuple[Ints, Ints]:
    """Each edge's two switches as arrays; the edge list is shared by a graph's states."""
    return _ends_entry(graph)[1]


def _structure_key(graph: FabricGraph) -> bytes:
    """Equal for graphs with the same switches and switch-to-switch links, in order."""
    return _ends_entry(graph)[2]


# One CSR per adjacency list (a graph's state): kept while that list is alive.
_cache: dict[int, tuple[object, Csr]] = {}


def csr(graph: FabricGraph) -> Csr:
    key = id(graph.adjacency)
    hit = _cache.get(key)
    if hit is not None and hit[0] is graph.adjacency:
        return hit[1]
    built = Csr(graph)
    if len(_cache) > 8:
        _cache.clear()
    _cache[key] = (graph.adjacency, built)
    return built


def layers_and_colours(
    graph: FabricGraph, group: Group, c: Csr, prefer: Ints | None = None
) -> tuple[Ints, Ints, list[SwitchId]]:
    """As `trees.layers_and_colours`: levels, colours, and the order they were given in."""
    n = len(graph.switches)
    level = np.full(n, INF, dtype=np.int64)
    colour = np.full(n, -1, dtype=np.int64)
    single = len(group) == 1
    members = np.array(group, dtype=np.int64)
    level[members] = 0
    if not single:
        colour[members] = np.arange(len(group)) % 2
    order: list[SwitchId] = sorted(group)
    frontier = np.array(sorted(group), dtype=np.int64)
    depth, alternate = 0, 0
    while frontier.size:
        depth += 1
        starts, ends = c.indptr[frontier], c.indptr[frontier + 1]
        entries = _ranges(starts, ends)
        reached = c.nbr[entries]
        fresh = _distinct(reached[level[reached] == INF], n)
        if not fresh.size:
            break
        level[fresh] = depth
        # Colours of this layer: the set of colours among the neighbours one layer nearer.
        rows = _ranges(c.indptr[fresh], c.indptr[fresh + 1])
        below = c.nbr[rows]
        nearer = level[below] == depth - 1
        col = colour[below]
        bits = np.where(nearer & (col >= 0), np.left_shift(1, np.maximum(col, 0)), 0)
        seen = np.zeros(n, dtype=np.int64)
        np.bitwise_or.at(seen, c.src[rows], bits)
        seen_layer = seen[fresh]
        alt = (seen_layer != 1) & (seen_layer != 2)
        if single and depth == 1:
            alt[:] = True
        layer_colour = seen_layer - 1
        if prefer is None:
            k = int(alt.sum())
            layer_colour[alt] = (alternate + np.arange(k)) % 2
            alternate += k
        else:
            layer_colour[alt] = prefer[fresh[alt]]
        colour[fresh] = layer_colour
        order.extend(fresh.tolist())
        frontier = fresh
    if single:
        colour[group[0]] = BOTH
    return level, colour, order


def _distinct(values: Ints, n: int) -> Ints:
    """The distinct switch numbers among `values`, ascending (a mark per switch: no sort)."""
    mark = np.zeros(n, dtype=bool)
    mark[values] = True
    found: Ints = np.flatnonzero(mark)
    return found


def _ranges(starts: Ints, ends: Ints) -> Ints:
    """The concatenation of range(s, e) for each pair (CSR rows)."""
    lengths = ends - starts
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    offsets: Ints = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    result: Ints = np.arange(total, dtype=np.int64) + offsets
    return result


def _weights(seed: int, eid: Ints) -> npt.NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        return (np.uint64(seed) ^ eid.astype(np.uint64)) * np.uint64(GOLDEN)


def _best(rows: Ints, keys: list[npt.NDArray[np.generic]]) -> Ints:
    """For each distinct row, the index of its candidate with the largest key tuple (the
    last key is the primary one, as in np.lexsort)."""
    order: Ints = np.lexsort([*keys, rows])
    last = np.ones(order.size, dtype=bool)
    last[:-1] = rows[order][1:] != rows[order][:-1]
    return order[last]


class _Intact:
    """One fabric structure with every switch-to-switch link in service: its CSR (made
    when first needed) and its colours per group."""

    def __init__(self) -> None:
        self.csr: Csr | None = None
        self.colours: dict[Group, Ints] = {}


# Per fabric structure (its edges' ends, as bytes).
_intact: dict[bytes, _Intact] = {}


def _intact_of(graph: FabricGraph) -> _Intact:
    key = _structure_key(graph)
    found = _intact.get(key)
    if found is None:
        if len(_intact) > 4:
            _intact.clear()
        found = _intact[key] = _Intact()
    return found


def intact_colours(graph: FabricGraph, group: Group) -> Ints | None:
    """The colours `group`'s partition gives each switch with every switch-to-switch link
    of `graph`'s fabric in service: what a switch free to choose its colour takes, so that
    colours stay where they were while links fail and return. None when `graph` is that
    fabric (its own count gives them). Kept per structure and group: a topology change
    that moves no switch-to-switch link (a drain, a host) finds them made."""
    if csr(graph).intact:
        return None
    intact = _intact_of(graph)
    found = intact.colours.get(group)
    if found is None:
        if intact.csr is None:
            intact.csr = Csr(graph, every_edge=True)
        found = layers_and_colours(graph, group, intact.csr)[1].astype(np.int8)
        intact.colours[group] = found
    return found


def keep_intact_colours(graph: FabricGraph, group: Group, colour: Sequence[int]) -> None:
    """`colour`, computed for `group` on `graph`, kept as its intact colours if `graph` is
    the intact fabric: a plan made with every link in service then costs the first
    failure after it nothing to find them (~1 ms a group at k=32)."""
    if csr(graph).intact:
        _intact_of(graph).colours.setdefault(group, np.array(colour, dtype=np.int8))


def compute_group(
    graph: FabricGraph, group: Group, sources: set[SwitchId], prefer: Ints | None = None
) -> GroupTrees | None:
    """`trees.compute_group` with arrays; None where only the Python path is exact."""
    if graph.has_srlgs:
        return None
    c = csr(graph)
    n = len(graph.switches)
    level, colour, order = layers_and_colours(graph, group, c, prefer)
    single = len(group) == 1
    weight = _weights(group_seed(group), c.eid)
    src, nbr = c.src, c.nbr
    nexts: list[list[NextHop | None]] = []
    dists: list[Ints] = []
    own_edge: list[Ints] = []
    for col in COLOURS:
        dist = np.full(n, INF, dtype=np.int64)
        hop_entry = np.full(n, NO_HOP, dtype=np.int64)  # the chosen CSR entry per switch
        hop_edge = np.full(n, -1, dtype=np.int64)
        ends = (level == 0) & ((colour == col) | single)
        dist[ends], hop_entry[ends] = 0, TO_HOST
        # Own colour: a neighbour one layer nearer, of this colour (or both), max weight.
        mine = (colour[src] == col) & (level[src] > 0) & (level[src] < INF)
        cand = (
            mine & (level[nbr] == level[src] - 1) & ((colour[nbr] == col) | (colour[nbr] == BOTH))
        )
        k = np.nonzero(cand)[0]
        if k.size:
            best = k[_best(src[k], [weight[k]])]
            v = src[best]
            hop_entry[v], hop_edge[v], dist[v] = best, c.eid[best], level[v]
        wanted = (colour == col) & (level > 0) & (level < INF)
        if bool((wanted & (hop_entry == NO_HOP)).any()):
            return None  # a switch of this colour has no own-colour hop: Python decides
        dists.append(dist)
        own_edge.append(hop_edge)
        nexts.append(_hops(hop_entry, c.hop))
    fallback = False
    missing_sets: list[frozenset[SwitchId]] = []
    empty: frozenset[str] = frozenset()
    srlgs: tuple[list[frozenset[str]], list[frozenset[str]]] = ([empty] * n, [empty] * n)
    dist_lists: list[list[int]] = []
    for col in COLOURS:
        dist, hops = dists[col], nexts[col]
        taken = own_edge[other_colour(col)]
        need = np.array([h is None for h in hops]) & (level < INF)
        cand = (
            need[src]
            & ((colour[nbr] == col) | (colour[nbr] == BOTH))
            & (dist[nbr] < INF)
            & (c.eid != taken[src])
        )
        k = np.nonzero(cand)[0]
        if k.size:
            # Nearest first (smallest distance: largest negated), then the highest weight.
            best = k[_best(src[k], [weight[k], -dist[nbr[k]]])]
            v = src[best]
            for vi, ki in zip(v.tolist(), best.tolist(), strict=True):
                hops[vi] = c.hop[ki]
            dist[v] = dist[nbr[best]] + 1
        dist_list = dist.tolist()
        # Switches with no neighbour of this colour: trees.extend, exactly as in Python.
        missing = [u for u in order if hops[u] is None]
        missing_sets.append(frozenset(missing))
        if missing:
            fallback = fallback or not sources.isdisjoint(missing)
            seeds = extension_seeds(graph, missing, dist)
            extend(missing, hops, dist_list, srlgs[col], graph.adjacency, graph.edges, seeds)
        dist_lists.append(dist_list)
        # The other colour's pass sees this colour's hops as they are now (as in Python).
        own_edge[col] = np.array([-1 if h is None else h.edge for h in hops], dtype=np.int64)
    return GroupTrees(
        group,
        level.tolist(),
        colour.tolist(),
        (nexts[0], nexts[1]),
        (dist_lists[0], dist_lists[1]),
        srlgs,
        fallback,
        "partition",
        (missing_sets[0], missing_sets[1]),
    )


def extension_seeds(
    graph: FabricGraph, missing: Iterable[SwitchId], dist: Sequence[int] | Ints
) -> list[tuple[int, SwitchId]]:
    """`trees.extend`'s starting points, as it would find them: (distance, switch) of the
    neighbours of `missing` that have a path (a missing switch counts as having none). A
    walk of every missing switch's neighbours in Python was a quarter of re-layering a
    k=32 group (the cores without a neighbour of one colour: ~8,000 steps a colour)."""
    c, n = csr(graph), len(graph.switches)
    d = np.array(dist, dtype=np.int64)  # a copy: the caller's distances stay as they are
    todo = np.zeros(n, dtype=bool)
    todo[list(missing)] = True
    d[todo] = INF
    start = todo[c.src] & (d[c.nbr] < INF)
    us = _distinct(c.nbr[start], n)
    return list(zip(d[us].tolist(), us.tolist(), strict=True))


NO_HOP, TO_HOST = -1, -2  # hop_entry values that are not CSR entries
_TO_HOST = NextHop(HOST, -1)


def _hops(entry: Ints, hop: list[NextHop]) -> list[NextHop | None]:
    return [None if k == NO_HOP else _TO_HOST if k == TO_HOST else hop[k]
            for k in entry.tolist()]  # fmt: skip
