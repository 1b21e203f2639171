"""The pure plan of a lab: every namespace, veth pair, address and setting that `up` makes.

`plan_lab(doc, prefix)` turns a `FabricDocument` into a `LabPlan` without touching the
system, so the mapping is unit-tested without root and other processes can recompute it.
The executor (`thorn_lab.build`) only applies a plan.

What a plan contains
    - one namespace per node (`NamespaceKind.switch` or `host`) and per workload;
    - one veth pair per link, each end in its node's namespace, named after its port
      (`names.port_ifname`), with the port's MAC and address;
    - per workload, a veth pair: ``vf`` (the workload's MAC and IP) in the workload's
      namespace and its representor ``<vf>_rep`` in the host's namespace;
    - the host's TEP addresses, as /32 (/128), on its loopback ``lo``;
    - sysctls per namespace: IPv6 off unless the namespace has an IPv6 address, reverse
      path filtering off everywhere, forwarding on in switches only.

Ports in no link get no device (listed in `unlinked_ports`); the kernel has no `dummy`
driver here and a port without a peer would only mislead.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from thorn.fabric import Fabric, FabricError
from thorn.model import FabricDocument, Role
from thorn_lab import names

__all__ = [
    "EndPlan",
    "LabPlan",
    "NamespaceKind",
    "NamespacePlan",
    "PlanError",
    "VethPlan",
    "WorkloadPlan",
    "plan_lab",
]


class PlanError(ValueError):
    """The fabric cannot be laid out as a lab (invalid document or a name collision)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NamespaceKind(StrEnum):
    switch = "switch"
    host = "host"
    workload = "workload"


class NamespacePlan(_Frozen):
    name: str
    kind: NamespaceKind
    node: str  # for a workload: the host it runs on
    workload: str | None = None
    sysctls: dict[str, str]  # path below /proc/sys -> value, written in this order
    loopback: list[str] = []  # addresses with prefix length on `lo` (a host's TEPs)


class EndPlan(_Frozen):
    """One end of a veth pair."""

    namespace: str
    ifname: str
    node: str  # the fabric node, or for a VF the workload's name
    port: str | None  # the fabric port; None for a VF or representor
    mac: str | None = None  # None: the kernel picks one
    addresses: list[str] = []  # with prefix length


class VethPlan(_Frozen):
    name: str  # "leaf1:swp1--spine1:swp1" for a link; the workload's name for a VF pair
    kind: Literal["link", "workload"]
    a: EndPlan
    b: EndPlan


class WorkloadPlan(_Frozen):
    name: str
    node: str
    namespace: str
    vni: int
    vf: str
    rep: str
    mac: str
    ip: str  # with /32 (/128)
    subnet: str | None  # the VNI's workloads: a link-scope route on the VF, None if alone


class LabPlan(_Frozen):
    prefix: str
    namespaces: list[NamespacePlan]
    veths: list[VethPlan]
    workloads: list[WorkloadPlan]
    ports: dict[str, dict[str, str]]  # node -> port -> interface name
    unlinked_ports: list[str] = []  # "node:port" with no link: no device is made

    def namespace_of(self, node: str) -> str:
        for ns in self.namespaces:
            if ns.node == node and ns.kind is not NamespaceKind.workload:
                return ns.name
        raise KeyError(node)

    def links(self) -> list[VethPlan]:
        return [v for v in self.veths if v.kind == "link"]


def link_name(a: str, b: str) -> str:
    return f"{a}--{b}"


def _sysctls(kind: NamespaceKind, ipv6: bool) -> dict[str, str]:
    values: dict[str, str] = {}
    if ipv6:
        # Keep IPv6 for the addresses asked for, without link-locals or DAD delays.
        values["net/ipv6/conf/all/disable_ipv6"] = "0"
        values["net/ipv6/conf/default/disable_ipv6"] = "0"
        values["net/ipv6/conf/default/addr_gen_mode"] = "1"
        values["net/ipv6/conf/all/accept_dad"] = "0"
        values["net/ipv6/conf/default/accept_dad"] = "0"
    else:
        # No ND/MLD noise on any device; `default` covers devices made later.
        values["net/ipv6/conf/all/disable_ipv6"] = "1"
        values["net/ipv6/conf/default/disable_ipv6"] = "1"
    # Red and blue paths are asymmetric by design: strict reverse-path checks would drop them.
    values["net/ipv4/conf/all/rp_filter"] = "0"
    values["net/ipv4/conf/default/rp_filter"] = "0"
    # New namespaces inherit IPv4 settings from the machine's; say what each kind needs.
    forwarding = "1" if kind is NamespaceKind.switch else "0"
    values["net/ipv4/ip_forward"] = forwarding
    if ipv6:
        values["net/ipv6/conf/all/forwarding"] = forwarding
    return values


