"""UDP sockets for BFD: RFC 5881 (single hop, port 3784) and RFC 5883 (multihop, port 4784).

Two kinds of socket, both non-blocking:

- a *listener* per namespace, address family, hop mode and bind address, which receives with
  the TTL / hop limit and the destination address and interface of every datagram
  (IP_RECVTTL + IP_PKTINFO, or their IPv6 twins): the manager checks the TTL (RFC 5881 §5,
  RFC 5883 §5) and demultiplexes by addresses;
- a *sender* per session, bound to a source port in 49152-65535 that stays the same for the
  session's life (RFC 5881 §4), sending with TTL 255, optionally pinned to an interface with
  SO_BINDTODEVICE.

A socket belongs to the network namespace of the thread that created it; the manager creates
them inside the session's namespace (see `thorn.netns.entered`).
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
import struct
from dataclasses import dataclass

SINGLE_HOP_PORT = 3784
MULTIHOP_PORT = 4784
SOURCE_PORT_MIN = 49152
SOURCE_PORT_MAX = 65535
SEND_TTL = 255
SINGLE_HOP_TTL = 255  # RFC 5881 §5: anything else did not come from a direct neighbour
MULTIHOP_MIN_TTL = 254  # RFC 5883 leaves it to configuration; FRR's bfdd default is 254

# Linux values that Python 3.11's socket module does not export.
_IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
_IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)
_IN_PKTINFO = struct.Struct("=i4s4s")  # ifindex, spec_dst, header destination
_IN6_PKTINFO = struct.Struct("=16sI")  # header destination, ifindex
_INT = struct.Struct("=i")
_HOP_COUNT = {(socket.IPPROTO_IP, socket.IP_TTL), (socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT)}
_V6_PKTINFO = (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO)
ANCILLARY_SIZE = socket.CMSG_SPACE(_INT.size) + socket.CMSG_SPACE(_IN6_PKTINFO.size)
RECEIVE_SIZE = 512  # a control packet is 24 bytes (more with auth); larger is malformed anyway
_BIND_ATTEMPTS = 64


@dataclass(frozen=True, slots=True)
class Datagram:
    """One received datagram with what the kernel told us about its IP header."""

    data: bytes
    source: str
    destination: str | None
    ifindex: int
    ttl: int | None


def normalise(address: str) -> str:
    """The canonical text of an address, so "10.0.0.01"-style spellings never split a key."""
    return str(ipaddress.ip_address(address))


def family_of(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


def port_for(multihop: bool) -> int:
    return MULTIHOP_PORT if multihop else SINGLE_HOP_PORT


def ttl_acceptable(ttl: int | None, multihop: bool, min_ttl: int | None = None) -> bool:
    """RFC 5881 §5 / RFC 5883 §5; a datagram whose TTL the kernel did not report is refused.
    Multihop takes `min_ttl` (the session's, as FRR's `minimum-ttl`), by default 254."""
    if ttl is None:
        return False
    if multihop:
        return ttl >= (min_ttl if min_ttl is not None else MULTIHOP_MIN_TTL)
    return ttl == SINGLE_HOP_TTL


def _wildcard(family: socket.AddressFamily) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"


def open_listener(
    family: socket.AddressFamily, port: int, bind_address: str | None
) -> socket.socket:
    """A socket receiving BFD control packets on `port`, with TTL and destination reported.

    SO_REUSEADDR lets a wildcard listener and address-specific ones share the port in one
    namespace; the kernel hands each datagram to the most specific match.
    """
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IP, _IP_RECVTTL, 1)
            sock.setsockopt(socket.IPPROTO_IP, _IP_PKTINFO, 1)
        sock.bind((bind_address or _wildcard(family), port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def open_sender(
    family: socket.AddressFamily,
    local_address: str | None,
    ifname: str | None,
    rng: random.Random,
) -> socket.socket:
    """A socket for one session's packets: TTL 255, a fixed source port in 49152-65535.

    Not connected: a peer that is unreachable when the session is added (link down, no route
    yet) must not make the add fail; each send names the destination and may fail on its own.
    """
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, SEND_TTL)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, SEND_TTL)
        if ifname is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        # Nothing should arrive on the source port; keep a stray flood from holding memory.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        host = local_address or _wildcard(family)
        for attempt in range(_BIND_ATTEMPTS):
            try:
                sock.bind((host, rng.randint(SOURCE_PORT_MIN, SOURCE_PORT_MAX)))
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == _BIND_ATTEMPTS - 1:
                    raise
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def receive(sock: socket.socket) -> Datagram:
    """One datagram from a listener; BlockingIOError when none is queued."""
    data, ancillary, _flags, source = sock.recvmsg(RECEIVE_SIZE, ANCILLARY_SIZE)
    ttl: int | None = None
    destination: str | None = None
    ifindex = 0
    for level, kind, payload in ancillary:
        if (level, kind) in _HOP_COUNT and len(payload) >= _INT.size:
            ttl = _INT.unpack_from(payload)[0]
        elif (level, kind) == (socket.IPPROTO_IP, _IP_PKTINFO) and len(payload) >= _IN_PKTINFO.size:
            ifindex, _spec, dst = _IN_PKTINFO.unpack_from(payload)
            destination = socket.inet_ntop(socket.AF_INET, dst)
        elif (level, kind) == _V6_PKTINFO and len(payload) >= _IN6_PKTINFO.size:
            dst6, ifindex = _IN6_PKTINFO.unpack_from(payload)
            destination = socket.inet_ntop(socket.AF_INET6, dst6)
    # The kernel's own text form is canonical already, except IPv6 scope suffixes.
    peer = str(source[0]).split("%", 1)[0]
    return Datagram(data, peer, destination, ifindex, ttl)
