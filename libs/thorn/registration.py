"""Observed beside declared: the pure checks behind registration and the cabling check.

Three questions, each a pure function of the fabric and the agents' latest registrations:

- `refusal(fabric, node, observed)`: is this registration bad input? A node that is not in
  the topology, a VF that names no device the registration lists, an RDMA device bound to
  a netdev the topology does not know (neither a port of the node nor a workload's VF or
  its representor there). A refused registration is not stored; the last good one stays.
- `mismatches(fabric, node, observed)`: where the node differs from its declaration: a
  declared port missing, a wrong MAC, a port address absent, a workload's VF absent.
- `cabling(fabric, observations)`: per declared link, what its ends hear on the neighbour
  probe. `verified`: an end hears the declared peer port and no end hears another;
  `miscabled`: an end hears a port other than the declared peer (a positive contradiction);
  `unverified`: nothing heard (no agent, probes not yet heard, or the link down).

Why only a contradiction marks a link miscabled: fabrics without agents, or with agents
that have not heard their neighbours yet, must keep working, so silence is never held
against a link. `next_miscabled` makes the verdict sticky: a link once miscabled stays out
of the paths until it is heard cabled as declared (verified), not merely when it goes
quiet (a pulled cable, an agent restarting).

Ports are matched by interface name: a declared port's netdev is `port_ifname(port)` (the
name itself when Linux allows it), a workload's VF is its `vf` netdev or that VF's
representor `representor_ifname(vf)` on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from thorn.fabric import Fabric
from thorn.ifnames import port_ifname, representor_ifname
from thorn.model import Link
from thorn.observed import HeardNeighbour, NodeObservation

MismatchKind = Literal[
    "port_missing", "wrong_mac", "address_missing", "vf_absent", "unexpected_neighbour",
    "registration_refused",
]  # fmt: skip
CablingState = Literal["verified", "unverified", "miscabled"]


class Mismatch(BaseModel):
    """One difference between a node's declaration and what its agent observes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    kind: MismatchKind
    subject: str = Field(description="the port, VF or device it is about")
    declared: str | None = None
    observed: str | None = None
    message: str


