"""One node's agent: follows the node's desired state in JetStream KV and reconciles.

It watches `node.<name>` and, for a host, `vni.<vni>.*` of each of its VNIs. Every change
marks the node dirty; one worker reconciles at a time, so a burst of updates costs one or
two reconciles, never a queue of them. Nothing is touched before the watch has caught up
(an agent that starts before its desired state exists leaves the kernel as it is); a
deleted document removes everything THORN made on the node.

The driver follows the document's kind: a switch's routes go to the switch route driver; a
host gets the flower driver when the kernel has cls_flower and act_tunnel_key, the
emulation driver otherwise (`drivers.choose`).

`flip(peer, colour)` is the local fast failover: it moves traffic toward one peer host to
its other colour straight away (a shared-action replace, or FDB replaces in emulation),
without reading the kernel or waiting for the controller, and reports a `failover.<node>`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram
from pydantic import TypeAdapter, ValidationError

from thorn.bus import Bus, CaughtUp, DesiredStateEntry, DesiredStateStore
from thorn.desired import (
    DesiredState,
    HostState,
    SwitchState,
    VniState,
    node_key,
)
from thorn.events import (
    DatapathApplied,
    FailoverEvent,
    FailoverTier,
    FlipCommand,
    OffloadReport,
    Trace,
    agent_flip_subject,
    utcnow,
)
from thorn.model import Colour
from thorn_programmer.bfd import State
from thorn_programmer.drivers.netlink import ApplyError, NetlinkDatapath
from thorn_programmer.intent import (
    HostIntent,
    Intent,
    SwitchIntent,
    host_intent,
    switch_intent,
)
from thorn_programmer.kernel import diff
from thorn_programmer.overrides import Overrides
from thorn_programmer.reconcile import ReconcileResult, reconcile

log = structlog.get_logger("thorn.programmer")

RECONCILES = Counter(
    "thorn_programmer_reconciles_total", "Reconcile runs", ["node", "driver", "result"]
)
KERNEL_CHANGES = Counter(
    "thorn_programmer_kernel_changes_total", "Kernel objects added, replaced or deleted",
    ["node", "op"],
)  # fmt: skip
RECONCILE_SECONDS = Histogram(
    "thorn_programmer_reconcile_seconds", "Time to read, diff and apply one node",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)  # fmt: skip
APPLIED_REVISION = Gauge(
    "thorn_programmer_applied_plan_revision", "Plan revision last applied", ["node"]
)
FLIPS = Counter("thorn_programmer_local_failovers_total", "Local fast failovers", ["node"])
BAD_DOCUMENTS = Counter(
    "thorn_programmer_bad_documents_total", "Desired-state documents that did not validate",
    ["node"],
)  # fmt: skip

UNSENT = Counter(
    "thorn_programmer_events_unsent_total",
    "Applied reports and failover events NATS did not take: kept to send again (failover "
    "events, up to OUTBOX_LIMIT) or restated by the next report (applied)",
    ["node", "kind"],
)
FAILOVERS_DROPPED = Counter(
    "thorn_programmer_failover_events_dropped_total",
    "Failover events dropped because more than OUTBOX_LIMIT waited for NATS",
    ["node"],
)

STALE_DOCUMENTS = Counter(
    "thorn_programmer_stale_documents_total",
    "Desired-state documents ignored because an older leader term wrote them",
    ["node"],
)

_DOCUMENT: TypeAdapter[DesiredState] = TypeAdapter(DesiredState)
HEARTBEAT_SECONDS = 15.0  # well inside pathcomp's 60 s liveness window
RENDER_TRIES = 3  # a reconcile renders again when a flip lands while it reads, this often
OUTBOX_LIMIT = 1000  # failover events kept while NATS is away (the oldest go first)
WATCH_RETRY_SECONDS = 1.0  # before asking again for a watch that could not be made

# (kind, netns) -> the driver, as an async context manager
DriverFactory = Callable[[str, str | None], AbstractAsyncContextManager[NetlinkDatapath]]


@dataclass(slots=True)
class AgentStatus:
    node: str
    netns: str | None
    driver: str | None = None
    key_revision: int = 0
    plan_revision: int | None = None
    reconciles: int = 0
    last_changes: int = 0
    last_errors: list[str] = field(default_factory=list)
    last_seconds: float = 0.0
    overrides: dict[str, str] = field(default_factory=dict)
    # Hosts on the flower driver: the offload mode, why (a fallback) and the read-back.
    offload: OffloadReport | None = None


class NodeAgent:
    def __init__(
        self,
        node: str,
        kv: DesiredStateStore,
        bus: Bus,
        drivers: DriverFactory,
        netns: str | None = None,
        overrides: Overrides | None = None,
    ) -> None:
        self.node = node
        self.kv = kv
        self.bus = bus
        self.drivers = drivers
        self.status = AgentStatus(node=node, netns=netns)
        self._netns = netns
        self._doc: HostState | SwitchState | None = None
        self._deleted = False
        self._received = 0  # the node key's revision last received (status: last applied)
        # The newest pathcomp leader term among the documents taken (see thorn.desired: term).
        # Kept for the life of the agent: a restarted agent takes the KV's current document.
        self._term = 0
        self._chunks: dict[tuple[int, int], VniState] = {}
        self._vni_watches: dict[int, asyncio.Task[None]] = {}
        # Peers moved to their other colour by a flip (kept across restarts when given a file).
        self.overrides = overrides or Overrides(None, revertive=True, hold_down=2.0)
        self._revert: asyncio.TimerHandle | None = None
        self._dirty = asyncio.Event()
        self._caught_up = asyncio.Event()
        self._driver: NetlinkDatapath | None = None
        self._driver_kind: str | None = None
        self._stack = AsyncExitStack()
        self._lock = asyncio.Lock()
        self._last_intent: Intent | None = None
        self._last_result: ReconcileResult | None = None  # repeated by the heartbeat
        self.reconciled = asyncio.Event()  # set after every reconcile (tests wait on it)
        # Flips asked for by BFD, and the work each flip leaves for after the kernel change.
        self._flips: set[asyncio.Task[None]] = set()
        self._flips_done = 0  # flips applied so far (see reconcile_now)
        # Failover events NATS did not take yet, sent again before the next one and with
        # each heartbeat: the failover history must not lose what happened while it was away.
        # Each with its Nats-Msg-Id: a publish that timed out may still have been stored (the
        # client sends what it buffered on reconnect), and the stream keeps one copy.
        self.outbox: collections.deque[tuple[str, FailoverEvent]] = collections.deque()
        self._outbox_lock = asyncio.Lock()  # one sender at a time keeps the order
        # Called with each intent once applied (BFD sessions follow what was programmed).
        self.on_applied: list[Callable[[Intent | None], Awaitable[None]]] = []
        # This host's path sessions' states (set by the BFD wiring; none: no sessions).
        self.path_state: Callable[[str, Colour], State | None] = lambda _p, _c: None
        # The VNIs this node's NATS identity may read (all without credentials), and whom to
        # tell of those it may not yet (the credentials keeper renews): a watch it may not
        # make is not asked for.
        self.permits_vni: Callable[[int], bool] = lambda _vni: True
        self.vnis_refused: Callable[[set[int]], None] = lambda _vnis: None

    # --- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch and reconcile until cancelled."""
        watcher = asyncio.create_task(self._watch_node(), name=f"watch-{self.node}")
        commands = await self.bus.subscribe(
            agent_flip_subject(self.node), self.on_command, model=FlipCommand
        )
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"heartbeat-{self.node}")
        try:
            await self._caught_up.wait()
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                await self.reconcile_now()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(Exception):  # the connection may be gone already
                await commands.unsubscribe()
            if self._revert is not None:
                self._revert.cancel()
            watcher.cancel()
            for task in self._vni_watches.values():
                task.cancel()
            await asyncio.gather(watcher, *self._vni_watches.values(), return_exceptions=True)
            self._vni_watches.clear()
            # A later run (a supervisor restarting this agent) opens a fresh driver.
            await self._stack.aclose()
            self._stack, self._driver, self._driver_kind = AsyncExitStack(), None, None

    async def _watching(
        self, key: str, take: Callable[[DesiredStateEntry | CaughtUp], None]
    ) -> None:
        """Hand every item of `key`'s watch to `take`; a watch that cannot be made (the
        connection being made again, a renewal's reconnect) is asked for again, after a
        pause: the agent must never stop following its documents."""
        while True:
            try:
                async with self.kv.watch(key) as watch:
                    async for item in watch:
                        take(item)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("desired_state_watch_failed", node=self.node, key=key,
                            error=f"{type(exc).__name__}: {exc}",
                            retry_in_s=WATCH_RETRY_SECONDS)  # fmt: skip
                await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def _watch_node(self) -> None:
        def take(item: DesiredStateEntry | CaughtUp) -> None:
            if isinstance(item, CaughtUp):
                self._caught_up.set()
                if self._doc is not None:
                    self._dirty.set()
                return
            self._take_node(item)

        await self._watching(node_key(self.node), take)

    def _take_node(self, entry: DesiredStateEntry) -> None:
        self._received = entry.revision
        if entry.deleted:
            self._doc, self._deleted = None, True
        else:
            try:
                doc = _DOCUMENT.validate_json(entry.value or b"")
            except ValidationError as exc:
                BAD_DOCUMENTS.labels(self.node).inc()
                log.error("bad_desired_state", node=self.node, error=str(exc))
                return  # keep following the last good document
            if not isinstance(doc, HostState | SwitchState) or doc.node != self.node:
                BAD_DOCUMENTS.labels(self.node).inc()
                log.error("desired_state_not_for_this_node", node=self.node)
                return
            if doc.term < self._term:  # a deposed leader's late write: fenced off
                STALE_DOCUMENTS.labels(self.node).inc()
                log.warning("stale_desired_state_ignored", node=self.node, term=doc.term,
                            newest_term=self._term, key_revision=entry.revision)  # fmt: skip
                return
            self._term = doc.term
            self._doc, self._deleted = doc, False
            if isinstance(doc, HostState):
                self._follow_vnis(set(doc.vnis))
        if self._caught_up.is_set():
            self._dirty.set()

    def _follow_vnis(self, wanted: set[int]) -> None:
        refused = {vni for vni in wanted if not self.permits_vni(vni)}
        if refused:
            self.vnis_refused(refused)
        vnis = wanted - refused
        for vni in set(self._vni_watches) - vnis:
            self._vni_watches.pop(vni).cancel()
            self._chunks = {k: v for k, v in self._chunks.items() if k[0] != vni}
        for vni in vnis - set(self._vni_watches):
            self._vni_watches[vni] = asyncio.create_task(
                self._watch_vni(vni), name=f"watch-{self.node}-vni-{vni}"
            )

    async def permissions_changed(self) -> None:
        """Renewed credentials: follow the VNIs of the document that they allow now (and
        drop those they no longer do)."""
        if isinstance(self._doc, HostState):
            self._follow_vnis(set(self._doc.vnis))
            self._dirty.set()

    async def _watch_vni(self, vni: int) -> None:
        def take(item: DesiredStateEntry | CaughtUp) -> None:
            if isinstance(item, CaughtUp):
                self._dirty.set()
                return
            chunk_no = int(item.node.rsplit(".", 1)[1])
            if item.deleted:
                self._chunks.pop((vni, chunk_no), None)
            else:
                try:
                    self._chunks[(vni, chunk_no)] = item.decode(VniState)
                except ValidationError as exc:
                    BAD_DOCUMENTS.labels(self.node).inc()
                    log.error("bad_vni_state", node=self.node, vni=vni, error=str(exc))
                    return
            if self._caught_up.is_set():
                self._dirty.set()

        await self._watching(f"vni.{vni}.*", take)

    # --- reconciling -----------------------------------------------------------------------

    def intent(self) -> Intent | None:
        doc = self._doc
        if doc is None:
            return None
        if isinstance(doc, SwitchState):
            return switch_intent(doc)
        self.overrides.agree(set(doc.blue_peers))  # the controller's plan says the same now
        return host_intent(doc, self._chunks.values(), self.overrides.colours())

    async def _driver_for(self, kind: str) -> NetlinkDatapath:
        if self._driver is None or self._driver_kind != kind:
            await self._stack.aclose()
            self._stack = AsyncExitStack()
            driver = await self._stack.enter_async_context(self.drivers(kind, self._netns))
            await driver.setup()
            self._driver, self._driver_kind = driver, kind
            self.status.driver = driver.name
            log.info("datapath_driver", node=self.node, driver=driver.name)
            return driver
        return self._driver

    async def reconcile_now(self) -> ReconcileResult | None:
        """Make the kernel match the desired state with this host's overrides. The kernel
        is read and diffed without the agent's lock, so a failover never waits behind a
        long read; a flip that lands meanwhile makes this render again (the last try holds
        the lock throughout, so a reconcile always ends)."""
        result: ReconcileResult | None = None
        for attempt in range(RENDER_TRIES):
            whole = attempt + 1 == RENDER_TRIES
            async with self._lock:
                prepared = await self._prepare()
                if prepared is None:
                    return None
                intent, received, driver = prepared
                generation = self._flips_done
                commit = functools.partial(self._commit, intent, received)
                if whole:
                    result = await reconcile(driver, intent, commit=commit)
            if not whole:
                result = await reconcile(
                    driver, intent, lock=self._lock, commit=commit,
                    current=lambda: self._flips_done == generation,  # noqa: B023 (this pass's)
                )  # fmt: skip
                if result.stale:
                    continue
            break
        assert result is not None
        self._record(result)
        self.reconciled.set()
        self.reconciled = asyncio.Event()
        self._last_result = result
        await self._report(result)
        for follower in self.on_applied:
            await follower(None if self._deleted else self._last_intent)
        return result

    async def _prepare(self) -> tuple[Intent, int, NetlinkDatapath] | None:
        """Under the lock: the intent to reconcile, the KV revision it follows, its driver."""
        received = self._received
        intent = self.intent()
        if intent is None and not self._deleted:
            return None
        if intent is None:  # the node left the fabric: remove what THORN made
            if self._driver is None:
                return None
            intent = _empty(self._last_intent, self.node)
        kind = "host" if isinstance(intent, HostIntent) else "switch"
        return intent, received, await self._driver_for(kind)

    def _commit(self, intent: Intent, received: int) -> None:
        """Under the lock, once the kernel matches `intent`: it is what flips start from."""
        self._last_intent = intent
        self.status.key_revision = received

    def _record(self, result: ReconcileResult) -> None:
        s = self.status
        s.reconciles += 1
        s.plan_revision = result.revision
        s.last_changes = len(result.applied)
        s.last_errors = [e.message for e in result.errors]
        s.last_seconds = result.seconds
        s.overrides = dict(self.overrides.colours())
        s.offload = self._driver.offload_report() if self._driver is not None else None
        RECONCILES.labels(self.node, result.driver, "ok" if result.ok else "error").inc()
        RECONCILE_SECONDS.observe(result.seconds)
        APPLIED_REVISION.labels(self.node).set(result.revision)
        for change in result.applied:
            KERNEL_CHANGES.labels(self.node, change.op).inc()
        level = log.warning if result.errors else log.info
        level("reconciled", node=self.node, driver=result.driver, revision=result.revision,
              changes=len(result.applied), errors=s.last_errors[:5],
              deferred=len(result.deferred),
              ms=round(result.seconds * 1000, 2))  # fmt: skip

    async def _heartbeat(self) -> None:
        """Repeat the last applied report while nothing changes: pathcomp counts an agent
        live (and waits for it between make-before-break stages) only if it heard from it
        within a minute."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            if self._last_result is not None:
                await self._report(self._last_result)
            await self._send_outbox()

    async def _report(self, result: ReconcileResult) -> None:
        event = DatapathApplied(
            node=self.node, driver=result.driver, key_revision=self.status.key_revision,
            plan_revision=result.revision, changes=len(result.applied),
            errors=self.status.last_errors, seconds=result.seconds, at=utcnow(),
            offload=self.status.offload,
        )  # fmt: skip
        try:
            await self.bus.publish(event)
        except Exception as exc:  # the heartbeat or the next reconcile restates it
            UNSENT.labels(self.node, "applied").inc()
            log.warning("applied_report_not_sent", node=self.node,
                        revision=result.revision, error=str(exc))  # fmt: skip

    def record_failover(self, event: FailoverEvent) -> None:
        """Send a failover this node's repairs made (called on the loop; does not wait)."""
        self.record_after(self._publish_failover(event))

    async def _publish_failover(self, event: FailoverEvent) -> None:
        """Send `event` after any still waiting; what NATS does not take waits in order."""
        self.outbox.append((f"{self.node}-{uuid.uuid4().hex}", event))
        while len(self.outbox) > OUTBOX_LIMIT:
            self.outbox.popleft()
            FAILOVERS_DROPPED.labels(self.node).inc()
        await self._send_outbox()

    async def _send_outbox(self) -> None:
        async with self._outbox_lock:
            while self.outbox:
                msg_id, event = self.outbox[0]
                try:
                    await self.bus.publish(event, msg_id=msg_id)
                except Exception as exc:
                    UNSENT.labels(self.node, "failover").inc()
                    log.warning("failover_event_not_sent", node=self.node,
                                waiting=len(self.outbox), error=str(exc))  # fmt: skip
                    return
                if self.outbox and self.outbox[0][0] == msg_id:  # not dropped meanwhile
                    self.outbox.popleft()

    # --- local fast failover -----------------------------------------------------------------

    @property
    def applied(self) -> Intent | None:
        """The intent last applied to the kernel (None before the first reconcile)."""
        return self._last_intent

    def colour_of(self, peer: str) -> Colour | None:
        """The colour traffic toward peer host `peer` takes now (None: no such peer)."""
        intent = self._last_intent
        if not isinstance(intent, HostIntent):
            return None
        return next((p.colour for p in intent.peers if p.host == peer), None)

    def flip_soon(self, peer: str, colour: Colour, reason: str) -> None:
        """`flip` as a task of its own (from a detector's callback); failures are logged."""

        async def flip() -> None:
            try:
                await self.flip(peer, colour, reason)
            except (LookupError, RuntimeError) as exc:
                log.warning("failover_not_done", node=self.node, peer=peer, error=str(exc))

        task = asyncio.create_task(flip(), name=f"flip-{self.node}-{peer}")
        self._flips.add(task)
        task.add_done_callback(self._flips.discard)

    async def flip(self, peer: str, colour: Colour, reason: str) -> float:
        """Send traffic toward `peer` on `colour` now (the agent's own decision)."""
        return await self.flip_many([peer], colour, reason, tier="source")

    async def on_command(self, command: FlipCommand) -> None:
        """Pathcomp's urgent flips, and its word that re-protection is done."""
        received = utcnow()
        if command.kind == "reprotected":
            named = list(self.overrides.by_peer) if command.every_peer else command.peers
            # Not toward a peer whose preferred path this host's own BFD sees down.
            peers = [p for p in named if self.path_state(p, self.preferred(p)) is not
                     State.DOWN]  # fmt: skip
            first = self.overrides.reprotected(peers, command.plan_revision, time.time())
            if first is not None:
                self._schedule_revert(first)
            return
        if command.colour is None:
            return
        trace = command.trace
        if trace is not None:
            trace = trace.then("agent_received", self.node, at=received)
        try:
            await self.flip_many(command.peers, command.colour, f"central: {command.element}",
                                 tier="central", trace=trace,
                                 plan_revision=command.plan_revision)  # fmt: skip
        except (LookupError, RuntimeError) as exc:
            log.warning("central_flip_not_done", node=self.node, error=str(exc))

    def preferred(self, peer: str) -> Colour:
        """The colour the desired state puts `peer` on (what a revert goes back to)."""
        doc = self._doc
        return Colour.blue if isinstance(doc, HostState) and peer in doc.blue_peers else Colour.red

    def on_path(self, peer: str, colour: Colour, up: bool) -> None:
        """This host's BFD toward `peer` on `colour` came Up or went Down (on the loop): an
        override away from the preferred colour may revert once that path works again."""
        if peer not in self.overrides.by_peer or colour != self.preferred(peer):
            return
        if not up:
            self.overrides.path_down(peer)
            return
        at = self.overrides.path_up(peer, time.time())
        if at is not None:
            self._schedule_revert(at)

    def _schedule_revert(self, at: float) -> None:
        if self._revert is not None:
            self._revert.cancel()
        delay = max(0.0, at - time.time())
        self._revert = asyncio.get_running_loop().call_later(delay, self._revert_due)

    def _revert_due(self) -> None:
        self._revert = None
        gone = self.overrides.due(time.time())
        if gone:
            log.info("failover_reverted", node=self.node, peers=gone[:20], count=len(gone))
            self._dirty.set()  # reconcile: the preferred colour, as the desired state says
        pending = [o.revert_at for o in self.overrides.by_peer.values() if o.revert_at]
        if pending:
            self._schedule_revert(min(pending))

    async def flip_many(
        self,
        peers: list[str],
        colour: Colour,
        reason: str,
        *,
        tier: FailoverTier,
        trace: Trace | None = None,
        plan_revision: int | None = None,
    ) -> float:
        """Send traffic toward `peers` on `colour` now, in as few kernel messages as the
        driver allows. Returns the seconds the kernel took."""
        async with self._lock:
            before = self._last_intent
            if not isinstance(before, HostIntent) or self._driver is None:
                raise RuntimeError(f"{self.node}: no host datapath to fail over yet")
            current = {p.host: p.colour for p in before.peers}
            moving = [p for p in peers if p in current and current[p] != colour]
            unknown = [p for p in peers if p not in current]
            if unknown and len(unknown) == len(peers):
                raise LookupError(f"{self.node} has no peer host {unknown[0]!r}")
            revision = plan_revision if plan_revision is not None else (before.revision or 0)
            self.overrides.put(peers, colour, reason, tier, revision, time.time(), save=False)
            # A preferred path already Up again (its session flapped back before this flip
            # ran) starts the revert clock now: its Up came before there was anything to undo.
            for peer in peers:
                preferred = self.preferred(peer)
                if colour != preferred and self.path_state(peer, preferred) is State.UP:
                    self.on_path(peer, preferred, True)
            if not moving:
                self.record_after(self.overrides.save_off_loop())  # not under the lock
                return 0.0
            # From what the kernel has (the last applied intent), only the moving peers'
            # colour changes: no rebuild from the documents on the critical path. The next
            # reconcile renders the documents with the override, to the same result.
            moved = set(moving)
            after = dataclasses.replace(before, peers=tuple(
                dataclasses.replace(p, colour=colour) if p.host in moved and colour in p.teps
                else p for p in before.peers))  # fmt: skip
            driver = self._driver
            # Only the moving peers' objects are rendered (the critical path stays O(peers
            # moved), not O(every peer)): everything else renders the same either way.
            changes = diff(driver.render(_only(after, moved)), driver.render(_only(before, moved)))
            start = time.perf_counter()
            report = await driver.apply(changes)
            seconds = time.perf_counter() - start
            self._last_intent = after
            self._flips_done += 1  # a reconcile that read before this renders again
        FLIPS.labels(self.node).inc()
        applied = trace.then("agent_applied", self.node) if trace is not None else None
        # The rest (the overrides file, logs, the failover event) waits until the loop has
        # run what is ready: in a process serving many nodes, the other hosts' flips first.
        self.record_after(self._after_flip(moving, current[moving[0]], colour, reason, tier,
                                           seconds, report.errors, applied))  # fmt: skip
        return seconds

    def record_after(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"after-flip-{self.node}")
        self._flips.add(task)
        task.add_done_callback(self._flips.discard)

    async def _after_flip(self, moving: list[str], was: Colour, colour: Colour,
                          reason: str, tier: FailoverTier, seconds: float,
                          errors: list[ApplyError], trace: Trace | None) -> None:  # fmt: skip
        await self.overrides.save_off_loop()
        if errors:
            log.error("failover_errors", node=self.node, peers=moving[:10],
                      errors=[e.message for e in errors])  # fmt: skip
        log.info("failover", node=self.node, tier=tier, to=colour, peers=moving[:10],
                 count=len(moving), kernel_ms=round(seconds * 1000, 3),
                 trace=trace.id if trace else None)  # fmt: skip
        event = FailoverEvent(node=self.node, peers=moving, from_colour=was, to_colour=colour,
                              at=utcnow(), reason=reason, tier=tier, kernel_ms=seconds * 1000,
                              trace=trace)  # fmt: skip
        await self._publish_failover(event)


def _only(intent: HostIntent, hosts: set[str]) -> HostIntent:
    """The intent cut down to the peers on `hosts` and the VNIs they share with this host."""
    peers = tuple(p for p in intent.peers if p.host in hosts)
    vnis = {p.vni for p in peers}
    return HostIntent(node=intent.node, revision=intent.revision, teps=intent.teps, routes=(),
                      local=tuple(w for w in intent.local if w.vni in vnis), peers=peers,
                      incomplete=intent.incomplete)  # fmt: skip


def _empty(last: Intent | None, node: str) -> Intent:
    if isinstance(last, HostIntent):
        return HostIntent(node=node, revision=last.revision, teps={}, routes=(), local=(), peers=())
    return SwitchIntent(node=node, revision=last.revision if last else 0, routes=())
