"""cls_flower as a pyroute2 classifier plugin: pyroute2 0.9.7 ships none.

`options` decodes and encodes TCA_OPTIONS of a `flower` filter; its `nla_map` is the kernel's
TCA_FLOWER_* enum (6.1 `pkt_cls.h`) in order, so the position of a name is its attribute type.
`parameters()` turns a typed `FlowerFilter` into that value the way iproute2's `tc/f_flower.c`
does: masks always sent for MACs and IPs, exact ports without a mask, ETH_TYPE from the
protocol (absent for "all"), TCA_FLOWER_FLAGS always present.
"""

# pyroute2's nla classes are untyped; subclassing them is the plugin contract.
# mypy: allow-subclassing-any

from __future__ import annotations

from typing import Any

from pyroute2.netlink import nla  # type: ignore[import-untyped,unused-ignore]

from thorn_programmer.netlink.actions import action_list, tca_act
from thorn_programmer.netlink.constants import ETH_P_ALL, IPPROTO_TCP, ClsFlag
from thorn_programmer.netlink.models import FULL_MAC_MASK, FlowerFilter, FlowerMatch, IPNetwork

KIND = "flower"

# The whole 6.1 enum, up to TCA_FLOWER_KEY_L2TPV3_SID (105). Keys THORN does not set are
# 'hex': a foreign filter still decodes and shows what it had.
_FLOWER_ATTRS: tuple[tuple[str, str], ...] = (
    ("TCA_FLOWER_UNSPEC", "none"),
    ("TCA_FLOWER_CLASSID", "uint32"),
    ("TCA_FLOWER_INDEV", "asciiz"),
    ("TCA_FLOWER_ACT", "*tca_act"),
    ("TCA_FLOWER_KEY_ETH_DST", "l2addr"),
    ("TCA_FLOWER_KEY_ETH_DST_MASK", "l2addr"),
    ("TCA_FLOWER_KEY_ETH_SRC", "l2addr"),
    ("TCA_FLOWER_KEY_ETH_SRC_MASK", "l2addr"),
    ("TCA_FLOWER_KEY_ETH_TYPE", "be16"),
    ("TCA_FLOWER_KEY_IP_PROTO", "uint8"),
    ("TCA_FLOWER_KEY_IPV4_SRC", "ip4addr"),
    ("TCA_FLOWER_KEY_IPV4_SRC_MASK", "ip4addr"),
    ("TCA_FLOWER_KEY_IPV4_DST", "ip4addr"),
    ("TCA_FLOWER_KEY_IPV4_DST_MASK", "ip4addr"),
    ("TCA_FLOWER_KEY_IPV6_SRC", "ip6addr"),
    ("TCA_FLOWER_KEY_IPV6_SRC_MASK", "ip6addr"),
    ("TCA_FLOWER_KEY_IPV6_DST", "ip6addr"),
    ("TCA_FLOWER_KEY_IPV6_DST_MASK", "ip6addr"),
    ("TCA_FLOWER_KEY_TCP_SRC", "be16"),
    ("TCA_FLOWER_KEY_TCP_DST", "be16"),
    ("TCA_FLOWER_KEY_UDP_SRC", "be16"),
    ("TCA_FLOWER_KEY_UDP_DST", "be16"),
    ("TCA_FLOWER_FLAGS", "uint32"),
    ("TCA_FLOWER_KEY_VLAN_ID", "be16"),
    ("TCA_FLOWER_KEY_VLAN_PRIO", "uint8"),
    ("TCA_FLOWER_KEY_VLAN_ETH_TYPE", "be16"),
    ("TCA_FLOWER_KEY_ENC_KEY_ID", "be32"),
    ("TCA_FLOWER_KEY_ENC_IPV4_SRC", "ip4addr"),
    ("TCA_FLOWER_KEY_ENC_IPV4_SRC_MASK", "ip4addr"),
    ("TCA_FLOWER_KEY_ENC_IPV4_DST", "ip4addr"),
    ("TCA_FLOWER_KEY_ENC_IPV4_DST_MASK", "ip4addr"),
    ("TCA_FLOWER_KEY_ENC_IPV6_SRC", "ip6addr"),
    ("TCA_FLOWER_KEY_ENC_IPV6_SRC_MASK", "ip6addr"),
    ("TCA_FLOWER_KEY_ENC_IPV6_DST", "ip6addr"),
    ("TCA_FLOWER_KEY_ENC_IPV6_DST_MASK", "ip6addr"),
    ("TCA_FLOWER_KEY_TCP_SRC_MASK", "be16"),
    ("TCA_FLOWER_KEY_TCP_DST_MASK", "be16"),
    ("TCA_FLOWER_KEY_UDP_SRC_MASK", "be16"),
    ("TCA_FLOWER_KEY_UDP_DST_MASK", "be16"),
    ("TCA_FLOWER_KEY_SCTP_SRC_MASK", "be16"),
    ("TCA_FLOWER_KEY_SCTP_DST_MASK", "be16"),
    ("TCA_FLOWER_KEY_SCTP_SRC", "be16"),
    ("TCA_FLOWER_KEY_SCTP_DST", "be16"),
    ("TCA_FLOWER_KEY_ENC_UDP_SRC_PORT", "be16"),
    ("TCA_FLOWER_KEY_ENC_UDP_SRC_PORT_MASK", "be16"),
    ("TCA_FLOWER_KEY_ENC_UDP_DST_PORT", "be16"),
    ("TCA_FLOWER_KEY_ENC_UDP_DST_PORT_MASK", "be16"),
    ("TCA_FLOWER_KEY_FLAGS", "be32"),
    ("TCA_FLOWER_KEY_FLAGS_MASK", "be32"),
    ("TCA_FLOWER_KEY_ICMPV4_CODE", "hex"),
    ("TCA_FLOWER_KEY_ICMPV4_CODE_MASK", "hex"),
    ("TCA_FLOWER_KEY_ICMPV4_TYPE", "hex"),
    ("TCA_FLOWER_KEY_ICMPV4_TYPE_MASK", "hex"),
    ("TCA_FLOWER_KEY_ICMPV6_CODE", "hex"),
    ("TCA_FLOWER_KEY_ICMPV6_CODE_MASK", "hex"),
    ("TCA_FLOWER_KEY_ICMPV6_TYPE", "hex"),
    ("TCA_FLOWER_KEY_ICMPV6_TYPE_MASK", "hex"),
    ("TCA_FLOWER_KEY_ARP_SIP", "hex"),
    ("TCA_FLOWER_KEY_ARP_SIP_MASK", "hex"),
    ("TCA_FLOWER_KEY_ARP_TIP", "hex"),
    ("TCA_FLOWER_KEY_ARP_TIP_MASK", "hex"),
    ("TCA_FLOWER_KEY_ARP_OP", "hex"),
    ("TCA_FLOWER_KEY_ARP_OP_MASK", "hex"),
    ("TCA_FLOWER_KEY_ARP_SHA", "hex"),
    ("TCA_FLOWER_KEY_ARP_SHA_MASK", "hex"),
    ("TCA_FLOWER_KEY_ARP_THA", "hex"),
    ("TCA_FLOWER_KEY_ARP_THA_MASK", "hex"),
    ("TCA_FLOWER_KEY_MPLS_TTL", "hex"),
    ("TCA_FLOWER_KEY_MPLS_BOS", "hex"),
    ("TCA_FLOWER_KEY_MPLS_TC", "hex"),
    ("TCA_FLOWER_KEY_MPLS_LABEL", "hex"),
    ("TCA_FLOWER_KEY_TCP_FLAGS", "hex"),
    ("TCA_FLOWER_KEY_TCP_FLAGS_MASK", "hex"),
    ("TCA_FLOWER_KEY_IP_TOS", "hex"),
    ("TCA_FLOWER_KEY_IP_TOS_MASK", "hex"),
    ("TCA_FLOWER_KEY_IP_TTL", "hex"),
    ("TCA_FLOWER_KEY_IP_TTL_MASK", "hex"),
    ("TCA_FLOWER_KEY_CVLAN_ID", "hex"),
    ("TCA_FLOWER_KEY_CVLAN_PRIO", "hex"),
    ("TCA_FLOWER_KEY_CVLAN_ETH_TYPE", "hex"),
    ("TCA_FLOWER_KEY_ENC_IP_TOS", "hex"),
    ("TCA_FLOWER_KEY_ENC_IP_TOS_MASK", "hex"),
    ("TCA_FLOWER_KEY_ENC_IP_TTL", "hex"),
    ("TCA_FLOWER_KEY_ENC_IP_TTL_MASK", "hex"),
    ("TCA_FLOWER_KEY_ENC_OPTS", "hex"),
    ("TCA_FLOWER_KEY_ENC_OPTS_MASK", "hex"),
    ("TCA_FLOWER_IN_HW_COUNT", "uint32"),
    ("TCA_FLOWER_KEY_PORT_SRC_MIN", "hex"),
    ("TCA_FLOWER_KEY_PORT_SRC_MAX", "hex"),
    ("TCA_FLOWER_KEY_PORT_DST_MIN", "hex"),
    ("TCA_FLOWER_KEY_PORT_DST_MAX", "hex"),
    ("TCA_FLOWER_KEY_CT_STATE", "hex"),
    ("TCA_FLOWER_KEY_CT_STATE_MASK", "hex"),
    ("TCA_FLOWER_KEY_CT_ZONE", "hex"),
    ("TCA_FLOWER_KEY_CT_ZONE_MASK", "hex"),
    ("TCA_FLOWER_KEY_CT_MARK", "hex"),
    ("TCA_FLOWER_KEY_CT_MARK_MASK", "hex"),
    ("TCA_FLOWER_KEY_CT_LABELS", "hex"),
    ("TCA_FLOWER_KEY_CT_LABELS_MASK", "hex"),
    ("TCA_FLOWER_KEY_MPLS_OPTS", "hex"),
    ("TCA_FLOWER_KEY_HASH", "hex"),
    ("TCA_FLOWER_KEY_HASH_MASK", "hex"),
    ("TCA_FLOWER_KEY_NUM_OF_VLANS", "hex"),
    ("TCA_FLOWER_KEY_PPPOE_SID", "hex"),
    ("TCA_FLOWER_KEY_PPP_PROTO", "hex"),
    ("TCA_FLOWER_KEY_L2TPV3_SID", "hex"),
)


