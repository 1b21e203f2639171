"""The BFD runtime: one thread that owns the UDP sockets and drives many pure sessions.

`BfdManager` feeds each `Session` the packets demultiplexed to it and the clock
(`time.monotonic`), carries out its `Send` actions and turns its `StateChange` actions into
`BfdEvent`s carrying the detection time. Everything a session touches runs on the manager's
thread; other threads (the agent's asyncio loop) talk to it through a command queue and an
eventfd, so the sessions need no locks.

Why a dedicated thread and not asyncio: measured in docs/bfd.md, the thread's select() timeout
wakes within ~0.1 ms of a deadline, while asyncio timers round up to whole milliseconds and
wait behind every other callback of the agent's loop (a 20 ms step: 20 ms late). A thread in a
process whose loop runs many short steps can be starved of the GIL, though: `BfdProcess` runs
this same manager in a child process for that case.

Sessions may live in named network namespaces: their sockets are created inside the namespace
by the manager's thread (a socket stays in the namespace it was created in).

A session may be *armed* (`arm`) with prebuilt netlink messages: a switch's single-hop
session carries the route deletes that leave its port's protected primaries to their
backups. When the session goes from Up to Down (not on the peer's AdminDown), the runtime
sends them itself, before it emits the event: the repair costs the detection time and one
sendmsg, whatever the agent's loop is doing (tier 1 in docs/detection.md, "Failover tiers as
built"; the agent then records it and makes its own rendering agree, repair.py).

Whatever may block runs on a second thread, `Effects` (effects.py), never on the timers' thread: the
armed withdraws (a route delete waits for the RTNL lock, which a link going down elsewhere
holds through RCU grace periods: 10-40 ms measured under the bench's load) and the events
(`on_event` may write to a pipe its reader has not drained). A timers' thread blocked for a
detection time fails every session it runs at once.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
import random
import select
import socket
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from queue import Empty, SimpleQueue
from types import TracebackType
from typing import Any, TypeVar

import structlog

from thorn.netns import entered
from thorn.watchdog import StallWatchdog
from thorn_programmer.bfd import transport
from thorn_programmer.bfd.auth import BfdAuth
from thorn_programmer.bfd.codec import ControlPacket, DecodeError, Diag, State, decode
from thorn_programmer.bfd.effects import Effects
from thorn_programmer.bfd.events import (
    DROP_SPOOFED,
    DROP_TTL,
    DROP_UNKNOWN_SESSION,
    DROP_WRONG_INTERFACE,
    BfdEvent,
    Counters,
    SessionStatus,
)
from thorn_programmer.bfd.metrics import COLLECTOR
from thorn_programmer.bfd.session import Send, Session, SessionConfig, StateChange

log = structlog.get_logger("thorn.bfd")

T = TypeVar("T")

_RECEIVE_BURST = 64  # datagrams per listener per wakeup: timers are never starved by a flood
_DRAIN_BURST = 4096  # after a stall: what a socket's buffer holds, still bounded
# A timer run this late counts as late (Counters.late_timers): at 10 ms x 3 a stall of the
# runtime itself of about a detection time fails every session it holds at once.
LATE_TIMER_S = 0.005
# After such a stall, a session whose peer this runtime also runs is not found down before
# this long after the runtime resumed: time for the peer's overdue packet to arrive.
STALL_GRACE_S = LATE_TIMER_S
_MAX_WAIT_S = 1.0  # the loop re-checks at least this often even with nothing scheduled
_FD_SETSIZE = 1024  # select() cannot watch descriptors above this; poll() (1 ms) then
_COMMAND_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class _ListenerKey:
    netns: str | None
    family: socket.AddressFamily
    multihop: bool
    bind_address: str | None


class _Listener:
    __slots__ = ("key", "sock", "users")

    def __init__(self, key: _ListenerKey, sock: socket.socket) -> None:
        self.key = key
        self.sock = sock
        self.users = 0


class _Entry:
    """A session with its sockets and its place in the timer heap."""

    __slots__ = (
        "admin_down_left",
        "armed",
        "due",
        "encoded",
        "ifindex",
        "ifname",
        "listener",
        "local_address",
        "netns",
        "peer",
        "sender",
        "session",
    )

    def __init__(
        self,
        session: Session,
        peer: str,
        local_address: str | None,
        ifname: str | None,
        ifindex: int,
        netns: str | None,
        sender: socket.socket,
        listener: _Listener,
    ) -> None:
        self.session = session
        self.encoded: tuple[ControlPacket | None, bytes] = (None, b"")  # the last sent
        self.peer = peer
        self.local_address = local_address
        self.ifname = ifname
        self.ifindex = ifindex
        self.netns = netns
        self.sender = sender
        self.listener = listener
        self.due: float | None = None  # the heap entry that is current; others are stale
        self.armed: tuple[bytes, ...] = ()  # netlink requests to send on Up -> Down
        self.admin_down_left = 0  # > 0: removed, still announcing AdminDown (§6.8.16)

    @property
    def multihop(self) -> bool:
        return self.session.config.multihop


_AddrKey = tuple[str | None, bool, str, str | None]  # netns, multihop, peer, local address


def _netns(name: str | None) -> AbstractContextManager[None]:
    return nullcontext() if name is None else entered(name)


class BfdManager:
    """Many BFD sessions over UDP, run by one thread.

    >>> manager = BfdManager(on_event=print)
    >>> manager.start()
    >>> manager.add(SessionConfig(1, "10.0.0.1", "10.0.0.0", 10_000, 10_000), ifname="eth1")
    >>> manager.close()

    `on_event` is called on the runtime's effects thread, in order: it may block without
    delaying any timer, but the events behind it wait (hand them to a loop, see
    `EventQueue`). Every public method is thread-safe.
    """

    def __init__(
        self,
        on_event: Callable[[BfdEvent], None] | None = None,
        *,
        name: str = "bfd",
        rng: random.Random | None = None,
        watchdog: StallWatchdog | None = None,
    ) -> None:
        self.name = name
        self._watchdog = watchdog  # told before each wait when the loop runs again
        self._on_event = on_event
        self._rng = rng if rng is not None else random.Random()
        self._by_disc: dict[int, _Entry] = {}
        self._by_addr: dict[_AddrKey, _Entry] = {}
        self._draining: set[_Entry] = set()
        self._listeners: dict[_ListenerKey, _Listener] = {}
        self._by_fd: dict[int, _Listener] = {}
        self._effects = Effects(on_event, name)
        self._heap: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._commands: SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = SimpleQueue()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stop_by = 0.0
        self._received = 0
        self._sent = 0
        self._send_errors = 0
        self._receive_errors = 0
        self._late_timers = 0
        self._stalls_excused = 0
        self._max_late = 0.0
        self._late = 0.0  # how late the timer being run now is
        self._dropped: Tally[str] = Tally()
        self._changes: Tally[str] = Tally()
        COLLECTOR.managers.add(self)

    # ---------------------------------------------------------------------------------------
    # Public API (any thread)
    # ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("BfdManager already started")
        self._thread = threading.Thread(target=self._run, name=f"bfd-{self.name}", daemon=True)
        self._effects.start()
        self._thread.start()

    def add(
        self, config: SessionConfig, *, ifname: str | None = None, netns: str | None = None
    ) -> None:
        """Start a session. `ifname` pins its packets to that interface (SO_BINDTODEVICE,
        and received packets must arrive on it); `netns` is a named namespace (None: the
        manager's own). Raises ValueError for a duplicate discriminator or address key,
        OSError if a socket cannot be made (e.g. no such interface or namespace)."""
        self._call(lambda: self._add(config, ifname, netns))

    def arm(self, local_discriminator: int, messages: Iterable[bytes]) -> None:
        """Send `messages` (prebuilt rtnetlink requests, in the session's namespace) the
        moment the session goes from Up to Down, unless the peer said AdminDown; an empty
        list disarms it. KeyError if no such session."""
        armed = tuple(messages)
        self._call(lambda: setattr(self._by_disc[local_discriminator], "armed", armed))

    def set_auth(self, local_discriminator: int, auth: BfdAuth | None) -> None:
        """Change a running session's authentication (§6.7.4) without restarting it: new
        keys keep its sequence numbers (a key rotation), so the peer that has the same keys
        never sees a gap. KeyError if no such session."""
        self._call(lambda: self._by_disc[local_discriminator].session.set_auth(auth))

    def remove(self, local_discriminator: int, *, admin_down: bool = True) -> None:
        """Stop a session. With `admin_down` (§6.8.16) an Up or Init session first tells the
        peer it is AdminDown (detect-mult packets, one per negotiated interval), so the peer
        does not count a failure. KeyError if no such session."""
        self._call(lambda: self._remove(local_discriminator, admin_down))

    def sessions(self) -> list[SessionStatus]:
        return self._call(lambda: [self._status(e) for e in self._by_disc.values()])

    def counters(self) -> Counters:
        return Counters(
            received=self._received,
            sent=self._sent,
            send_errors=self._send_errors,
            receive_errors=self._receive_errors,
            dropped=dict(self._dropped),
            state_changes=dict(self._changes),
            late_timers=self._late_timers,
            stalls_excused=self._stalls_excused,
            max_timer_late_ms=round(self._max_late * 1000, 3),
        )

    def close(self, *, admin_down: bool = True, timeout: float = 2.0) -> None:
        """Stop the runtime and close every socket. With `admin_down`, sessions that are Up
        announce AdminDown first (bounded by `timeout`); without, they just fall silent, which
        the peers see as a failure."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._close_sockets()
            return

        def begin() -> None:
            for disc in list(self._by_disc):
                self._remove(disc, admin_down)
            self._stopping = True
            self._stop_by = time.monotonic() + timeout

        self._call(begin)
        if not self._effects.is_current():  # else: called from an event callback
            thread.join(timeout + 1.0)

    def __enter__(self) -> BfdManager:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    # Commands: run on the manager's thread, the caller waits for the result
    # ---------------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        thread = self._thread
        if thread is None or threading.current_thread() is thread:
            return fn()  # not started yet, or called from an event callback
        if not thread.is_alive():
            raise RuntimeError("BfdManager is closed")
        future: Future[T] = Future()
        self._commands.put((fn, future))
        with self._wake_lock:  # never write to a closed (and maybe reused) descriptor number
            if self._wake < 0:
                raise RuntimeError("BfdManager is closed")
            os.eventfd_write(self._wake, 1)
        return future.result(_COMMAND_TIMEOUT_S)

    def _run_commands(self) -> None:
        with suppress(BlockingIOError):
            os.eventfd_read(self._wake)
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _add(self, config: SessionConfig, ifname: str | None, netns: str | None) -> None:
        disc = config.local_discriminator
        if disc in self._by_disc or any(
            e.session.local_discriminator == disc for e in self._draining
        ):
            raise ValueError(f"local discriminator {disc} is in use")
        peer = transport.normalise(config.peer)
        local = transport.normalise(config.local_address) if config.local_address else None
        family = transport.family_of(peer)
        if local is not None and transport.family_of(local) != family:
            raise ValueError(f"peer {peer} and local address {local} differ in family")
        key: _AddrKey = (netns, config.multihop, peer, local)
        if key in self._by_addr:
            raise ValueError(f"a session to {peer} from {local or 'any address'} exists")
        lkey = _ListenerKey(netns, family, config.multihop, local)
        with _netns(netns):
            ifindex = socket.if_nametoindex(ifname) if ifname is not None else 0
            sender = transport.open_sender(family, local, ifname, self._rng)
            try:
                listener = self._listeners.get(lkey)
                if listener is None:
                    port = transport.port_for(config.multihop)
                    listener = _Listener(lkey, transport.open_listener(family, port, local))
                    self._listeners[lkey] = listener
                    self._by_fd[listener.sock.fileno()] = listener
            except BaseException:
                sender.close()
                raise
        listener.users += 1
        entry = _Entry(
            Session(config, time.monotonic(), self._rng),
            peer,
            local,
            ifname,
            ifindex,
            netns,
            sender,
            listener,
        )
        self._by_disc[disc] = entry
        self._by_addr[key] = entry
        self._schedule(entry)

    def _remove(self, disc: int, admin_down: bool) -> None:
        entry = self._by_disc.pop(disc)
        del self._by_addr[(entry.netns, entry.multihop, entry.peer, entry.local_address)]
        self._release(entry.listener)
        session = entry.session
        if admin_down and session.state in (State.INIT, State.UP):
            # §6.8.16: hold AdminDown for about the peer's detection time, then go quiet.
            entry.admin_down_left = max(3, session.config.detect_mult)
            self._draining.add(entry)
            now = time.monotonic()
            self._emit(
                entry, StateChange(session.state, State.ADMIN_DOWN, Diag.ADMINISTRATIVELY_DOWN, now)
            )
            entry.due = now
            heapq.heappush(self._heap, (now, next(self._seq), entry))
        else:
            entry.due = None
            entry.sender.close()

    def _release(self, listener: _Listener) -> None:
        listener.users -= 1
        if listener.users == 0:
            del self._listeners[listener.key]
            del self._by_fd[listener.sock.fileno()]
            listener.sock.close()

    def _status(self, entry: _Entry) -> SessionStatus:
        s = entry.session
        return SessionStatus(
            local_discriminator=s.local_discriminator,
            remote_discriminator=s.remote_discriminator,
            peer=entry.peer,
            local_address=entry.local_address,
            ifname=entry.ifname,
            netns=entry.netns,
            multihop=entry.multihop,
            state=s.state,
            remote_state=s.remote_state,
            diag=s.diag,
            desired_min_tx_us=s.config.desired_min_tx_us,
            required_min_rx_us=s.config.required_min_rx_us,
            detect_mult=s.config.detect_mult,
            tx_interval_us=s.tx_interval_us,
            detection_time_us=s.detection_time_us,
            auth=s.config.auth.describe() if s.config.auth is not None else None,
        )

    # ---------------------------------------------------------------------------------------
    # The loop
    # ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._watchdog is not None:
            self._watchdog.start()  # watching this thread
        try:
            while not (self._stopping and (not self._draining or time.monotonic() > self._stop_by)):
                self._wait()
                now = time.monotonic()
                self._excuse_own_stall(now)
                self._expire(now)
        except BaseException:
            log.exception("bfd runtime crashed", manager=self.name)
            raise
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()
            self._close_sockets()
            self._fail_pending()
            self._effects.stop()  # after the last events: they are delivered first

    def _earliest_due(self) -> float | None:
        """The earliest live deadline (stale heap entries, rescheduled or removed since,
        are dropped on the way)."""
        heap = self._heap
        while heap and heap[0][0] != heap[0][2].due:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _wait(self) -> None:
        due = self._earliest_due()
        timeout = _MAX_WAIT_S if due is None else min(_MAX_WAIT_S, max(0.0, due - time.monotonic()))
        fds = [self._wake, *self._by_fd]
        if self._watchdog is not None:
            self._watchdog.expect(timeout)
        if max(fds) < _FD_SETSIZE:
            ready: Iterable[int] = select.select(fds, [], [], timeout)[0]
        else:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            ready = [fd for fd, _ev in poller.poll(timeout * 1000.0)]
        for fd in ready:
            if fd == self._wake:
                self._run_commands()
            else:
                listener = self._by_fd.get(fd)
                if listener is not None:
                    self._receive(listener)

    def _excuse_own_stall(self, now: float) -> None:
        """After a stall of this runtime (its earliest timer over LATE_TIMER_S late): read
        every socket dry first (a peer elsewhere was heard meanwhile: its packets wait there),
        then excuse the stall to every session whose peer is a session of this same runtime.
        That peer was stalled too, so its silence was this runtime's, not the path's. Only a
        lab puts both ends in one runtime (every node's agent in one process); there a stall
        would otherwise fail every session of the fabric at once, which separate nodes
        never do together.

        Excused is only what the stall hid: such a session is not found down before
        STALL_GRACE_S from now (the peer's overdue packet goes out in this same pass). Its
        deadline was not pushed by the stall's whole length: then every stall during a
        real failure's detection time added itself to the detection (a silent drop was
        found 17 ms late once, with no single stall as long)."""
        due = self._earliest_due()
        if due is None or now - due <= LATE_TIMER_S:
            return
        for listener in list(self._by_fd.values()):
            self._receive(listener, burst=_DRAIN_BURST)
        excused = False
        for entry in self._by_disc.values():
            session = entry.session
            other = self._by_disc.get(session.remote_discriminator)
            if (
                other is not None
                and other.session.remote_discriminator == session.local_discriminator
                and session.excuse_until(now + STALL_GRACE_S)
            ):
                self._schedule(entry)
                excused = True
        if excused:
            self._stalls_excused += 1

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _seq, entry = heapq.heappop(heap)
            if due != entry.due:
                continue
            entry.due = None
            self._late = now - due
            if self._late > LATE_TIMER_S:
                self._late_timers += 1
                self._max_late = max(self._max_late, self._late)
            if entry.admin_down_left:
                self._announce_admin_down(entry, now)
            else:
                self._apply(entry, entry.session.tick(now))
                self._schedule(entry)
            self._late = 0.0

    def _announce_admin_down(self, entry: _Entry, now: float) -> None:
        packet = dataclasses.replace(
            entry.session.packet(),
            state=State.ADMIN_DOWN,
            diag=Diag.ADMINISTRATIVELY_DOWN,
            poll=False,
            final=False,
        )
        self._send(entry, packet)
        entry.admin_down_left -= 1
        if entry.admin_down_left:
            entry.due = now + entry.session.tx_interval_us / 1e6
            heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
        else:
            self._draining.discard(entry)
            entry.sender.close()

    def _schedule(self, entry: _Entry) -> None:
        due = entry.session.next_deadline()
        if due != entry.due:
            entry.due = due
            if due is not None:
                heapq.heappush(self._heap, (due, next(self._seq), entry))

    def _receive(self, listener: _Listener, burst: int = _RECEIVE_BURST) -> None:
        for _ in range(burst):
            try:
                datagram = transport.receive(listener.sock)
            except BlockingIOError:
                return
            except OSError as exc:
                # e.g. ICMP errors queued on the socket; the next read sees the next datagram.
                self._receive_errors += 1
                log.debug("bfd receive error", manager=self.name, error=str(exc))
                continue
            self._received += 1
            reason = self._deliver(listener.key, datagram, time.monotonic())
            if reason is not None:
                self._dropped[reason] += 1

    def _deliver(self, where: _ListenerKey, datagram: transport.Datagram, now: float) -> str | None:
        """Demultiplex one datagram to its session (§6.8.6); the drop reason, or None."""
        # Multihop: the session's own minimum TTL is checked once the session is known.
        if not transport.ttl_acceptable(datagram.ttl, where.multihop, min_ttl=1):
            return DROP_TTL
        try:
            packet = decode(datagram.data)
        except DecodeError as exc:
            return exc.reason.value
        if packet.your_discriminator:
            entry = self._by_disc.get(packet.your_discriminator)
            if entry is None or entry.netns != where.netns or entry.multihop != where.multihop:
                return DROP_UNKNOWN_SESSION
            if entry.peer != datagram.source:
                return DROP_SPOOFED
        else:
            # Only Down/AdminDown packets get here (the codec refuses the rest): match by
            # addresses, the destination as the kernel saw it, then a session with no local.
            base = (where.netns, where.multihop, datagram.source)
            entry = self._by_addr.get((*base, datagram.destination)) or self._by_addr.get(
                (*base, None)
            )
            if entry is None:
                return DROP_UNKNOWN_SESSION
        if where.multihop and not transport.ttl_acceptable(
            datagram.ttl, True, entry.session.config.min_ttl
        ):
            return DROP_TTL
        if entry.ifindex and not where.multihop and datagram.ifindex != entry.ifindex:
            return DROP_WRONG_INTERFACE
        refused = entry.session.authenticate(packet, datagram.data, now)
        if refused is not None:
            return refused
        self._apply(entry, entry.session.receive(packet, now))
        self._schedule(entry)
        return None

    def _apply(self, entry: _Entry, actions: Iterable[Send | StateChange]) -> None:
        changed = False
        for action in actions:
            if isinstance(action, Send):
                self._send(entry, action.packet)
            else:
                self._emit(entry, action)
                changed = True
        if changed:
            # Tell the peer at once instead of at the next (slow, up to 1 s) periodic packet,
            # as FRR's bfdd does: on Up this carries the Poll that moves both ends to the fast
            # timers (§6.8.3), on Init it lets the peer come Up, on Down it reports the cause.
            self._send(entry, entry.session.packet())

    def _send(self, entry: _Entry, packet: ControlPacket) -> None:
        try:
            last, data = entry.encoded
            if packet is not last:
                data = packet.encode()
                entry.encoded = (packet, data)
            if packet.auth:  # signed anew each time: every packet takes a sequence number
                data = entry.session.seal(data)
            entry.sender.sendto(data, (entry.peer, transport.port_for(entry.multihop)))
        except OSError:
            # No route, link down, full buffer: the session's timers decide what that means.
            self._send_errors += 1
            return
        self._sent += 1

    def _emit(self, entry: _Entry, change: StateChange) -> None:
        self._changes[change.new.name.lower()] += 1
        armed: tuple[bytes, ...] = ()
        if (
            entry.armed
            and change.old is State.UP
            and change.new is State.DOWN
            and entry.session.remote_state is not State.ADMIN_DOWN
        ):
            armed = entry.armed
        # The wall clock of the same instant, without calling time.time() in the hot path.
        wall = time.time() - (time.monotonic() - change.at)
        event = BfdEvent(
            local_discriminator=entry.session.local_discriminator,
            peer=entry.peer,
            local_address=entry.local_address,
            ifname=entry.ifname,
            netns=entry.netns,
            multihop=entry.multihop,
            old=change.old,
            new=change.new,
            diag=change.diag,
            monotonic=change.at,
            wall=datetime.fromtimestamp(wall, UTC),
            remote_state=entry.session.remote_state,
            timer_late_ms=round(self._late * 1000, 3),
            tx_interval_us=entry.session.tx_interval_us,
            detection_time_us=entry.session.detection_time_us,
            excused_ms=round(entry.session.excused_s * 1000, 3)
            if change.diag is Diag.CONTROL_DETECTION_TIME_EXPIRED
            else 0.0,
        )
        self._effects.put(entry.netns, armed, event)

    def _close_sockets(self) -> None:
        for entry in (*self._by_disc.values(), *self._draining):
            entry.sender.close()
        for listener in self._listeners.values():
            listener.sock.close()
        self._by_disc.clear()
        self._by_addr.clear()
        self._draining.clear()
        self._listeners.clear()
        self._by_fd.clear()
        self._heap.clear()
        with self._wake_lock:
            if self._wake >= 0:
                os.close(self._wake)
                self._wake = -1

    def _fail_pending(self) -> None:
        while True:
            try:
                _fn, future = self._commands.get_nowait()
            except Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("BfdManager is closed"))
