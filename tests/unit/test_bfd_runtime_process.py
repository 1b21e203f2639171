"""`BfdProcess`: the manager in a child process, over loopback (no root needed). Requests and
their errors cross the pipe, events come back in order with timestamps on the shared
monotonic clock, and a dead child is reported instead of hanging the caller."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from thorn_lab.traffic import SENDER_RT_PRIORITY
from thorn_programmer.bfd import (
    AuthKey,
    AuthType,
    BfdAuth,
    BfdEvent,
    BfdManager,
    BfdProcess,
    Diag,
    SessionConfig,
    State,
)
from thorn_programmer.bfd.process import RT_PRIORITY

A, B = "127.0.0.1", "127.0.0.2"


def fast(disc: int, peer: str, local: str) -> SessionConfig:
    return SessionConfig(disc, peer, local, 10_000, 10_000, 3)


class Recorder:
    def __init__(self) -> None:
        self.events: list[BfdEvent] = []
        self.threads: set[str] = set()
        self.cond = threading.Condition()

    def __call__(self, event: BfdEvent) -> None:
        with self.cond:
            self.events.append(event)
            self.threads.add(threading.current_thread().name)
            self.cond.notify_all()

    def wait_for(self, new: State, timeout: float = 10.0) -> BfdEvent:
        with self.cond:
            assert self.cond.wait_for(lambda: any(e.new == new for e in self.events), timeout)
            return next(e for e in self.events if e.new == new)


@pytest.fixture
def pair() -> Iterator[tuple[BfdProcess, Recorder, BfdManager]]:
    recorder = Recorder()
    child = BfdProcess(recorder, name="unit-process")
    peer = BfdManager(name="unit-process-peer")
    child.start()
    peer.start()
    try:
        yield child, recorder, peer
    finally:
        child.close(admin_down=False)
        peer.close(admin_down=False)


def test_sessions_in_the_child_come_up_and_report_events(
    pair: tuple[BfdProcess, Recorder, BfdManager],
) -> None:
    child, recorder, peer = pair
    child.add(fast(1, B, A))
    peer.add(fast(2, A, B))
    up = recorder.wait_for(State.UP)
    assert (up.local_discriminator, up.peer, up.local_address) == (1, B, A)
    assert abs(up.monotonic - time.monotonic()) < 10  # the same clock in both processes
    assert recorder.threads == {"bfd-unit-process-rx"}
    deadline = time.monotonic() + 5
    # Both Poll sequences over (the peer's Final may still carry its slow 1 s until then).
    while (child.sessions()[0].tx_interval_us, child.sessions()[0].detection_time_us) != (
        10_000,
        30_000,
    ):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (status,) = child.sessions()
    assert (status.state, status.remote_discriminator, status.detection_time_us) == (
        State.UP,
        2,
        30_000,
    )
    assert child.counters().received > 0
    cut = time.monotonic()
    peer.close(admin_down=False)
    down = recorder.wait_for(State.DOWN)
    assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
    assert 0.015 < down.monotonic - cut < 0.030 + 0.1


def test_authenticated_sessions_run_in_the_child_and_take_new_keys_there(
    pair: tuple[BfdProcess, Recorder, BfdManager],
) -> None:
    child, recorder, peer = pair
    old = BfdAuth(AuthType.METICULOUS_KEYED_SHA1, (AuthKey(1, b"first"),), 1)
    # 50 ms x 3: what is tested is the keys crossing the pipe, not the timers under load.
    slow = {"auth": old, "desired_min_tx_us": 50_000, "required_min_rx_us": 50_000}
    child.add(replace(fast(1, B, A), **slow))
    peer.add(replace(fast(2, A, B), **slow))
    recorder.wait_for(State.UP)
    keys = (AuthKey(1, b"first"), AuthKey(2, b"second"))
    for send in (1, 2):  # both accept both keys before either sends the new one
        child.set_auth(1, BfdAuth(old.type, keys, send))  # across the pipe
        peer.set_auth(2, BfdAuth(old.type, keys, send))
    assert child.sessions()[0].auth == "meticulous-keyed-sha1, sends key 2, accepts 1, 2"
    sent = child.counters().sent
    deadline = time.monotonic() + 5
    while child.counters().sent < sent + 10:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert child.counters().dropped == {} and peer.counters().dropped == {}
    assert State.DOWN not in [e.new for e in recorder.events], recorder.events
    with pytest.raises(KeyError):
        child.set_auth(42, None)


def test_errors_cross_the_pipe(pair: tuple[BfdProcess, Recorder, BfdManager]) -> None:
    child, _recorder, _peer = pair
    child.add(fast(1, B, A))
    with pytest.raises(ValueError, match="discriminator"):
        child.add(fast(1, "127.0.0.3", A))
    with pytest.raises(KeyError):
        child.remove(42)
    with pytest.raises(OSError):
        child.add(fast(3, "127.0.0.3", A), netns="no-such-namespace")
    child.remove(1)
    assert child.sessions() == []


def test_a_dead_child_is_reported_not_waited_for(
    pair: tuple[BfdProcess, Recorder, BfdManager],
) -> None:
    child, _recorder, _peer = pair
    process = child._process
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait(5)
    deadline = time.monotonic() + 5
    while True:
        try:
            child.sessions()
        except RuntimeError:
            break
        assert time.monotonic() < deadline, "still answering after SIGKILL"
        time.sleep(0.01)


def test_the_child_asks_for_prompt_scheduling(
    pair: tuple[BfdProcess, Recorder, BfdManager],
) -> None:
    """As root the BFD process runs SCHED_FIFO (timers on time under a busy machine);
    unprivileged it falls back to nice -10 or the default, and says which."""
    child = pair[0]
    if os.geteuid() == 0:
        assert child.scheduling == f"SCHED_FIFO {RT_PRIORITY}"
        assert RT_PRIORITY > SENDER_RT_PRIORITY  # above the lab's traffic meter
    else:
        assert child.scheduling in ("nice -10", "normal")
