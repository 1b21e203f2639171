"""A whole fabric in memory, with the rules that span entities.

`Fabric` is the pure core of the topology service: every write is validated here first and,
when valid, applied and described as a list of `Change`s that the store persists in one
transaction. Nothing here does I/O. A failed operation leaves the fabric exactly as it was.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from thorn.model import (
    FABRIC_FORMAT,
    AdminState,
    Colour,
    FabricDocument,
    FabricSummary,
    IPAddress,
    Link,
    LinkSpec,
    LinkUpdate,
    Miscabled,
    Node,
    NodeSpec,
    NodeUpdate,
    Port,
    PortRef,
    PortSpec,
    PortUpdate,
    Role,
    Tenant,
    TenantUpdate,
    Tep,
    Vni,
    Workload,
)

Loc = tuple[str | int, ...]
IssueKind = Literal["invalid", "not_found", "conflict"]
EntityKind = Literal["node", "port", "link", "tenant", "vni", "workload", "tep", "cabling"]
ChangeOp = Literal["create", "update", "delete"]
MAX_ISSUES = 100
# The model of each kind's row: what a Change's value is (and what an event carries).
ROW_MODELS: dict[str, type[BaseModel]] = {
    "node": Node, "port": Port, "link": Link, "tenant": Tenant, "vni": Vni,
    "workload": Workload, "tep": Tep, "cabling": Miscabled,
}  # fmt: skip


@dataclass(frozen=True)
class Issue:
    """One broken rule: where (a path into the request body) and what."""

    loc: Loc
    msg: str
    kind: IssueKind = "invalid"

    def at(self, *prefix: str | int) -> Issue:
        return Issue((*prefix, *self.loc), self.msg, self.kind)

    def __str__(self) -> str:
        where = ".".join(str(p) for p in self.loc)
        return f"{where}: {self.msg}" if where else self.msg


class FabricError(Exception):
    """A request breaks one or more fabric rules; nothing was changed."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(str(i) for i in issues[:5]))
        self.issues = issues

    def __reduce__(self) -> tuple[type[FabricError], tuple[list[Issue]]]:
        return (FabricError, (self.issues,))  # whole across a process boundary

    @classmethod
    def one(cls, loc: Loc, msg: str, kind: IssueKind = "invalid") -> FabricError:
        return cls([Issue(loc, msg, kind)])


class NotFound(Exception):
    """The resource a request addresses (by URL) does not exist."""


class NotReplayable(Exception):
    """A `topology.changed` event's rows cannot be replayed on a held fabric (`replayed`)."""


@dataclass(frozen=True)
class Change:
    """One row-level effect of an operation, in the order the store must apply it."""

    kind: EntityKind
    op: ChangeOp
    key: str
    value: BaseModel | None = None

    @property
    def summary(self) -> dict[str, str]:
        return {"kind": self.kind, "op": self.op, "key": self.key}


