"""What the BFD runtime tells: a session's state change (`BfdEvent`), a session's status and
the runtime's counters, and `EventQueue`, which hands events from the runtime's thread to
an asyncio loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime

from thorn_programmer.bfd.auth import AUTH_DROP_REASONS
from thorn_programmer.bfd.codec import Diag, Refusal, State

# Why a received datagram was dropped (counted per reason).
DROP_TTL = "ttl"
DROP_UNKNOWN_SESSION = "unknown_session"
DROP_SPOOFED = "spoofed"
DROP_WRONG_INTERFACE = "wrong_interface"
DROP_REASONS = (
    *(r.value for r in Refusal),
    DROP_TTL,
    DROP_UNKNOWN_SESSION,
    DROP_SPOOFED,
    DROP_WRONG_INTERFACE,
    *AUTH_DROP_REASONS,
)


@dataclass(frozen=True, slots=True)
class BfdEvent:
    """A session changed state. `remote_state` is the peer's state as last heard (AdminDown:
    the peer withdrew the session on purpose, §6.8.16). `monotonic` is when the runtime saw
    the change (time.monotonic(): the packet's arrival or the detection timer's expiry);
    `wall` is the same instant in UTC."""

    local_discriminator: int
    peer: str
    local_address: str | None
    ifname: str | None
    netns: str | None
    multihop: bool
    old: State
    new: State
    diag: Diag
    monotonic: float
    wall: datetime
    remote_state: State
    # What the runtime withdrew itself (an armed session gone Down): kernel routes deleted,
    # and the time from detection to the kernel's last answer.
    withdrawn: int = 0
    withdrawn_ms: float | None = None
    withdraw_errors: tuple[str, ...] = ()
    # How late the runtime ran the timer behind this change (a detection time expiry): a
    # Down found long after it was due says this process stalled, not only the path.
    timer_late_ms: float = 0.0
    # The session's negotiated timers at the change (§6.8.7 transmit interval before
    # jitter, §6.8.4 detection time); 0 while nothing was heard from the peer.
    tx_interval_us: int = 0
    detection_time_us: int = 0
    # How much later a detection time expiry came for this runtime's own stalls excused
    # to the session (`BfdManager._excuse_own_stall`): 0 outside a lab.
    excused_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """A snapshot of one session for status pages; intervals in microseconds."""

    local_discriminator: int
    remote_discriminator: int
    peer: str
    local_address: str | None
    ifname: str | None
    netns: str | None
    multihop: bool
    state: State
    remote_state: State
    diag: Diag
    desired_min_tx_us: int
    required_min_rx_us: int
    detect_mult: int
    tx_interval_us: int
    detection_time_us: int
    auth: str | None = None  # the session's authentication (type and key ids), None: none


@dataclass(frozen=True, slots=True)
class Counters:
    """Totals since the manager started; `dropped` by reason, `state_changes` by new state."""

    received: int
    sent: int
    send_errors: int
    receive_errors: int
    dropped: Mapping[str, int]
    state_changes: Mapping[str, int]
    late_timers: int = 0  # timers run over LATE_TIMER_S after they were due
    stalls_excused: int = 0  # stalls not counted against peers in this runtime
    max_timer_late_ms: float = 0.0


class EventQueue:
    """Hands `BfdEvent`s from the manager's thread to an asyncio loop.

    Pass `queue.put` as the manager's `on_event`, then `async for event in queue`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._queue: asyncio.Queue[BfdEvent] = asyncio.Queue()

    def put(self, event: BfdEvent) -> None:
        with suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def get(self) -> BfdEvent:
        return await self._queue.get()

    def __aiter__(self) -> AsyncIterator[BfdEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[BfdEvent]:
        while True:
            yield await self._queue.get()
