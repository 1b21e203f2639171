"""What one node's datapath must do, derived from its desired-state documents (pure).

The documents (libs/thorn/desired.py) are written for the wire: a host's own state plus the
membership of its VNIs, chunked and shared by every member. An `Intent` is the same
knowledge joined up for a datapath driver: the routes, the TEPs, the local workloads, and
every remote workload in the node's VNIs with the TEP its traffic is sent to right now.

The active colour toward a peer host is red, unless pathcomp listed the peer in
`blue_peers` (red cannot reach it), the peer has no red TEP, or the agent itself moved it
(`overrides`: the local fast failover, which does not wait for the controller).

A switch route may carry a loop-free backup next hop (`NextHop`); the ports whose primaries
the agent took out itself (BFD Down on the link: `withdrawn`, see repair.py) are part of the
switch's intent too, so that no reconcile puts those primaries back behind its back.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from thorn.desired import (
    HostState,
    OffloadName,
    SwitchState,
    VniMember,
    VniState,
)
from thorn.model import Colour

COLOURS: tuple[Colour, Colour] = (Colour.red, Colour.blue)


def other(colour: Colour) -> Colour:
    return colour.other


@dataclass(frozen=True, slots=True)
class NextHop:
    dev: str
    via: str | None


@dataclass(frozen=True, slots=True)
class UnderlayRoute:
    prefix: str
    dev: str
    via: str | None
    backup: NextHop | None = None  # switches: the loop-free alternate (thorn.desired.Backup)


@dataclass(frozen=True, slots=True)
class LocalWorkload:
    """A workload on this host: its VF's representor is where encap starts and decap ends."""

    name: str
    vni: int
    rep: str
    mac: str
    ip: str


@dataclass(frozen=True, slots=True)
class Peer:
    """A remote workload in one of this host's VNIs, and where its traffic goes now."""

    name: str
    vni: int
    mac: str
    ip: str
    host: str
    teps: Mapping[Colour, str]
    colour: Colour  # the active colour

    @property
    def tep(self) -> str:
        return self.teps[self.colour]


@dataclass(frozen=True, slots=True)
class SwitchIntent:
    node: str
    revision: int
    routes: tuple[UnderlayRoute, ...]
    # Ports whose primaries are withdrawn locally (their link's BFD session is Down): a route
    # through one of them that has a backup elsewhere is left to its backup.
    withdrawn: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class HostIntent:
    node: str
    revision: int
    teps: Mapping[Colour, str]
    routes: tuple[UnderlayRoute, ...]
    local: tuple[LocalWorkload, ...]
    peers: tuple[Peer, ...]
    # VNIs whose membership is not complete yet: their encap is left as it is.
    incomplete: frozenset[int] = field(default_factory=frozenset)
    offload: OffloadName = "auto"  # the node's policy (drivers/offload.py decides per node)

    @property
    def vnis(self) -> list[int]:
        return sorted({w.vni for w in self.local})

    def source_tep(self, colour: Colour) -> str:
        """The outer source address for `colour` (the other colour's TEP if it has none)."""
        return self.teps.get(colour) or self.teps[other(colour)]

    def peer_hosts(self) -> dict[str, Mapping[Colour, str]]:
        return {p.host: p.teps for p in self.peers}


Intent = HostIntent | SwitchIntent


def rep_name(vf: str) -> str:
    """The representor of a VF on the host (`ip link` reads `vf` as a keyword: vf0 -> vf0_rep)."""
    return f"{vf}_rep"


def _routes(state: HostState | SwitchState, *, backups: bool) -> tuple[UnderlayRoute, ...]:
    return tuple(
        UnderlayRoute(
            prefix=r.prefix,
            dev=r.port,
            via=r.via,
            backup=NextHop(r.backup.port, r.backup.via) if backups and r.backup else None,
        )
        for r in sorted(state.routes, key=lambda r: (r.prefix, r.colour or ""))
    )


def switch_intent(state: SwitchState, withdrawn: Collection[str] = ()) -> SwitchIntent:
    """A switch's routes with their backups. `withdrawn`: ports whose primaries the agent took
    out on its own (repair.LocalRepair), kept out until their BFD session is Up again."""
    # A switch route per (prefix, colour): the colours' prefixes never overlap, so the prefix
    # (and the metric: primary or backup) names a kernel route.
    return SwitchIntent(node=state.node, revision=state.plan_revision,
                        routes=_routes(state, backups=True),
                        withdrawn=frozenset(withdrawn))  # fmt: skip


def members(chunks: Iterable[VniState]) -> dict[int, list[VniMember] | None]:
    """Each VNI's members, or None while its chunks are not all there at one revision."""
    by_vni: dict[int, list[VniState]] = {}
    for chunk in chunks:
        by_vni.setdefault(chunk.vni, []).append(chunk)
    out: dict[int, list[VniMember] | None] = {}
    for vni, parts in by_vni.items():
        revisions = {p.topology_revision for p in parts}
        numbers = sorted(p.chunk for p in parts)
        complete = len(revisions) == 1 and numbers == list(range(parts[0].chunks))
        out[vni] = (
            [m for p in sorted(parts, key=lambda p: p.chunk) for m in p.members]
            if complete
            else None
        )
    return out


def host_intent(
    state: HostState,
    chunks: Iterable[VniState],
    overrides: Mapping[str, Colour] | None = None,
) -> HostIntent:
    """Join a host's state with its VNIs' members. `overrides`: peer host -> colour chosen by
    the agent's own fast failover (they win until the controller's plan agrees or moves on)."""
    overrides = overrides or {}
    blue = set(state.blue_peers)
    local = tuple(
        LocalWorkload(name=w.name, vni=w.vni, rep=rep_name(w.vf), mac=w.mac.lower(), ip=w.ip)
        for w in sorted(state.local, key=lambda w: (w.vni, w.name))
    )
    own_macs = {w.mac for w in local}
    wanted = set(state.vnis)
    membership = members(c for c in chunks if c.vni in wanted)
    peers: list[Peer] = []
    incomplete: set[int] = set()
    for vni in sorted(wanted):
        listed = membership.get(vni)
        if listed is None:
            incomplete.add(vni)
            continue
        for m in listed:
            if m.host == state.node or m.mac.lower() in own_macs:
                continue
            teps: dict[Colour, str] = {}
            if m.red:
                teps[Colour.red] = m.red
            if m.blue:
                teps[Colour.blue] = m.blue
            if not teps:
                continue  # a peer with no TEP cannot be reached through the fabric
            colour: Colour = overrides.get(m.host) or (
                Colour.blue if m.host in blue else Colour.red
            )
            if colour not in teps:
                colour = other(colour)
            peers.append(
                Peer(
                    name=m.name,
                    vni=vni,
                    mac=m.mac.lower(),
                    ip=m.ip,
                    host=m.host,
                    teps=teps,
                    colour=colour,
                )
            )
    return HostIntent(
        node=state.node,
        revision=state.plan_revision,
        teps=dict(state.teps),
        routes=_routes(state, backups=False),  # a host's uplink routes: one each, no backup
        local=local,
        peers=tuple(peers),
        incomplete=frozenset(incomplete),
        offload=state.offload,
    )
