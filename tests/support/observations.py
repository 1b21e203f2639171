"""Registrations as agents would send them, for the registration tests of every lane.

The fabric is leaf_spine(2, 2, 2) (or larger: host1 and leaf/spine ports are named alike):
host1:eth1 (MAC 02:00:00:00:00:01, 10.0.0.0/31) runs workload host1-vf0 on VF vf0.
"""

from __future__ import annotations

from typing import Any

from thorn.observed import (
    HeardNeighbour,
    NodeObservation,
    ObservedPort,
    ObservedVf,
    RdmaDevice,
    RdmaGid,
    RdmaObservation,
    RdmaPort,
)


def host1(**changes: Any) -> NodeObservation:
    """host1 as declared: eth1 with its MAC and address, vf0 behind vf0_rep."""
    observed = NodeObservation(
        ports=[
            ObservedPort(name="eth1", mac="02:00:00:00:00:01", admin_up=True, carrier=True,
                         speed_mbps=10000, addresses=["10.0.0.0/31"]),  # type: ignore[list-item]
            ObservedPort(name="vf0_rep", kind="veth", admin_up=True, carrier=True),
        ],
        vfs=[ObservedVf(name="vf0", representor="vf0_rep")],
        rdma=RdmaObservation(unavailable="RDMA unavailable: Failed to get devices list"),
    )  # fmt: skip
    return observed.model_copy(update=changes)


def rdma_on(netdev: str) -> RdmaObservation:
    """One Soft-RoCE device bound to `netdev`, with its RoCE v2 GID."""
    gid = RdmaGid(index=1, gid="::ffff:100.64.0.1", type="RoCE v2", netdev=netdev)
    port = RdmaPort(port=1, state="active", link_layer="ethernet", gids=[gid])
    return RdmaObservation(devices=[RdmaDevice(name="rxe0", netdev=netdev, ports=[port])])


def hears(port: str, chassis: str, port_id: str) -> NodeObservation:
    """A node whose probe hears `chassis`:`port_id` on its `port`."""
    return NodeObservation(neighbours=[HeardNeighbour(port=port, chassis=chassis, port_id=port_id)])
