"""reconcile()'s locking (pure: a stand-in driver with an in-memory kernel): the kernel is
read without the agent's lock and only the changes are applied under it, so a failover never
waits behind a read; a failover that lands during the read sends the pass back to render."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from thorn_programmer.drivers.netlink import ApplyError, ApplyReport
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.intent import SwitchIntent, UnderlayRoute
from thorn_programmer.kernel import Change, KernelObject, Route
from thorn_programmer.reconcile import reconcile

INTENT = SwitchIntent("leaf1", 3, (UnderlayRoute("10.224.0.16/32", "swp1", "10.0.0.33"),))


class Kernel:
    """A driver over a set of routes; `read` waits for `release` when one is given."""

    name = "stand-in"
    settles_in_one_pass = False  # as NetlinkDatapath's: read back after applying

    def __init__(self, lock: asyncio.Lock, release: asyncio.Event | None = None) -> None:
        self.objects: list[KernelObject] = []
        self.lock, self.release = lock, release
        self.applied_under_lock: list[bool] = []
        self.read_under_lock: list[bool] = []

    async def prepare(self, intent: SwitchIntent) -> None:
        pass  # as NetlinkDatapath's: nothing to ask the kernel before rendering

    def render(self, intent: SwitchIntent) -> list[KernelObject]:
        return [Route(r.prefix, r.dev, r.via, 10) for r in intent.routes]

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[object]:
        return contextlib.nullcontext()  # as NetlinkDatapath's: no change outside reconcile

    async def read(self) -> list[KernelObject]:
        self.read_under_lock.append(self.lock.locked())
        if self.release is not None:
            await self.release.wait()
        return list(self.objects)

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        self.applied_under_lock.append(self.lock.locked())
        for c in changes:
            if c.op == "add":
                self.objects.append(c.obj)
        return ApplyReport(applied=list(changes))


async def test_the_kernel_is_read_without_the_lock_and_changed_under_it() -> None:
    lock = asyncio.Lock()
    kernel = Kernel(lock)
    committed: list[bool] = []
    result = await reconcile(kernel, INTENT, lock=lock,  # type: ignore[arg-type]
                             commit=lambda: committed.append(lock.locked()))  # fmt: skip
    assert result.ok and not result.stale and len(result.applied) == 1
    assert kernel.read_under_lock == [False, False]  # the pass, then the check that follows
    assert kernel.applied_under_lock == [True]
    assert committed == [True]  # once, under the lock, when the kernel matched


async def test_a_flip_during_the_read_sends_the_pass_back_to_render_and_applies_nothing() -> None:
    lock, release = asyncio.Lock(), asyncio.Event()
    kernel = Kernel(lock, release)
    flips = 0
    committed: list[bool] = []
    task = asyncio.create_task(reconcile(kernel, INTENT, lock=lock,  # type: ignore[arg-type]
                                         current=lambda: flips == 0,
                                         commit=lambda: committed.append(True)))  # fmt: skip
    await asyncio.sleep(0)  # the reconcile is reading now
    async with lock:  # a failover takes the lock at once: nobody holds it while reading
        flips += 1
    release.set()
    result = await task
    assert result.stale and result.applied == [] and kernel.applied_under_lock == []
    assert committed == []  # the intent it read for is not what flips start from


async def test_a_switch_is_not_read_back_after_a_pass_that_applied_every_change() -> None:
    """A switch's routes are independent objects (`SwitchRouteDriver.settles_in_one_pass`):
    once every change of a pass applied, a second read of ~2,000 routes finds nothing."""
    lock = asyncio.Lock()
    kernel = Kernel(lock)
    kernel.settles_in_one_pass = SwitchRouteDriver.settles_in_one_pass
    committed: list[bool] = []
    result = await reconcile(kernel, INTENT, lock=lock,  # type: ignore[arg-type]
                             commit=lambda: committed.append(True))  # fmt: skip
    assert SwitchRouteDriver.settles_in_one_pass
    assert result.ok and len(result.applied) == 1 and result.passes == 1
    assert kernel.read_under_lock == [False]  # the pass alone
    assert committed == [True]


class Refusing(Kernel):
    """Applies nothing of the second route: the kernel refuses it."""

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        report = await super().apply(changes[:1])
        report.errors = [ApplyError(c, "refused") for c in changes[1:]]
        return report


async def test_a_switch_pass_with_a_refused_change_is_read_back() -> None:
    lock = asyncio.Lock()
    kernel = Refusing(lock)
    kernel.settles_in_one_pass = True
    two = SwitchIntent("leaf1", 3, (*INTENT.routes, UnderlayRoute("10.224.0.32/32", "swp2", None)))
    result = await reconcile(kernel, two, lock=lock)  # type: ignore[arg-type]
    assert not result.ok and len(result.applied) == 1
    assert kernel.read_under_lock == [False, False]  # read again: what did the kernel keep?
