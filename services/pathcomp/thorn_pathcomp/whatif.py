"""What-if: what failing some links or nodes would do to the served plan, without doing it.

Pure: it reads a plan and never changes it. Re-protection is simulated with the same
`Plan.update_links` the service runs on a real failure; it returns a new plan and leaves the
served one whole, so the answer is what the service would compute.

For every host pair whose routes could cross a failed element (the plan's edge index names
the destination groups; hosts on a failed host link or switch add their own pairs):
- `flip`: the active colour crosses it, the standby does not. The source NIC flips to the
  standby colour and runs unprotected until re-protection.
- `lose_protection`: only the standby colour crosses it: traffic stays, its backup is gone.
- `cut`: both colours cross it: no path until re-protection.
Then each such pair's status in the re-protected plan: protected, degraded (shares only what
no topology avoids: a single-homed end's host link or switch, a switch, an SRLG),
unprotected (a switch-to-switch link is shared) or unreachable.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from thorn_pathcomp.graph import Group, SwitchId
from thorn_pathcomp.plan import Plan, Protection
from thorn_pathcomp.trees import COLOURS

Verdict = Literal["flip", "lose_protection", "cut"]
EXAMPLES = 25  # host pairs listed by name; the counts cover every pair


class UnknownElement(LookupError):
    """A link id or node name the planned topology does not have."""

    def __init__(self, kind: Literal["link", "node"], value: str) -> None:
        super().__init__(f"{kind} '{value}' not found in the planned topology")
        self.kind = kind
        self.value = value


@dataclass(frozen=True)
class PairImpact:
    src: str
    dst: str
    verdict: Verdict
    after: Protection


@dataclass
class WhatIf:
    links: list[int]  # every link that would fail, those of failed nodes included
    nodes: list[str]
    pairs: int = 0  # host pairs in the plan
    impact: Counter[Verdict] = field(default_factory=Counter)
    after: Counter[Protection] = field(default_factory=Counter)  # of the affected pairs
    examples: list[PairImpact] = field(default_factory=list)
    seconds: float = 0.0


def _failed_links(plan: Plan, links: Iterable[int], nodes: Iterable[str]) -> set[int]:
    """The link ids that fail with these links and nodes; UnknownElement for a stranger."""
    graph = plan.graph
    failed: set[int] = set()
    for link in links:
        if link not in graph.edge_of_link and link not in graph.host_links:
            raise UnknownElement("link", str(link))
        failed.add(link)
    index = graph.index
    hosts = {a.host for a in graph.host_links.values()}
    for node in nodes:
        if node in index:
            s = index[node]
            failed |= {graph.edges[i].link_id for i in graph.incident[s]}
            failed |= {lid for lid, a in graph.host_links.items() if a.switch == s}
        elif node in hosts:
            failed |= {lid for lid, a in graph.host_links.items() if a.host == node}
        else:
            raise UnknownElement("node", node)
    return failed


@dataclass(frozen=True)
class _Route:
    switches: tuple[SwitchId, ...]
    edges: frozenset[int]


def _routes(plan: Plan, src: Group, dst: Group) -> tuple[_Route, _Route] | None:
    """Red and blue between two groups, as the plan's source choice takes them."""
    if not src or not dst or dst not in plan.trees:
        return None
    starts = plan.egress(src, dst)
    if starts is None:
        return None
    trees = plan.trees[dst]
    out = []
    for colour, start in zip(COLOURS, starts, strict=True):
        hops = trees.path(start, colour)
        out.append(_Route(tuple(v for v, _ in hops), frozenset(e for _, e in hops if e >= 0)))
    return out[0], out[1]


def what_if(plan: Plan, *, links: Iterable[int] = (), nodes: Iterable[str] = ()) -> WhatIf:
    """Simulate failing `links` and `nodes` (switches or hosts) on a copy of `plan`."""
    start = time.perf_counter()
    node_list = sorted(set(nodes))
    failed = _failed_links(plan, links, node_list)
    graph = plan.graph
    result = WhatIf(sorted(failed), node_list)
    failed_edges = {graph.edge_of_link[lid] for lid in failed if lid in graph.edge_of_link}
    failed_attach = {lid for lid in failed if lid in graph.host_links}
    failed_switches = {graph.index[n] for n in node_list if n in graph.index}
    hit_hosts = {graph.host_links[lid].host for lid in failed_attach}
    after, _ = plan.update_links({lid: False for lid in failed}, plan.topology_revision)

    groups = graph.groups
    hit_groups = {graph.group_of(h) for h in hit_hosts}
    dst_groups = set().union(*(plan.users.get(e, set()) for e in failed_edges))
    dst_groups |= hit_groups | {g for g in groups if failed_switches & set(g)}

    def crosses(route: _Route, src_host: str | None, dst_host: str | None) -> bool:
        if route.edges & failed_edges or failed_switches & set(route.switches):
            return True
        for host, switch in ((src_host, route.switches[0]), (dst_host, route.switches[-1])):
            if host is not None and any(
                a.link_id in failed_attach for a in graph.attachments[host] if a.switch == switch
            ):
                return True
        return False

    result.pairs = sum(
        len(hs) * len(hd) - (len(hs) if s == d else 0)
        for s, hs in groups.items()
        for d, hd in groups.items()
    )
    for src, src_hosts in groups.items():
        for dst, dst_hosts in groups.items():
            if dst not in dst_groups and src not in hit_groups:
                continue
            routes = _routes(plan, src, dst)
            if routes is None:
                continue  # unreachable already: nothing to lose
            # Hosts on a failed link count one by one; the rest of a group as one class.
            src_classes: list[tuple[list[str], str | None]]
            src_classes = [([h], h) for h in src_hosts if h in hit_hosts]
            src_classes.append(([h for h in src_hosts if h not in hit_hosts], None))
            dst_classes: list[tuple[list[str], str | None]]
            dst_classes = [([h], h) for h in dst_hosts if h in hit_hosts]
            dst_classes.append(([h for h in dst_hosts if h not in hit_hosts], None))
            for s_hosts, s_one in src_classes:
                for d_hosts, d_one in dst_classes:
                    weight = len(s_hosts) * len(d_hosts)
                    if src == dst and s_one == d_one:
                        weight -= len(s_hosts)  # a host is no pair with itself
                    if weight <= 0:
                        continue
                    hit = [crosses(r, s_one, d_one) for r in routes]
                    if not any(hit):
                        continue
                    # A pair with routes has both colours, and its source sends red.
                    verdict: Verdict = (
                        "cut" if all(hit) else "flip" if hit[0] else "lose_protection"
                    )
                    s_now = after.graph.group_of(s_one) if s_one else src
                    d_now = after.graph.group_of(d_one) if d_one else dst
                    status = after.protection(s_now, d_now)
                    result.impact[verdict] += weight
                    result.after[status] += weight
                    if len(result.examples) < EXAMPLES:
                        d_name = next(h for h in d_hosts if h != s_hosts[0])
                        result.examples.append(PairImpact(s_hosts[0], d_name, verdict, status))
    result.seconds = time.perf_counter() - start
    return result


__all__ = ["PairImpact", "UnknownElement", "WhatIf", "what_if"]
