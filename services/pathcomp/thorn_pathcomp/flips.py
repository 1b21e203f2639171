"""The central fast path: which sources must flip which peers when a link fails (pure).

When health reports a link down, the (source host, peer) pairs whose *active* colour
crosses it are moved to their other colour at once, by one urgent message per source host,
before any re-protection is computed or written. The pairs come from the served plan:

- a link is crossed by colour `c` toward destination group `g` below the switch `v` whose
  route of that colour takes it (or, for a host link, below the attachment switch whose
  last hop it is); the switches whose `c` path passes `v` are `v`'s subtree in that tree
  (children lists kept with the trees);
- a source group is hit when its egress switch of colour `c` is in that subtree, or when
  its own egress of colour `c` is the failed host link;
- a pair is flipped only if the other colour's path does not cross the link too (a flip
  would not help: that is a shared risk, reported by the plan);
- every pair whose one colour crosses it is told to use the other, whichever it is on now:
  agents also move pairs by themselves (their own BFD), which the plan does not see, and an
  agent does nothing for a pair already on the colour it is told.

`plan.users` (edge -> groups whose trees take it) keeps the search to the destinations
the link matters for.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from thorn.model import Colour
from thorn_pathcomp.graph import FabricGraph, Group, SwitchId
from thorn_pathcomp.node_documents import DesiredStates
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.trees import (
    BLUE,
    COLOUR_AT,
    COLOURS,
    HOST,
    RED,
    ColourIndex,
    GroupTrees,
    other_colour,
)

__all__ = ["Flip", "link_flips", "prepare_flips"]


@dataclass(frozen=True)
class Flip:
    """One source host's urgent move: traffic toward `peers` goes on `colour` now."""

    node: str
    peers: tuple[str, ...]
    colour: Colour


def _children(trees: GroupTrees, colour: ColourIndex) -> tuple[array[int], array[int]]:
    """Per switch, the switches whose `colour` next hop is it: those of switch v are
    `switches[offsets[v]:offsets[v + 1]]` (kept with the trees)."""
    found = trees.children.get(colour)
    if found is not None:
        return found
    parents = [-1 if hop is None or hop.switch == HOST else hop.switch
               for hop in trees.next[colour]]  # fmt: skip
    counts = [0] * (len(parents) + 1)
    for parent in parents:
        counts[parent + 1] += parent >= 0
    offsets = array("i", accumulate(counts))
    switches = array("i", bytes(4 * offsets[-1]))
    at = list(offsets)
    for v, parent in enumerate(parents):
        if parent >= 0:
            switches[at[parent]] = v
            at[parent] += 1
    trees.children[colour] = (offsets, switches)
    return offsets, switches


def prepare_flips(plan: Plan) -> None:
    """Build every tree's children lists ahead (in a worker thread), so that a failure's
    flips, on the event loop and on the urgent path, only walk them. At k=32 building them
    is ~0.5 ms a tree; trees a plan update keeps keep theirs."""
    for trees in plan.trees.values():
        for colour in COLOURS:
            _children(trees, colour)


def _subtree(trees: GroupTrees, colour: ColourIndex, top: SwitchId) -> set[SwitchId]:
    offsets, switches = _children(trees, colour)
    out, stack = {top}, [top]
    while stack:
        v = stack.pop()
        for child in switches[offsets[v] : offsets[v + 1]]:
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def _crossing(
    trees: GroupTrees, colour: ColourIndex, edge: int | None, ends: tuple[SwitchId, ...]
) -> set[int]:
    """Switches whose `colour` path takes switch edge `edge` (`ends`: its two switches) or,
    with `edge` None, ends at the host link of the one switch in `ends`. Only a link's own
    switches can step over it, so only they are looked at."""
    out: set[int] = set()
    for v in ends:
        hop = trees.next[colour][v]
        if hop is None:
            continue
        if (hop.switch == HOST) if edge is None else (hop.edge == edge and hop.switch != HOST):
            out |= _subtree(trees, colour, v)
    return out


def _sources_at(graph: FabricGraph) -> dict[SwitchId, list[Group]]:
    """Per switch, the source groups it is a member of (where their paths may start)."""
    at: dict[SwitchId, list[Group]] = {}
    for group in graph.groups:
        for switch in group:
            at.setdefault(switch, []).append(group)
    return at


def link_flips(states: DesiredStates, link_id: int) -> list[Flip]:
    """The urgent flips for link `link_id` failing, per source host (sorted)."""
    plan = states.plan
    graph = plan.graph
    edge = graph.edge_of_link.get(link_id)
    attachment = graph.host_links.get(link_id)
    if edge is not None:
        destinations: Iterable[Group] = sorted(plan.users.get(edge, ()))
        ends: tuple[SwitchId, ...] = (graph.edges[edge].u, graph.edges[edge].v)
    elif attachment is not None:
        destinations = [g for g in plan.trees if attachment.switch in g]
        ends = (attachment.switch,)
    else:
        return []
    sources_at = _sources_at(graph)
    # (source hosts, destination hosts, the colour cut), per pair of groups hit
    hit: list[tuple[list[str], set[str], ColourIndex]] = []
    only = {attachment.host} if attachment is not None else None  # a host link: its host
    for group in destinations:
        trees = plan.trees[group]
        crossing = [_crossing(trees, c, edge, ends) for c in COLOURS]
        # A source is cut only if a colour starts inside the crossing switches, and its
        # starts are its own switches: only the groups with a member there are looked at.
        candidates = {s for v in crossing[0] | crossing[1] for s in sources_at.get(v, ())}
        for source in sorted(candidates):
            starts = plan.egress(source, group)
            if starts is None:
                continue
            cut = [starts[c] in crossing[c] for c in COLOURS]
            if cut[0] != cut[1]:
                targets = set(graph.groups.get(group, [])) if only is None else only
                hit.append((graph.groups[source], targets, RED if cut[0] else BLUE))
    if attachment is not None:  # the source side: a multi-homed host's own uplink
        source, at = graph.group_of(attachment.host), attachment.switch
        for group in plan.trees if len(source) > 1 else ():
            starts = plan.egress(source, group)
            if starts is not None and (starts[0] == at) != (starts[1] == at):
                colour = RED if starts[0] == at else BLUE
                hit.append(([attachment.host], set(graph.groups.get(group, [])), colour))
    return _per_host(states, hit)


def _per_host(
    states: DesiredStates, hit: list[tuple[list[str], set[str], ColourIndex]]
) -> list[Flip]:
    """Turn the hit (sources, destinations, colour cut) into one move per source: its peers
    among the destinations go to the other colour. Whatever colour each pair is on now: the
    plan knows its own choice, not the flips agents made on their own (a source's BFD, an
    earlier central flip not yet reverted), and an agent leaves a pair already on the safe
    colour as it is."""
    by_source: dict[str, dict[Colour, set[str]]] = {}
    for sources, destinations, colour in hit:
        to: Colour = COLOUR_AT[other_colour(colour)]
        for host in sources:
            if host not in states.hosts:
                continue
            peers = states.peers_of(host, among=destinations)
            if peers:
                by_source.setdefault(host, {}).setdefault(to, set()).update(peers)
    return [
        Flip(host, tuple(sorted(peers)), colour)
        for host, moves in sorted(by_source.items())
        for colour, peers in sorted(moves.items())
    ]