class CablingVerdict(BaseModel):
    """What the neighbour probe says about one declared link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    link_id: int
    a: str
    b: str
    state: CablingState
    heard: list[str] = Field(
        default_factory=list, description="per end that heard something: 'end hears node:port'"
    )
    reason: str | None = Field(None, description="for miscabled: what contradicts the link")


def _known_netdevs(fabric: Fabric, node: str) -> set[str]:
    known = {port_ifname(p) for p in fabric.node_ports.get(node, [])}
    for wl in fabric.workloads.values():
        if wl.node == node:
            known |= {wl.vf, representor_ifname(wl.vf)}
    return known


def refusal(fabric: Fabric, node: str, observed: NodeObservation) -> str | None:
    """Why this registration must be refused, or None when it may be stored."""
    if node not in fabric.nodes:
        return f"node {node!r} is not in the topology: register nodes the topology declares"
    devices = {p.name for p in observed.ports}
    for i, vf in enumerate(observed.vfs):
        for field in ("representor", "parent"):
            name = getattr(vf, field)
            if name is not None and name not in devices:
                return (
                    f"vfs[{i}].{field}: VF {vf.name!r} names device {name!r}, which is not "
                    "among the node's registered ports"
                )
    known = _known_netdevs(fabric, node)
    for i, device in enumerate(observed.rdma.devices):
        netdevs = [("netdev", device.netdev)] + [
            (f"ports[{j}].gids[{k}].netdev", gid.netdev)
            for j, port in enumerate(device.ports)
            for k, gid in enumerate(port.gids)
        ]
        for where, netdev in netdevs:
            if netdev is not None and netdev not in known:
                return (
                    f"rdma.devices[{i}].{where}: RDMA device {device.name!r} is bound to "
                    f"netdev {netdev!r}, which the topology does not know on node {node!r} "
                    "(neither a declared port nor a workload's VF there)"
                )
    return None


def mismatches(fabric: Fabric, node: str, observed: NodeObservation) -> list[Mismatch]:
    """Where `node` as observed differs from its declaration (the node must exist)."""
    out: list[Mismatch] = []
    ports = {p.name: p for p in observed.ports}
    for name in fabric.node_ports.get(node, []):
        declared = fabric.ports[(node, name)]
        ifname = port_ifname(name)
        seen = ports.get(ifname)
        if seen is None:
            out.append(Mismatch(node=node, kind="port_missing", subject=name, declared=ifname,
                                message=f"port {name!r} (netdev {ifname!r}) is not on the "
                                        "node"))  # fmt: skip
            continue
        if declared.mac is not None and seen.mac != declared.mac:
            out.append(Mismatch(node=node, kind="wrong_mac", subject=name, declared=declared.mac,
                                observed=seen.mac,
                                message=f"port {name!r} has MAC {seen.mac}, declared "
                                        f"{declared.mac}"))  # fmt: skip
        if declared.address is not None and declared.address not in seen.addresses:
            out.append(Mismatch(node=node, kind="address_missing", subject=name,
                                declared=str(declared.address),
                                observed=", ".join(str(a) for a in seen.addresses) or None,
                                message=f"port {name!r} lacks its declared address "
                                        f"{declared.address}"))  # fmt: skip
    present = set(ports) | {v.name for v in observed.vfs}
    present |= {v.representor for v in observed.vfs if v.representor}
    for wl in sorted(fabric.workloads.values(), key=lambda w: w.name):
        if wl.node != node:
            continue
        if wl.vf not in present and representor_ifname(wl.vf) not in present:
            out.append(Mismatch(node=node, kind="vf_absent", subject=wl.vf,
                                declared=f"{wl.vf} (workload {wl.name})",
                                message=f"VF {wl.vf!r} of workload {wl.name!r} is absent: "
                                        f"neither it nor its representor "
                                        f"{representor_ifname(wl.vf)!r} is on the "
                                        "node"))  # fmt: skip
    linked = {port_ifname(p) for (n, p) in fabric.link_of_port if n == node}
    for heard in observed.neighbours:
        if heard.port not in linked:
            out.append(Mismatch(node=node, kind="unexpected_neighbour", subject=heard.port,
                                observed=f"{heard.chassis}:{heard.port_id}",
                                message=f"port {heard.port!r} hears {heard.chassis}:"
                                        f"{heard.port_id} but is in no declared link"))  # fmt: skip
    return out


def _heard_on(observations: Mapping[str, NodeObservation]) -> dict[tuple[str, str], HeardNeighbour]:
    return {(node, n.port): n for node, obs in observations.items() for n in obs.neighbours}


def _verdict(link: Link, heard: dict[tuple[str, str], HeardNeighbour]) -> CablingVerdict:
    ends = ((link.a, link.b), (link.b, link.a))
    said: list[str] = []
    wrong: list[str] = []
    right = False
    for here, peer in ends:
        got = heard.get((here.node, port_ifname(here.port)))
        if got is None:
            continue
        expected = (peer.node, port_ifname(peer.port))
        said.append(f"{here} hears {got.chassis}:{got.port_id}")
        if (got.chassis, got.port_id) == expected:
            right = True
        else:
            wrong.append(f"{here} hears {got.chassis}:{got.port_id}, not {peer}")
    state: CablingState = "miscabled" if wrong else "verified" if right else "unverified"
    return CablingVerdict(link_id=link.id, a=str(link.a), b=str(link.b), state=state,
                          heard=said, reason="; ".join(wrong) or None)  # fmt: skip


def cabling(fabric: Fabric, observations: Mapping[str, NodeObservation]) -> list[CablingVerdict]:
    """Every declared link's cabling verdict from the latest registrations, by link id."""
    heard = _heard_on(observations)
    return [_verdict(fabric.links[i], heard) for i in sorted(fabric.links)]


def next_miscabled(
    current: Mapping[int, str], verdicts: list[CablingVerdict]
) -> dict[int, str | None]:
    """The changes to the miscabled set (link id -> reason, or None to clear) the verdicts
    call for: a contradiction marks a link, a verification clears it, and silence leaves it
    as it was. A marked link keeps the reason it was marked for (each change is a topology
    revision that pathcomp replans on; the live verdict shows what is heard now)."""
    changes: dict[int, str | None] = {}
    for verdict in verdicts:
        if verdict.state == "miscabled" and verdict.link_id not in current:
            changes[verdict.link_id] = verdict.reason
        elif verdict.state == "verified" and verdict.link_id in current:
            changes[verdict.link_id] = None
    return changes


__all__ = [
    "CablingVerdict",
    "Mismatch",
    "cabling",
    "mismatches",
    "next_miscabled",
    "refusal",
]
