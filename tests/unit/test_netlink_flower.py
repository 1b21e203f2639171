"""cls_flower: the match model, encode -> decode round trips, and both encoders agreeing."""

from __future__ import annotations

import socket
import struct
from ipaddress import ip_address, ip_network
from typing import Any

import pytest
from hypothesis import given, settings
from test_netlink_strategies import FILTERS

from thorn_programmer.netlink import (
    ETH_P_ALL,
    ETH_P_IP,
    ETH_P_IPV6,
    IPPROTO_UDP,
    ROCEV2_PORT,
    ActionRef,
    Control,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
    TcDecodeError,
    TunnelKeySet,
    decode_filter,
    decode_filters,
    filter_add,
    filter_delete,
    filter_dump,
    filter_replace,
)
from thorn_programmer.netlink.codec import encode_message
from thorn_programmer.netlink.constants import RTM_NEWTFILTER, ClsFlag, NlmFlag
from thorn_programmer.netlink.flower import options
from thorn_programmer.netlink.messages import tcmsg

ENCAP = FlowerFilter(
    ifindex=3,
    priority=10,
    handle=1,
    skip_hw=True,
    match=FlowerMatch(dst_ip=ip_network("10.0.2.5/32")),
    actions=(ActionRef("tunnel_key", 7), Mirred.redirect(4)),
)


def header(msg: bytes) -> tuple[int, int, int, int]:
    """(length, type, flags, seq) of an encoded message."""
    return (
        int.from_bytes(msg[0:4], "little"),
        int.from_bytes(msg[4:6], "little"),
        int.from_bytes(msg[6:8], "little"),
        int.from_bytes(msg[8:12], "little"),
    )


# --- the enum ---------------------------------------------------------------------------------


def test_the_nla_map_follows_the_kernel_enum() -> None:
    # Spot checks against linux/pkt_cls.h (6.1): a position is an attribute type.
    position = {name: i for i, (name, _type) in enumerate(options.nla_map)}
    assert position["TCA_FLOWER_ACT"] == 3
    assert position["TCA_FLOWER_KEY_ETH_TYPE"] == 8
    assert position["TCA_FLOWER_KEY_UDP_DST"] == 21
    assert position["TCA_FLOWER_FLAGS"] == 22
    assert position["TCA_FLOWER_KEY_ENC_KEY_ID"] == 26
    assert position["TCA_FLOWER_KEY_ENC_UDP_DST_PORT"] == 45
    assert position["TCA_FLOWER_IN_HW_COUNT"] == 86
    assert position["TCA_FLOWER_KEY_L2TPV3_SID"] == 105


# --- the match model --------------------------------------------------------------------------


def test_eth_type_is_inferred_from_the_inner_addresses() -> None:
    assert FlowerMatch(dst_ip=ip_network("10.0.0.0/8")).eth_type == ETH_P_IP
    assert FlowerMatch(src_ip=ip_network("2001:db8::/32")).eth_type == ETH_P_IPV6
    assert FlowerMatch().eth_type is None
    assert ENCAP.protocol == ETH_P_IP
    assert FlowerFilter(ifindex=1, priority=1).protocol == ETH_P_ALL


