"""The BFD runtime over loopback, no root needed: two managers in this namespace (127.0.0.1
and 127.0.0.2 on lo) come Up, negotiate timers, detect loss and say goodbye with AdminDown;
hand-made datagrams from a plain UDP socket are each dropped and counted with their reason.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from thorn_programmer.bfd import (
    AuthKey,
    AuthType,
    BfdAuth,
    BfdEvent,
    BfdManager,
    ControlPacket,
    Diag,
    EventQueue,
    SessionConfig,
    State,
)
from thorn_programmer.bfd.auth import sign

A, B, STRANGER = "127.0.0.1", "127.0.0.2", "127.0.0.3"
WAIT_S = 5.0


class Recorder:
    """Events from a manager's thread, with a way to wait for one."""

    def __init__(self) -> None:
        self.events: list[BfdEvent] = []
        self._cond = threading.Condition()

    def __call__(self, event: BfdEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, match: Callable[[BfdEvent], bool], timeout: float = WAIT_S) -> BfdEvent:
        def matching() -> list[BfdEvent]:
            return [e for e in self.events if match(e)]

        with self._cond:
            assert self._cond.wait_for(matching, timeout), (
                f"no matching event within {timeout} s; saw {self.events}"
            )
            return matching()[0]


def wait_until(check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def fast(disc: int, peer: str, local: str, **kw: int | bool) -> SessionConfig:
    values: dict[str, int | bool] = {
        "desired_min_tx_us": 10_000,
        "required_min_rx_us": 10_000,
        "detect_mult": 3,
    }
    values.update(kw)
    return SessionConfig(disc, peer, local, **values)  # type: ignore[arg-type]


def fast_and_up(manager: BfdManager) -> bool:
    """Up, both Poll sequences over: nothing left of the 1 s slow-start timers (§6.8.3)."""
    return all(
        s.state == State.UP and s.tx_interval_us < 1_000_000 and s.detection_time_us < 1_000_000
        for s in manager.sessions()
    )


Pair = tuple[BfdManager, Recorder, BfdManager, Recorder]


@pytest.fixture
def pair() -> Iterator[Pair]:
    ra, rb = Recorder(), Recorder()
    a = BfdManager(ra, name="unit-a")
    b = BfdManager(rb, name="unit-b")
    a.start()
    b.start()
    try:
        yield a, ra, b, rb
    finally:
        a.close(admin_down=False)
        b.close(admin_down=False)


def test_sessions_come_up_and_negotiate_timers_as_rfc_5880_says(pair: Pair) -> None:
    a, ra, b, rb = pair
    a.add(fast(1, B, A, desired_min_tx_us=10_000, required_min_rx_us=30_000, detect_mult=3))
    b.add(fast(2, A, B, desired_min_tx_us=20_000, required_min_rx_us=10_000, detect_mult=4))
    ra.wait_for(lambda e: e.new == State.UP)
    rb.wait_for(lambda e: e.new == State.UP)
    wait_until(lambda: fast_and_up(a) and fast_and_up(b))
    (sa,), (sb,) = a.sessions(), b.sessions()
    assert (sa.remote_discriminator, sb.remote_discriminator) == (2, 1)
    # §6.8.7: TX interval = max(own DesiredMinTx, remote RequiredMinRx).
    assert sa.tx_interval_us == max(10_000, 10_000)
    assert sb.tx_interval_us == max(20_000, 30_000)
    # §6.8.4: detection = remote DetectMult x max(own RequiredMinRx, remote DesiredMinTx).
    assert sa.detection_time_us == 4 * max(30_000, 20_000)
    assert sb.detection_time_us == 3 * max(10_000, 10_000)
    up = ra.wait_for(lambda e: e.new == State.UP)
    assert (up.peer, up.local_address, up.multihop, up.ifname) == (B, A, False, None)
    labels = {"manager": "unit-a", "state": "up"}
    assert REGISTRY.get_sample_value("thorn_bfd_state_changes_total", labels) == 1
    assert REGISTRY.get_sample_value("thorn_bfd_sessions", labels) == 1
    sent = REGISTRY.get_sample_value("thorn_bfd_packets_sent_total", {"manager": "unit-a"})
    assert sent is not None and sent > 0
    assert abs(up.wall.timestamp() - (time.time() - (time.monotonic() - up.monotonic))) < 0.01


def test_a_silent_peer_is_detected_within_the_detection_time(pair: Pair) -> None:
    a, ra, b, _rb = pair
    a.add(fast(1, B, A))
    b.add(fast(2, A, B))
    wait_until(lambda: fast_and_up(a) and fast_and_up(b))
    cut = time.monotonic()
    b.close(admin_down=False)
    down = ra.wait_for(lambda e: e.new == State.DOWN)
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    assert down.remote_state == State.DOWN  # §6.8.1: forgotten when the detection time expires
    # 3 x 10 ms from the last packet (sent at most 10 ms before the cut), plus loaded-CI slack.
    assert 0.015 < down.monotonic - cut < 0.030 + 0.1
    assert a.counters().state_changes["down"] == 1


def test_an_event_consumer_that_blocks_does_not_stop_the_timers() -> None:
    """The agent reading events may stall (a busy loop, a full pipe to it): the runtime's
    timers keep every session up meanwhile; only the events wait, and come in order."""
    gate = threading.Event()
    gate.set()
    ra, rb = Recorder(), Recorder()

    def stalling(event: BfdEvent) -> None:
        gate.wait(5.0)
        ra(event)

    a, b = BfdManager(stalling, name="unit-stall-a"), BfdManager(rb, name="unit-stall-b")
    a.start()
    b.start()
    try:
        a.add(fast(1, B, A))
        b.add(fast(2, A, B))
        wait_until(lambda: fast_and_up(a) and fast_and_up(b))
        gate.clear()  # from now on a's consumer sits on the next event
        a.add(fast(3, STRANGER, A))
        b.add(fast(4, A, STRANGER))
        # Session 3 changed state: its first event is stuck in a's consumer.
        wait_until(lambda: sum(a.counters().state_changes.values()) >= 2)
        time.sleep(0.3)  # ten detection times with a's consumer stalled
        assert [e for e in rb.events if e.new == State.DOWN] == []
        assert a.counters().state_changes.get("down", 0) == 0
        gate.set()
        ra.wait_for(lambda e: e.local_discriminator == 3 and e.new == State.UP)
        assert [e.new for e in ra.events if e.local_discriminator == 3][-1] == State.UP
    finally:
        gate.set()
        a.close(admin_down=False)
        b.close(admin_down=False)


def test_a_stall_of_the_runtime_is_not_counted_against_a_peer_it_also_runs() -> None:
    """Both ends in one runtime (a lab's agent serving every node): a 100 ms stall of that
    runtime silences both, and neither declares the other down for it."""
    events = Recorder()
    both = BfdManager(events, name="unit-both-ends")
    both.start()
    try:
        both.add(fast(1, B, A))
        both.add(fast(2, A, B))
        wait_until(lambda: fast_and_up(both))
        both._call(lambda: time.sleep(0.1))  # the timers' thread held: ten detection times
        time.sleep(0.1)
        assert [e for e in events.events if e.new == State.DOWN] == []
        assert both.counters().stalls_excused >= 1
    finally:
        both.close(admin_down=False)


def test_a_stall_is_not_excused_to_a_peer_in_another_runtime(pair: Pair) -> None:
    """A peer elsewhere that fell silent during the stall is found down right after it."""
    a, ra, b, _rb = pair
    a.add(fast(1, B, A))
    b.add(fast(2, A, B))
    wait_until(lambda: fast_and_up(a) and fast_and_up(b))
    b.close(admin_down=False)
    a._call(lambda: time.sleep(0.1))
    down = ra.wait_for(lambda e: e.new == State.DOWN)
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    assert a.counters().stalls_excused == 0


def test_remove_announces_admin_down_so_the_peer_sees_no_failure(pair: Pair) -> None:
    a, ra, b, rb = pair
    a.add(fast(1, B, A))
    b.add(fast(2, A, B))
    wait_until(lambda: fast_and_up(a) and fast_and_up(b))
    a.remove(1)
    local = ra.wait_for(lambda e: e.new == State.ADMIN_DOWN)
    assert local.diag == Diag.ADMINISTRATIVELY_DOWN
    remote = rb.wait_for(lambda e: e.new == State.DOWN)
    assert remote.diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN
    assert remote.remote_state == State.ADMIN_DOWN  # a withdrawal, not a failure
    assert a.sessions() == []
    # The address key is free at once; the discriminator only once AdminDown is over.
    with pytest.raises(ValueError, match="discriminator"):
        a.add(fast(1, B, A))
    a.add(fast(3, B, A))
    wait_until(lambda: fast_and_up(a) and fast_and_up(b))


def test_api_refuses_duplicates_and_unknown_sessions(pair: Pair) -> None:
    a, _ra, _b, _rb = pair
    a.add(fast(1, B, A))
    with pytest.raises(ValueError, match="discriminator"):
        a.add(fast(1, STRANGER, A))
    with pytest.raises(ValueError, match="exists"):
        a.add(fast(5, B, A))
    with pytest.raises(ValueError, match="family"):
        a.add(fast(6, "::1", A))
    with pytest.raises(OSError):
        a.add(fast(7, STRANGER, A), ifname="no-such-if0")
    with pytest.raises(KeyError):
        a.remove(99)
    assert [s.local_discriminator for s in a.sessions()] == [1]


async def test_event_queue_hands_events_to_asyncio(pair: Pair) -> None:
    _a, _ra, b, _rb = pair
    queue = EventQueue()
    c = BfdManager(queue.put, name="unit-c")
    c.start()
    try:
        await asyncio.to_thread(c.add, fast(3, B, A))
        await asyncio.to_thread(b.add, fast(2, A, B))
        seen: list[State] = []
        async with asyncio.timeout(WAIT_S):
            async for event in queue:
                seen.append(event.new)
                if event.new == State.UP:
                    break
        assert seen[-1] == State.UP
    finally:
        await asyncio.to_thread(c.close, admin_down=False)


# ---------------------------------------------------------------------------------------------
# Bad input: each datagram is dropped, counted under its reason, and the manager carries on.
# ---------------------------------------------------------------------------------------------

GOOD = ControlPacket(
    state=State.DOWN,
    detect_mult=3,
    my_discriminator=77,
    your_discriminator=0,
    desired_min_tx_us=1_000_000,
    required_min_rx_us=10_000,
)


# A well-formed Keyed SHA1 packet, for a session that does not authenticate.
SIGNED = sign(
    replace(GOOD, auth=True, length=52).encode(),
    BfdAuth(AuthType.KEYED_SHA1, (AuthKey(1, b"secret"),), 1),
    sequence=1,
)


def inject(data: bytes, source: str, port: int = 3784, ttl: int = 255) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        sock.bind((source, 0))
        sock.sendto(data, (A, port))


@pytest.fixture
def lone() -> Iterator[tuple[BfdManager, Recorder]]:
    """A manager with a single-hop session 1 (to B) and a multihop session 2 (to B), no peer."""
    recorder = Recorder()
    manager = BfdManager(recorder, name="unit-lone")
    manager.start()
    manager.add(fast(1, B, A))
    manager.add(fast(2, B, A, multihop=True))
    try:
        yield manager, recorder
    finally:
        manager.close(admin_down=False)


BAD_INPUT = {
    "too_short": (GOOD.encode()[:20], B, 3784, 255),
    "bad_version": (replace(GOOD, version=2).encode(), B, 3784, 255),
    "bad_length_long": (replace(GOOD, length=30).encode(), B, 3784, 255),
    "bad_length_short": (replace(GOOD, length=20).encode(), B, 3784, 255),
    "zero_detect_mult": (replace(GOOD, detect_mult=0).encode(), B, 3784, 255),
    "zero_my_discriminator": (replace(GOOD, my_discriminator=0).encode(), B, 3784, 255),
    "zero_your_discriminator": (replace(GOOD, state=State.UP).encode(), B, 3784, 255),
    "multipoint": (replace(GOOD, multipoint=True).encode(), B, 3784, 255),
    "auth_present": (SIGNED, B, 3784, 255),
    "auth_malformed": (SIGNED[:25] + b"\x1d" + SIGNED[26:], B, 3784, 255),  # Auth Len 29
    "ttl_single_hop_254": (GOOD.encode(), B, 3784, 254),
    "ttl_multihop_253": (GOOD.encode(), B, 4784, 253),
    "unknown_session": (replace(GOOD, your_discriminator=999).encode(), B, 3784, 255),
    "unknown_session_by_address": (GOOD.encode(), STRANGER, 3784, 255),
    "spoofed": (replace(GOOD, your_discriminator=1).encode(), STRANGER, 3784, 255),
    "wrong_hop_mode": (replace(GOOD, your_discriminator=2).encode(), B, 3784, 255),
}
REASON = {
    "bad_length_long": "bad_length",
    "bad_length_short": "bad_length",
    "ttl_single_hop_254": "ttl",
    "ttl_multihop_253": "ttl",
    "unknown_session_by_address": "unknown_session",
    "wrong_hop_mode": "unknown_session",
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_dropped_and_counted(lone: tuple[BfdManager, Recorder], case: str) -> None:
    manager, recorder = lone
    reason = REASON.get(case, case)
    data, source, port, ttl = BAD_INPUT[case]
    inject(data, source, port, ttl)
    wait_until(lambda: manager.counters().dropped.get(reason, 0) == 1)
    counts = manager.counters()
    assert counts.received == 1
    assert dict(counts.dropped) == {reason: 1}
    sample = REGISTRY.get_sample_value(
        "thorn_bfd_packets_dropped_total", {"manager": "unit-lone", "reason": reason}
    )
    assert sample == 1
    assert recorder.events == []
    assert {s.state for s in manager.sessions()} == {State.DOWN}
    # Still alive: a good packet from the peer is taken (session 1 goes Init).
    inject(GOOD.encode(), B)
    recorder.wait_for(lambda e: e.local_discriminator == 1 and e.new == State.INIT)


@pytest.mark.parametrize("ttl", [254, 255])
def test_multihop_accepts_ttl_from_254(lone: tuple[BfdManager, Recorder], ttl: int) -> None:
    manager, recorder = lone
    inject(GOOD.encode(), B, 4784, ttl)
    event = recorder.wait_for(lambda e: e.new == State.INIT)
    assert (event.local_discriminator, event.multihop) == (2, True)
    assert manager.counters().dropped == {}


@pytest.mark.parametrize(("ttl", "taken"), [(251, True), (250, True), (249, False)])
def test_a_multihop_session_takes_its_own_minimum_ttl(ttl: int, taken: bool) -> None:
    """Peers several routers apart (a host's TEP to another's across a Clos: 3-5 hops) need
    a lower bound than FRR's default 254, as FRR's per-peer `minimum-ttl` gives."""
    recorder = Recorder()
    with BfdManager(recorder, name="unit-min-ttl") as manager:
        manager.add(fast(3, B, A, multihop=True, min_ttl=250))
        inject(GOOD.encode(), B, 4784, ttl)
        if taken:
            assert recorder.wait_for(lambda e: e.new == State.INIT).local_discriminator == 3
        else:
            wait_until(lambda: manager.counters().dropped.get("ttl", 0) == 1)
            assert recorder.events == []


def test_min_ttl_is_refused_on_a_single_hop_session() -> None:
    with pytest.raises(ValueError, match="min_ttl is for multihop"):
        fast(4, B, A, min_ttl=250)
