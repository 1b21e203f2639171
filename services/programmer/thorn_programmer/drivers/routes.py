"""THORN's routes as prebuilt rtnetlink messages (`ip route replace|del ... proto thorn`).

Packed directly (a fixed layout, a few microseconds each) so that route changes go out in
batches like every other prebuilt message, many per sendmsg: a switch's reconcile, and
above all its local repair, where the primaries through a failed port leave in one
sendmsg (`SwitchRouteDriver.withdraw_port`).
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from thorn_programmer.kernel import RT_TABLE_MAIN, RTPROT_THORN, PortRule, Route, is_uturn_table
from thorn_programmer.netlink.constants import NlmFlag

RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15
RT_TABLE_UNSPEC = 0
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255
RTN_UNICAST = 1

_HEADER = struct.Struct("=IHHII")  # nlmsghdr
# rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTMSG = struct.Struct("=BBBBBBBBI")
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")


def _attr(kind: int, payload: bytes) -> bytes:
    return _NLA.pack(4 + len(payload), kind) + payload  # 4 or 16 bytes: no padding needed


def route_message(op: str, route: Route, ifindex: int | None) -> bytes:
    """`op` "add"/"replace": `ip route replace PREFIX [via VIA] dev DEV metric M proto thorn`
    (no via: scope link); "delete": `ip route del PREFIX metric M proto thorn` and, where
    known, the same device and gateway, so that only that one route of the prefix goes.
    `ifindex` None: the device is gone (a delete then matches without it)."""
    # inet_pton, not ipaddress: ~10x faster, and the prefixes are THORN's own (rendered from
    # validated documents, or read back from the kernel), so already in network form.
    address, _, length = route.prefix.partition("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    dst = socket.inet_pton(family, address)
    prefixlen = int(length) if length else len(dst) * 8
    attrs = [_attr(RTA_DST, dst)]
    if ifindex is not None:
        attrs.append(_attr(RTA_OIF, _U32.pack(ifindex)))
    if route.via:
        gateway = socket.inet_pton(
            socket.AF_INET6 if ":" in route.via else socket.AF_INET, route.via
        )
        attrs.append(_attr(RTA_GATEWAY, gateway))
    if route.metric:  # 0 (a route read back without one): match any metric
        attrs.append(_attr(RTA_PRIORITY, _U32.pack(route.metric)))
    table = route.table
    if table != RT_TABLE_MAIN:  # the header's byte holds ids below 256 only
        attrs.append(_attr(RTA_TABLE, _U32.pack(table)))
        table = table if table < 256 else RT_TABLE_UNSPEC
    flags = NlmFlag.REQUEST | NlmFlag.ACK
    if op == "delete":
        kind, scope, rtype = RTM_DELROUTE, RT_SCOPE_NOWHERE, 0  # scope, type: any
    else:
        # REPLACE matches on (prefix, metric): the primary and the backup are two routes.
        kind, rtype = RTM_NEWROUTE, RTN_UNICAST
        flags |= NlmFlag.CREATE | NlmFlag.REPLACE
        scope = RT_SCOPE_UNIVERSE if route.via else RT_SCOPE_LINK
    body = _RTMSG.pack(family, prefixlen, 0, 0, table, RTPROT_THORN, scope, rtype, 0)
    body += b"".join(attrs)
    return _HEADER.pack(_HEADER.size + len(body), kind, int(flags), 0, 0) + body


# --- policy rules (a switch port's U-turn rule) ----------------------------------------------
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
FRA_IIFNAME, FRA_PRIORITY, FRA_TABLE, FRA_PROTOCOL = 3, 6, 15, 21
FR_ACT_TO_TBL = 1
FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}


def _padded(kind: int, payload: bytes) -> bytes:
    attr = _NLA.pack(4 + len(payload), kind) + payload
    return attr + bytes(-len(attr) % 4)


def rule_message(op: str, rule: PortRule) -> bytes:
    """`ip rule add|del iif IIF lookup TABLE pref PRIORITY proto thorn` (`op` "add" or
    "delete"; rules have no replace). An add is exclusive: the kernel would otherwise keep
    a second, identical rule."""
    attrs = b"".join((
        _padded(FRA_IIFNAME, rule.iif.encode() + b"\0"),
        _attr(FRA_PRIORITY, _U32.pack(rule.priority)),
        _attr(FRA_TABLE, _U32.pack(rule.table)),
        _padded(FRA_PROTOCOL, bytes((RTPROT_THORN,))),
    ))  # fmt: skip
    flags = NlmFlag.REQUEST | NlmFlag.ACK
    if op == "delete":
        kind = RTM_DELRULE
    else:
        kind = RTM_NEWRULE
        flags |= NlmFlag.CREATE | NlmFlag.EXCL
    # fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags
    table = rule.table if rule.table < 256 else RT_TABLE_UNSPEC
    body = _RTMSG.pack(FAMILIES[rule.family], 0, 0, 0, table, 0, 0, FR_ACT_TO_TBL, 0) + attrs
    return _HEADER.pack(_HEADER.size + len(body), kind, int(flags), 0, 0) + body


# --- reading them back (a switch's reconcile), without pyroute2's general parser ------------
# Measured under make-run's lab: a leaf's read through pyroute2 (a link dump, an address
# dump, two route dumps and a qdisc dump, each fully decoded) took 20-40 ms of the loop, and
# a re-protection reconciles every switch at once. These read only what a switch's routes
# need, straight from the kernel's messages.

RTM_GETROUTE, RTM_GETLINK = 26, 18
IFLA_IFNAME = 3
_IFINFOMSG = struct.Struct("=BxHiII")


def dump_routes_message(family: int) -> bytes:
    """RTM_GETROUTE dump of one family (every table: the reply names each route's)."""
    body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    flags = NlmFlag.REQUEST | NlmFlag.DUMP
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETROUTE, int(flags), 0, 0) + body


