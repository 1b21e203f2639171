"""Switch-local repair on BFD: tier 1 of docs/detection.md ("Failover tiers as built"), for
the failures the kernel cannot see.

Carrier loss and admin down need no agent: the kernel skips or deletes the primary route and
uses the backup installed beside it (drivers/switch.py). A silent failure (carrier up,
packets lost) shows only in BFD: when a switch's single-hop session on a port goes from Up
to Down, `LocalRepair.withdraw` removes the primaries through that port at once, in one
batch (`SwitchRouteDriver.withdraw_port`), without waiting for health or pathcomp.

The withdrawn port is a local override: every later rendering of the switch's intent leaves
those primaries out (`SwitchIntent.withdrawn`), so a reconcile of the desired state, which
still names them until pathcomp re-routes, does not put them back while the session is Down.
The override ends when the session has been Up again for the up hold (`restore_after_hold`,
`THORN_LINK_UP_HOLD_MS`, Junos' BFD `holddown-interval`: a gray link's session comes Up for
a few tens of milliseconds at a time, and each of those would otherwise put traffic back on
it), or at once when the session is removed (`restore`: its port got another neighbour, or
the node left the fabric). A Down during the hold cancels it. One `LocalRepair` per node
lives as long as the process, so the override outlives a restarted agent and the driver it
reopens.

A port set admin down loses its routes in the kernel, and none can be added while it stays
down (the driver defers them). `link` follows the port's admin state from the agent's link
monitor: when it comes up again, its routes go back at once (`reassert`), before the
neighbour's BFD session can come Up and send traffic this way.

The withdraw itself is usually done before the agent hears of it: the BFD runtime carries
each link session's route deletes (armed after every apply, `SwitchRouteDriver.armed`) and
sends them the moment the session goes Down (bfd/manager.py). `withdrawn_by_runtime` then
marks the port withdrawn and runs the same withdraw through the driver, which finds those
routes gone (ESRCH, no error) and deletes any the armed batch missed.

Each repair is a failover of tier "switch" in the history (`on_failover`): a withdraw on BFD
Down, and a port losing carrier while primaries with backups go through it (the kernel
moved them, in no time the agent can measure: `kernel_ms` 0). Its `peers` are the
destination TEP prefixes left to their backups, `to_colour` is "backup".
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import structlog
from prometheus_client import Counter

from thorn.events import FailoverEvent, Trace, new_trace_id, utcnow
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.kernel import Route
from thorn_programmer.monitor import LinkEvent

log = structlog.get_logger("thorn.programmer.repair")

LOCAL_REPAIRS = Counter(
    "thorn_programmer_local_repairs_total",
    "Primaries withdrawn from a port on BFD Down, or restored on BFD Up, by a switch agent",
    ["node", "op"],
)

Op = Literal["withdraw", "restore", "reassert"]


@dataclass(frozen=True, slots=True)
class RepairRecord:
    op: Op
    port: str
    reason: str
    routes: int  # kernel routes removed or put back
    sendmsgs: int
    seconds: float  # from the BFD event's arrival on the loop to the kernel's last ack
    errors: list[str] = field(default_factory=list)
    by_runtime: bool = False  # the BFD runtime sent the deletes (seconds: from detection)


class LocalRepair:
    """One switch's withdrawn ports and the driver that carries them out (while there is
    one). `withdraw` and `restore` are BFD callbacks on the agent's loop: each runs as a
    task, one at a time, in the order they came."""

    def __init__(self, node: str, up_hold: float = 0.0) -> None:
        self.node = node
        self.up_hold = up_hold  # seconds a session must stay Up before its port is restored
        self.withdrawn: set[str] = set()
        self._held: dict[str, asyncio.Task[None]] = {}  # port -> restore waiting for the hold
        self.driver: SwitchRouteDriver | None = None
        self.last: RepairRecord | None = None
        self._admin_up: dict[str, bool] = {}  # per port, as the link monitor last saw it
        self._carrier: dict[str, bool] = {}
        # Where failover events go (the agent's outbox); None: nowhere (tests of the kernel).
        self.on_failover: Callable[[FailoverEvent], None] | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def armed(self) -> dict[str, tuple[bytes, ...]]:
        """What the BFD runtime should withdraw per port on its own (none without a driver)."""
        return self.driver.armed() if self.driver is not None else {}

    def attach(self, driver: SwitchRouteDriver) -> None:
        driver.withdrawn = self.withdrawn  # one set: the driver renders with it
        self.driver = driver

    def detach(self, driver: SwitchRouteDriver) -> None:
        if self.driver is driver:
            self.driver = None

    def withdraw(self, port: str, reason: str) -> None:
        self._cancel_hold(port)
        self._spawn("withdraw", port, reason)

    def restore(self, port: str, reason: str) -> None:
        """Put the port's primaries back now (its session is gone: nothing watches it)."""
        self._cancel_hold(port)
        self._spawn("restore", port, reason)

    def restore_after_hold(self, port: str, reason: str) -> None:
        """The port's session came Up: put its primaries back once it has stayed Up for the
        up hold (a withdraw before then cancels it)."""
        if self.up_hold <= 0:
            self.restore(port, reason)
            return
        # Held even when the port is not withdrawn (yet: a withdraw may still be queued);
        # restoring a port that is not withdrawn does nothing.
        if port in self._held:
            return  # already waiting, since the earlier Up
        self._held[port] = asyncio.create_task(self._after_hold(port, reason),
                                               name=f"repair-{self.node}-hold-{port}")  # fmt: skip

    async def _after_hold(self, port: str, reason: str) -> None:
        await asyncio.sleep(self.up_hold)
        del self._held[port]
        self._spawn("restore", port, f"{reason}, held {self.up_hold:g} s")

    def _cancel_hold(self, port: str) -> None:
        if (task := self._held.pop(port, None)) is not None:
            task.cancel()

    def withdrawn_by_runtime(
        self, port: str, reason: str, routes: int, ms: float, errors: tuple[str, ...]
    ) -> None:
        """The BFD runtime withdrew `routes` primaries through `port` itself, `ms` after
        detection (its armed batch): record it and bring the override up to date."""
        self._cancel_hold(port)
        self._spawn("withdraw", port, reason, (routes, ms, errors))

    def link(self, event: LinkEvent) -> None:
        """A link monitor event (on the agent's loop): a port back to admin up gets its
        routes again."""
        was = self._admin_up.get(event.ifname)
        had_carrier = self._carrier.get(event.ifname)
        self._admin_up[event.ifname] = event.admin_up and not event.deleted
        self._carrier[event.ifname] = event.carrier and not event.deleted
        if self.driver is None:
            return
        if was is False and event.admin_up and not event.deleted:
            self._spawn("reassert", event.ifname, "port admin up")
        if had_carrier and not event.carrier and not event.deleted:
            prefixes = self._protected_through(event.ifname)
            if prefixes:
                self._failover(prefixes, f"carrier lost on {event.ifname}: the kernel uses "
                               "the backups", 0.0, event.at_ns / 1e9)  # fmt: skip

    def _protected_through(self, port: str) -> list[str]:
        """Destination prefixes whose primary goes through `port` and that have a backup."""
        intent = self.driver.intent if self.driver is not None else None
        if intent is None:
            return []
        # ... and whose backup's port still has carrier: otherwise nothing was repaired
        protected = (r for r in intent.routes if r.backup is not None and r.backup.dev != port
                     and self._carrier.get(r.backup.dev, True))  # fmt: skip
        return sorted({r.prefix for r in protected if r.dev == port})

    def _failover(self, prefixes: list[str], reason: str, kernel_ms: float,
                  detected_at: float) -> None:  # fmt: skip
        if self.on_failover is None:
            return
        detected = datetime.fromtimestamp(detected_at, UTC)
        trace = Trace(id=new_trace_id()).then("detected", self.node, at=detected)
        trace = trace.then("agent_applied", self.node)
        self.on_failover(FailoverEvent(
            node=self.node, peers=prefixes, from_colour=None, to_colour="backup", at=utcnow(),
            reason=reason, tier="switch", kernel_ms=kernel_ms, trace=trace,
        ))  # fmt: skip

    def holding(self) -> list[str]:
        """The withdrawn ports whose restore waits for the up hold."""
        return sorted(p for p in self._held if p in self.withdrawn)

    async def idle(self) -> None:
        """Wait until every withdraw and restore asked for so far is done (a restore waiting
        for its hold is not waited for: see `holding`)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(
        self,
        op: Op,
        port: str,
        reason: str,
        runtime: tuple[int, float, tuple[str, ...]] | None = None,
    ) -> None:
        start = time.perf_counter()
        task = asyncio.create_task(self._run(op, port, reason, start, runtime),
                                   name=f"repair-{self.node}-{op}-{port}")  # fmt: skip
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        op: Op,
        port: str,
        reason: str,
        start: float,
        runtime: tuple[int, float, tuple[str, ...]] | None = None,
    ) -> None:
        async with self._lock:  # state is checked here, so a quick Down then Up ends Up
            if op != "reassert" and (port in self.withdrawn) == (op == "withdraw"):
                return  # already so
            driver = self.driver
            if driver is None:  # no datapath yet: its first reconcile renders the override
                if op == "withdraw":
                    self.withdrawn.add(port)
                elif op == "restore":
                    self.withdrawn.discard(port)
                return
            try:
                if op == "withdraw":
                    report = await driver.withdraw_port(port)
                elif op == "restore":
                    report = await driver.restore_port(port)
                else:
                    report = await driver.reassert_port(port)
            except Exception:
                # The override is in place (the driver sets it first): the next reconcile
                # carries it out. Logged, so the failure is seen.
                log.exception("local_repair_failed", node=self.node, op=op, port=port)
                return
        seconds = time.perf_counter() - start
        # ESRCH: the kernel removed that route already (the port went admin down, or the
        # BFD runtime's armed batch deleted it).
        gone = [e.change for e in report.errors if e.errno == errno.ESRCH]
        errors = [e.message for e in report.errors if e.errno != errno.ESRCH]
        if op == "reassert" and not report.applied and not errors:
            return  # nothing routed through it
        routes, sendmsgs = len(report.applied), report.sendmsgs
        if runtime is not None:  # the critical path was the runtime's, from detection
            routes, seconds = routes + runtime[0], runtime[1] / 1000
            sendmsgs, errors = sendmsgs + 1, [*runtime[2], *errors]
        self.last = RepairRecord(op, port, reason, routes, sendmsgs, seconds, errors,
                                 by_runtime=runtime is not None)  # fmt: skip
        LOCAL_REPAIRS.labels(self.node, op).inc()
        changed = [*report.applied, *(gone if runtime is not None else ())]
        if op == "withdraw" and changed:
            moved = sorted({c.obj.prefix for c in changed if isinstance(c.obj, Route)})
            self._failover(moved, reason, seconds * 1000, time.time() - seconds)
        level = log.error if errors else log.warning if op == "withdraw" else log.info
        level("local_repair", node=self.node, op=op, port=port, reason=reason,
              routes=routes, sendmsgs=sendmsgs, ms=round(seconds * 1000, 3),
              by_runtime=runtime is not None, errors=errors[:5])  # fmt: skip
