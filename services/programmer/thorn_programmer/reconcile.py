"""Reconcile: read the kernel, diff it against the rendered intent, apply the difference.

Idempotent by construction: a second run reads back what the first wrote and finds nothing
to do, so restarting the agent causes no rule churn. A pass whose changes succeeded is
followed by another read, because one change can take others with it (replacing a VXLAN
device drops its FDB entries), unless the driver's changes cannot (a switch's routes:
`settles_in_one_pass`) and all of them applied; passes stop when nothing is left, or when
what is left is what just failed (those errors are reported, never swallowed). Changes a
driver defers (a switch route through a port that is admin down, which the kernel refuses
until the port is up) are reported apart and carried out when the port comes up
(repair.LocalRepair.link).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from thorn_programmer.drivers.netlink import ApplyError, NetlinkDatapath
from thorn_programmer.intent import Intent
from thorn_programmer.kernel import Change, diff
from thorn_programmer.render import held

MAX_PASSES = 3


@dataclass(slots=True)
class ReconcileResult:
    node: str
    revision: int
    driver: str
    applied: list[Change] = field(default_factory=list)
    errors: list[ApplyError] = field(default_factory=list)
    deferred: list[ApplyError] = field(default_factory=list)  # see ApplyReport.deferred
    passes: int = 0
    seconds: float = 0.0
    stale: bool = False  # a failover changed the intent while it read: render again

    @property
    def ok(self) -> bool:
        return not self.errors


async def plan_changes(driver: NetlinkDatapath, intent: Intent) -> list[Change]:
    """What reconcile would do now (a dry run)."""
    await driver.prepare(intent)
    desired = driver.render(intent)
    actual = [o for o in await driver.read() if not held(intent, o)]
    return diff(desired, actual)


async def reconcile(
    driver: NetlinkDatapath,
    intent: Intent,
    *,
    lock: asyncio.Lock | None = None,
    current: Callable[[], bool] = lambda: True,
    commit: Callable[[], None] = lambda: None,
) -> ReconcileResult:
    """Reconcile `intent`. With `lock`, the kernel is read and diffed without it and only
    the changes are applied under it, so a failover (which takes the same lock) does not
    wait behind a long read; if `current()` turns false meanwhile (a flip moved peers), the
    pass stops with `stale` set and the caller renders again. `commit` runs under the lock
    once the kernel matches `intent` as far as it can."""
    start = time.perf_counter()
    result = ReconcileResult(node=intent.node, revision=intent.revision, driver=driver.name)
    failed: set[tuple[str, tuple[object, ...]]] = set()
    guard = lock if lock is not None else contextlib.nullcontext()
    for n in range(MAX_PASSES):
        async with driver.exclusive():  # no local repair between this read and its apply
            changes = await plan_changes(driver, intent)
            todo = [c for c in changes if (c.op, c.obj.key) not in failed]
            async with guard:
                if not current():
                    result.stale = True
                    break
                report = None
                if todo:
                    result.passes += 1
                    report = await driver.apply(todo)
                    result.applied += report.applied
                    result.errors += report.errors
                    result.deferred += report.deferred
                    failed |= {(e.change.op, e.change.obj.key)
                               for e in report.errors + report.deferred}  # fmt: skip
                settled = (
                    report is not None
                    and driver.settles_in_one_pass
                    and not report.errors
                    and not report.deferred
                )
                if report is None or not report.applied or settled or n + 1 == MAX_PASSES:
                    commit()
                    break
    result.seconds = time.perf_counter() - start
    return result
