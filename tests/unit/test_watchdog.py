"""The stall watchdog names what held a loop, while it holds it, and how long it lasted."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from thorn.watchdog import (
    GcPauses,
    LoopWatchdog,
    StallWatchdog,
    building_long_lived,
    settle_heap,
)


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


def test_a_garbage_collection_over_the_bound_is_logged_and_every_one_is_timed() -> None:
    def collections() -> float:
        return REGISTRY.get_sample_value("thorn_gc_pause_seconds_count", {"generation": "2"}) or 0

    before = collections()
    pauses = GcPauses(warn_s=0.0).install()  # every collection is over a bound of zero
    try:
        with capture_logs() as logs:
            gc.collect()
    finally:
        pauses.uninstall()
    logged = [e for e in logs if e["event"] == "gc_pause"]
    assert [e["generation"] for e in logged] == [2] and logged[0]["ms"] >= 0
    assert collections() == before + 1
    gc.collect()  # uninstalled: no longer timed
    assert collections() == before + 1


def test_a_settled_heap_is_out_of_the_collectors_walk_and_new_objects_are_not() -> None:
    class StartUp:
        pass

    made_at_start = StartUp()
    default = gc.get_threshold()
    try:
        settle_heap()
        made_later = StartUp()
        tracked = gc.get_objects()
        assert not any(o is made_at_start for o in tracked)
        assert any(o is made_later for o in tracked)
    finally:
        gc.unfreeze()
        gc.set_threshold(*default)  # the rest of the session collects as Python does


def test_a_settled_heap_is_collected_less_often_than_pythons_default() -> None:
    default = gc.get_threshold()
    try:
        settle_heap()
        young, middle, full = gc.get_threshold()
        assert young * middle * full >= 50 * 700 * 10 * 10  # objects per full collection
        assert young <= 20_000  # a young collection stays short (a BFD child runs them)
    finally:
        gc.unfreeze()
        gc.set_threshold(*default)


def test_a_long_lived_build_runs_no_collection_and_is_frozen_after() -> None:
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        frozen_before = gc.get_freeze_count()
        with building_long_lived():
            built = [{"i": i} for i in range(50_000)]  # would trigger dozens of collections
            assert not gc.isenabled()
        assert gc.isenabled() and collections == []
        assert gc.get_freeze_count() >= frozen_before + len(built)
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
