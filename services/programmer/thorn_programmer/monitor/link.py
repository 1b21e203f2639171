"""`LinkMonitor`: every link event of one network namespace, in order, loss never silent.

Two raw NETLINK_ROUTE sockets opened inside the namespace (they stay bound to it): one joined
to the link group and read by a dedicated thread with a blocking recv (pyroute2 0.9.x can lose
events between select() and get()), one for dumps. Events reach asyncio through
`call_soon_threadsafe`. When the kernel drops events (ENOBUFS) the reader delivers what is
still queued, dumps every link and emits `Resync` followed by that state.

Start before `snapshot()`: events are queued from `start()` on, so snapshot then iterate
misses nothing (an event may repeat a state the snapshot already showed).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable

from thorn_programmer.monitor.parse import (
    NLM_F_DUMP_INTR,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTNLGRP_LINK,
    SO_TIMESTAMPNS,
    LinkCounters,
    LinkEvent,
    Resync,
    error_code,
    getlink_dump,
    messages,
    noop,
    parse_counters,
    parse_link,
    timestamp_ns,
)
from thorn_programmer.netlink.constants import SOL_NETLINK
from thorn_programmer.netlink.transport import open_socket

NETLINK_ADD_MEMBERSHIP = 1
_RECV_SIZE = 1 << 18
_ANC_SIZE = 64
_DUMP_RETRIES = 8
# Backstop for close(): the reader normally wakes on a NOOP sent to its own port.
_RCVTIMEO = struct.pack("=qq", 1, 0)

MonitorItem = LinkEvent | Resync


class DumpInterrupted(OSError):
    """Links kept changing during every dump attempt (NLM_F_DUMP_INTR each time)."""


def dump(
    sock: socket.socket, seq: int, request: Callable[[int], bytes] = getlink_dump
) -> list[tuple[int, bytes]]:
    """(type, payload) of every message of one consistent dump (`request(seq)` asks for it:
    by default RTM_GETLINK, every link)."""
    for attempt in range(_DUMP_RETRIES):
        ours = (seq + attempt) & 0xFFFFFFFF
        sock.send(request(ours))
        parts: list[tuple[int, bytes]] = []
        interrupted = False
        done = False
        while not done:
            for mtype, flags, got, payload in messages(sock.recv(_RECV_SIZE)):
                if got != ours:
                    continue  # a late answer to an earlier attempt
                if mtype in (NLMSG_ERROR, NLMSG_DONE):
                    code = error_code(payload)
                    if code:
                        raise OSError(code, f"dump: {errno.errorcode.get(code, code)}")
                    interrupted |= bool(flags & NLM_F_DUMP_INTR)
                    done = True
                    break
                interrupted |= bool(flags & NLM_F_DUMP_INTR)
                parts.append((mtype, payload))
        if not interrupted:
            return parts
    raise DumpInterrupted(errno.EINTR, "dump interrupted on every attempt")


class _Dumper:
    """A plain NETLINK_ROUTE socket in the namespace for dumps; thread-safe."""

    def __init__(self, netns: str | None) -> None:
        self.sock = open_socket(netns, 4 << 20, 1 << 16)
        self.sock.settimeout(10.0)
        self._lock = threading.Lock()
        self._seq = itertools.count(1, _DUMP_RETRIES)

    def sample(self) -> tuple[list[LinkEvent], dict[str, LinkCounters]]:
        """Every link's state and counters, from one dump (each RTM_NEWLINK has both)."""
        # Stamped before asking: an event read after this instant may be newer than the dump.
        at = time.time_ns()
        with self._lock:
            parts = dump(self.sock, next(self._seq))
        links = [e for t, p in parts if (e := parse_link(t, p, at)) is not None]
        counters = dict(c for t, p in parts if (c := parse_counters(t, p)) is not None)
        return links, counters

    def links(self) -> list[LinkEvent]:
        return self.sample()[0]

    def counters(self) -> dict[str, LinkCounters]:
        return self.sample()[1]

    def close(self) -> None:
        self.sock.close()


def sample_counters(netns: str | None = None) -> dict[str, LinkCounters]:
    """Every interface's packets, errors and drops (IFLA_STATS64) in `netns`, by ifname."""
    dumper = _Dumper(netns)
    try:
        return dumper.counters()
    finally:
        dumper.close()


