"""Kernel constants for TC over rtnetlink, spelled out once so encoder and decoder agree.

Values come from the uapi headers (`linux/rtnetlink.h`, `linux/netlink.h`, `linux/pkt_cls.h`,
`linux/tc_act/tc_*.h`, 6.1) and were checked against what iproute2 6.1 sends. pyroute2 only has
part of them (no TCA_CHAIN, no TCA_ACT_FLAGS, no RTM_*ACTION payload), hence this module.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag
from typing import Final

# Ethernet protocols (host order; the wire carries them big-endian).
ETH_P_ALL: Final = 0x0003
ETH_P_IP: Final = 0x0800
ETH_P_IPV6: Final = 0x86DD
IPPROTO_TCP: Final = 6
IPPROTO_UDP: Final = 17
ROCEV2_PORT: Final = 4791
VXLAN_PORT: Final = 4789

# Filter parents as `tc ... ingress` / `egress` encode them: TC_H_MAKE(TC_H_CLSACT, MIN_*),
# which the kernel accepts for both the `ingress` and the `clsact` qdisc.
TC_H_INGRESS: Final = 0xFFFFFFF2
TC_H_EGRESS: Final = 0xFFFFFFF3

# rtnetlink message types.
RTM_NEWTFILTER: Final = 44
RTM_DELTFILTER: Final = 45
RTM_GETTFILTER: Final = 46
RTM_NEWACTION: Final = 48
RTM_DELACTION: Final = 49
RTM_GETACTION: Final = 50

NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3

NLMSG_HDR_LEN: Final = 16
TCMSG_LEN: Final = 20
TCAMSG_LEN: Final = 4

# Netlink socket options (SOL_NETLINK).
SOL_NETLINK: Final = 270
NETLINK_CAP_ACK: Final = 10
NETLINK_EXT_ACK: Final = 11


class NlmFlag(IntFlag):
    """nlmsg_flags; NEW requests reuse the GET bits 0x100/0x200 with another meaning."""

    REQUEST = 0x1
    MULTI = 0x2
    ACK = 0x4
    DUMP = 0x300
    REPLACE = 0x100
    EXCL = 0x200
    CREATE = 0x400
    APPEND = 0x800
    # On NLMSG_ERROR: the request was not echoed back / extack TLVs follow.
    CAPPED = 0x100
    ACK_TLVS = 0x200


class ClsFlag(IntFlag):
    """TCA_CLS_FLAGS_* in TCA_FLOWER_FLAGS."""

    SKIP_HW = 1 << 0
    SKIP_SW = 1 << 1
    IN_HW = 1 << 2
    NOT_IN_HW = 1 << 3
    VERBOSE = 1 << 4


class ActFlag(IntFlag):
    """TCA_ACT_FLAGS_* (a bitfield32 in TCA_ACT_FLAGS)."""

    NO_PERCPU_STATS = 1 << 0
    SKIP_HW = 1 << 1
    SKIP_SW = 1 << 2


TCA_ACT_FLAG_LARGE_DUMP_ON: Final = 1 << 0


class Control(IntEnum):
    """TC_ACT_*: what happens after an action (the `action` field of tc_gen)."""

    UNSPEC = -1
    OK = 0
    RECLASSIFY = 1
    SHOT = 2
    PIPE = 3
    STOLEN = 4
    QUEUED = 5
    REPEAT = 6
    REDIRECT = 7
    TRAP = 8


class MirredAction(IntEnum):
    """TCA_*_REDIR / TCA_*_MIRROR of tc_mirred.h (the `eaction` field)."""

    EGRESS_REDIRECT = 1
    EGRESS_MIRROR = 2
    INGRESS_REDIRECT = 3
    INGRESS_MIRROR = 4


class TunnelKeyAction(IntEnum):
    """t_action of struct tc_tunnel_key; 0 is what tc sends to bind by index."""

    BIND = 0
    SET = 1
    RELEASE = 2