def test_a_full_mac_mask_is_no_mask_and_macs_are_lowercase() -> None:
    match = FlowerMatch(eth_dst="AA:BB:CC:00:11:22", eth_dst_mask="FF:FF:FF:FF:FF:FF")
    assert match == FlowerMatch(eth_dst="aa:bb:cc:00:11:22")


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        ({"src_ip": ip_network("10.0.0.0/8"), "dst_ip": ip_network("::/0")}, "mixed"),
        ({"eth_type": ETH_P_IPV6, "dst_ip": ip_network("10.0.0.1/32")}, "IPv4 keys need"),
        ({"dst_port": ROCEV2_PORT, "eth_type": ETH_P_IP}, "need ip_proto"),
        ({"ip_proto": IPPROTO_UDP}, "ip_proto needs"),
        ({"eth_dst_mask": "ff:ff:ff:00:00:00"}, "without eth_dst"),
        ({"eth_src": "00:11:22:33:44"}, "not a MAC"),
        ({"enc_key_id": 1 << 32}, "outside"),
        ({"enc_src_ip": ip_network("10.0.0.1/32"), "enc_dst_ip": ip_network("::1/128")}, "mixed"),
    ],
)
def test_keys_the_kernel_would_ignore_are_refused(keys: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        FlowerMatch(**keys)


def test_a_filter_holds_at_most_32_actions() -> None:
    with pytest.raises(ValueError, match="32 actions"):
        FlowerFilter(ifindex=1, priority=1, actions=(Gact(),) * 33)


# --- requests ---------------------------------------------------------------------------------


def test_add_replace_delete_carry_tc_header_flags() -> None:
    base = NlmFlag.REQUEST | NlmFlag.ACK
    assert header(filter_add(ENCAP))[1:] == (44, base | NlmFlag.EXCL | NlmFlag.CREATE, 0)
    assert header(filter_replace(ENCAP))[1:] == (44, base | NlmFlag.CREATE, 0)
    assert header(filter_delete(ENCAP))[1:] == (45, base, 0)
    assert header(filter_dump(3))[1:] == (46, NlmFlag.REQUEST | NlmFlag.DUMP, 0)


def test_the_tcm_info_holds_priority_and_protocol_in_network_order() -> None:
    msg = tcmsg(filter_add(ENCAP))
    msg.decode()
    assert msg["info"] == (10 << 16) | socket.htons(ETH_P_IP)
    assert (msg["index"], msg["handle"], msg["parent"]) == (3, 1, 0xFFFFFFF2)


def test_the_encap_rule_round_trips() -> None:
    state = decode_filter(filter_add(ENCAP))
    assert state.spec == ENCAP
    assert [a.index for a in state.actions] == [7, 0]
    assert state.unmodelled == ()


def test_delete_decodes_to_where_the_filter_is() -> None:
    spec = decode_filter(filter_delete(ENCAP)).spec
    assert (spec.ifindex, spec.priority, spec.handle, spec.protocol) == (3, 10, 1, ETH_P_IP)
    assert spec.actions == ()


@settings(max_examples=300, deadline=None)
@given(FILTERS)
def test_any_filter_round_trips_through_add_and_replace(spec: FlowerFilter) -> None:
    assert decode_filter(filter_add(spec)).spec == spec
    assert decode_filter(filter_replace(spec)).spec == spec


@settings(max_examples=300, deadline=None)
@given(FILTERS)
def test_the_fast_codec_agrees_with_pyroute2s(spec: FlowerFilter) -> None:
    for build in (filter_add, filter_replace, filter_delete):
        msg = build(spec)
        assert msg == build(spec, engine="pyroute2")
        assert decode_filter(msg) == decode_filter(msg, engine="pyroute2")


def test_a_dump_request_is_byte_identical_in_both_engines() -> None:
    assert filter_dump(7) == filter_dump(7, engine="pyroute2")


# --- what only a kernel dump carries ---------------------------------------------------------


def dump_entry(options_attrs: list[list[Any]], *, kind: str = "flower") -> bytes:
    """A filter message as the kernel dumps one, built from the same nla classes."""
    value: dict[str, Any] = {
        "index": 3,
        "handle": 1,
        "parent": 0xFFFFFFF2,
        "info": (10 << 16) | socket.htons(ETH_P_IP),
        "attrs": [["TCA_KIND", kind], ["TCA_CHAIN", 0]],
    }
    if options_attrs:
        value["attrs"].append(["TCA_OPTIONS", {"attrs": options_attrs}])
    return encode_message(tcmsg, RTM_NEWTFILTER, NlmFlag.MULTI, value)


def bound_tunnel_key(index: int, bindcnt: int) -> list[Any]:
    parms = {"index": index, "action": Control.PIPE, "refcnt": bindcnt + 1, "bindcnt": bindcnt}
    parms["t_action"] = 1
    stats = {
        "attrs": [
            ["TCA_STATS_BASIC", {"bytes": 1500, "packets": 10}],
            ["TCA_STATS_BASIC_HW", {"bytes": 0, "packets": 0}],
            ["TCA_STATS_QUEUE", {"drops": 2, "overlimits": 1}],
        ]
    }
    opts = [
        ["TCA_TUNNEL_KEY_ENC_IPV4_SRC", "10.1.0.1"],
        ["TCA_TUNNEL_KEY_ENC_IPV4_DST", "10.2.0.1"],
        ["TCA_TUNNEL_KEY_ENC_KEY_ID", 100],
        ["TCA_TUNNEL_KEY_ENC_DST_PORT", 4789],
        ["TCA_TUNNEL_KEY_NO_CSUM", 0],
        ["TCA_TUNNEL_KEY_ENC_TOS", 0],
        ["TCA_TUNNEL_KEY_ENC_TTL", 0],
        ["TCA_TUNNEL_KEY_PARMS", parms],
    ]
    return [
        ["TCA_ACT_KIND", "tunnel_key"],
        ["TCA_ACT_STATS", stats],
        ["TCA_ACT_FLAGS", {"flags": 2, "selector": 2}],
        ["TCA_ACT_IN_HW_COUNT", 0],
        ["TCA_ACT_OPTIONS", {"attrs": opts}],
    ]


def test_a_dumped_filter_carries_offload_state_and_counters() -> None:
    entry = dump_entry(
        [
            ["TCA_FLOWER_KEY_IPV4_DST", "10.0.2.5"],
            ["TCA_FLOWER_KEY_IPV4_DST_MASK", "255.255.255.255"],
            ["TCA_FLOWER_ACT", [{"attrs": bound_tunnel_key(7, 2)}]],
            ["TCA_FLOWER_KEY_ETH_TYPE", ETH_P_IP],
            ["TCA_FLOWER_FLAGS", ClsFlag.SKIP_HW | ClsFlag.NOT_IN_HW],
            ["TCA_FLOWER_IN_HW_COUNT", 0],
        ]
    )
    state = decode_filter(entry)
    assert state.not_in_hw and not state.in_hw and state.in_hw_count == 0
    assert state.spec.skip_hw and not state.spec.skip_sw
    (shared,) = state.actions
    assert shared.action == TunnelKeySet(
        src=ip_address("10.1.0.1"), dst=ip_address("10.2.0.1"), key_id=100, dst_port=4789, index=7
    )
    assert (shared.index, shared.refcnt, shared.bindcnt) == (7, 3, 2)
    assert (shared.counters.bytes, shared.counters.packets) == (1500, 10)
    assert (shared.counters.drops, shared.counters.overlimits) == (2, 1)
    assert shared.skip_hw and shared.in_hw_count == 0


def test_exact_port_masks_of_a_dump_are_the_plain_key() -> None:
    entry = dump_entry(
        [
            ["TCA_FLOWER_KEY_IP_PROTO", IPPROTO_UDP],
            ["TCA_FLOWER_KEY_UDP_DST", ROCEV2_PORT],
            ["TCA_FLOWER_KEY_UDP_DST_MASK", 0xFFFF],
            ["TCA_FLOWER_KEY_ENC_UDP_DST_PORT", 4789],
            ["TCA_FLOWER_KEY_ENC_UDP_DST_PORT_MASK", 0xFFFF],
            ["TCA_FLOWER_FLAGS", 0],
        ]
    )
    state = decode_filter(entry)
    assert state.spec.match == FlowerMatch(
        eth_type=ETH_P_IP, ip_proto=IPPROTO_UDP, dst_port=ROCEV2_PORT, enc_dst_port=4789
    )
    assert state.unmodelled == ()


def test_keys_the_models_cannot_hold_are_reported_not_dropped() -> None:
    entry = dump_entry(
        [
            ["TCA_FLOWER_KEY_VLAN_ID", 10],
            ["TCA_FLOWER_KEY_IP_PROTO", IPPROTO_UDP],
            ["TCA_FLOWER_KEY_UDP_DST", ROCEV2_PORT],
            ["TCA_FLOWER_KEY_UDP_DST_MASK", 0xFF00],
            ["TCA_FLOWER_KEY_IPV4_SRC", "10.0.0.1"],
            ["TCA_FLOWER_KEY_IPV4_SRC_MASK", "255.0.255.0"],
        ]
    )
    state = decode_filter(entry)
    assert set(state.unmodelled) == {
        "TCA_FLOWER_KEY_VLAN_ID",
        "TCA_FLOWER_KEY_UDP_DST_MASK",
        "TCA_FLOWER_KEY_IPV4_SRC_MASK",
    }
    assert state.spec.match.src_ip is None


def test_the_dumped_filters_decode_alike_in_both_engines() -> None:
    entry = dump_entry(
        [
            ["TCA_FLOWER_ACT", [{"attrs": bound_tunnel_key(7, 2)}]],
            ["TCA_FLOWER_KEY_VLAN_ID", 10],
            ["TCA_FLOWER_FLAGS", ClsFlag.SKIP_HW | ClsFlag.NOT_IN_HW],
            ["TCA_FLOWER_IN_HW_COUNT", 0],
        ]
    )
    assert decode_filter(entry) == decode_filter(entry, engine="pyroute2")
    assert decode_filters([dump_entry([]), entry, dump_entry([], kind="u32")]) == [
        decode_filter(entry)
    ]


def test_an_attribute_of_a_newer_kernel_is_reported_as_unmodelled() -> None:
    entry = bytearray(dump_entry([["TCA_FLOWER_FLAGS", 0]]))
    # Append TCA_FLOWER type 200 (u32) inside TCA_OPTIONS, the last attribute.
    options_at = len(entry) - 12
    entry += struct.pack("=HHI", 8, 200, 1)
    struct.pack_into("=H", entry, options_at, 20)
    struct.pack_into("=I", entry, 0, len(entry))
    assert decode_filter(bytes(entry)).unmodelled == ("UNKNOWN_200",)


def test_a_classifier_head_or_another_kind_is_not_a_flower_filter() -> None:
    with pytest.raises(TcDecodeError, match="classifier head"):
        decode_filter(dump_entry([]))
    with pytest.raises(TcDecodeError, match="not a flower filter"):
        decode_filter(dump_entry([], kind="u32"))
