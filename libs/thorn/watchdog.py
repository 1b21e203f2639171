"""Watchdogs that catch a stalled loop in the act: an event loop held by a blocking call,
or the BFD runtime's timer thread not run on time; and the one stall no stack shows, the
interpreter's garbage collector (`GcPauses`, `settle_heap`, `gc_paused`, `keep_long_lived`).
Kept free of web imports: the
BFD child process imports it."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import structlog
from prometheus_client import Histogram

LOOP_STALLS = Histogram(
    "thorn_loop_stall_seconds",
    "How long a watched loop (the event loop, the BFD runtime) went past a check-in it had "
    "promised, for each stall over its watchdog's threshold",
    ["loop"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

GC_PAUSES = Histogram(
    "thorn_gc_pause_seconds",
    "Python's garbage collections: how long each held every thread of the process",
    ["generation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)

log = structlog.get_logger("thorn.watchdog")


# Young generation after 10,000 net new objects (default 700); the middle one after 20 of
# those (default 10), a full collection after 20 middle ones (default 10): a full walk per
# ~4 million objects that outlived their first collections instead of per 70,000.
COLLECT_AFTER = (10_000, 20, 20)


def settle_heap() -> None:
    """Put everything alive now (modules, settings, start-up state) out of the collector's
    reach, so a full collection walks only what was made since. Call once start-up is done.
    Why: a full collection stops every thread of the process, and its length grows with the
    heap. Measured in the BFD child (70,000 objects after its imports): 40-60 ms, longer
    than a 10 ms x 3 detection time, and such pauses recurred every few seconds under load;
    after this, under 1 ms. Frozen objects are never freed; start-up objects rarely die.

    The collector then runs less often (`COLLECT_AFTER`): a full collection walks every
    object made since start-up, and at k=32 with the default thresholds health ran one
    every 2 s (p50 138 ms, up to 1.6 s) and pathcomp up to 3 s ones, past their 3 s leader
    leases; none of them found garbage. Reference counting frees the rest as before."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECT_AFTER)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection while a big structure is built. Why: each allocation burst
    triggers full collections that walk everything built so far; building a k=40 fabric
    snapshot (a few hundred thousand objects) saw ten of them, up to 640 ms each, holding
    every thread of the process (the API's event loop too). Reference counting still frees."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def building_long_lived() -> Iterator[None]:
    """Build something big and long-lived (a fabric snapshot) with no collection running,
    then freeze it out of every later one, without walking it: even a young-generation
    collection of a fresh k=40 snapshot holds the GIL for 600 ms. What is frozen is still
    freed by reference counting when replaced (snapshots hold no cycles)."""
    with gc_paused():
        yield
        gc.freeze()


def keep_long_lived() -> None:
    """Move what was just built to last (a plan) out of every later full collection. Only
    the young generations are collected first: a full collection of a large plan holds the
    GIL for hundreds of milliseconds."""
    gc.collect(1)
    gc.freeze()


class GcPauses:
    """Times every garbage collection of this process (`gc.callbacks`) into
    `thorn_gc_pause_seconds`; one over `warn_s` is logged as `gc_pause`. A watchdog's stack
    of a stall the collector caused shows only the line that happened to allocate."""

    def __init__(self, warn_s: float) -> None:
        self.warn_s = warn_s
        self._started = 0.0

    def install(self) -> GcPauses:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        GC_PAUSES.labels(str(info["generation"])).observe(took)
        if took > self.warn_s:
            log.warning("gc_pause", ms=round(took * 1000, 1), generation=info["generation"],
                        collected=info["collected"], frozen=gc.get_freeze_count())  # fmt: skip


class StallWatchdog:
    """Finds what stalls a loop (an event loop, a timer thread): the loop says when it will
    check in next (`expect`); a thread of the watchdog's own looks every `check_s`, and once
    the loop is `threshold_s` past that, it logs `<name>_stalled` with the loop thread's stack
    as it is then (the culprit, caught in the act); at the loop's next check-in it logs how
    long the stall lasted and records it in `thorn_loop_stall_seconds`."""

    def __init__(self, name: str, threshold_s: float, check_s: float) -> None:
        self.name = name
        self.threshold_s = threshold_s
        self.check_s = check_s
        now = time.monotonic()
        self._mark = (now, now + 3600.0)  # (the last check-in, when the next one is due)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def expect(self, within_s: float) -> None:
        """The watched loop checks in again within `within_s` (from its own thread)."""
        now = time.monotonic()
        self._mark = (now, now + within_s)  # one tuple: the watcher reads it whole

    def start(self, watched: int | None = None) -> None:
        """Watch thread `watched` (default: the calling thread)."""
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(watched or threading.get_ident(),),
            name=f"{self.name}-watchdog", daemon=True,
        )  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)

    def _watch(self, watched: int) -> None:
        stalled_from: float | None = None  # when the check-in the loop missed was due
        while not self._stop.wait(self.check_s):
            (last, due), now = self._mark, time.monotonic()
            if stalled_from is not None and due != stalled_from:  # it checked in again
                late = max(0.0, last - stalled_from)
                LOOP_STALLS.labels(self.name).observe(late)
                log.warning(f"{self.name}_resumed", late_ms=round(late * 1000, 1))
                stalled_from = None
            if stalled_from is None and now - due > self.threshold_s:
                stalled_from = due
                frame = sys._current_frames().get(watched)
                stack = traceback.format_stack(frame, limit=12) if frame is not None else []
                log.warning(f"{self.name}_stalled", late_ms=round((now - due) * 1000, 1),
                            stack="".join(stack))  # fmt: skip


class LoopWatchdog:
    """`StallWatchdog` for a service's event loop: a task checks in every `beat_s`; a
    stretch over `threshold_s` without one (a blocking call on the loop, or a process the
    machine does not run) is logged as `event_loop_stalled` with what the loop was doing.
    asyncio's own debug mode reports slow callbacks only after they end, without their
    stack, and slows every callback."""

    def __init__(self, service: str, threshold_s: float = 0.25, beat_s: float = 0.05) -> None:
        self.watchdog = StallWatchdog("event_loop", threshold_s, beat_s)
        self.service = service
        self.beat_s = beat_s

    async def _beat(self) -> None:
        while True:
            self.watchdog.expect(self.beat_s)
            await asyncio.sleep(self.beat_s)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LoopWatchdog]:
        """Watch the running loop (and the process's garbage collections) while the block
        runs."""
        self.watchdog.expect(self.beat_s)
        beat = asyncio.create_task(self._beat(), name=f"{self.service}-watchdog-beat")
        pauses = GcPauses(warn_s=self.watchdog.threshold_s / 5).install()
        self.watchdog.start()
        try:
            yield self
        finally:
            pauses.uninstall()
            self.watchdog.stop()
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
