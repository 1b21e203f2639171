"""Desired state per node, built from a plan (pure: no I/O).

`DesiredStates` keeps every node's document (see `thorn.desired` for the schema) for the
current plan. On an incremental plan update, `advance` rebuilds only the switch routes of the
recomputed groups and the hosts those can touch; `diff` then says which nodes changed, and in
which make-before-break stage each must be written (destination outward, hosts last).
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from thorn.desired import VNI_CHUNK, vni_key
from thorn.fabric import Fabric, port_key
from thorn.model import Colour, Workload
from thorn_pathcomp.backups import carry_routing, gained_link_moves, routing
from thorn_pathcomp.graph import Attachment, FabricGraph, Group
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.trees import (
    COLOUR_AT,
    COLOURS,
    HOST,
    INF,
    ColourIndex,
    GroupTrees,
    NextHop,
)

HOST_STAGE = 1_000  # hosts change their egress last, once every switch has its new routes
COLOURS = COLOURS
NAMES = COLOUR_AT  # colour index -> the colour (its text in documents)

RouteKey = tuple[str, str | None]  # (prefix, colour)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
N = TypeVar("N", ipaddress.IPv4Network, ipaddress.IPv6Network)
Route = dict[str, Any]


def _host_prefix(address: str) -> str:
    return f"{address}/{32 if '.' in address else 128}"


def _default(address: str) -> str:
    return "0.0.0.0/0" if "." in address else "::/0"


@dataclass
class NodeChange:
    node: str
    stage: int  # its first write comes after every change of a lower stage
    added: int = 0
    replaced: int = 0
    removed: int = 0
    stages: list[int] = field(default_factory=list)  # every stage it is written at


REMOVAL_STAGE = HOST_STAGE + 1  # routes that go away go last


@dataclass
class _Topology:
    """What the documents need from the fabric, indexed once per topology revision."""

    address: dict[tuple[str, str], str]  # (node, port) -> interface address
    tep: dict[tuple[str, str], str]  # (host, colour) -> TEP
    defaults: list[str]  # default prefixes of the TEP address families in use
    missing_red: bool  # some host has no red TEP: its peers must use blue
    local: dict[str, list[dict[str, Any]]]  # host -> its workloads
    offload: dict[str, str]  # host -> its offload policy
    members: dict[int, list[dict[str, Any]]]  # VNI -> workloads with their hosts' TEPs
    # VNI -> its member hosts (made when first asked). Not host -> peers: at k=32 a VNI of
    # every host made that 8,192 sets of 8,191 (~2 GB, 12 s to build).
    vni_hosts: dict[int, frozenset[str]] | None = None
    # VNI -> its member hosts that have no red TEP (made when first asked).
    no_red: dict[int, set[str]] | None = None
    # Every TEP as a number, sorted, per colour and address family (made from `tep` unless
    # given); each pool is the smallest prefix covering one such list, where group
    # prefixes may widen to.
    numbers: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    pools: dict[tuple[str, int], Network] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.numbers:
            for (_, colour), text in self.tep.items():
                address = ipaddress.ip_address(text)
                self.numbers.setdefault((colour, address.version), []).append(int(address))
            for numbers in self.numbers.values():
                numbers.sort()
        for (colour, version), numbers in self.numbers.items():
            if not numbers:
                continue
            network = ipaddress.ip_network((numbers[0], 128 if version == 6 else 32))
            while int(network.broadcast_address) < numbers[-1]:
                network = network.supernet()
            self.pools[(colour, version)] = network

    def hosts_in(self, vni: int) -> frozenset[str]:
        if self.vni_hosts is None:
            self.vni_hosts = {v: frozenset(m["host"] for m in ms) for v, ms in self.members.items()}
        return self.vni_hosts.get(vni, frozenset())

    def members_without_red(self, vni: int) -> set[str]:
        if self.no_red is None:
            self.no_red = {}
            for number, members in self.members.items():
                if hosts := {m["host"] for m in members if m["red"] is None}:
                    self.no_red[number] = hosts
        return self.no_red.get(vni, set())

    @classmethod
    def of(cls, fabric: Fabric) -> _Topology:
        tep = {(t.node, t.colour.value): str(t.address) for t in fabric.teps.values()}
        local: dict[str, list[dict[str, Any]]] = {}
        members: dict[int, list[dict[str, Any]]] = {}
        for w in sorted(fabric.workloads.values(), key=lambda w: w.name):
            local.setdefault(w.node, []).append(_local(w))
            members.setdefault(w.vni, []).append(_member(w, tep))
        return cls(
            address={k: str(p.address.ip) for k, p in fabric.ports.items() if p.address},
            tep=tep,
            defaults=sorted({_default(a) for a in tep.values()}),
            missing_red=any((node, "red") not in tep for node, _ in tep),
            local=local,
            offload={n.name: n.offload.value for n in fabric.nodes.values()},
            members=members,
        )

    def moved(self, fabric: Fabric, hosts: set[str]) -> _Topology:
        """This index with `hosts` as `fabric` now has them, the rest as it was: the
        fast path for a change of hosts only. (A switch port that went with a host's link
        may keep its entry in `address`: no route uses it.)"""
        address = {k: v for k, v in self.address.items() if k[0] not in hosts}
        tep = {k: v for k, v in self.tep.items() if k[0] not in hosts}
        offload = {h: v for h, v in self.offload.items() if h not in hosts}
        numbers = {k: list(v) for k, v in self.numbers.items()}
        for (host, colour), text in self.tep.items():
            if host in hosts:
                address_ = ipaddress.ip_address(text)
                numbers[(colour, address_.version)].remove(int(address_))
        for host in hosts & fabric.nodes.keys():
            offload[host] = fabric.nodes[host].offload.value
            for name in fabric.node_ports[host]:
                ends = [fabric.ports[(host, name)]]
                if (link_id := fabric.link_of_port.get((host, name))) is not None:
                    link = fabric.links[link_id]
                    ends.append(fabric.ports[port_key(link.b if link.a.node == host else link.a)])
                address.update({(p.node, p.name): str(p.address.ip) for p in ends if p.address})
            for colour in Colour:
                if (found := fabric.teps.get((host, colour))) is not None:
                    tep[(host, colour.value)] = str(found.address)
                    bisect.insort(numbers.setdefault((colour.value, found.address.version), []),
                                  int(found.address))  # fmt: skip
        workloads = sorted((w for w in fabric.workloads.values() if w.node in hosts),
                           key=lambda w: w.name)  # fmt: skip
        local = {h: w for h, w in self.local.items() if h not in hosts}
        vnis = {w["vni"] for h in hosts for w in self.local.get(h, [])}
        for w in workloads:
            local.setdefault(w.node, []).append(_local(w))
            vnis.add(w.vni)
        members = dict(self.members)  # the lists of other VNIs are shared, never changed
        for vni in vnis:
            kept = [m for m in self.members.get(vni, []) if m["host"] not in hosts]
            kept += [_member(w, tep) for w in workloads if w.vni == vni]
            members[vni] = sorted(kept, key=lambda m: str(m["name"]))
            if not members[vni]:
                del members[vni]
        return _Topology(
            address=address,
            tep=tep,
            defaults=sorted({_default(a) for a in tep.values()}),
            missing_red=any((node, "red") not in tep for node, _ in tep),
            local=local,
            offload=offload,
            members=members,
            numbers=numbers,
        )

    def widen(self, block: N, own: list[int], colour: str) -> N:
        """`block` of one group's TEPs, widened to the largest prefix in its colour's pool
        that holds no other TEP (of any group or colour): a prefix that stays the same while
        hosts come and go within it, so their switches' routes toward it stay too."""
        pool = self.pools[(colour, block.version)]
        lists = [v for (_, version), v in self.numbers.items() if version == block.version]
        while block.prefixlen > pool.prefixlen:
            wider = block.supernet()
            low, high = int(wider.network_address), int(wider.broadcast_address)
            everyone = sum(bisect.bisect_right(n, high) - bisect.bisect_left(n, low) for n in lists)
            mine = bisect.bisect_right(own, high) - bisect.bisect_left(own, low)
            if everyone != mine:
                break
            block = wider
        return block


