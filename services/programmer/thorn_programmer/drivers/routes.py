"""THORN's routes as prebuilt rtnetlink messages (`ip route replace|del ... proto thorn`).

Packed directly (a fixed layout, a few microseconds each) so that route changes go out in
batches like every other prebuilt message, many per sendmsg: a switch's reconcile, and
above all its local repair, where the primaries through a failed port leave in one
sendmsg (`SwitchRouteDriver.withdraw_port`).
"""

from __future__ import annotations

import socket
import struct

from thorn_programmer.kernel import RTPROT_THORN, Route
from thorn_programmer.netlink.constants import NlmFlag

RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY = 1, 4, 5, 6
RT_TABLE_MAIN = 254
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
    flags = NlmFlag.REQUEST | NlmFlag.ACK
    if op == "delete":
        kind, scope, rtype = RTM_DELROUTE, RT_SCOPE_NOWHERE, 0  # scope, type: any
    else:
        # REPLACE matches on (prefix, metric): the primary and the backup are two routes.
        kind, rtype = RTM_NEWROUTE, RTN_UNICAST
        flags |= NlmFlag.CREATE | NlmFlag.REPLACE
        scope = RT_SCOPE_UNIVERSE if route.via else RT_SCOPE_LINK
    body = _RTMSG.pack(family, prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_THORN, scope, rtype, 0)
    body += b"".join(attrs)
    return _HEADER.pack(_HEADER.size + len(body), kind, int(flags), 0, 0) + body
