"""Reconcile: read the kernel, diff it against the rendered intent, apply the difference.

Idempotent by construction: a second run reads back what the first wrote and finds nothing
to do, so restarting the agent causes no rule churn. A pass whose changes succeeded is
followed by another read, because one change can take others with it (replacing a VXLAN
device drops its FDB entries); passes stop when nothing is left, or when what is left is
what just failed (those errors are reported, never swallowed). Changes a driver defers
(a switch route through a port that is admin down, which the kernel refuses until the port
is up) are reported apart and carried out when the port comes up (repair.LocalRepair.link).
"""

from __future__ import annotations

import time
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

    @property
    def ok(self) -> bool:
        return not self.errors


async def plan_changes(driver: NetlinkDatapath, intent: Intent) -> list[Change]:
    """What reconcile would do now (a dry run)."""
    desired = driver.render(intent)
    actual = [o for o in await driver.read() if not held(intent, o)]
    return diff(desired, actual)


async def reconcile(driver: NetlinkDatapath, intent: Intent) -> ReconcileResult:
    start = time.perf_counter()
    result = ReconcileResult(node=intent.node, revision=intent.revision, driver=driver.name)
    failed: set[tuple[str, tuple[object, ...]]] = set()
    for _ in range(MAX_PASSES):
        changes = await plan_changes(driver, intent)
        todo = [c for c in changes if (c.op, c.obj.key) not in failed]
        if not todo:
            break
        result.passes += 1
        report = await driver.apply(todo)
        result.applied += report.applied
        result.errors += report.errors
        result.deferred += report.deferred
        failed |= {(e.change.op, e.change.obj.key) for e in report.errors + report.deferred}
        if not report.applied:
            break
    result.seconds = time.perf_counter() - start
    return result
