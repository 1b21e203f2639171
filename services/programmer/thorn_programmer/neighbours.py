"""Neighbour discovery: an LLDP probe out of each fabric port, and what each port hears.

Every `interval` seconds the agent sends one IEEE 802.1AB LLDP frame (ethertype 0x88cc, to
the nearest-bridge group 01:80:c2:00:00:0e) out of each fabric port: chassis id = the node
name (subtype 7, locally assigned), port id = the port's netdev name (subtype 5, interface
name), TTL = 4 intervals. It listens on the same ports and keeps, per local port, the last
neighbour heard until its TTL runs out. Real LLDP agents (lldpd on a switch) are understood
too when they send a System Name TLV: that name stands for the chassis.

Pure parts: `encode_probe`, `decode_probe` and `NeighbourTable` (time is an argument).
The shell, `NeighbourProbe`, owns one AF_PACKET socket in the node's namespace, opened
bound to the LLDP ethertype only, so it sees nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import re
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from thorn.observed import HeardNeighbour
from thorn_programmer.netlink.transport import socket_in_netns

log = structlog.get_logger("thorn.programmer.neighbours")

PROBES = Counter(
    "thorn_programmer_neighbour_probes_total", "LLDP probes sent and heard", ["node", "way"]
)

ETH_P_LLDP = 0x88CC
LLDP_MULTICAST = bytes.fromhex("0180c200000e")
TLV_END, TLV_CHASSIS, TLV_PORT, TLV_TTL, TLV_SYSTEM_NAME = 0, 1, 2, 3, 5
CHASSIS_LOCAL = 7
PORT_IFNAME, PORT_LOCAL = 5, 7
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0
PACKET_OUTGOING = 4
SIOCGIFINDEX = 0x8933
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$")
_TLV = struct.Struct("!H")


@dataclass(frozen=True, slots=True)
class Probe:
    """What one LLDP frame says: who sent it (node, port) and for how long it holds."""

    chassis: str
    port_id: str
    ttl: int


def _tlv(kind: int, value: bytes) -> bytes:
    return _TLV.pack((kind << 9) | len(value)) + value


def encode_probe(node: str, port: str, ttl: int) -> bytes:
    """The LLDPDU (the frame's payload) announcing `node`'s port `port`."""
    return b"".join((
        _tlv(TLV_CHASSIS, bytes([CHASSIS_LOCAL]) + node.encode()),
        _tlv(TLV_PORT, bytes([PORT_IFNAME]) + port.encode()),
        _tlv(TLV_TTL, struct.pack("!H", max(0, min(ttl, 0xFFFF)))),
        _tlv(TLV_END, b""),
    ))  # fmt: skip


def decode_probe(payload: bytes) -> Probe | None:
    """The sender of an LLDPDU, or None if it does not name a node and port we can match
    (a chassis that is neither a local name nor backed by a System Name, a malformed TLV)."""
    tlvs: dict[int, bytes] = {}
    offset = 0
    while offset + 2 <= len(payload):
        (head,) = _TLV.unpack_from(payload, offset)
        kind, length = head >> 9, head & 0x1FF
        value = payload[offset + 2 : offset + 2 + length]
        if len(value) != length:
            return None
        if kind == TLV_END:
            break
        tlvs.setdefault(kind, value)
        offset += 2 + length
    chassis, port, ttl = tlvs.get(TLV_CHASSIS), tlvs.get(TLV_PORT), tlvs.get(TLV_TTL)
    if not chassis or not port or ttl is None or len(ttl) != 2:
        return None
    name = None
    if chassis[0] == CHASSIS_LOCAL:
        name = chassis[1:].decode("utf-8", "replace")
    elif TLV_SYSTEM_NAME in tlvs:
        name = tlvs[TLV_SYSTEM_NAME].decode("utf-8", "replace").split(".", 1)[0]
    if port[0] not in (PORT_IFNAME, PORT_LOCAL):
        return None
    port_id = port[1:].decode("utf-8", "replace")
    if name is None or not _NAME.match(name) or not _IFNAME.match(port_id):
        return None
    return Probe(name, port_id, struct.unpack("!H", ttl)[0])


class NeighbourTable:
    """Per local port, the last neighbour heard and until when it holds (monotonic s)."""

    def __init__(self) -> None:
        self._heard: dict[str, tuple[Probe, float]] = {}

    def heard(self, port: str, probe: Probe, now: float) -> bool:
        """Note `probe` heard on `port`; True when the port's neighbour changed."""
        before = self._heard.get(port)
        if probe.ttl == 0:  # a shutdown LLDPDU: forget the sender now
            self._heard.pop(port, None)
            return before is not None
        self._heard[port] = (probe, now + probe.ttl)
        return before is None or (before[0].chassis, before[0].port_id) != (
            probe.chassis, probe.port_id,
        )  # fmt: skip

    def expire(self, now: float) -> bool:
        """Forget neighbours whose TTL ran out; True when any went."""
        gone = [port for port, (_, until) in self._heard.items() if until <= now]
        for port in gone:
            del self._heard[port]
        return bool(gone)

    def neighbours(self) -> list[HeardNeighbour]:
        return [
            HeardNeighbour(port=port, chassis=probe.chassis, port_id=probe.port_id)
            for port, (probe, _) in sorted(self._heard.items())
        ]


class NeighbourProbe:
    """Sends the node's probes out of `ports()` and listens for its neighbours' probes.
    `on_change` is called (on the loop) when a port's neighbour changes or goes."""

    def __init__(
        self,
        node: str,
        netns: str | None,
        ports: Callable[[], list[str]],
        *,
        interval: float = 1.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        self.netns = netns
        self.ports = ports
        self.interval = interval
        self.ttl = max(1, math.ceil(4 * interval))
        self.table = NeighbourTable()
        self.on_change = on_change
        self._joined: set[str] = set()

    def neighbours(self) -> list[HeardNeighbour]:
        return self.table.neighbours()

    async def run(self) -> None:
        sock = await asyncio.to_thread(socket_in_netns, self.netns, _packet_socket)
        loop = asyncio.get_running_loop()
        loop.add_reader(sock.fileno(), self._receive, sock)
        try:
            while True:
                self._send_all(sock)
                if self.table.expire(time.monotonic()):
                    self._changed()
                await asyncio.sleep(self.interval)
        finally:
            loop.remove_reader(sock.fileno())
            sock.close()

    def _send_all(self, sock: socket.socket) -> None:
        for port in self.ports():
            if port not in self._joined:
                with contextlib.suppress(OSError):  # gone again: joined when it is back
                    _join(sock, port)
                    self._joined.add(port)
            frame = encode_probe(self.node, port, self.ttl)
            try:
                sock.sendto(frame, (port, ETH_P_LLDP, 0, 0, LLDP_MULTICAST))
            except OSError:  # down or gone: nothing to hear on it either
                self._joined.discard(port)
                continue
            PROBES.labels(self.node, "sent").inc()

    def _receive(self, sock: socket.socket) -> None:
        for _ in range(64):  # bounded: the loop serves other nodes too
            try:
                payload, address = sock.recvfrom(1500)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("neighbour_receive_failed", node=self.node, error=str(exc))
                return
            port, pkttype = address[0], address[2]
            probe = decode_probe(payload)
            if pkttype == PACKET_OUTGOING or probe is None:
                continue
            PROBES.labels(self.node, "heard").inc()
            if self.table.heard(port, probe, time.monotonic()):
                log.info("neighbour_heard", node=self.node, port=port, chassis=probe.chassis,
                         port_id=probe.port_id)  # fmt: skip
                self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _packet_socket() -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_LLDP))
    sock.setblocking(False)
    return sock


def _join(sock: socket.socket, port: str) -> None:
    """Receive the LLDP group on `port` (a real NIC filters multicast it was not asked for)."""
    index = _ifindex(sock, port)
    mreq = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, LLDP_MULTICAST)
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)


def _ifindex(sock: socket.socket, name: str) -> int:
    """`name`'s ifindex in the socket's namespace (if_nametoindex asks this thread's)."""
    request = struct.pack("16si", name.encode(), 0)
    return int(struct.unpack("16si", fcntl.ioctl(sock.fileno(), SIOCGIFINDEX, request))[1])


__all__ = ["NeighbourProbe", "NeighbourTable", "Probe", "decode_probe", "encode_probe"]
