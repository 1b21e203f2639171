"""The kernel lane is real: Debian's kernel, its tc modules, and a flower/tunnel_key datapath.

Two emulated hosts (namespaces with a representor `rep0`, an external VXLAN `vxlan0` and a
red and a blue uplink through two router namespaces) carry workload UDP inside VXLAN. The
rules are made with iproute2's `tc`, as the host role of docs/architecture says:
encap `flower skip_hw dst_ip PEER action tunnel_key index 7 action mirred ... vxlan0`,
decap `flower skip_hw enc_key_id 100 dst_ip LOCAL action tunnel_key unset action mirred
... rep0`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from netlab import (
    LANE_MODULES,
    Fabric,
    NetnsFactory,
    build_fabric,
    flip_with_tc,
    program_tunnel_with_tc,
    receive,
    static_neighbours,
    tc,
    tunnel_key_dst,
    tx_packets,
    udp_receiver,
    udp_send,
)

PORT = 5001


@pytest.fixture
def fabric(netns: NetnsFactory) -> Fabric:
    built = build_fabric(netns)
    static_neighbours(built)
    program_tunnel_with_tc(built, "red")
    return built


def test_the_guest_runs_debians_kernel_not_the_hosts() -> None:
    release = os.uname().release
    assert release != os.environ["THORN_LANE_HOST_KERNEL"]
    assert Path(f"/boot/vmlinuz-{release}").is_file()
    assert "Debian" in Path("/proc/version").read_text()


def test_the_lane_modules_are_loaded() -> None:
    loaded = {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}
    assert set(LANE_MODULES) <= loaded


def test_the_rules_are_flower_and_tunnel_key_in_software(fabric: Fabric) -> None:
    encap = tc(fabric.a.ns, "filter show dev rep0 ingress")
    assert "flower" in encap and "skip_hw" in encap and "not_in_hw" in encap
    assert "tunnel_key" in encap and "Egress Redirect to device vxlan0" in encap
    decap = tc(fabric.b.ns, "filter show dev vxlan0 ingress")
    assert "enc_key_id 100" in decap and "unset" in decap
    assert tunnel_key_dst(fabric.a) == fabric.b.tep["red"]


def test_workload_udp_crosses_the_red_path_inside_vxlan(fabric: Fabric) -> None:
    a, b = fabric.a, fabric.b
    red_before, blue_before = tx_packets(a.ns, "red"), tx_packets(a.ns, "blue")
    payloads = [f"red {i}".encode() for i in range(20)]
    with udp_receiver(b.workload, PORT) as sock:
        udp_send(a.workload, b.workload, PORT, payloads)
        # As a multiset: the first packet may wait for the underlay's ARP and land last.
        assert sorted(receive(sock, len(payloads))) == sorted(payloads)
    assert tx_packets(a.ns, "red") - red_before >= len(payloads)
    assert tx_packets(a.ns, "blue") - blue_before == 0


def test_one_shared_action_replace_moves_the_traffic_to_the_blue_tep(fabric: Fabric) -> None:
    a, b = fabric.a, fabric.b
    with udp_receiver(b.workload, PORT) as sock:
        red_before, blue_before = tx_packets(a.ns, "red"), tx_packets(a.ns, "blue")
        udp_send(a.workload, b.workload, PORT, [b"before"] * 10)
        assert receive(sock, 10) == [b"before"] * 10
        red_mid, blue_mid = tx_packets(a.ns, "red"), tx_packets(a.ns, "blue")
        # At least: the first packet toward a router may also cost an ARP request.
        assert red_mid - red_before >= 10 and blue_mid - blue_before == 0

        flip_with_tc(fabric, a, "blue")
        assert tunnel_key_dst(a) == b.tep["blue"]

        udp_send(a.workload, b.workload, PORT, [b"after"] * 10)
        assert receive(sock, 10) == [b"after"] * 10
        assert tx_packets(a.ns, "red") - red_mid == 0
        assert tx_packets(a.ns, "blue") - blue_mid >= 10
