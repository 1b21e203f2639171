"""Desired datapath state per node: what pathcomp writes to JetStream KV (one key per node) and
what each node's programmer agent reconciles its kernel to.

A switch gets one route per (destination attachment group, colour), aggregated to the TEP
prefixes of that group's hosts, or a /32 where a host hangs off the switch itself, and with
it, where one exists, a loop-free backup next hop (`Backup`) the kernel falls back to. A host gets
its TEPs, its egress per destination and colour, its local workloads (decap) and its peers
(encap): the peer host's red and blue TEPs and which colour is active.

`stage` orders updates across nodes for make-before-break: a route's stage is the switch's
hop distance to the destination along the new tree, and a change at stage n is applied only
after every change at stages below n, so a switch never points at a neighbour that has not
yet learned the new route (updates run from the destination outward; no transient loop).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from thorn.model import Colour

OffloadName = Literal["auto", "hardware", "software"]  # thorn.model.OffloadPolicy's values


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Backup(_Doc):
    """A switch route's loop-free alternate next hop (RFC 5286 "downstream path": the
    neighbour is strictly closer to the destination along the same colour's tree, so
    forwarding from it can never come back, whatever else has failed). The switch installs it
    as a second route of a higher metric: the kernel uses it the moment the primary port
    loses carrier (`ignore_routes_with_linkdown`) or goes admin down, with no agent involved."""

    port: str = Field(description="this node's egress port for the backup")
    neighbour: str = Field(description="the backup's next switch")
    via: str | None = Field(None, description="the neighbour's address on that link")


class Route(_Doc):
    prefix: str = Field(description="destination TEP prefix, e.g. 10.224.0.16/28")
    colour: Colour | None = Field(description="the colour it carries; null: both")
    port: str = Field(description="this node's egress port")
    neighbour: str = Field(description="the next node (a switch, or the destination host)")
    via: str | None = Field(None, description="the neighbour's address on that link")
    stage: int = Field(ge=0, description="apply after all lower stages (destination outward)")
    backup: Backup | None = Field(
        None, description="switches: the loop-free alternate; null: none exists (a local risk)"
    )


class LocalWorkload(_Doc):
    """A workload on this host: decapsulated traffic for it goes to its VF."""

    name: str
    vni: int
    vf: str
    mac: str
    ip: str


class VniMember(_Doc):
    """A workload of a VNI and the TEPs of the host it lives on: an encap rule's target."""

    name: str
    mac: str
    ip: str
    host: str
    red: str | None
    blue: str | None


class SwitchState(_Doc):
    kind: Literal["switch"] = "switch"
    node: str
    plan_revision: int
    topology_revision: int
    term: int = Field(
        0,
        ge=0,
        description="the pathcomp leader's term that wrote it (a fencing token): an "
        "agent ignores a document of an older term than the newest it has taken",
    )
    routes: list[Route]


class HostState(_Doc):
    """A host's state. Its peers are the members of its VNIs (see VniState); the active
    colour toward a peer is red unless the peer host is listed in `blue_peers`."""

    kind: Literal["host"] = "host"
    node: str
    plan_revision: int
    topology_revision: int
    term: int = Field(
        0,
        ge=0,
        description="the pathcomp leader's term that wrote it (a fencing token): an "
        "agent ignores a document of an older term than the newest it has taken",
    )
    teps: dict[Colour, str]
    routes: list[Route]
    local: list[LocalWorkload]
    vnis: list[int]
    blue_peers: list[str]
    offload: OffloadName = Field(
        "auto", description="the node's offload policy (thorn.model.OffloadPolicy)"
    )


class VniState(_Doc):
    """One chunk of a VNI's membership, shared by every host in the VNI (written once, not
    copied into each host's state: a VNI spanning 8,192 GPUs would otherwise put 67 million
    peer entries into the store)."""

    kind: Literal["vni"] = "vni"
    vni: int
    chunk: int
    chunks: int
    topology_revision: int
    members: list[VniMember]


DesiredState = Annotated[SwitchState | HostState | VniState, Field(discriminator="kind")]

# A host's TEPs sit on its loopback with this label: the programmer owns addresses labelled
# so (and the lab, which builds nodes as the programmer would, labels them the same way).
TEP_LABEL = "lo:thorn"

VNI_CHUNK = 1000  # members per VniState: ~130 kB, well inside NATS's 1 MB message limit


def node_key(node: str) -> str:
    return f"node.{node}"


def vni_key(vni: int, chunk: int) -> str:
    return f"vni.{vni}.{chunk}"
