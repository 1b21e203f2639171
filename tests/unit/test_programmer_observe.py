"""What an agent registers, from its pure parts: the LLDP probe's frames and neighbour table,
pyverbs' answers turned into the registration's RDMA view, and rtnetlink dumps turned into
ports and VFs."""

from __future__ import annotations

import socket
import struct

from thorn.observed import ObservedPort
from thorn_programmer.neighbours import NeighbourTable, Probe, decode_probe, encode_probe
from thorn_programmer.observe import LinkInfo, build, parse_address, parse_link, probe_ports
from thorn_programmer.rdma import RawDevice, RawGid, RawPort, describe, unavailable
from thorn_programmer.register import rdma_of_namespace

# --- LLDP ---------------------------------------------------------------------------------------


def test_a_probe_round_trips_node_port_and_ttl() -> None:
    frame = encode_probe("leaf1", "swp3", 4)
    assert decode_probe(frame) == Probe("leaf1", "swp3", 4)


def test_a_probe_is_standard_lldp_chassis_port_ttl_end() -> None:
    frame = encode_probe("n", "p", 4)
    # type 1 (chassis) len 2 subtype 7 'n'; type 2 (port) len 2 subtype 5 'p'; TTL 4; end
    assert frame == bytes.fromhex("0202076e04020570060200040000")


def test_a_switch_lldpd_naming_itself_by_system_name_is_understood() -> None:
    def tlv(kind: int, value: bytes) -> bytes:
        return struct.pack("!H", kind << 9 | len(value)) + value

    frame = (
        tlv(1, bytes([4]) + bytes.fromhex("020000000001"))  # chassis: a MAC
        + tlv(2, bytes([5]) + b"Ethernet0")
        + tlv(3, struct.pack("!H", 120))
        + tlv(5, b"spine1.dc1.example")
        + tlv(0, b"")
    )
    assert decode_probe(frame) == Probe("spine1", "Ethernet0", 120)


def test_frames_that_name_no_node_or_are_cut_short_are_ignored() -> None:
    frame = encode_probe("leaf1", "swp3", 4)
    assert decode_probe(frame[:9]) is None  # truncated inside the port TLV
    mac_chassis = bytes.fromhex("020704020000000001") + frame[4 + 5 :]
    assert decode_probe(mac_chassis) is None  # a MAC chassis and no System Name
    assert decode_probe(encode_probe("bad name", "swp3", 4)) is None


def test_the_table_keeps_the_last_neighbour_per_port_until_its_ttl_runs_out() -> None:
    table = NeighbourTable()
    assert table.heard("swp1", Probe("spine1", "swp1", 4), now=0.0) is True
    assert table.heard("swp1", Probe("spine1", "swp1", 4), now=1.0) is False  # same news
    assert table.expire(now=4.9) is False
    assert [(n.port, n.chassis, n.port_id) for n in table.neighbours()] == [
        ("swp1", "spine1", "swp1")
    ]
    assert table.heard("swp1", Probe("spine1", "swp2", 4), now=2.0) is True  # recabled
    assert table.expire(now=6.0) is True
    assert table.neighbours() == []


def test_a_shutdown_lldpdu_forgets_the_sender_at_once() -> None:
    table = NeighbourTable()
    table.heard("swp1", Probe("spine1", "swp1", 4), now=0.0)
    assert table.heard("swp1", Probe("spine1", "swp1", 0), now=1.0) is True
    assert table.neighbours() == []


# --- RDMA ---------------------------------------------------------------------------------------


def test_pyverbs_answers_become_devices_ports_and_gids_with_their_netdev() -> None:
    device = RawDevice("rxeA", "5a8e:b4ff:fe79:25e6", [RawPort(1, 4, 2, [
        RawGid(1, "0000:0000:0000:0000:0000:ffff:0a00:0001", 2, 7),
        RawGid(0, "fe80:0000:0000:0000:588e:b4ff:fe79:25e6", 1, 7),
    ])])  # fmt: skip
    seen = describe([device], {7: "vfA"}.get)
    (rxe,) = seen.devices
    assert seen.unavailable is None
    assert (rxe.name, rxe.netdev, rxe.node_guid) == ("rxeA", "vfA", "5a8e:b4ff:fe79:25e6")
    (port,) = rxe.ports
    assert (port.port, port.state, port.link_layer) == (1, "active", "ethernet")
    assert [(g.index, g.gid, g.type, g.netdev) for g in port.gids] == [
        (0, "fe80::588e:b4ff:fe79:25e6", "IB/RoCE v1", "vfA"),
        (1, "::ffff:10.0.0.1", "RoCE v2", "vfA"),
    ]  # fmt: skip


