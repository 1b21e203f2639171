"""What a node's agent observes on its node and registers with topology (pure models).

An agent registers, on `agent.register.<node>`, what its kernel shows: its ports (name, MAC,
carrier, speed, addresses), its VFs and their representors, its RDMA devices (read through
pyverbs, or why RDMA is unavailable) and the neighbours it hears on each port (the LLDP
probe). Topology keeps the latest registration of each node beside the declared fabric
(`thorn.registration` compares them). These models are the wire format and what the API
shows; they check form only: whether a registration fits the topology is topology's call.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from thorn.model import IfName, Name

MAX_PORTS = 4096
MAX_GIDS = 256

_MAC_TEXT = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def _observed_mac(value: object) -> object:
    # What the kernel shows, normalised; unlike a declared MAC, any value is a fact.
    if isinstance(value, str):
        text = value.strip().lower().replace("-", ":")
        if not _MAC_TEXT.match(text):
            raise ValueError(f"'{value}' is not a MAC address (expected aa:bb:cc:dd:ee:ff)")
        return text
    return value


ObservedMac = Annotated[str, BeforeValidator(_observed_mac)]
ObservedInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
Text = Annotated[str, StringConstraints(max_length=200)]


class _Observed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObservedPort(_Observed):
    """A netdev of the node as its kernel shows it."""

    name: IfName
    mac: ObservedMac | None = None
    kind: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        None, description="the link kind (veth, vxlan, ...); none for a physical port"
    )
    admin_up: bool
    carrier: bool
    speed_mbps: int | None = Field(None, ge=0, description="none: the driver does not say")
    addresses: list[ObservedInterface] = Field(default_factory=list, max_length=256)


class ObservedVf(_Observed):
    """A VF the node carries: the VF netdev `name`, its representor on the node (switchdev),
    and the physical function (uplink) it belongs to, when the kernel says."""

    name: IfName
    representor: IfName | None = None
    parent: IfName | None = None
    mac: ObservedMac | None = None


class RdmaGid(_Observed):
    """One entry of an RDMA port's GID table."""

    index: int = Field(ge=0)
    gid: Annotated[str, StringConstraints(max_length=64)]
    type: Annotated[str, StringConstraints(max_length=32)] = Field(
        description="'RoCE v2', 'IB/RoCE v1' or 'IB' (the kernel's gid_attrs/types words)"
    )
    netdev: IfName | None = None


class RdmaPort(_Observed):
    port: int = Field(ge=1, le=255)
    state: Annotated[str, StringConstraints(max_length=32)]
    link_layer: Annotated[str, StringConstraints(max_length=32)] = ""
    gids: list[RdmaGid] = Field(default_factory=list, max_length=MAX_GIDS)


class RdmaDevice(_Observed):
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    node_guid: Annotated[str, StringConstraints(max_length=32)] = ""
    netdev: IfName | None = Field(None, description="the netdev the device is bound to")
    ports: list[RdmaPort] = Field(default_factory=list, max_length=255)


class RdmaObservation(_Observed):
    """The node's RDMA devices, or why there are none to read (`unavailable`)."""

    unavailable: Text | None = Field(
        None, description="'RDMA unavailable: <reason>' when the devices cannot be read"
    )
    devices: list[RdmaDevice] = Field(default_factory=list, max_length=256)


class HeardNeighbour(_Observed):
    """The neighbour probe heard node `chassis`, port `port_id`, on the local port `port`."""

    port: IfName
    chassis: Name
    port_id: IfName


class NodeObservation(_Observed):
    ports: list[ObservedPort] = Field(default_factory=list, max_length=MAX_PORTS)
    vfs: list[ObservedVf] = Field(default_factory=list, max_length=MAX_PORTS)
    rdma: RdmaObservation = Field(default_factory=RdmaObservation)
    neighbours: list[HeardNeighbour] = Field(default_factory=list, max_length=MAX_PORTS)


__all__ = [
    "HeardNeighbour",
    "NodeObservation",
    "ObservedPort",
    "ObservedVf",
    "RdmaDevice",
    "RdmaGid",
    "RdmaObservation",
    "RdmaPort",
]
