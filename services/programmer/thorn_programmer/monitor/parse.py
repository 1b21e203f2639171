"""Pure rtnetlink parsing for the link monitor: bytes in, frozen values out (no I/O, no root).

Numbers from the uapi headers: `linux/rtnetlink.h` (RTM_*, RTNLGRP_LINK), `linux/netlink.h`
(NLMSG_*, NLM_F_*), `linux/if_link.h` (IFLA_*, struct rtnl_link_stats64, IF_OPER_*),
`linux/if.h` (IFF_*); checked against pyroute2 0.9.7's ifinfmsg attribute map.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Final

NLMSG_NOOP: Final = 1
NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
NLM_F_REQUEST: Final = 0x1
NLM_F_MULTI: Final = 0x2
NLM_F_DUMP_INTR: Final = 0x10
NLM_F_DUMP: Final = 0x300

RTM_NEWLINK: Final = 16
RTM_DELLINK: Final = 17
RTM_GETLINK: Final = 18
# Group number for NETLINK_ADD_MEMBERSHIP; the legacy bind mask RTMGRP_LINK is 1 << (1 - 1).
RTNLGRP_LINK: Final = 1

IFLA_IFNAME: Final = 3
IFLA_OPERSTATE: Final = 16
IFLA_STATS64: Final = 23
IFLA_CARRIER: Final = 33
IFLA_CARRIER_CHANGES: Final = 35

IFF_UP: Final = 1 << 0
IFF_LOWER_UP: Final = 1 << 16

# SOL_SOCKET SO_TIMESTAMPNS(_OLD) and its cmsg type: struct timespec (two longs).
SO_TIMESTAMPNS: Final = 35
SCM_TIMESTAMPNS: Final = SO_TIMESTAMPNS
_SOL_SOCKET: Final = 1

_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
_TIMESPEC = struct.Struct("=qq")
_STATS_HEAD = struct.Struct("=8Q")  # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped
_NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER


class OperState(IntEnum):
    """RFC 2863 operational state (IF_OPER_*), as IFLA_OPERSTATE carries it."""

    UNKNOWN = 0
    NOTPRESENT = 1
    DOWN = 2
    LOWERLAYERDOWN = 3
    TESTING = 4
    DORMANT = 5
    UP = 6


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One link's state as the kernel reported it.

    `carrier` is IFLA_CARRIER when present (the physical fact), else IFF_LOWER_UP. `at_ns` is
    wall-clock `time.time_ns()` when the message was read (the kernel stamps no netlink
    message: SO_TIMESTAMPNS gives no cmsg there, measured on 6.18).
    """

    ifname: str
    ifindex: int
    admin_up: bool
    carrier: bool
    oper_state: OperState
    deleted: bool
    at_ns: int
    carrier_changes: int | None


@dataclass(frozen=True, slots=True)
class Resync:
    """The kernel dropped events (ENOBUFS, noticed at `at_ns`): the next `links` LinkEvents
    are the whole current state; a link not among them is gone. `number` counts this
    monitor's resyncs so far."""

    at_ns: int
    links: int
    number: int


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """The gray-failure subset of rtnl_link_stats64, or a difference of two samples."""

    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int

    @property
    def faults(self) -> int:
        """Errors plus drops: in a delta, a rising value hints at a gray failure."""
        return self.rx_errors + self.tx_errors + self.rx_dropped + self.tx_dropped

    def since(self, before: LinkCounters) -> LinkCounters:
        """Per-counter increase; a counter that went backwards was reset, so count from 0."""
        values = []
        for field in fields(self):
            now, then = getattr(self, field.name), getattr(before, field.name)
            values.append(now - then if now >= then else now)
        return LinkCounters(*values)