def dump_rules_message(family: int) -> bytes:
    body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    flags = NlmFlag.REQUEST | NlmFlag.DUMP
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETRULE, int(flags), 0, 0) + body


def parse_thorn_rule(message: bytes) -> PortRule | None:
    """THORN's port rule (proto thorn, an iif, a table) an RTM_NEWRULE message holds."""
    if len(message) < _HEADER.size + _RTMSG.size:
        return None
    family, *_, table, _r1, _r2, _action, _flags = _RTMSG.unpack_from(message, _HEADER.size)
    attrs = _attrs(message, _HEADER.size + _RTMSG.size)
    proto, iif = attrs.get(FRA_PROTOCOL), attrs.get(FRA_IIFNAME)
    if proto is None or proto[0] != RTPROT_THORN or iif is None:
        return None
    if FRA_TABLE in attrs:
        table = _U32.unpack(attrs[FRA_TABLE][:4])[0]
    priority = _U32.unpack(attrs[FRA_PRIORITY][:4])[0] if FRA_PRIORITY in attrs else 0
    return PortRule(
        family=6 if family == socket.AF_INET6 else 4,
        iif=iif.split(b"\0", 1)[0].decode("utf-8", "replace"),
        table=table,
        priority=priority,
    )


def dump_links_message() -> bytes:
    body = _IFINFOMSG.pack(0, 0, 0, 0, 0)
    flags = NlmFlag.REQUEST | NlmFlag.DUMP
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETLINK, int(flags), 0, 0) + body


def _attrs(message: bytes, offset: int) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    while offset + _NLA.size <= len(message):
        length, kind = _NLA.unpack_from(message, offset)
        if length < _NLA.size:
            break
        found[kind & 0x3FFF] = message[offset + _NLA.size : offset + length]
        offset += (length + 3) & ~3
    return found


def parse_link(message: bytes) -> tuple[int, dict[int, bytes]] | None:
    """(ifindex, IFLA_* attributes by number) of an RTM_NEWLINK message (with its header)."""
    if len(message) < _HEADER.size + _IFINFOMSG.size:
        return None
    _family, _type, index, _flags, _change = _IFINFOMSG.unpack_from(message, _HEADER.size)
    return index, _attrs(message, _HEADER.size + _IFINFOMSG.size)


def parse_link_name(message: bytes) -> tuple[int, str] | None:
    """(ifindex, name) of an RTM_NEWLINK message (with its netlink header)."""
    link = parse_link(message)
    if link is None or IFLA_IFNAME not in link[1]:
        return None
    return link[0], asciiz(link[1][IFLA_IFNAME])


def asciiz(payload: bytes) -> str:
    return payload.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_thorn_route(message: bytes, names: dict[int, str]) -> Route | None:
    """The THORN route (proto thorn, in the main table or a U-turn table) an RTM_NEWROUTE
    message holds, else None."""
    if len(message) < _HEADER.size + _RTMSG.size:
        return None
    family, dst_len, _src, _tos, table, proto, _scope, _type, _flags = _RTMSG.unpack_from(
        message, _HEADER.size
    )
    if proto != RTPROT_THORN:
        return None
    attrs = _attrs(message, _HEADER.size + _RTMSG.size)
    if RTA_TABLE in attrs:  # holds the id when it does not fit the header's byte
        table = _U32.unpack(attrs[RTA_TABLE][:4])[0]
    if table != RT_TABLE_MAIN and not is_uturn_table(table):
        return None
    size = 4 if family == socket.AF_INET else 16
    dst = attrs.get(RTA_DST, bytes(size))
    network = ipaddress.ip_network((ipaddress.ip_address(dst[:size]), dst_len), strict=False)
    gateway = attrs.get(RTA_GATEWAY)
    oif = attrs.get(RTA_OIF)
    metric = attrs.get(RTA_PRIORITY)
    return Route(
        prefix=str(network),
        dev=names.get(_U32.unpack(oif[:4])[0], "?") if oif else "?",
        via=str(ipaddress.ip_address(gateway[:size])) if gateway else None,
        metric=_U32.unpack(metric[:4])[0] if metric else 0,  # IPv4: none for metric 0
        table=table,
    )