class RowChange(Protocol):
    """A change as `Fabric.replay` takes it: a `Change`, or an event's (its row as JSON)."""

    @property
    def kind(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> Any: ...


PortKey = tuple[str, str]


def port_key(ref: PortRef) -> PortKey:
    return (ref.node, ref.port)


@dataclass
class _Intervals:
    """Disjoint address ranges, sorted, each with the ports that use it (at most two)."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    users: list[list[PortKey]] = field(default_factory=list)

    def find(self, start: int, end: int) -> int | None:
        """Index of the range that overlaps [start, end], if any (ranges are disjoint)."""
        i = bisect.bisect_right(self.starts, end) - 1
        if i >= 0 and self.ends[i] >= start:
            return i
        return None

    def add(self, start: int, end: int, user: PortKey) -> None:
        i = self.find(start, end)
        if i is not None:
            bisect.insort(self.users[i], user)  # sorted: messages never depend on history
            return
        j = bisect.bisect_left(self.starts, start)
        self.starts.insert(j, start)
        self.ends.insert(j, end)
        self.users.insert(j, [user])

    def copy(self) -> _Intervals:
        return _Intervals(list(self.starts), list(self.ends), [list(u) for u in self.users])

    def remove(self, start: int, end: int, user: PortKey) -> None:
        i = self.find(start, end)
        if i is None:
            return
        self.users[i].remove(user)
        if not self.users[i]:
            del self.starts[i], self.ends[i], self.users[i]


def _span(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[int, int]:
    return int(net.network_address), int(net.broadcast_address)


class Fabric:
    """Nodes, ports, links, tenants, VNIs, workloads and TEPs, with their cross-rules."""

    def __init__(self, revision: int = 0, next_link_id: int = 1) -> None:
        self.revision = revision
        self.next_link_id = next_link_id
        self.nodes: dict[str, Node] = {}
        self.ports: dict[PortKey, Port] = {}
        self.node_ports: dict[str, list[str]] = {}
        self.links: dict[int, Link] = {}
        self.link_of_port: dict[PortKey, int] = {}
        self.tenants: dict[str, Tenant] = {}
        self.vnis: dict[int, Vni] = {}
        self.workloads: dict[str, Workload] = {}
        self.teps: dict[tuple[str, Colour], Tep] = {}
        # Links the cabling check found miscabled (observed, not declared: never exported),
        # link id -> what was heard. Path computation leaves them out, as drained links.
        self.miscabled: dict[int, Miscabled] = {}
        # Indexes behind the cross-entity rules.
        self._address_owner: dict[IPAddress, str] = {}
        self._mac_owner: dict[str, str] = {}
        self._nets: dict[int, _Intervals] = {4: _Intervals(), 6: _Intervals()}
        self._tep_points: dict[int, list[int]] = {4: [], 6: []}
        self._overlay_ip: dict[tuple[int, IPAddress], str] = {}
        self._overlay_mac: dict[tuple[int, str], str] = {}
        self._vf: dict[tuple[str, str], str] = {}

    # --- whole-document operations --------------------------------------------------------

    @classmethod
    def from_document(cls, doc: FabricDocument, revision: int = 0, next_link_id: int = 1) -> Fabric:
        """Build and validate a fabric; raise FabricError listing every broken rule."""
        fabric = cls(revision, next_link_id)
        issues: list[Issue] = []

        sections: list[tuple[str, Iterable[tuple[int, object]]]] = [
            ("tenants", enumerate(doc.tenants)),
            ("vnis", enumerate(doc.vnis)),
            ("nodes", enumerate(doc.nodes)),
            ("links", enumerate(doc.links)),
            ("teps", enumerate(doc.teps)),
            ("workloads", enumerate(doc.workloads)),
        ]
        for section, items in sections:
            for index, item in items:
                try:
                    fabric._add_any(item)
                except FabricError as err:
                    issues.extend(i.at(section, index) for i in err.issues)
                    if len(issues) >= MAX_ISSUES:
                        raise FabricError(issues[:MAX_ISSUES]) from None
        if issues:
            raise FabricError(issues)
        return fabric

    def _add_any(self, item: object) -> None:
        if isinstance(item, Tenant):
            self.add_tenant(item)
        elif isinstance(item, Vni):
            self.add_vni(item)
        elif isinstance(item, NodeSpec):
            self.add_node(item)
        elif isinstance(item, LinkSpec):
            self.add_link(item)
        elif isinstance(item, Tep):
            self.add_tep(item)
        elif isinstance(item, Workload):
            self.add_workload(item)
        else:  # pragma: no cover - the document's types are closed
            raise TypeError(type(item))

    def to_document(self) -> FabricDocument:
        nodes = [
            NodeSpec(
                **node.model_dump(),
                ports=[
                    PortSpec(**self.ports[(name, p)].model_dump(exclude={"node"}))
                    for p in self.node_ports[name]
                ],
            )
            for name, node in self.nodes.items()
        ]
        return FabricDocument(
            format=FABRIC_FORMAT,
            revision=self.revision,
            nodes=nodes,
            links=list(self.links.values()),
            tenants=list(self.tenants.values()),
            vnis=list(self.vnis.values()),
            workloads=list(self.workloads.values()),
            teps=list(self.teps.values()),
        )

    def summary(self) -> FabricSummary:
        hosts = sum(1 for n in self.nodes.values() if n.role is Role.host)
        return FabricSummary(
            revision=self.revision,
            nodes=len(self.nodes),
            hosts=hosts,
            switches=len(self.nodes) - hosts,
            ports=len(self.ports),
            links=len(self.links),
            tenants=len(self.tenants),
            vnis=len(self.vnis),
            workloads=len(self.workloads),
            teps=len(self.teps),
        )

    def all_changes(self) -> list[Change]:
        """Every entity as a create, in an order that satisfies references (for bulk insert)."""
        out: list[Change] = [Change("tenant", "create", t.name, t) for t in self.tenants.values()]
        out += [Change("vni", "create", str(v.vni), v) for v in self.vnis.values()]
        out += [Change("node", "create", n.name, n) for n in self.nodes.values()]
        out += [Change("port", "create", f"{p.node}:{p.name}", p) for p in self.ports.values()]
        out += [Change("link", "create", str(lk.id), lk) for lk in self.links.values()]
        out += [Change("tep", "create", _tep_key(t), t) for t in self.teps.values()]
        out += [Change("workload", "create", w.name, w) for w in self.workloads.values()]
        out += [Change("cabling", "create", str(m.link_id), m) for m in self.miscabled.values()]
        return out

    def copy(self) -> Fabric:
        """An independent copy: its containers are new, the entities shared (they are
        frozen models, replaced and never changed in place; so are a node's port lists).
        ~30 ms at 10,000 nodes, where building it again from rows takes seconds."""
        new = Fabric(self.revision, self.next_link_id)
        new.__dict__.update({k: v.copy() if isinstance(v, dict) else v
                             for k, v in self.__dict__.items()})  # fmt: skip
        new._nets = {v: i.copy() for v, i in self._nets.items()}
        new._tep_points = {v: list(p) for v, p in self._tep_points.items()}
        return new

    def replay(self, changes: Iterable[RowChange]) -> None:
        """Apply row changes another process committed (a `topology.changed` event's), through
        the same rules as the operations that made them, in their order. Raises FabricError
        or NotFound when they do not fit this fabric (it was not at their base revision):
        then this fabric is in an unknown state and must be reloaded."""
        for change in changes:
            self._replay_one(change)

    def replayed(
        self, revision: int, changes: Sequence[RowChange], spare: Fabric | None = None
    ) -> Fabric:
        """This fabric moved to `revision` by a `topology.changed` event's rows, as a copy
        (`spare`: one made of it ahead); this one stays as it is. Raises NotReplayable when
        the rows cannot be replayed here: not the next revision, a bulk write summarised
        instead of itemised, or rows that do not fit. Then read the store whole. At k=32
        that read takes ~5 s, a replay milliseconds."""
        if revision != self.revision + 1:
            raise NotReplayable(f"revision {revision} does not follow {self.revision}")
        if not changes or any(
            c.kind not in ROW_MODELS or (c.op != "delete" and c.value is None) for c in changes
        ):
            raise NotReplayable("a bulk write: its rows are not itemised")
        fabric = spare if spare is not None else self.copy()
        try:
            fabric.replay(changes)
        except (FabricError, NotFound) as exc:
            raise NotReplayable(f"its rows do not fit: {exc}") from exc
        fabric.revision = revision
        return fabric

    def hosts_touched(self, changes: Sequence[RowChange]) -> set[str] | None:
        """The hosts that changes (about to be replayed here) touch: their nodes, ports,
        links, TEPs and workloads; tenants, VNIs and new or deleted switch ports touch none.
        None when they touch a switch, a switch port's address, or a link that joins no
        host."""
        rows = [_row_dict(c.value) for c in changes]
        roles = {n.name: n.role for n in self.nodes.values()}
        roles |= {c.key: Role(r["role"]) for c, r in zip(changes, rows, strict=True)
                  if c.kind == "node" and "role" in r}  # fmt: skip
        hosts: set[str] = set()
        for change, row in zip(changes, rows, strict=True):
            if change.kind in ("tenant", "vni"):
                continue
            if change.kind in ("link", "cabling"):
                link = self.links.get(int(change.key))
                ends = [row["a"]["node"], row["b"]["node"]] if "a" in row else []
                ends += [link.a.node, link.b.node] if link is not None else []
                names = {n for n in ends if roles.get(n) is Role.host}
                if not names:
                    return None  # a switch-to-switch link (or one this fabric does not know)
                hosts |= names
                continue
            if change.kind == "workload":
                known = self.workloads.get(change.key)
                name = str(row.get("node") or (known.node if known else ""))
            else:  # node, port "node:port", tep "node/colour"
                name = change.key.replace("/", ":").partition(":")[0]
            if roles.get(name) is Role.host:
                hosts.add(name)
            elif not (change.kind == "port" and change.op != "update"):
                return None  # a switch, or a switch port's address (the routes' next hops)
            # A switch port that comes or goes carries no link: no path uses it.
        return hosts

    def admin_states_only(self, changes: Sequence[RowChange]) -> bool:
        """Whether changes (about to be replayed here) only set admin states of nodes or
        links held here (a drain, an undrain): paths move, but no address, TEP, workload,
        SRLG or offload policy does."""
        if not changes:
            return False
        for change in changes:
            known: Node | Link | None = None
            if change.op == "update" and change.kind == "node":
                known = self.nodes.get(change.key)
            elif change.op == "update" and change.kind == "link" and change.key.isdigit():
                known = self.links.get(int(change.key))
            if known is None or change.value is None:
                return False
            try:
                row = ROW_MODELS[change.kind].model_validate(change.value)
            except ValidationError:
                return False
            if row.model_copy(update={"admin_state": known.admin_state}) != known:
                return False
        return True

    def _replay_one(self, change: RowChange) -> None:
        kind, op, key, value = change.kind, change.op, change.key, change.value
        if op == "delete":
            self._replay_delete(kind, key)
            return
        row: Any = ROW_MODELS[kind].model_validate(value)
        if kind == "node" and op == "create":
            self.add_node(NodeSpec(**row.model_dump()))
        elif kind == "node":
            node_fields = ("mgmt_address", "labels", "admin_state", "offload")
            self.update_node(key, NodeUpdate(**{f: getattr(row, f) for f in node_fields}))
        elif kind == "port" and op == "create":
            self.add_port(row.node, PortSpec(**row.model_dump(exclude={"node"})))
        elif kind == "port":
            fields = ("mac", "address", "speed_mbps")
            self.update_port(row.node, row.name, PortUpdate(**{f: getattr(row, f) for f in fields}))
        elif kind == "link" and op == "create":
            self.add_link(LinkSpec(**row.model_dump(exclude={"id"})), link_id=row.id)
        elif kind == "link":
            self.update_link(row.id, LinkUpdate(srlgs=row.srlgs, admin_state=row.admin_state))
        elif kind == "cabling":
            self.set_miscabled(row.link_id, row.reason)
        elif kind == "tenant" and op == "update":
            self.tenant(key)
            self.tenants[key] = row
        else:  # the rest only come and go
            adders: dict[str, Callable[[Any], list[Change]]] = {
                "tenant": self.add_tenant, "vni": self.add_vni,
                "workload": self.add_workload, "tep": self.add_tep,
            }  # fmt: skip
            adders[kind](row)

    def _replay_delete(self, kind: str, key: str) -> None:
        if kind == "node":
            self.delete_node(key)
        elif kind == "port":
            node, _, name = key.partition(":")
            self.delete_port(node, name)
        elif kind == "link":
            self.delete_link(int(key))
        elif kind == "cabling":
            self.set_miscabled(int(key), None)
        elif kind == "tenant":
            self.delete_tenant(key)
        elif kind == "vni":
            self.delete_vni(int(key))
        elif kind == "workload":
            self.delete_workload(key)
        else:
            node, _, colour = key.partition("/")
            self.delete_tep(node, Colour(colour))

    # --- nodes ----------------------------------------------------------------------------

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(f"node '{name}' not found") from None

    def add_node(self, spec: NodeSpec) -> list[Change]:
        if spec.name in self.nodes:
            raise FabricError.one(("name",), f"node '{spec.name}' already exists", "conflict")
        issues: list[Issue] = []
        if spec.mgmt_address is not None:
            issues += self._address_free(spec.mgmt_address, ("mgmt_address",))
        seen: set[str] = set()
        for i, port in enumerate(spec.ports):
            if port.name in seen:
                issues.append(
                    Issue(("ports", i, "name"), f"port '{port.name}' repeated", "conflict")
                )
            seen.add(port.name)
        if issues:
            raise FabricError(issues)
        node = Node(**spec.model_dump(exclude={"ports"}))
        self.nodes[node.name] = node
        self.node_ports[node.name] = []
        if node.mgmt_address is not None:
            self._address_owner[node.mgmt_address] = f"management address of node '{node.name}'"
        changes = [Change("node", "create", node.name, node)]
        for i, port in enumerate(spec.ports):
            try:
                changes += self.add_port(node.name, port)
            except FabricError as err:
                issues.extend(x.at("ports", i) for x in err.issues)
        if issues:
            self._drop_node(node.name)
            raise FabricError(issues)
        return changes

    def update_node(self, name: str, update: NodeUpdate) -> list[Change]:
        node = self.node(name)
        given = update.model_fields_set
        values = node.model_dump()
        if "mgmt_address" in given and update.mgmt_address != node.mgmt_address:
            if update.mgmt_address is not None and (
                issues := self._address_free(update.mgmt_address, ("mgmt_address",))
            ):
                raise FabricError(issues)
            values["mgmt_address"] = update.mgmt_address
        if "labels" in given:
            values["labels"] = update.labels or {}
        if update.admin_state is not None:
            values["admin_state"] = update.admin_state
        if update.offload is not None:
            values["offload"] = update.offload
        new = Node(**values)
        if new == node:
            return []  # nothing to change: no revision, no event
        if node.mgmt_address is not None:
            del self._address_owner[node.mgmt_address]
        if new.mgmt_address is not None:
            self._address_owner[new.mgmt_address] = f"management address of node '{name}'"
        self.nodes[name] = new
        return [Change("node", "update", name, new)]

    def drain_node(self, name: str) -> list[Change]:
        """Take a switch out of the path plans before maintenance (idempotent).

        A host is refused: it is no transit node, so a drain would move nothing off it, and
        its own workloads' traffic cannot avoid it (marking it would only cut them off).
        Stop or move its workloads, then an admin sets it `down` with PATCH.
        """
        node = self.node(name)
        if node.role is Role.host:
            raise FabricError.one(
                ("role",),
                f"node '{name}' is a host: it carries no transit traffic to move off, and its "
                "own workloads' traffic cannot avoid it; stop or move its workloads, then an "
                "admin sets admin_state down with PATCH (to move traffic off one of its "
                "links, drain that link)",
                "conflict",
            )
        return self.update_node(name, NodeUpdate(admin_state=AdminState.drained))

    def undrain_node(self, name: str) -> list[Change]:
        """Return a drained node to service; a node that is down stays an admin's decision."""
        if self.node(name).admin_state is AdminState.down:
            raise FabricError.one(
                ("admin_state",),
                f"node '{name}' is down, not drained; an admin brings it up with PATCH",
                "conflict",
            )
        return self.update_node(name, NodeUpdate(admin_state=AdminState.up))

    def delete_node(self, name: str, cascade: bool = False) -> list[Change]:
        self.node(name)
        links = [
            self.link_of_port[(name, p)]
            for p in self.node_ports[name]
            if (name, p) in self.link_of_port
        ]
        workloads = [w.name for w in self.workloads.values() if w.node == name]
        teps = [t for t in self.teps.values() if t.node == name]
        if not cascade and (links or workloads or teps):
            raise FabricError.one(
                ("name",),
                f"node '{name}' still has {len(links)} link(s), {len(workloads)} workload(s) "
                f"and {len(teps)} TEP(s); delete them first or pass cascade=true",
                "conflict",
            )
        changes: list[Change] = []
        for link_id in links:
            changes += self.delete_link(link_id)
        for wl in workloads:
            changes += self.delete_workload(wl)
        for tep in teps:
            changes += self.delete_tep(tep.node, tep.colour)
        for port in list(self.node_ports[name]):
            changes += self.delete_port(name, port)
        self._drop_node(name)
        changes.append(Change("node", "delete", name))
        return changes

    def _drop_node(self, name: str) -> None:
        for port in list(self.node_ports.get(name, [])):
            self._unindex_port(self.ports.pop((name, port)))
        node = self.nodes.pop(name)
        self.node_ports.pop(name, None)
        if node.mgmt_address is not None:
            self._address_owner.pop(node.mgmt_address, None)

    # --- ports ----------------------------------------------------------------------------

    def port(self, node: str, name: str) -> Port:
        self.node(node)
        try:
            return self.ports[(node, name)]
        except KeyError:
            raise NotFound(f"port '{name}' not found on node '{node}'") from None

    def add_port(self, node: str, spec: PortSpec) -> list[Change]:
        self.node(node)
        if (node, spec.name) in self.ports:
            raise FabricError.one(
                ("name",), f"port '{spec.name}' already exists on node '{node}'", "conflict"
            )
        port = Port(node=node, **spec.model_dump())
        if issues := self._port_issues(port):
            raise FabricError(issues)
        self.ports[(node, port.name)] = port
        self.node_ports[node] = [*self.node_ports[node], port.name]  # new: copies share it
        self._index_port(port)
        return [Change("port", "create", f"{node}:{port.name}", port)]

    def update_port(self, node: str, name: str, update: PortUpdate) -> list[Change]:
        old = self.port(node, name)
        values = old.model_dump()
        values.update({k: getattr(update, k) for k in update.model_fields_set})
        new = Port(**values)
        if new == old:
            return []  # nothing to change: no revision, no event
        self._unindex_port(old)
        issues = self._port_issues(new)
        link_id = self.link_of_port.get((node, name))
        if not issues and link_id is not None:
            link = self.links[link_id]
            other = link.b if port_key(link.a) == (node, name) else link.a
            issues = self._same_network(new, self.ports[port_key(other)], ("address",))
        if issues:
            self._index_port(old)
            raise FabricError(issues)
        self.ports[(node, name)] = new
        self._index_port(new)
        return [Change("port", "update", f"{node}:{name}", new)]

    def delete_port(self, node: str, name: str) -> list[Change]:
        port = self.port(node, name)
        if (node, name) in self.link_of_port:
            raise FabricError.one(
                ("name",),
                f"port '{node}:{name}' is in link {self.link_of_port[(node, name)]}; "
                "delete the link first",
                "conflict",
            )
        self._unindex_port(port)
        del self.ports[(node, name)]
        self.node_ports[node] = [p for p in self.node_ports[node] if p != name]
        return [Change("port", "delete", f"{node}:{name}")]

    def _port_issues(self, port: Port) -> list[Issue]:
        issues: list[Issue] = []
        if port.mac is not None and port.mac in self._mac_owner:
            issues.append(
                Issue(
                    ("mac",),
                    f"MAC {port.mac} is already used by {self._mac_owner[port.mac]}",
                    "conflict",
                )
            )
        if port.address is not None:
            issues += self._address_free(port.address.ip, ("address",))
            net = port.address.network
            start, end = _span(net)
            ranges = self._nets[net.version]
            i = ranges.find(start, end)
            if i is not None:
                same = ranges.starts[i] == start and ranges.ends[i] == end
                users = ", ".join(f"{n}:{p}" for n, p in ranges.users[i])
                if not same:
                    issues.append(
                        Issue(
                            ("address",),
                            f"network {net} overlaps the network of port {users}",
                            "conflict",
                        )
                    )
                elif len(ranges.users[i]) >= 2:
                    issues.append(
                        Issue(
                            ("address",),
                            f"network {net} is already used by the two ports "
                            f"{users} of a point-to-point link",
                            "conflict",
                        )
                    )
            points = self._tep_points[net.version]
            j = bisect.bisect_left(points, start)
            if j < len(points) and points[j] <= end:
                tep = ipaddress.ip_address(points[j])
                issues.append(
                    Issue(
                        ("address",),
                        f"network {net} contains {self._address_owner[tep]} ({tep})",
                        "conflict",
                    )
                )
        return issues

    def _index_port(self, port: Port) -> None:
        key = (port.node, port.name)
        if port.mac is not None:
            self._mac_owner[port.mac] = f"port {port.node}:{port.name}"
        if port.address is not None:
            self._address_owner[port.address.ip] = f"port {port.node}:{port.name}"
            self._nets[port.address.version].add(*_span(port.address.network), key)

    def _unindex_port(self, port: Port) -> None:
        key = (port.node, port.name)
        if port.mac is not None:
            self._mac_owner.pop(port.mac, None)
        if port.address is not None:
            self._address_owner.pop(port.address.ip, None)
            self._nets[port.address.version].remove(*_span(port.address.network), key)

    def _address_free(self, address: IPAddress, loc: Loc) -> list[Issue]:
        owner = self._address_owner.get(address)
        if owner is None:
            return []
        return [Issue(loc, f"address {address} is already the {owner}", "conflict")]

    @staticmethod
    def _same_network(a: Port, b: Port, loc: Loc) -> list[Issue]:
        if a.address is None or b.address is None:
            return []
        if a.address.network != b.address.network:
            return [
                Issue(
                    loc,
                    f"link ends {a.node}:{a.name} ({a.address}) and "
                    f"{b.node}:{b.name} ({b.address}) are not in the same network",
                )
            ]
        return []

    # --- links ----------------------------------------------------------------------------

    def link(self, link_id: int) -> Link:
        try:
            return self.links[link_id]
        except KeyError:
            raise NotFound(f"link {link_id} not found") from None

    def add_link(self, spec: LinkSpec, link_id: int | None = None) -> list[Change]:
        """Add a link; `link_id` is given only when loading stored links."""
        issues: list[Issue] = []
        ends: list[Port] = []
        for side in ("a", "b"):
            ref: PortRef = getattr(spec, side)
            if ref.node not in self.nodes:
                issues.append(Issue((side, "node"), f"node '{ref.node}' not found", "not_found"))
                continue
            port = self.ports.get(port_key(ref))
            if port is None:
                issues.append(
                    Issue(
                        (side, "port"),
                        f"port '{ref.port}' not found on node '{ref.node}'",
                        "not_found",
                    )
                )
                continue
            used = self.link_of_port.get(port_key(ref))
            if used is not None:
                issues.append(
                    Issue((side, "port"), f"port '{ref}' is already in link {used}", "conflict")
                )
            ends.append(port)
        if len(ends) == 2:
            issues += self._same_network(ends[0], ends[1], ("b", "port"))
        if issues:
            raise FabricError(issues)
        if link_id is None:
            link_id = self.next_link_id
        elif link_id in self.links:
            raise FabricError.one(("id",), f"link {link_id} already exists", "conflict")
        self.next_link_id = max(self.next_link_id, link_id + 1)
        link = Link(id=link_id, **spec.model_dump(exclude={"id"}))
        self.links[link.id] = link
        self.link_of_port[port_key(link.a)] = link.id
        self.link_of_port[port_key(link.b)] = link.id
        return [Change("link", "create", str(link.id), link)]

    def update_link(self, link_id: int, update: LinkUpdate) -> list[Change]:
        old = self.link(link_id)
        values = old.model_dump()
        if "srlgs" in update.model_fields_set:
            values["srlgs"] = update.srlgs or []
        if update.admin_state is not None:
            values["admin_state"] = update.admin_state
        new = Link(**values)
        if new == old:
            return []  # nothing to change: no revision, no event
        self.links[link_id] = new
        return [Change("link", "update", str(link_id), new)]

    def drain_link(self, link_id: int) -> list[Change]:
        """Take a link out of the path plans before maintenance (idempotent)."""
        return self.update_link(link_id, LinkUpdate(admin_state=AdminState.drained))

    def undrain_link(self, link_id: int) -> list[Change]:
        """Return a drained link to service; a link that is down stays an admin's decision."""
        if self.link(link_id).admin_state is AdminState.down:
            raise FabricError.one(
                ("admin_state",),
                f"link {link_id} is down, not drained; an admin brings it up with PATCH",
                "conflict",
            )
        return self.update_link(link_id, LinkUpdate(admin_state=AdminState.up))

    def delete_link(self, link_id: int) -> list[Change]:
        link = self.link(link_id)
        del self.links[link_id]
        del self.link_of_port[port_key(link.a)]
        del self.link_of_port[port_key(link.b)]
        self.miscabled.pop(link_id, None)  # its row goes with the link (ON DELETE CASCADE)
        return [Change("link", "delete", str(link_id))]

    def set_miscabled(self, link_id: int, reason: str | None) -> list[Change]:
        """Mark a link miscabled (what its ends heard) or, with None, cabled as declared
        again. Marking it again with another reason updates the reason."""
        self.link(link_id)
        before = self.miscabled.get(link_id)
        if reason is None:
            if before is None:
                return []
            del self.miscabled[link_id]
            return [Change("cabling", "delete", str(link_id))]
        mark = Miscabled(link_id=link_id, reason=reason[:500])
        if before == mark:
            return []
        self.miscabled[link_id] = mark
        return [Change("cabling", "create" if before is None else "update", str(link_id), mark)]

    # --- tenants and VNIs -----------------------------------------------------------------

    def tenant(self, name: str) -> Tenant:
        try:
            return self.tenants[name]
        except KeyError:
            raise NotFound(f"tenant '{name}' not found") from None

    def add_tenant(self, tenant: Tenant) -> list[Change]:
        if tenant.name in self.tenants:
            raise FabricError.one(("name",), f"tenant '{tenant.name}' already exists", "conflict")
        self.tenants[tenant.name] = tenant
        return [Change("tenant", "create", tenant.name, tenant)]

    def update_tenant(self, name: str, update: TenantUpdate) -> list[Change]:
        old = self.tenant(name)
        new = old.model_copy(update=update.model_dump(exclude_unset=True))
        if new == old:
            return []
        self.tenants[name] = new
        return [Change("tenant", "update", name, new)]

    def delete_tenant(self, name: str) -> list[Change]:
        self.tenant(name)
        if used := sorted(v.vni for v in self.vnis.values() if v.tenant == name):
            raise FabricError.one(
                ("name",), f"tenant '{name}' still owns VNI(s) {used}", "conflict"
            )
        del self.tenants[name]
        return [Change("tenant", "delete", name)]

    def vni(self, number: int) -> Vni:
        try:
            return self.vnis[number]
        except KeyError:
            raise NotFound(f"VNI {number} not found") from None

    def add_vni(self, vni: Vni) -> list[Change]:
        issues: list[Issue] = []
        if vni.vni in self.vnis:
            issues.append(Issue(("vni",), f"VNI {vni.vni} already exists", "conflict"))
        if any(v.name == vni.name for v in self.vnis.values()):
            issues.append(Issue(("name",), f"a VNI named '{vni.name}' already exists", "conflict"))
        if vni.tenant not in self.tenants:
            issues.append(Issue(("tenant",), f"tenant '{vni.tenant}' not found", "not_found"))
        if issues:
            raise FabricError(issues)
        self.vnis[vni.vni] = vni
        return [Change("vni", "create", str(vni.vni), vni)]

    def delete_vni(self, number: int) -> list[Change]:
        self.vni(number)
        if used := sorted(w.name for w in self.workloads.values() if w.vni == number):
            raise FabricError.one(
                ("vni",), f"VNI {number} still has workload(s) {used[:10]}", "conflict"
            )
        del self.vnis[number]
        return [Change("vni", "delete", str(number))]

    # --- workloads ------------------------------------------------------------------------

    def workload(self, name: str) -> Workload:
        try:
            return self.workloads[name]
        except KeyError:
            raise NotFound(f"workload '{name}' not found") from None

    def add_workload(self, wl: Workload) -> list[Change]:
        issues: list[Issue] = []
        if wl.name in self.workloads:
            issues.append(Issue(("name",), f"workload '{wl.name}' already exists", "conflict"))
        issues += self._host_issues(wl.node)
        if wl.vni not in self.vnis:
            issues.append(Issue(("vni",), f"VNI {wl.vni} not found", "not_found"))
        if owner := self._vf.get((wl.node, wl.vf)):
            issues.append(
                Issue(
                    ("vf",),
                    f"VF '{wl.vf}' on '{wl.node}' is already used by workload '{owner}'",
                    "conflict",
                )
            )
        if owner := self._overlay_ip.get((wl.vni, wl.ip)):
            issues.append(
                Issue(
                    ("ip",),
                    f"IP {wl.ip} is already used in VNI {wl.vni} by workload '{owner}'",
                    "conflict",
                )
            )
        if owner := self._overlay_mac.get((wl.vni, wl.mac)):
            issues.append(
                Issue(
                    ("mac",),
                    f"MAC {wl.mac} is already used in VNI {wl.vni} by workload '{owner}'",
                    "conflict",
                )
            )
        if issues:
            raise FabricError(issues)
        self.workloads[wl.name] = wl
        self._vf[(wl.node, wl.vf)] = wl.name
        self._overlay_ip[(wl.vni, wl.ip)] = wl.name
        self._overlay_mac[(wl.vni, wl.mac)] = wl.name
        return [Change("workload", "create", wl.name, wl)]

    def delete_workload(self, name: str) -> list[Change]:
        wl = self.workload(name)
        del self.workloads[name]
        del self._vf[(wl.node, wl.vf)]
        del self._overlay_ip[(wl.vni, wl.ip)]
        del self._overlay_mac[(wl.vni, wl.mac)]
        return [Change("workload", "delete", name)]

    def _host_issues(self, name: str) -> list[Issue]:
        node = self.nodes.get(name)
        if node is None:
            return [Issue(("node",), f"node '{name}' not found", "not_found")]
        if node.role is not Role.host:
            return [Issue(("node",), f"node '{name}' is a {node.role.value}, not a host")]
        return []

    # --- TEPs -----------------------------------------------------------------------------

    def tep(self, node: str, colour: Colour) -> Tep:
        try:
            return self.teps[(node, colour)]
        except KeyError:
            raise NotFound(f"no {colour.value} TEP on node '{node}'") from None

    def add_tep(self, tep: Tep) -> list[Change]:
        issues = self._host_issues(tep.node)
        if (tep.node, tep.colour) in self.teps:
            issues.append(
                Issue(
                    ("colour",),
                    f"node '{tep.node}' already has a {tep.colour.value} TEP",
                    "conflict",
                )
            )
        issues += self._address_free(tep.address, ("address",))
        point = int(tep.address)
        ranges = self._nets[tep.address.version]
        i = ranges.find(point, point)
        if i is not None:
            users = ", ".join(f"{n}:{p}" for n, p in ranges.users[i])
            issues.append(
                Issue(
                    ("address",),
                    f"TEP {tep.address} lies inside the network of port {users}",
                    "conflict",
                )
            )
        if issues:
            raise FabricError(issues)
        self.teps[(tep.node, tep.colour)] = tep
        self._address_owner[tep.address] = f"{tep.colour.value} TEP of node '{tep.node}'"
        bisect.insort(self._tep_points[tep.address.version], point)
        return [Change("tep", "create", _tep_key(tep), tep)]

    def delete_tep(self, node: str, colour: Colour) -> list[Change]:
        tep = self.tep(node, colour)
        del self.teps[(node, colour)]
        del self._address_owner[tep.address]
        self._tep_points[tep.address.version].remove(int(tep.address))
        return [Change("tep", "delete", _tep_key(tep))]


def _row_dict(value: Any) -> dict[str, Any]:
    """A change's row as JSON: an event carries it so; an operation's is a model."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value if isinstance(value, dict) else {}


def _tep_key(tep: Tep) -> str:
    return f"{tep.node}/{tep.colour.value}"