def test_an_infiniband_port_has_gids_without_a_netdev() -> None:
    device = RawDevice("mlx5_0", "", [RawPort(1, 1, 1, [RawGid(0, "fe80::1", 0, 0)])])
    (dev,) = describe([device], lambda _: "never asked").devices
    assert dev.netdev is None and dev.ports[0].state == "down"
    assert dev.ports[0].gids[0].type == "IB"


def test_rdma_unavailable_says_why() -> None:
    seen = unavailable("Failed to get devices list")
    assert seen.unavailable == "RDMA unavailable: Failed to get devices list"
    assert seen.devices == []


# --- ports and VFs from rtnetlink ---------------------------------------------------------------


def _attr(kind: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return struct.pack("=HH", length, kind) + value + bytes(-length % 4)


def test_a_link_message_gives_name_mac_kind_and_carrier() -> None:
    payload = (
        struct.pack("=BxHiII", 0, 1, 12, 0x1 | 0x10000, 0)  # IFF_UP | IFF_LOWER_UP
        + _attr(3, b"swp1\0")
        + _attr(1, bytes.fromhex("020000000001"))
        + _attr(18, _attr(1, b"veth\0"))
        + _attr(33, b"\x01")
    )
    assert parse_link(16, payload) == LinkInfo(12, "swp1", "02:00:00:00:00:01", "veth",
                                               True, True, None)  # fmt: skip
    assert parse_link(17, payload) is None  # only RTM_NEWLINK


def test_an_address_message_gives_its_interface_and_prefix() -> None:
    payload = struct.pack("=BBBBI", socket.AF_INET, 31, 0, 0, 12) + _attr(
        2, socket.inet_aton("10.0.0.4")
    )
    assert parse_address(20, payload) == (12, "10.0.0.4/31")


def test_ports_skip_the_loopback_and_tunnels_and_representors_give_vfs() -> None:
    links = [
        LinkInfo(1, "lo", None, None, True, True, None),
        LinkInfo(2, "eth1", "02:00:00:00:00:01", "veth", True, True, None),
        LinkInfo(3, "vf0_rep", "aa:00:00:00:00:01", "veth", True, True, None),
        LinkInfo(4, "thv1000", "aa:00:00:00:00:02", "vxlan", True, True, None),
        LinkInfo(5, "enp3s0f0r1", "aa:00:00:00:00:03", None, True, True, "pf0vf1"),
    ]
    ports, vfs = build(links, [(2, "10.0.0.0/31")], {"eth1": 10000})
    assert [p.name for p in ports] == ["enp3s0f0r1", "eth1", "vf0_rep"]
    eth1 = next(p for p in ports if p.name == "eth1")
    assert (eth1.speed_mbps, [str(a) for a in eth1.addresses]) == (10000, ["10.0.0.0/31"])
    assert [(v.name, v.representor) for v in vfs] == [
        ("enp3s0f0r1", "enp3s0f0r1"), ("vf0", "vf0_rep"),
    ]  # fmt: skip
    assert probe_ports(ports, vfs) == ["eth1"]


def test_a_port_that_is_admin_down_is_not_probed() -> None:
    assert probe_ports([ObservedPort(name="eth1", admin_up=False, carrier=False)], []) == []


def test_a_lab_node_reports_only_the_rdma_devices_on_its_own_netdevs() -> None:
    seen = describe([
        RawDevice("rxeA", "", [RawPort(1, 4, 2, [RawGid(1, "::ffff:10.0.0.1", 2, 7)])]),
        RawDevice("rxeB", "", [RawPort(1, 4, 2, [RawGid(1, "::ffff:10.0.0.2", 2, 8)])]),
    ], {7: "vfA", 8: "vfB"}.get)  # fmt: skip
    mine = rdma_of_namespace(seen, {"eth1", "vfA_rep", "vfA"})
    assert [d.name for d in mine.devices] == ["rxeA"]
    assert rdma_of_namespace(unavailable("no"), {"eth1"}).unavailable == "RDMA unavailable: no"