def _host_prefix(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return f"{ip}/{ip.max_prefixlen}"


def _covering(
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
) -> str | None:
    """The smallest network that holds every address (None for fewer than two)."""
    if len(ips) < 2:
        return None
    first = ips[0]
    for length in range(first.max_prefixlen, -1, -1):
        net = ipaddress.ip_network(f"{first}/{length}", strict=False)
        if all(ip in net for ip in ips):
            return str(net)
    return None  # pragma: no cover - /0 holds every address of one version


def plan_lab(doc: FabricDocument, prefix: str = names.DEFAULT_PREFIX) -> LabPlan:
    """Lay out `doc` as lab `prefix`; raise PlanError if the fabric is invalid or names clash."""
    try:
        names.check_prefix(prefix)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    try:
        Fabric.from_document(doc)
    except FabricError as exc:
        raise PlanError(f"the fabric is not valid: {exc}") from None

    ports: dict[str, dict[str, str]] = {}
    port_spec = {}
    for node in doc.nodes:
        ports[node.name] = {}
        taken: dict[str, str] = {names.LOOPBACK: "the loopback"}
        for p in node.ports:
            ifname = names.port_ifname(p.name)
            if ifname in taken:
                raise PlanError(
                    f"{node.name}: port '{p.name}' and {taken[ifname]} would both be "
                    f"interface '{ifname}'"
                )
            taken[ifname] = f"port '{p.name}'"
            ports[node.name][p.name] = ifname
            port_spec[(node.name, p.name)] = p

    ipv6_nodes = {
        node
        for (node, _), p in port_spec.items()
        if p.address is not None and p.address.version == 6
    }
    ipv6_nodes |= {t.node for t in doc.teps if t.address.version == 6}
    teps: dict[str, list[str]] = defaultdict(list)
    for tep in doc.teps:
        teps[tep.node].append(_host_prefix(tep.address))

    namespaces: list[NamespacePlan] = []
    for node in doc.nodes:
        kind = NamespaceKind.switch if node.role is Role.switch else NamespaceKind.host
        namespaces.append(
            NamespacePlan(
                name=names.node_namespace(prefix, node.name),
                kind=kind,
                node=node.name,
                sysctls=_sysctls(kind, node.name in ipv6_nodes),
                loopback=teps.get(node.name, []),
            )
        )

    def end(ref_node: str, ref_port: str) -> EndPlan:
        spec = port_spec[(ref_node, ref_port)]
        return EndPlan(
            namespace=names.node_namespace(prefix, ref_node),
            ifname=ports[ref_node][ref_port],
            node=ref_node,
            port=ref_port,
            mac=spec.mac,
            addresses=[str(spec.address)] if spec.address is not None else [],
        )

    veths: list[VethPlan] = []
    linked: set[tuple[str, str]] = set()
    for link in doc.links:
        linked.add((link.a.node, link.a.port))
        linked.add((link.b.node, link.b.port))
        veths.append(
            VethPlan(
                name=link_name(str(link.a), str(link.b)),
                kind="link",
                a=end(link.a.node, link.a.port),
                b=end(link.b.node, link.b.port),
            )
        )

    by_vni: dict[int, list[ipaddress.IPv4Address | ipaddress.IPv6Address]] = defaultdict(list)
    for wl in doc.workloads:
        by_vni[wl.vni].append(wl.ip)
    workloads: list[WorkloadPlan] = []
    for wl in doc.workloads:
        rep = names.representor_ifname(wl.vf)
        if rep in ports[wl.node].values() or rep == names.LOOPBACK:
            raise PlanError(f"{wl.node}: representor '{rep}' of workload '{wl.name}' is a port")
        ns = names.workload_namespace(prefix, wl.name)
        plan = WorkloadPlan(
            name=wl.name,
            node=wl.node,
            namespace=ns,
            vni=wl.vni,
            vf=wl.vf,
            rep=rep,
            mac=wl.mac,
            ip=_host_prefix(wl.ip),
            subnet=_covering([ip for ip in by_vni[wl.vni] if ip.version == wl.ip.version]),
        )
        workloads.append(plan)
        namespaces.append(
            NamespacePlan(
                name=ns,
                kind=NamespaceKind.workload,
                node=wl.node,
                workload=wl.name,
                sysctls=_sysctls(NamespaceKind.workload, wl.ip.version == 6),
            )
        )
        veths.append(
            VethPlan(
                name=wl.name,
                kind="workload",
                a=EndPlan(
                    namespace=ns,
                    ifname=wl.vf,
                    node=wl.name,
                    port=None,
                    mac=wl.mac,
                    addresses=[plan.ip],
                ),
                b=EndPlan(
                    namespace=names.node_namespace(prefix, wl.node),
                    ifname=rep,
                    node=wl.node,
                    port=None,
                ),
            )
        )

    seen: dict[str, str] = {}
    for space in namespaces:
        what = f"workload '{space.workload}'" if space.workload else f"node '{space.node}'"
        if space.name in seen:
            raise PlanError(f"{what} and {seen[space.name]} would share namespace '{space.name}'")
        seen[space.name] = what

    unlinked = [f"{n}:{p}" for (n, p) in port_spec if (n, p) not in linked]
    return LabPlan(
        prefix=prefix,
        namespaces=namespaces,
        veths=veths,
        workloads=workloads,
        ports=ports,
        unlinked_ports=unlinked,
    )
