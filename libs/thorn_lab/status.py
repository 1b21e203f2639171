"""What a lab looks like right now: nodes, links (both ends), workloads, faults. Read-only."""

from __future__ import annotations

from pydantic import BaseModel

from thorn import netns
from thorn_lab import state
from thorn_lab.blueprint import EndPlan
from thorn_lab.handle import Lab
from thorn_lab.rtnl import LinkState, Rtnl

__all__ = ["EndStatus", "LabStatus", "LinkStatus", "NodeStatus", "WorkloadStatus", "collect"]


class EndStatus(BaseModel):
    node: str
    port: str | None
    namespace: str
    ifname: str
    present: bool
    admin_up: bool = False
    carrier: bool = False
    operstate: str = "ABSENT"
    rx_packets: int = 0
    tx_packets: int = 0
    ingress_drops: int = 0  # packets a fault filter dropped at this end


class NodeStatus(BaseModel):
    name: str
    role: str
    namespace: str
    present: bool
    teps: list[str]


class LinkStatus(BaseModel):
    name: str
    a: EndStatus
    b: EndStatus
    faults: list[str]


class WorkloadStatus(BaseModel):
    name: str
    node: str
    namespace: str
    ip: str
    mac: str
    vni: int
    vf: EndStatus
    rep: EndStatus


class LabStatus(BaseModel):
    prefix: str
    created_at: str
    healthy: bool  # every device present, and up unless a recorded fault holds it down
    nodes: list[NodeStatus]
    links: list[LinkStatus]
    workloads: list[WorkloadStatus]
    faults: list[state.FaultRecord]


def _end(
    end: EndPlan,
    links: dict[str, dict[str, LinkState]],
    drops: dict[str, dict[int, int]],
) -> EndStatus:
    found = links.get(end.namespace, {}).get(end.ifname)
    base = EndStatus(
        node=end.node, port=end.port, namespace=end.namespace, ifname=end.ifname, present=False
    )
    if found is None:
        return base
    return base.model_copy(
        update={
            "present": True,
            "admin_up": found.admin_up,
            "carrier": found.carrier,
            "operstate": found.operstate,
            "rx_packets": found.rx_packets,
            "tx_packets": found.tx_packets,
            "ingress_drops": drops.get(end.namespace, {}).get(found.index, 0),
        }
    )


def collect(lab: Lab) -> LabStatus:
    plan = lab.plan
    links: dict[str, dict[str, LinkState]] = {}
    drops: dict[str, dict[int, int]] = {}
    for ns in plan.namespaces:
        if not netns.exists(ns.name):
            continue
        with Rtnl.open(ns.name) as handle:
            links[ns.name] = handle.links()
            drops[ns.name] = handle.ingress_drops()
    faults = state.load_faults(lab.prefix).faults
    by_device: dict[tuple[str, str], list[str]] = {}
    held: set[tuple[str, str]] = set()
    for fault in faults:
        for device in fault.touches:
            by_device.setdefault((device.namespace, device.ifname), []).append(fault.id)
        held |= {(d.namespace, d.ifname) for d in fault.touches}

    link_rows = []
    healthy = True
    for veth in plan.veths:
        a, b = _end(veth.a, links, drops), _end(veth.b, links, drops)
        ids = sorted(
            set(by_device.get((a.namespace, a.ifname), []))
            | set(by_device.get((b.namespace, b.ifname), []))
        )
        for end in (a, b):
            if not end.present or (end.operstate != "UP" and not ids):
                healthy = False
        if veth.kind == "link":
            link_rows.append(LinkStatus(name=veth.name, a=a, b=b, faults=ids))

    ends = {(v.a.namespace, v.a.ifname): v.a for v in plan.veths}
    ends |= {(v.b.namespace, v.b.ifname): v.b for v in plan.veths}
    workloads = [
        WorkloadStatus(
            name=w.name,
            node=w.node,
            namespace=w.namespace,
            ip=w.ip,
            mac=w.mac,
            vni=w.vni,
            vf=_end(ends[(w.namespace, w.vf)], links, drops),
            rep=_end(ends[(lab.namespace(w.node), w.rep)], links, drops),
        )
        for w in plan.workloads
    ]
    nodes = []
    for ns in plan.namespaces:
        if ns.workload is not None:
            continue
        present = ns.name in links
        healthy = healthy and present
        role = next(n.role.value for n in lab.fabric.nodes if n.name == ns.node)
        nodes.append(
            NodeStatus(
                name=ns.node, role=role, namespace=ns.name, present=present, teps=ns.loopback
            )
        )
    return LabStatus(
        prefix=lab.prefix,
        created_at=lab.description.created_at,
        healthy=healthy and all(netns.exists(w.namespace) for w in plan.workloads),
        nodes=nodes,
        links=link_rows,
        workloads=workloads,
        faults=faults,
    )
