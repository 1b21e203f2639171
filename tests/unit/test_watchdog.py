"""The stall watchdog names what held a loop, while it holds it, and how long it lasted."""

from __future__ import annotations

import asyncio
import threading
import time

from structlog.testing import capture_logs

from thorn.watchdog import LoopWatchdog, StallWatchdog


def held_by_a_slow_step() -> None:
    time.sleep(0.3)


def test_a_loop_that_misses_its_check_in_is_logged_with_its_stack_then_its_length() -> None:
    watchdog = StallWatchdog("unit_loop", threshold_s=0.02, check_s=0.005)

    def loop() -> None:
        watchdog.start()
        try:
            watchdog.expect(0.01)
            held_by_a_slow_step()  # promised 10 ms, away 300 ms
            watchdog.expect(0.5)
            time.sleep(0.05)  # within what it promised: the watchdog sees it back
        finally:
            watchdog.stop()

    with capture_logs() as logs:
        thread = threading.Thread(target=loop)
        thread.start()
        thread.join(5)
    stalled = [e for e in logs if e["event"] == "unit_loop_stalled"]
    resumed = [e for e in logs if e["event"] == "unit_loop_resumed"]
    assert len(stalled) == 1 and "held_by_a_slow_step" in stalled[0]["stack"]
    assert len(resumed) == 1 and 200 < resumed[0]["late_ms"] < 1000


def test_a_loop_on_time_is_never_reported() -> None:
    watchdog = StallWatchdog("unit_steady", threshold_s=0.05, check_s=0.005)
    with capture_logs() as logs:
        watchdog.start()
        for _ in range(20):
            watchdog.expect(0.01)
            time.sleep(0.005)
        watchdog.stop()
    assert [e for e in logs if e["event"].startswith("unit_steady")] == []


async def test_a_blocking_call_on_the_event_loop_is_caught_in_the_act() -> None:
    with capture_logs() as logs:
        async with LoopWatchdog("unit", threshold_s=0.05, beat_s=0.01).running():
            await asyncio.sleep(0.03)
            held_by_a_slow_step()  # blocks the loop
            await asyncio.sleep(0.05)
    stalled = [e for e in logs if e["event"] == "event_loop_stalled"]
    assert len(stalled) == 1 and "held_by_a_slow_step" in stalled[0]["stack"]
    assert any(e["event"] == "event_loop_resumed" for e in logs)