def counter_deltas(
    before: Mapping[str, LinkCounters], after: Mapping[str, LinkCounters]
) -> dict[str, LinkCounters]:
    """Increase per ifname present in both samples (a link that came or went has no delta)."""
    return {name: now.since(before[name]) for name, now in after.items() if name in before}


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload after the 16-byte header) for each message in a datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, mtype, flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            return  # truncated or corrupt: nothing after it can be trusted
        yield mtype, flags, seq, data[offset + _NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3


def attributes(payload: bytes, offset: int) -> dict[int, bytes]:
    """Top-level attributes from `offset` on, by type (the last one wins, as in the kernel)."""
    found: dict[int, bytes] = {}
    while offset + _NLA.size <= len(payload):
        length, atype = _NLA.unpack_from(payload, offset)
        if length < _NLA.size or offset + length > len(payload):
            break
        found[atype & _NLA_TYPE_MASK] = payload[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3
    return found


def _ifname(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(msg_type: int, payload: bytes, at_ns: int) -> LinkEvent | None:
    """A LinkEvent from an RTM_NEWLINK/RTM_DELLINK payload; None for anything else."""
    if msg_type not in (RTM_NEWLINK, RTM_DELLINK) or len(payload) < _IFINFOMSG.size:
        return None
    _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(payload)
    attrs = attributes(payload, _IFINFOMSG.size)
    name = attrs.get(IFLA_IFNAME)
    if name is None:
        return None
    carrier_attr = attrs.get(IFLA_CARRIER)
    carrier = bool(carrier_attr[0]) if carrier_attr else bool(flags & IFF_LOWER_UP)
    oper_attr = attrs.get(IFLA_OPERSTATE)
    oper = oper_attr[0] if oper_attr else OperState.UNKNOWN
    changes_attr = attrs.get(IFLA_CARRIER_CHANGES)
    return LinkEvent(
        ifname=_ifname(name),
        ifindex=index,
        admin_up=bool(flags & IFF_UP),
        carrier=carrier,
        oper_state=OperState(oper) if oper in OperState._value2member_map_ else OperState.UNKNOWN,
        deleted=msg_type == RTM_DELLINK,
        at_ns=at_ns,
        carrier_changes=_U32.unpack_from(changes_attr)[0]
        if changes_attr and len(changes_attr) >= 4
        else None,
    )


def parse_counters(msg_type: int, payload: bytes) -> tuple[str, LinkCounters] | None:
    """(ifname, counters) from an RTM_NEWLINK payload carrying IFLA_STATS64; else None."""
    if msg_type != RTM_NEWLINK or len(payload) < _IFINFOMSG.size:
        return None
    attrs = attributes(payload, _IFINFOMSG.size)
    name, stats = attrs.get(IFLA_IFNAME), attrs.get(IFLA_STATS64)
    if name is None or stats is None or len(stats) < _STATS_HEAD.size:
        return None
    rx_p, tx_p, _rx_b, _tx_b, rx_e, tx_e, rx_d, tx_d = _STATS_HEAD.unpack_from(stats)
    return _ifname(name), LinkCounters(rx_p, tx_p, rx_e, tx_e, rx_d, tx_d)


def error_code(payload: bytes) -> int:
    """The positive errno of an NLMSG_ERROR (or NLMSG_DONE) payload; 0 is an ack."""
    return -_I32.unpack_from(payload)[0] if len(payload) >= 4 else 0


def getlink_dump(seq: int) -> bytes:
    """RTM_GETLINK dump request for every link of the socket's namespace."""
    body = _IFINFOMSG.pack(0, 0, 0, 0, 0)
    header = _NLMSGHDR.pack(
        _NLMSGHDR.size + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    return header + body


def noop() -> bytes:
    """A bare NLMSG_NOOP: sent to the reader's own port to wake its blocking recv."""
    return _NLMSGHDR.pack(_NLMSGHDR.size, NLMSG_NOOP, 0, 0, 0)


def timestamp_ns(ancdata: Sequence[tuple[int, int, bytes]], fallback: int) -> int:
    """The SCM_TIMESTAMPNS stamp if the kernel attached one, else `fallback`."""
    for level, ctype, data in ancdata:
        if level == _SOL_SOCKET and ctype == SCM_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return fallback
