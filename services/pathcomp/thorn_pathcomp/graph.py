"""The fabric as path computation sees it: switches, usable links, host attachments.

Switches are numbered in name order, so every tie in the algorithms breaks the same way on
every run and every replica. A link carries traffic only when it and both its nodes are `up`:
`down` is out of service and `drained` is being emptied for maintenance, so both are left out.
Hosts are not transit nodes: they attach to one or more switches, and hosts with the same set
of switches form an attachment group that shares one pair of trees.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from thorn.fabric import Fabric
from thorn.model import AdminState, Role

SwitchId = int
Group = tuple[SwitchId, ...]  # sorted switch numbers a host attaches to


@dataclass(frozen=True)
class Edge:
    """A usable switch-to-switch link; `u` < `v` are switch numbers."""

    link_id: int
    u: SwitchId
    v: SwitchId
    u_port: str
    v_port: str
    srlgs: frozenset[str]

    def other(self, end: SwitchId) -> SwitchId:
        return self.v if end == self.u else self.u

    def port_at(self, end: SwitchId) -> str:
        return self.u_port if end == self.u else self.v_port


@dataclass(frozen=True)
class Attachment:
    """A usable link from a host port to a switch port."""

    host: str
    host_port: str
    switch: SwitchId
    switch_port: str
    link_id: int
    srlgs: frozenset[str]


@dataclass
class FabricGraph:
    switches: list[str]
    edges: list[Edge]
    # adjacency[s]: (neighbour, edge index), ordered by neighbour number then link id
    adjacency: list[list[tuple[SwitchId, int]]]
    attachments: dict[str, list[Attachment]]  # host -> its usable attachments
    groups: dict[Group, list[str]]  # attachment group -> hosts (sorted)
    excluded: dict[int, str] = field(default_factory=dict)  # link id -> why it carries nothing

    @property
    def index(self) -> dict[str, SwitchId]:
        return {name: i for i, name in enumerate(self.switches)}

    @property
    def sources(self) -> set[SwitchId]:
        """Switches with hosts attached: where red and blue paths start."""
        return {s for group in self.groups for s in group}

    def group_of(self, host: str) -> Group:
        return tuple(sorted({a.switch for a in self.attachments.get(host, [])}))

    @classmethod
    def from_fabric(cls, fabric: Fabric) -> FabricGraph:
        usable_node = {
            name: node.admin_state is AdminState.up for name, node in fabric.nodes.items()
        }
        switches = sorted(n for n, node in fabric.nodes.items() if node.role is Role.switch)
        index = {name: i for i, name in enumerate(switches)}
        edges: list[Edge] = []
        attachments: dict[str, list[Attachment]] = defaultdict(list)
        excluded: dict[int, str] = {}
        for link in sorted(fabric.links.values(), key=lambda lk: lk.id):
            a, b = link.a, link.b
            if link.admin_state is not AdminState.up:
                excluded[link.id] = f"link is {link.admin_state.value}"
                continue
            if not (usable_node[a.node] and usable_node[b.node]):
                excluded[link.id] = "an end node is not up"
                continue
            srlgs = frozenset(link.srlgs)
            a_switch, b_switch = a.node in index, b.node in index
            if a_switch and b_switch:
                (u, u_port), (v, v_port) = sorted(
                    ((index[a.node], a.port), (index[b.node], b.port))
                )
                edges.append(Edge(link.id, u, v, u_port, v_port, srlgs))
            elif a_switch or b_switch:
                host_end, switch_end = (b, a) if a_switch else (a, b)
                attachments[host_end.node].append(
                    Attachment(
                        host_end.node,
                        host_end.port,
                        index[switch_end.node],
                        switch_end.port,
                        link.id,
                        srlgs,
                    )
                )
            else:
                excluded[link.id] = "host-to-host links carry no fabric traffic"
        adjacency: list[list[tuple[SwitchId, int]]] = [[] for _ in switches]
        for i, edge in enumerate(edges):
            adjacency[edge.u].append((edge.v, i))
            adjacency[edge.v].append((edge.u, i))
        for neighbours in adjacency:
            neighbours.sort(key=lambda item: (item[0], edges[item[1]].link_id))
        groups: dict[Group, list[str]] = defaultdict(list)
        for host in sorted(attachments):
            attachments[host].sort(key=lambda at: (at.switch, at.link_id))
            groups[tuple(sorted({at.switch for at in attachments[host]}))].append(host)
        for name, node in fabric.nodes.items():
            if node.role is Role.host and usable_node[name] and name not in attachments:
                groups.setdefault((), []).append(name)  # isolated: no usable attachment
        return cls(switches, edges, adjacency, dict(attachments), dict(groups), excluded)