class options(nla):
    nla_map = _FLOWER_ATTRS
    tca_act = tca_act


def _ip_attrs(key: str, net: IPNetwork) -> list[list[Any]]:
    # key is e.g. "IPV4_SRC" or "ENC_IPV6_DST"; tc always sends the mask.
    return [
        [f"TCA_FLOWER_KEY_{key}", str(net.network_address)],
        [f"TCA_FLOWER_KEY_{key}_MASK", str(net.netmask)],
    ]


def _key_attrs(match: FlowerMatch) -> list[list[Any]]:
    attrs: list[list[Any]] = []
    for side in ("dst", "src"):
        mac = getattr(match, f"eth_{side}")
        if mac is not None:
            mask = getattr(match, f"eth_{side}_mask") or FULL_MAC_MASK
            attrs.append([f"TCA_FLOWER_KEY_ETH_{side.upper()}", mac])
            attrs.append([f"TCA_FLOWER_KEY_ETH_{side.upper()}_MASK", mask])
    if match.ip_proto is not None:
        attrs.append(["TCA_FLOWER_KEY_IP_PROTO", match.ip_proto])
    for side, net in (("SRC", match.src_ip), ("DST", match.dst_ip)):
        if net is not None:
            attrs += _ip_attrs(f"IPV{net.version}_{side}", net)
    l4 = "TCP" if match.ip_proto == IPPROTO_TCP else "UDP"
    for side, port in (("SRC", match.src_port), ("DST", match.dst_port)):
        if port is not None:
            attrs.append([f"TCA_FLOWER_KEY_{l4}_{side}", port])
    if match.enc_key_id is not None:
        attrs.append(["TCA_FLOWER_KEY_ENC_KEY_ID", match.enc_key_id])
    for side, net in (("SRC", match.enc_src_ip), ("DST", match.enc_dst_ip)):
        if net is not None:
            attrs += _ip_attrs(f"ENC_IPV{net.version}_{side}", net)
    if match.enc_dst_port is not None:
        attrs.append(["TCA_FLOWER_KEY_ENC_UDP_DST_PORT", match.enc_dst_port])
    return attrs


def flags_of(skip_hw: bool, skip_sw: bool) -> int:
    return (ClsFlag.SKIP_HW if skip_hw else 0) | (ClsFlag.SKIP_SW if skip_sw else 0)


def parameters(spec: FlowerFilter) -> dict[str, Any]:
    """The TCA_OPTIONS value of a flower filter, in the order tc emits it."""
    attrs: list[list[Any]] = []
    if spec.classid is not None:
        attrs.append(["TCA_FLOWER_CLASSID", spec.classid])
    attrs += _key_attrs(spec.match)
    if spec.actions:
        attrs.append(["TCA_FLOWER_ACT", action_list(spec.actions)])
    attrs.append(["TCA_FLOWER_FLAGS", flags_of(spec.skip_hw, spec.skip_sw)])
    if spec.protocol != ETH_P_ALL:
        attrs.append(["TCA_FLOWER_KEY_ETH_TYPE", spec.protocol])
    return {"attrs": attrs}
