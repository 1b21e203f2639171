"""The fabric as path computation sees it: switches, usable links, host attachments.

Switches are numbered in name order, so every tie in the algorithms breaks the same way on
every run and every replica. A link carries traffic only when it and both its nodes are `up`:
`down` is out of service and `drained` is being emptied for maintenance, so both are left out,
and so is a link the cabling check found miscabled (`Fabric.miscabled`).
Hosts are not transit nodes: they attach to one or more switches, and hosts with the same set
of switches form an attachment group that shares one pair of trees.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from thorn.fabric import Fabric
from thorn.model import AdminState, Link, Role

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
    # Every switch-to-switch link, in link id order, whatever its state: an edge's index
    # stays the same while links go down and up, so trees computed earlier stay valid.
    edges: list[Edge]
    alive: list[bool]  # per edge: carries traffic now
    # adjacency[s]: (neighbour, edge index) over alive edges, by neighbour number then link id
    adjacency: list[list[tuple[SwitchId, int]]]
    attachments: dict[str, list[Attachment]]  # host -> its usable attachments
    groups: dict[Group, list[str]]  # attachment group -> hosts (sorted)
    excluded: dict[int, str] = field(default_factory=dict)  # link id -> why it carries nothing
    # Every host link whatever its state, and whether it carries traffic now.
    host_links: dict[int, Attachment] = field(default_factory=dict)
    host_alive: dict[int, bool] = field(default_factory=dict)

    # Indexes over the structure (not the state): shared by graphs that differ in state only.
    has_srlgs: bool = False
    edge_of_link: dict[int, int] = field(default_factory=dict)
    incident: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.edge_of_link or not self.edges:
            return
        self.has_srlgs = any(e.srlgs for e in self.edges) or any(
            a.srlgs for a in self.host_links.values()
        )
        self.edge_of_link = {e.link_id: i for i, e in enumerate(self.edges)}
        self.incident = [[] for _ in self.switches]
        for i, e in enumerate(self.edges):
            self.incident[e.u].append(i)
            self.incident[e.v].append(i)

    @property
    def index(self) -> dict[str, SwitchId]:
        return {name: i for i, name in enumerate(self.switches)}

    @property
    def sources(self) -> set[SwitchId]:
        """Switches with hosts attached: where red and blue paths start."""
        return {s for group in self.groups for s in group}

    def cut_off(self) -> set[str]:
        """Nodes none of whose links carries traffic (a switch that died, a host whose
        links are all down): nothing forwards through them, so no rollout waits for them."""
        switches = {self.switches[s] for s, near in enumerate(self.adjacency) if not near}
        switches -= {self.switches[a.switch] for links in self.attachments.values() for a in links}
        hosts = {a.host for a in self.host_links.values()} - set(self.attachments)
        return switches | hosts

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
        alive: list[bool] = []
        host_links: dict[int, Attachment] = {}
        host_alive: dict[int, bool] = {}
        attachments: dict[str, list[Attachment]] = defaultdict(list)
        excluded: dict[int, str] = {}
        for link in sorted(fabric.links.values(), key=lambda lk: lk.id):
            a, b = link.a, link.b
            reason = _out_of_service(link, fabric, usable_node)
            usable = reason is None
            if reason is not None:
                excluded[link.id] = reason
            srlgs = frozenset(link.srlgs)
            a_switch, b_switch = a.node in index, b.node in index
            if a_switch and b_switch:
                (u, u_port), (v, v_port) = sorted(
                    ((index[a.node], a.port), (index[b.node], b.port))
                )
                edges.append(Edge(link.id, u, v, u_port, v_port, srlgs))
                alive.append(usable)
            elif a_switch or b_switch:
                host_end, switch_end = (b, a) if a_switch else (a, b)
                attachment = Attachment(
                    host_end.node,
                    host_end.port,
                    index[switch_end.node],
                    switch_end.port,
                    link.id,
                    srlgs,
                )
                host_links[link.id] = attachment
                host_alive[link.id] = usable
                if usable:
                    attachments[host_end.node].append(attachment)
            else:
                excluded[link.id] = "host-to-host links carry no fabric traffic"
        adjacency: list[list[tuple[SwitchId, int]]] = [[] for _ in switches]
        for i, edge in enumerate(edges):
            if alive[i]:
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
        return cls(
            switches,
            edges,
            alive,
            adjacency,
            dict(attachments),
            dict(groups),
            excluded,
            host_links,
            host_alive,
        )

    def with_hosts(self, fabric: Fabric, hosts: set[str]) -> FabricGraph:
        """This graph with `hosts` as `fabric` now has them (joined, left, their links
        changed), nothing of the switches changed: the fast path for a change of hosts,
        touching only their attachments and groups."""
        index = self.index
        host_links, host_alive = dict(self.host_links), dict(self.host_alive)
        excluded, attachments = dict(self.excluded), dict(self.attachments)
        groups = {g: list(h) for g, h in self.groups.items()}
        for gone in [i for i, a in self.host_links.items() if a.host in hosts]:
            del host_links[gone], host_alive[gone]
            excluded.pop(gone, None)
        for host in hosts:
            attachments.pop(host, None)
            for members in groups.values():
                if host in members:
                    members.remove(host)
        usable_node = {n: fabric.nodes[n].admin_state is AdminState.up
                       for n in hosts if n in fabric.nodes}  # fmt: skip
        for host in sorted(usable_node):
            for port in fabric.node_ports[host]:
                link_id = fabric.link_of_port.get((host, port))
                if link_id is None:
                    continue
                link = fabric.links[link_id]
                other = link.b if link.a.node == host else link.a
                if other.node not in index:  # host to host: carries no fabric traffic
                    excluded[link_id] = "host-to-host links carry no fabric traffic"
                    continue
                usable_node[other.node] = fabric.nodes[other.node].admin_state is AdminState.up
                reason = _out_of_service(link, fabric, usable_node)
                if reason is not None:
                    excluded[link_id] = reason
                at = Attachment(host, port, index[other.node], other.port, link_id,
                                frozenset(link.srlgs))  # fmt: skip
                host_links[link_id], host_alive[link_id] = at, reason is None
                if reason is None:
                    attachments.setdefault(host, []).append(at)
            now = sorted(attachments.get(host, []), key=lambda at: (at.switch, at.link_id))
            if now:
                attachments[host] = now
            if now or usable_node[host]:  # a host that is not up is in no group
                groups.setdefault(tuple(sorted({at.switch for at in now})), []).append(host)
        groups = {g: sorted(h) for g, h in groups.items() if h}
        graph = FabricGraph(self.switches, self.edges, self.alive, self.adjacency, attachments,
                            groups, excluded, host_links, host_alive, False, self.edge_of_link,
                            self.incident)  # fmt: skip
        graph.has_srlgs = any(e.srlgs for e in self.edges) or any(
            a.srlgs for a in host_links.values()
        )
        return graph

    def with_link_states(self, states: dict[int, bool]) -> FabricGraph:
        """This graph with some links up (True) or out of service (False): the fast path for
        health events and drains, touching only the switches and hosts at those links."""
        alive = list(self.alive)
        host_alive = dict(self.host_alive)
        excluded = dict(self.excluded)
        switches_touched: set[SwitchId] = set()
        hosts_touched: set[str] = set()
        for link_id, up in states.items():
            if link_id in self.edge_of_link:
                i = self.edge_of_link[link_id]
                if alive[i] != up:
                    alive[i] = up
                    switches_touched |= {self.edges[i].u, self.edges[i].v}
            elif link_id in self.host_links:
                if host_alive[link_id] != up:
                    host_alive[link_id] = up
                    hosts_touched.add(self.host_links[link_id].host)
            else:
                raise KeyError(f"link {link_id} is not a fabric link")
            if up:
                excluded.pop(link_id, None)
            else:  # a reason the link was already out for (drained, miscabled) stays
                excluded.setdefault(link_id, "out of service")
        adjacency = list(self.adjacency)
        for v in switches_touched:
            adjacency[v] = sorted(
                ((self.edges[i].other(v), i) for i in self.incident[v] if alive[i]),
                key=lambda item: (item[0], self.edges[item[1]].link_id),
            )
        attachments = dict(self.attachments)
        groups = {g: list(h) for g, h in self.groups.items()} if hosts_touched else self.groups
        for host in hosts_touched:
            old_group = self.group_of(host)
            now = sorted(
                (a for lid, a in self.host_links.items() if a.host == host and host_alive[lid]),
                key=lambda a: (a.switch, a.link_id),
            )
            if now:
                attachments[host] = now
            else:
                attachments.pop(host, None)
            if host in groups.get(old_group, []):
                groups[old_group].remove(host)
                if not groups[old_group]:
                    del groups[old_group]
            new_group = tuple(sorted({a.switch for a in now}))
            groups.setdefault(new_group, []).append(host)
            groups[new_group].sort()
        return FabricGraph(
            self.switches,
            self.edges,
            alive,
            adjacency,
            attachments,
            groups,
            excluded,
            self.host_links,
            host_alive,
            self.has_srlgs,
            self.edge_of_link,
            self.incident,
        )

    def same_structure(self, other: FabricGraph) -> bool:
        """Same switches and the same switch-to-switch links: edge indices carry over."""
        return self.switches == other.switches and [(e.link_id, e.u, e.v) for e in self.edges] == [
            (e.link_id, e.u, e.v) for e in other.edges
        ]


def _out_of_service(link: Link, fabric: Fabric, usable_node: dict[str, bool]) -> str | None:
    """Why a link carries no traffic (None: it does)."""
    if link.admin_state is not AdminState.up:
        return f"link is {link.admin_state.value}"
    if not (usable_node[link.a.node] and usable_node[link.b.node]):
        return "an end node is not up"
    if link.id in fabric.miscabled:  # out like a drained link, until heard right
        return f"link is miscabled: {fabric.miscabled[link.id].reason}"
    return None