def _local(w: Workload) -> dict[str, Any]:
    return {"name": w.name, "vni": w.vni, "vf": w.vf, "mac": w.mac, "ip": str(w.ip)}


def _member(w: Workload, tep: dict[tuple[str, str], str]) -> dict[str, Any]:
    return {"name": w.name, "mac": w.mac, "ip": str(w.ip), "host": w.node,
            "red": tep.get((w.node, "red")), "blue": tep.get((w.node, "blue"))}  # fmt: skip


@dataclass(frozen=True)
class HostsMoved:
    """A topology change that touched only hosts (`hosts`, their nodes, ports, links, TEPs,
    workloads; VNIs and tenants): the new topology index for `DesiredStates.advance`."""

    topology: _Topology
    hosts: set[str]

    @classmethod
    def of(cls, fabric: Fabric, hosts: set[str], before: _Topology | None = None) -> HostsMoved:
        """`before`: the topology index of the states being advanced (patched, not rebuilt)."""
        topology = before.moved(fabric, hosts) if before else _Topology.of(fabric)
        return cls(topology, hosts)


@dataclass
class DesiredStates:
    topology: _Topology
    plan: Plan
    revision: int
    prefixes: dict[tuple[Group, ColourIndex], list[str]] = field(default_factory=dict)
    switch_routes: dict[str, dict[RouteKey, Route]] = field(default_factory=dict)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    changes: dict[str, NodeChange] = field(default_factory=dict)  # hosts, since the last states
    # Switch routes as they were before `advance`: (switch -> key -> route or None if absent).
    previous: dict[str, dict[RouteKey, Route | None]] = field(default_factory=dict)
    _gaps: dict[Group, set[Group]] = field(default_factory=dict)
    _written: set[tuple[str, RouteKey]] = field(default_factory=set)
    _backup_docs: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    # The writing leader's term, stamped on every document (set by the service as it writes).
    term: int = 0

    @classmethod
    def build(cls, fabric: Fabric, plan: Plan, revision: int) -> DesiredStates:
        states = cls(_Topology.of(fabric), plan, revision)
        states._group_prefixes()
        states.switch_routes = {s: {} for s in plan.graph.switches}
        for group in plan.trees:
            states._add_group(group)
        for host in sorted(plan.graph.attachments):
            states.hosts[host] = states._host(host)
        states.changes = {}
        # Built from nothing: no predecessor to stage from (`_put` noted every route as new),
        # so `document_at` gives whole documents until `compare_with` names a predecessor.
        states.previous = {}
        return states

    # --- switches ---------------------------------------------------------------------------

    def _group_prefixes(self, only: set[Group] | None = None) -> None:
        """Each group's TEPs per colour, collapsed to as few prefixes as they allow, each
        widened while it holds no other TEP (`_Topology.widen`): every group's, or `only`
        these; a group that is gone loses its prefixes."""
        tep, groups = self.topology.tep, self.plan.graph.groups
        for group in only if only is not None else list(groups):
            hosts = groups.get(group)
            if hosts is None:
                for colour in COLOURS:
                    self.prefixes.pop((group, colour), None)
                continue
            for colour in COLOURS:
                name = NAMES[colour]
                addresses = [
                    ipaddress.ip_address(tep[(h, name)]) for h in hosts if (h, name) in tep
                ]
                v4 = [ipaddress.IPv4Network(a) for a in addresses if a.version == 4]
                v6 = [ipaddress.IPv6Network(a) for a in addresses if a.version == 6]
                self.prefixes[(group, colour)] = [
                    *self._widened(v4, name),
                    *self._widened(v6, name),
                ]

    def _widened(self, teps: list[N], colour: str) -> list[str]:
        """One group's TEPs of one family and colour as collapsed, widened prefixes."""
        own = sorted(int(t.network_address) for t in teps)
        blocks = ipaddress.collapse_addresses(teps)
        widened = [self.topology.widen(b, own, colour) for b in blocks]
        return [str(n) for n in ipaddress.collapse_addresses(widened)]

    def _add_group(self, group: Group, only: set[int] | None = None) -> None:
        """Switches' routes toward `group`'s TEP prefixes, per colour (all, or `only` these)."""
        graph, trees, topo = self.plan.graph, self.plan.trees[group], self.topology
        hosts = graph.groups.get(group, [])
        switches = range(len(graph.switches)) if only is None else sorted(only)
        for colour in COLOURS:
            name = NAMES[colour]
            prefixes = self.prefixes.get((group, colour), [])
            routes = routing(graph, trees, colour)
            for v in switches:
                hop = routes.next[v]
                if hop is None:
                    continue
                switch = graph.switches[v]
                table = self.switch_routes[switch]
                stage = routes.dist[v]
                if hop.switch == HOST:  # the destination hangs off this switch: a /32 each
                    for host in hosts:
                        address = topo.tep.get((host, name))
                        a = _attachment_at(graph.attachments[host], v)
                        if address is None or a is None:
                            continue
                        prefix = _host_prefix(address)
                        self._put(switch, table, (prefix, name), {
                            "prefix": prefix, "colour": name, "port": a.switch_port,
                            "neighbour": host, "via": topo.address.get((host, a.host_port)),
                            "stage": stage,
                        })  # fmt: skip
                    continue
                edge = graph.edges[hop.edge]
                neighbour = graph.switches[hop.switch]
                base: dict[str, Any] = {
                    "colour": name,
                    "port": edge.port_at(v),
                    "neighbour": neighbour,
                    "via": topo.address.get((neighbour, edge.port_at(hop.switch))),
                    "stage": stage,
                }
                if (alternate := routes.backup.get(v)) is not None:
                    base["backup"] = self._backup(v, alternate)
                for prefix in prefixes:
                    self._put(switch, table, (prefix, name), {"prefix": prefix, **base})

    def _backup(self, v: int, hop: NextHop) -> dict[str, Any]:
        """The document form of switch `v`'s backup next hop (shared by its routes)."""
        key = (v, hop.edge)
        found = self._backup_docs.get(key)
        if found is None:
            graph = self.plan.graph
            edge, neighbour = graph.edges[hop.edge], graph.switches[hop.switch]
            via = self.topology.address.get((neighbour, edge.port_at(hop.switch)))
            found = {"port": edge.port_at(v), "neighbour": neighbour, "via": via}
            self._backup_docs[key] = found
        return found

    def _put(self, switch: str, table: dict[RouteKey, Route], key: RouteKey, route: Route) -> None:
        self._written.add((switch, key))
        before = table.get(key)
        if before == route:
            return
        self.previous.setdefault(switch, {}).setdefault(key, before)
        table[key] = route

    def _redo_at(self, group: Group, plan: Plan, switches: set[int]) -> None:
        """Rebuild `group`'s routes at some switches, recording only real changes."""
        self._written = set()
        self._add_group(group, switches)
        self._drop(group, plan, switches, keep=self._written)

    def _group_keys(self, group: Group, plan: Plan) -> set[RouteKey]:
        """The route keys `group` has in these states' tables (prefixes and host /32s)."""
        keys: set[RouteKey] = {
            (p, NAMES[c]) for c in COLOURS for p in self.prefixes.get((group, c), [])
        }
        for host in plan.graph.groups.get(group, []):
            for c in COLOURS:
                address = self.topology.tep.get((host, NAMES[c]))
                if address:
                    keys.add((_host_prefix(address), NAMES[c]))
        return keys

    def _drop(
        self,
        group: Group,
        plan: Plan,
        only: set[int] | None = None,
        keep: set[tuple[str, RouteKey]] | None = None,
    ) -> None:
        """Remove `group`'s routes (everywhere, or at `only` these switches), but `keep`."""
        self._drop_keys(self._group_keys(group, plan), only, keep)

    def _drop_keys(
        self,
        keys: set[RouteKey],
        only: set[int] | None = None,
        keep: set[tuple[str, RouteKey]] | None = None,
    ) -> None:
        switches = self.plan.graph.switches
        for switch in switches if only is None else [switches[v] for v in only]:
            table = self.switch_routes[switch]
            for key in keys:
                if keep is not None and (switch, key) in keep:
                    continue
                before = table.pop(key, None)
                if before is not None:
                    self.previous.setdefault(switch, {}).setdefault(key, before)

    # --- hosts ------------------------------------------------------------------------------

    def _host(self, host: str) -> dict[str, Any]:
        graph, topo = self.plan.graph, self.topology
        attachments = graph.attachments.get(host, [])
        source = graph.group_of(host)
        routes: list[Route] = []
        if len({a.host_port for a in attachments}) == 1:
            # Single-homed: both colours leave by the one port; the switch tells them apart.
            a = attachments[0]
            switch = graph.switches[a.switch]
            for prefix in topo.defaults:
                routes.append({
                    "prefix": prefix, "colour": None, "port": a.host_port, "neighbour": switch,
                    "via": topo.address.get((switch, a.switch_port)), "stage": HOST_STAGE,
                })  # fmt: skip
        elif attachments:
            for group in self.plan.trees:
                starts = self.plan.egress(source, group)
                if starts is None:
                    continue
                for colour, start in zip(COLOURS, starts, strict=True):
                    at = _attachment_at(attachments, start)
                    if at is None:
                        continue
                    switch = graph.switches[at.switch]
                    for prefix in self.prefixes.get((group, colour), []):
                        routes.append({
                            "prefix": prefix, "colour": NAMES[colour], "port": at.host_port,
                            "neighbour": switch, "stage": HOST_STAGE,
                            "via": topo.address.get((switch, at.switch_port)),
                        })  # fmt: skip
        local = topo.local.get(host, [])
        vnis = sorted({w["vni"] for w in local})
        gaps = self._red_gaps(source)
        # Peers red cannot reach: those without a red TEP, and (rare) those in groups only
        # blue reaches from here. Not a scan of every member per host: one host without a
        # red TEP in a VNI of 8,192 made that 67 million steps (135 s at k=32).
        blue_peers: set[str] = set()
        for vni in vnis if gaps or topo.missing_red else ():
            blue_peers |= topo.members_without_red(vni)
            if gaps:
                blue_peers |= {m["host"] for m in topo.members.get(vni, [])
                               if graph.group_of(m["host"]) in gaps}  # fmt: skip
        blue_peers.discard(host)
        return {
            "kind": "host",
            "node": host,
            "teps": {c: topo.tep[(host, c)] for c in ("red", "blue") if (host, c) in topo.tep},
            "routes": sorted(routes, key=lambda r: (r["prefix"], r["colour"] or "")),
            "local": local,
            "vnis": vnis,
            "blue_peers": sorted(blue_peers),
            "offload": topo.offload.get(host, "auto"),
        }

    def peers_of(self, host: str, among: Set[str] | None = None) -> set[str]:
        """The hosts that `host` has workloads in common VNIs with (its encap targets); only
        those `among` the given hosts, if given (cheaper than all of them, then a cut)."""
        topo = self.topology
        out: set[str] = set()
        for vni in {w["vni"] for w in topo.local.get(host, ())}:
            out |= topo.hosts_in(vni) if among is None else topo.hosts_in(vni) & among
        out.discard(host)
        return out

    def _red_gaps(self, source: Group) -> set[Group]:
        """Destination groups only blue reaches from `source` (usually none)."""
        if source not in self._gaps:
            self._gaps[source] = {
                g for g in self.plan.graph.groups if self.plan.blue_only(source, g)
            }
        return self._gaps[source]

    # --- documents --------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        return sorted([*self.switch_routes, *self.hosts])

    def document(self, node: str) -> bytes:
        header = {
            "node": node,
            "plan_revision": self.revision,
            "topology_revision": self.plan.topology_revision,
            "term": self.term,
        }
        if node in self.switch_routes:
            routes = sorted(
                self.switch_routes[node].values(), key=lambda r: (r["prefix"], r["colour"] or "")
            )
            return orjson.dumps({"kind": "switch", **header, "routes": routes})
        return orjson.dumps({**self.hosts[node], **header})

    def document_at(self, node: str, stage: int) -> bytes:
        """A switch's document with only the route changes of stages up to `stage` applied:
        what to write at that stage of a make-before-break update."""
        previous = self.previous.get(node)
        if node not in self.switch_routes or not previous:
            return self.document(node)
        table = dict(self.switch_routes[node])
        for key, before in previous.items():
            now = table.get(key)
            if (now["stage"] if now is not None else REMOVAL_STAGE) > stage:
                if before is None:
                    table.pop(key, None)
                else:
                    table[key] = before
        routes = sorted(table.values(), key=lambda r: (r["prefix"], r["colour"] or ""))
        return orjson.dumps({
            "kind": "switch", "node": node, "plan_revision": self.revision,
            "topology_revision": self.plan.topology_revision, "term": self.term,
            "routes": routes,
        })  # fmt: skip

    def depends_on(self, node: str, stage: int) -> set[str]:
        """The switches whose agents must have applied their new routes before `node` may
        take its route changes of `stage`: make-before-break hop by hop. For each changed
        route, from its next hop (and its backup's) along the new routes, the first switch
        whose route for that prefix changed too (written at a lower stage). Switches on the
        way whose route did not change are passed through, not stopped at: they forward as
        before into a switch that may not have its new route yet."""
        previous = self.previous.get(node)
        table = self.switch_routes.get(node)
        if not previous or table is None:
            return set()
        out: set[str] = set()
        for key, before in previous.items():
            now = table.get(key)
            if now is None or now == before or now["stage"] != stage:
                continue
            starts = [now["neighbour"]]
            if (backup := now.get("backup")) is not None:
                starts.append(backup["neighbour"])
            for hop in starts:
                if (changed := self._first_changed(hop, key)) is not None:
                    out.add(changed)
        out.discard(node)  # a backup that leads back through itself
        return out

    def _first_changed(self, hop: str, key: RouteKey) -> str | None:
        """Along the new routes for `key` from `hop`: the first switch whose route for it
        changed in this update, or None (the destination reached first)."""
        seen: set[str] = set()
        while hop not in seen and (route := self.switch_routes.get(hop, {}).get(key)):
            before = self.previous.get(hop, {})
            if key in before and before[key] != route:
                return hop
            seen.add(hop)
            hop = route["neighbour"]
        return None

    def vni_documents(self) -> dict[str, bytes]:
        """Every VNI's membership, chunked: KV key -> document (depends on topology only)."""
        out: dict[str, bytes] = {}
        for vni, members in sorted(self.topology.members.items()):
            chunks = max(1, -(-len(members) // VNI_CHUNK))
            for i in range(chunks):
                out[vni_key(vni, i)] = orjson.dumps({
                    "kind": "vni", "vni": vni, "chunk": i, "chunks": chunks,
                    "topology_revision": self.plan.topology_revision,
                    "members": members[i * VNI_CHUNK : (i + 1) * VNI_CHUNK],
                })  # fmt: skip
        return out

    # --- incremental ------------------------------------------------------------------------

    def advance(
        self,
        plan: Plan,
        recomputed: frozenset[Group],
        dropped: frozenset[Group],
        revision: int,
        moved_hosts: HostsMoved | None = None,
    ) -> DesiredStates:
        """The states for `plan`, rebuilding only what the update touched.

        Same topology, or (`moved_hosts`) one where only hosts changed: their nodes, ports,
        links, TEPs or workloads, nothing of the switches. The route tables move to the new
        states (this one must not be used afterwards); `changes` of the new states lists
        what moved, for `diff`.
        """
        topology = moved_hosts.topology if moved_hosts else self.topology
        new = DesiredStates(topology, plan, revision)
        old_groups, new_groups = self.plan.graph.groups, plan.graph.groups
        # Groups whose hosts changed (a host link failed or came back, a host came or went)
        # or whose hosts' TEPs did: new TEP prefixes.
        regrouped = {g for g in old_groups.keys() | new_groups.keys()
                     if old_groups.get(g) != new_groups.get(g)}  # fmt: skip
        if moved_hosts:
            regrouped |= {group_of(h) for group_of in (self.plan.graph.group_of,
                          plan.graph.group_of) for h in moved_hosts.hosts}  # fmt: skip
            regrouped.discard(())  # isolated hosts have no routes toward them
        new.prefixes = dict(self.prefixes)
        if moved_hosts and topology.pools != self.topology.pools:
            new._group_prefixes()  # a pool grew or shrank: any group may widen differently
            regrouped |= {g for g, _ in new.prefixes.keys() | self.prefixes.keys()
                          if new.prefixes.get((g, _)) != self.prefixes.get((g, _))}  # fmt: skip
        elif regrouped or moved_hosts:
            # Groups whose widened prefix a moved TEP bounded, or now bounds.
            near = self._widened_near(moved_hosts) - regrouped if moved_hosts else set()
            new._group_prefixes(regrouped | near)
            regrouped |= {g for g in near if any(new.prefixes.get((g, c)) != self.prefixes.get(
                (g, c)) for c in COLOURS)}  # fmt: skip
        new.switch_routes, self.switch_routes = self.switch_routes, {}
        new._backup_docs = self._backup_docs
        relinked = plan.graph.alive != self.plan.graph.alive
        # Groups the update recomputed into the trees they had: a link coming back may be
        # any group's choice, so all are recomputed, and nearly all come out as before.
        # Only a link's ends can move there, as in a group the update kept (below); with no
        # link changed (a switch undrained whose links health still holds out), nothing,
        # unless the switches with hosts moved (an idle switch is one without).
        same = _same_trees(self.plan, plan, recomputed - regrouped)
        if relinked:
            recomputed = recomputed - same
        elif self.plan.graph.sources == plan.graph.sources:
            recomputed = recomputed - same
            if plan.graph is not self.plan.graph:  # the next event starts from these
                for group in set(plan.trees) - recomputed - regrouped:
                    carry_routing(self.plan.graph, self.plan.trees.get(group, plan.trees[group]),
                                  plan.graph, plan.trees[group], known_only=True)  # fmt: skip
        # Write the changed groups' new routes, then drop the old keys nobody wrote again:
        # a route that comes out the same (a host moved between groups) is no change.
        # Groups whose hosts changed but not their trees nor their prefixes: only the host
        # routes (a /32 each) at their own switches move.
        local = {g for g in regrouped - recomputed if g in plan.trees and g in self.plan.trees
                 and all(new.prefixes.get((g, c)) == self.prefixes.get((g, c))
                         for c in COLOURS)}  # fmt: skip
        new._written = set()
        for group in regrouped - local:
            if group in plan.trees:
                new._add_group(group)
        for group in dropped | (regrouped - local):
            new._drop_keys(self._group_keys(group, self.plan), keep=new._written)
        for group in local:
            new._written = set()
            new._add_group(group, set(group))
            new._drop_keys(self._group_keys(group, self.plan), set(group), keep=new._written)
        for group in recomputed - regrouped:
            old = self.plan.trees.get(group)
            if old is None:
                new._add_group(group)
                continue
            # Only switches whose route (next hop, distance) or backup moved get new routes.
            moved = _moved(self.plan.graph, old, plan.graph, plan.trees[group])
            if moved:
                new._redo_at(group, self.plan, moved)
        if relinked:
            # Groups the update kept have the same trees; only a backup or an idle
            # switch's descent at the ends of a changed link can move.
            changed = [i for i, (a, b) in enumerate(zip(plan.graph.alive, self.plan.graph.alive,
                                                        strict=True)) if a != b]  # fmt: skip
            for group in set(plan.trees) - recomputed - regrouped:
                trees = plan.trees[group]
                before = self.plan.trees.get(group, trees)  # equal; its routing is cached
                if not _may_move(self.plan.graph, before, plan.graph, changed):
                    carry_routing(self.plan.graph, before, plan.graph, trees)
                elif moved := _moved(self.plan.graph, before, plan.graph, trees):
                    new._redo_at(group, self.plan, moved)
        new.hosts = {h: d for h, d in self.hosts.items() if h in plan.graph.attachments}
        redo = self._touched(plan, recomputed, regrouped)
        redo |= {h for g in regrouped for h in new_groups.get(g, [])}
        if moved_hosts:
            redo |= moved_hosts.hosts | self._hosts_seeing(moved_hosts, new)
        for host in redo & set(plan.graph.attachments):
            document = new._host(host)
            if new.hosts.get(host) != document:
                new.hosts[host] = document
                new.changes[host] = NodeChange(host, HOST_STAGE)
        return new

    def _widened_near(self, moved: HostsMoved) -> set[Group]:
        """Groups whose prefix a moved host's TEP (before or after) may bound: those whose
        prefix is a supernet of it, or the sibling of one (`_Topology.widen` stops below a
        supernet holding a foreign TEP)."""
        owners: dict[str, set[Group]] = {}
        for (group, _), prefixes in self.prefixes.items():
            for prefix in prefixes:
                owners.setdefault(prefix, set()).add(group)
        near: set[Group] = set()
        for topology in (self.topology, moved.topology):
            for text in (topology.tep.get((h, c)) for h in moved.hosts for c in NAMES):
                if text is None:
                    continue
                network = ipaddress.ip_network(text)
                while True:
                    near |= owners.get(str(network), set())
                    if network.prefixlen == 0:
                        break
                    network = network.supernet()
                    for half in network.subnets():
                        near |= owners.get(str(half), set())
        return near

    def _hosts_seeing(self, moved: HostsMoved, new: DesiredStates) -> set[str]:
        """Other hosts whose documents can name a moved host: every host when the TEP
        address families changed (their default routes); else the moved hosts' VNI peers
        that reach it by blue only, before or after (their `blue_peers` lists)."""
        if new.topology.defaults != self.topology.defaults:
            return set(new.plan.graph.attachments)
        out: set[str] = set()
        states = (self, new)
        for host in moved.hosts:
            vnis = {m["vni"] for s in states for m in s.topology.local.get(host, [])}
            peers = {m["host"] for s in states for vni in vnis
                     for m in s.topology.members.get(vni, [])} - {host}  # fmt: skip
            if any(host in s.topology.local and (host, "red") not in s.topology.tep
                   for s in states):  # fmt: skip
                out |= peers  # a member without a red TEP: a blue peer of all of them
                continue
            for st in states:
                graph, destination = st.plan.graph, st.plan.graph.group_of(host)
                blue = {g for g in graph.groups if st.plan.blue_only(g, destination)}
                if blue:  # rare: some groups reach it by blue only
                    out |= {p for p in peers if graph.group_of(p) in blue}
        return out

    def compare_with(self, old: DesiredStates) -> None:
        """Record what differs from `old` (built independently, e.g. before a full replan),
        so that `diff` and `document_at` stage the move from it."""
        self.previous = {}
        for switch, table in self.switch_routes.items():
            before = old.switch_routes.get(switch, {})
            moved: dict[RouteKey, Route | None] = {
                key: before.get(key) for key, route in table.items() if before.get(key) != route
            }
            moved.update({key: route for key, route in before.items() if key not in table})
            if moved:
                self.previous[switch] = moved
        self.changes = {
            host: NodeChange(host, HOST_STAGE)
            for host, document in self.hosts.items()
            if old.hosts.get(host) != document
        }

    def _touched(self, plan: Plan, recomputed: frozenset[Group], regrouped: set[Group]) -> set[str]:
        """Hosts whose document a plan change can alter: multi-homed hosts (their egress per
        destination follows the trees) and hosts for which a recomputed destination became,
        or stopped being, reachable by blue only (the colour they use toward its hosts)."""
        graph = plan.graph
        hosts = {h for h, a in graph.attachments.items() if len({x.host_port for x in a}) > 1}
        sources = self.plan.graph.sources | graph.sources  # any source group's switches
        for destination in recomputed | regrouped:
            if all(_both_colours(p, destination, sources) for p in (self.plan, plan)):
                continue  # no source is blue-only toward it, before or after
            for source, members in graph.groups.items():
                before = self.plan.blue_only(source, destination)
                after = plan.blue_only(source, destination)
                # A flip changes the colour; a blue-only group that changed hosts, the list.
                if before != after or (destination in regrouped and after):
                    hosts.update(members)
        return hosts


def _moved(
    old_graph: FabricGraph, old: GroupTrees, graph: FabricGraph, new: GroupTrees
) -> set[int]:
    """Switches whose route or backup toward one group differs between two plans."""
    moved: set[int] = set()
    for c in COLOURS:
        a, b = routing(old_graph, old, c), routing(graph, new, c)
        moved.update(
            v for v, (x, y) in enumerate(zip(a.next, b.next, strict=True))
            if x != y or a.dist[v] != b.dist[v] or a.backup.get(v) != b.backup.get(v)
        )  # fmt: skip
    return moved


def _both_colours(plan: Plan, destination: Group, switches: Set[int]) -> bool:
    """Whether each of `switches` reaches `destination` by both colours in `plan`: then no
    source group among them is blue-only toward it (`Plan.blue_only`), as in a healthy
    fabric, and the check per source (512 x 512 pairs at k=32) can be skipped."""
    trees = plan.trees.get(destination)
    if trees is None:
        return False
    return all(trees.dist[c][s] < INF for c in COLOURS for s in switches)


def _same_trees(old: Plan, new: Plan, groups: Set[Group]) -> set[Group]:
    """Those of `groups` whose trees in `new` equal their trees in `old`."""
    out: set[Group] = set()
    for group in groups:
        before, after = old.trees.get(group), new.trees.get(group)
        if (
            before is not None
            and after is not None
            and (
                after is before
                or (after.dist == before.dist and after.level == before.level and after == before)
            )
        ):
            out.add(group)
    return out


def _may_move(
    old_graph: FabricGraph, trees: GroupTrees, graph: FabricGraph, edges: list[int]
) -> bool:
    """Whether changed `edges` can move a route or backup of a group whose trees stayed:
    a lost edge only if a route (an idle descent) or a backup took it; a gained one only if
    an end of it would take it (`backups.gained_link_moves`). Checked per link from the
    routing before, which is kept: a restored link may be any group's choice, and computing
    every group's routing again to find the few that change took seconds at k=32."""
    if old_graph.sources != graph.sources:
        return True  # which switches count as idle moved
    for c in COLOURS:
        r = routing(old_graph, trees, c)
        for i in edges:
            e = graph.edges[i]
            if not graph.alive[i]:
                for end in (e.u, e.v):
                    hop, alternate = r.next[end], r.backup.get(end)
                    if (hop is not None and hop.edge == i) or (alternate and alternate.edge == i):
                        return True
            elif gained_link_moves(old_graph, trees, c, r, i):
                return True
    return False


def _attachment_at(attachments: list[Attachment], switch: int) -> Attachment | None:
    return next((a for a in attachments if a.switch == switch), None)


def diff(old: DesiredStates | None, new: DesiredStates) -> list[NodeChange]:
    """Nodes whose document changed, by the stage of their first write, then by name.

    A switch route's change belongs to the stage of its new route (its distance to the
    destination along the new tree); a removal goes last; hosts come after every switch.
    Write stage by stage with `new.document_at(node, stage)`: a switch never points at a
    neighbour that has not learned the new route yet (destination outward, no loops).
    Without `old`: every node, all at stage 0 (a first programming has no traffic to loop).
    """
    if old is None:
        return [NodeChange(n, 0, stages=[0]) for n in new.nodes()]
    changes: list[NodeChange] = []
    for node, previous in new.previous.items():
        table = new.switch_routes[node]
        change = NodeChange(node, REMOVAL_STAGE)
        stages: set[int] = set()
        for key, before in previous.items():
            now = table.get(key)
            if now == before:
                continue
            if now is None:
                change.removed += 1
                stages.add(REMOVAL_STAGE)
            else:
                stages.add(now["stage"])
                if before is None:
                    change.added += 1
                else:
                    change.replaced += 1
        if stages:
            change.stages = sorted(stages)
            change.stage = change.stages[0]
            changes.append(change)
    for change in new.changes.values():
        change.stages = [change.stage]
        changes.append(change)
    return sorted(changes, key=lambda c: (c.stage, c.node))


__all__ = ["HOST_STAGE", "REMOVAL_STAGE", "DesiredStates", "HostsMoved", "NodeChange", "diff"]