class LinkMonitor:
    """Link events of one namespace (`None`: the caller's) as an async iterator.

    `start()` from inside the event loop that will iterate; `close()` from that loop ends the
    iteration. `resyncs` counts kernel drops recovered by a dump.
    """

    def __init__(self, netns: str | None = None, *, rcvbuf: int = 32 << 20) -> None:
        self.netns = netns
        self._rcvbuf = rcvbuf
        self._events: socket.socket | None = None
        self._dumper: _Dumper | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[MonitorItem | BaseException | None] = asyncio.Queue()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._closed = False
        self._resyncs = 0

    @property
    def resyncs(self) -> int:
        return self._resyncs

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("LinkMonitor already started")
        self._loop = asyncio.get_running_loop()
        self._dumper = _Dumper(self.netns)
        try:
            sock = open_socket(self.netns, self._rcvbuf, 1 << 16)
        except BaseException:
            self._dumper.close()
            raise
        try:
            sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, RTNLGRP_LINK)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _RCVTIMEO)
            # Used if a kernel ever stamps netlink messages; 6.18 does not (at_ns falls back).
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except BaseException:
            sock.close()
            self._dumper.close()
            raise
        self._events = sock
        name = f"link-monitor-{self.netns or 'self'}"
        self._thread = threading.Thread(target=self._read, args=(sock,), name=name, daemon=True)
        self._thread.start()

    def snapshot(self) -> list[LinkEvent]:
        """Every link of the namespace now (RTM_GETLINK dump); blocking, any thread."""
        if self._dumper is None:
            raise RuntimeError("LinkMonitor not started")
        return self._dumper.links()

    def counters(self) -> dict[str, LinkCounters]:
        """`sample_counters` over this monitor's dump socket."""
        return self.sample()[1]

    def sample(self) -> tuple[list[LinkEvent], dict[str, LinkCounters]]:
        """`snapshot` and `counters` from one dump; blocking, any thread."""
        if self._dumper is None:
            raise RuntimeError("LinkMonitor not started")
        return self._dumper.sample()

    def close(self) -> None:
        if self._thread is None or self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._events is not None and self._dumper is not None:
            try:
                port = self._events.getsockname()[0]
                self._dumper.sock.sendto(noop(), (port, 0))
            except OSError:
                pass  # the receive timeout wakes the reader instead
        self._thread.join(timeout=5.0)
        if self._events is not None:
            self._events.close()
        if self._dumper is not None:
            self._dumper.close()
        self._post([None])

    def __aiter__(self) -> LinkMonitor:
        return self

    async def __anext__(self) -> MonitorItem:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # later iterations end too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(None)  # the reader has stopped: end after this error
            raise item
        return item

    async def __aenter__(self) -> LinkMonitor:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # --- reader thread -------------------------------------------------------------------

    def _post(self, items: list[MonitorItem | BaseException | None]) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._deliver, items)
        except RuntimeError:
            self._stopping.set()  # the loop is closed: nobody is listening any more

    def _deliver(self, items: list[MonitorItem | BaseException | None]) -> None:
        for item in items:
            self._queue.put_nowait(item)

    def _read(self, sock: socket.socket) -> None:
        try:
            self._read_loop(sock)
        except BaseException as exc:  # a consumer must never wait on a dead reader
            self._post([exc])

    def _read_loop(self, sock: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                data, anc, _flags, _addr = sock.recvmsg(_RECV_SIZE, _ANC_SIZE)
            except BlockingIOError:
                continue  # SO_RCVTIMEO: look at the stop flag
            except OSError as exc:
                if self._stopping.is_set():
                    return
                if exc.errno == errno.ENOBUFS:
                    if not self._resync(sock):
                        return
                    continue
                self._post([exc])
                return
            self._post_events(data, timestamp_ns(anc, time.time_ns()))

    def _post_events(self, data: bytes, at: int) -> None:
        events: list[MonitorItem | BaseException | None] = [
            e for t, _f, _s, p in messages(data) if (e := parse_link(t, p, at)) is not None
        ]
        if events:
            self._post(events)

    def _resync(self, sock: socket.socket) -> bool:
        """After ENOBUFS: deliver what is still queued, then dump and emit the whole state.

        The kernel reports ENOBUFS once per congestion and stays silent about further drops
        until the receive queue has been read empty; so empty it first, and only then dump:
        every drop after that point raises ENOBUFS again.
        """
        at = time.time_ns()
        while True:
            try:
                data, anc, _flags, _addr = sock.recvmsg(_RECV_SIZE, _ANC_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break  # empty: the kernel has cleared its congestion mark
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    continue
                self._post([exc])
                return False
            self._post_events(data, timestamp_ns(anc, time.time_ns()))
        assert self._dumper is not None
        try:
            links = self._dumper.links()
        except OSError as exc:
            self._post([exc])
            return False
        self._resyncs += 1
        marker = Resync(at_ns=at, links=len(links), number=self._resyncs)
        self._post([marker, *links])
        return True
