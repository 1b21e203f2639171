"""The health service's shell around `HealthCore`: agent reports in (NATS requests), link
transitions out (`health.link.<id>` through JetStream), history and machines to the store.

The critical path of a report: decode and check it, apply it to the core (pure, in memory),
publish every transition and wait for JetStream's acknowledgements, then reply to the agent.
So an `ok` reply means the events are stored in the stream. The store is written after the
reply, by one writer task, in batches: a slow database never delays failover.

One lock orders everything that moves a machine (reports, topology changes, dampening
ticks), so the events of one link are published in the order they happened.

The failover history (agents' `FailoverEvent`s from THORN_FAILOVER) is written by
`FailoverRecorder` (recorder.py), on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter, Gauge, Histogram
from pydantic import ValidationError

from thorn.bus import Bus, BusError
from thorn.events import (
    AGENT_REPORT_ALL,
    AGENT_REPORT_PREFIX,
    TOPOLOGY_CHANGED,
    AgentReport,
    AgentReportReply,
    LinkHealthChanged,
    TopologyChanged,
    Trace,
    new_trace_id,
)
from thorn.fabric import Fabric, NotReplayable
from thorn.health_records import HealthRecord, LinkStateRecord
from thorn.rcbudget import Tenancy
from thorn.store import Store
from thorn.watchdog import building_long_lived
from thorn_health.budget_watch import BudgetWatch
from thorn_health.core import HealthCore, LinkEnds, Origin, Outcome, links_of
from thorn_health.linkstate import HealthConfig, Transition
from thorn_health.recorder import FailoverRecorder

log = structlog.get_logger("thorn.health")

QUEUE_GROUP = "thorn-health"

REPORTS = Counter(
    "thorn_health_reports_total", "Agent reports received, by result (applied, refused, failed)",
    ["result"],
)  # fmt: skip
WRONG_NODE = Counter(
    "thorn_health_reports_wrong_node_total",
    "Reports refused because they speak for another node than their subject, which is the one "
    "the sender's NATS credentials allow it to publish on (also counted as refused)",
)
ITEMS = Counter(
    "thorn_health_report_items_total",
    "Report items, by result (applied; unknown: no such link or port in the topology)",
    ["result"],
)
TRANSITIONS = Counter(
    "thorn_health_transitions_total", "Link state transitions published, by new state", ["state"]
)
SEQ_GAPS = Counter("thorn_health_seq_gaps_total", "Agent reports missed (gaps in seq)")
PUBLISH_FAILURES = Counter(
    "thorn_health_publish_failures_total", "Link events that could not be published at once"
)
UNPUBLISHED_LIMIT = 100_000  # events held while NATS is away (~30 MB)
UNPUBLISHED_DROPPED = Counter(
    "thorn_health_unpublished_dropped_total",
    "Link events dropped unpublished: NATS was away longer than the bound holds",
)
STORE_ERRORS = Counter("thorn_health_store_errors_total", "Failed writes of health records")
ANSWER_WAITS_FOR_STORE_S = 0.5
"""A report is answered once what it changed is in the store, so a standby that takes over
from the store knows every answered report. While the database is away, the answer goes
after this long (the records are kept and written when it is back; health keeps working)."""
ANSWERED_BEFORE_STORED = Counter(
    "thorn_health_reports_answered_before_stored_total",
    "Reports answered before their records were in the store (the database was slow or away)",
)
REPORT_TO_PUBLISH = Histogram(
    "thorn_health_report_publish_seconds",
    "From receiving an agent report to its link events acknowledged by JetStream",
    buckets=(0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)
LINKS = Gauge("thorn_health_links", "Links by health state", ["state"])


class ReportRefused(ValueError):
    """A malformed report: the message names the field."""


class ReportForAnotherNode(ReportRefused):
    """A report whose payload names another node than its subject: the subject is what the
    sender's credentials were checked against, so it is the sender's identity."""


def parse_report(subject: str, data: bytes, max_items: int) -> AgentReport:
    """The report in a request, or `ReportRefused` naming what is wrong with it."""
    try:
        report = AgentReport.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        raise ReportRefused(f"not a valid AgentReport: {problems}") from exc
    subject_node = subject.removeprefix(AGENT_REPORT_PREFIX + ".")
    if report.node != subject_node:
        raise ReportForAnotherNode(
            f"node: {report.node!r} does not match the subject's node {subject_node!r}"
        )
    if len(report.items) > max_items:
        raise ReportRefused(f"items: {len(report.items)} items, more than this health's limit"
                            f" of {max_items}")  # fmt: skip
    return report


class HealthService:
    def __init__(
        self,
        store: Store,
        bus: Bus,
        config: HealthConfig | None = None,
        *,
        min_packets: int = 100,
        max_items: int = 1000,
        refresh_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.bus = bus
        self.config = config or HealthConfig()
        self.min_packets = min_packets
        self.core = HealthCore(self.config, min_packets=min_packets)
        self.links: dict[int, LinkEnds] = {}  # the topology as health sees it
        self.leading = False  # the active replica: takes reports, publishes, writes
        self.refresh_seconds = refresh_seconds
        self.max_items = max_items
        self.clock = clock
        self.revision = -1
        self.fabric: Fabric | None = None  # at `revision`: what topology events replay on
        self._lock = asyncio.Lock()
        # Records go to the writer in numbered batches; `_stored` is the last one written.
        self._records: asyncio.Queue[tuple[int, list[HealthRecord]]] = asyncio.Queue()
        self._enqueued = 0
        self._stored = 0
        self._unpublished: deque[LinkHealthChanged] = deque()  # bounded by _hold
        self._subscriptions: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []  # the active replica's writer and ticker
        self._reports: Subscription | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.active = asyncio.Event()  # set while this replica takes agent reports
        self._wake = asyncio.Event()
        self._stopping = False
        # Who waits for which batch to be stored, soonest first: the writer wakes only those
        # its batch covers (one event woke every waiting answer at each write, and with
        # thousands of answers waiting at k=32 each write cost thousands of wake-ups).
        self._store_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_ids = itertools.count()
        self._answering: set[asyncio.Task[None]] = set()  # answers waiting for the store
        # Failover history: every replica writes it (idempotent), see recorder.py.
        self.failovers = FailoverRecorder(store, bus)
        # Tenants' RC budgets and which pairs carry whose traffic, from the topology.
        self.tenancy = Tenancy()
        self.budgets = BudgetWatch(store, lambda: self.tenancy)

    # --- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start as a standby: the machines and topology from the store, the topology
        followed, the API served. `lead()` makes this replica the active one."""
        # Follow the topology before loading it: a change in between is not missed.
        self._subscriptions.append(
            await self.bus.subscribe(TOPOLOGY_CHANGED, self.on_topology, model=TopologyChanged)
        )
        await self.reload_topology("start")
        await self._load_machines()
        self._refresher = asyncio.create_task(self._refresh(), name="health-refresh")
        await self.failovers.start()
        self.budgets.start()
        log.info("health_standby", links=len(self.core.links), revision=self.revision)

    async def lead(self) -> None:
        """Be the active replica until cancelled: start from the store (the previous active
        replica's last word), then take agent reports, publish, write, tick."""
        try:
            async with self._lock:
                outcome = await self._load_machines(publish=True)
                self.leading = True
                self._after(outcome)
            self._stopping = False
            self._tasks = [
                asyncio.create_task(self._writer(), name="health-writer"),
                asyncio.create_task(self._ticker(), name="health-ticker"),
            ]
            self._reports = await self.bus.nc.subscribe(
                AGENT_REPORT_ALL, queue=QUEUE_GROUP, cb=self.on_report_msg
            )
            self.active.set()
            log.info("health_active", links=len(self.core.links), revision=self.revision)
            await asyncio.Event().wait()  # until leadership goes (cancelled)
        finally:
            await self._step_down()

    async def _step_down(self) -> None:
        self.leading = False
        self.active.clear()
        if self._reports is not None:
            with contextlib.suppress(Exception):
                await self._reports.unsubscribe()
            self._reports = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self.flush()
        if self._answering:  # each at most ANSWER_WAITS_FOR_STORE_S
            await asyncio.wait(set(self._answering), timeout=ANSWER_WAITS_FOR_STORE_S * 2)
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        self._tasks = []
        log.info("health_standby", reason="no longer the active replica")

    async def stop(self) -> None:
        if self.leading or self._tasks:
            await self._step_down()
        for sub in self._subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.wait([self._refresher], timeout=5.0)
        await self.budgets.stop()
        await self.failovers.stop()

    async def _load_machines(self, *, publish: bool = False) -> Outcome:
        """A fresh core from the store's machines and open failures, on the current topology.
        `publish`: the active replica publishes what changed while nobody was (drains)."""
        core = HealthCore(self.config, min_packets=self.min_packets)
        core.restore(await self.store.health_states(), await self.store.open_failures())
        outcome = core.set_topology(self.links, self.clock())
        if self.leading or publish:
            await self._publish(outcome.transitions)
        self.core = core
        for state, count in core.counts().items():
            LINKS.labels(state).set(count)
        return outcome

    async def _refresh(self) -> None:
        """A standby keeps its view (the API's answers) as fresh as the store."""
        while True:
            await asyncio.sleep(self.refresh_seconds)
            if self.leading:
                continue
            try:
                async with self._lock:
                    if not self.leading:
                        await self._load_machines()
            except Exception as exc:  # the database is away: try again later
                log.warning("health_refresh_failed", error=str(exc))

    async def flush(self) -> None:
        """Wait until everything decided so far is in the store: a transition is published
        and its records handed to the writer under the lock, so one published a moment ago
        (seen by a subscriber) is in this wait."""
        async with self._lock:
            last = self._enqueued
        await self._stored_through(last)

    async def _stored_through(self, batch: int) -> None:
        if self._stored >= batch:
            return
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._store_waiters, (batch, next(self._waiter_ids), stored))
        await stored

    def _mark_stored(self, batch: int) -> None:
        self._stored = batch
        waiters = self._store_waiters
        while waiters and waiters[0][0] <= batch:
            stored = heapq.heappop(waiters)[2]
            if not stored.done():  # done: its wait timed out
                stored.set_result(None)

    # --- inputs ---------------------------------------------------------------------------

    async def on_report_msg(self, msg: Msg) -> None:
        received = time.perf_counter()
        try:
            report = parse_report(msg.subject, msg.data, self.max_items)
        except ReportRefused as exc:
            REPORTS.labels("refused").inc()
            if isinstance(exc, ReportForAnotherNode):
                WRONG_NODE.inc()
            log.warning("report_refused", subject=msg.subject, error=str(exc))
            await self._reply(msg, AgentReportReply(ok=False, applied=0, error=str(exc)))
            return
        try:
            async with self._lock:
                outcome = self.core.apply(report, self.clock())
                await self._publish(outcome.transitions, outcome.origins)
                self._after(outcome)  # in the lock: records reach the writer in report order
                decided = self._enqueued  # a retried report's first try is in this too
        except Exception as exc:  # a bug, not the agent's fault: say so, and keep serving
            REPORTS.labels("failed").inc()
            log.exception("report_failed", node=report.node, seq=report.seq)
            error = f"health failed to apply the report: {type(exc).__name__}"
            await self._reply(msg, AgentReportReply(ok=False, applied=0, error=error))
            return
        REPORT_TO_PUBLISH.observe(time.perf_counter() - received)
        # Answered from a task of its own: the next report (this callback runs one message
        # at a time) is applied and published meanwhile, and one commit answers many.
        ok = AgentReportReply(ok=True, applied=outcome.applied)
        answer = asyncio.create_task(self._answer_once_stored(msg, ok, decided))
        self._answering.add(answer)
        answer.add_done_callback(self._answering.discard)
        REPORTS.labels("applied").inc()
        ITEMS.labels("applied").inc(outcome.applied)
        if outcome.unknown:
            ITEMS.labels("unknown").inc(len(outcome.unknown))
            log.debug("report_items_unknown", node=report.node, items=outcome.unknown[:10],
                     count=len(outcome.unknown))  # fmt: skip
        if outcome.seq_gap:
            SEQ_GAPS.inc(outcome.seq_gap)
            log.warning("report_seq_gap", node=report.node, seq=report.seq,
                        missed=outcome.seq_gap)  # fmt: skip
        elif outcome.duplicate:
            log.info("report_retry_deduplicated", node=report.node, seq=report.seq)
        elif outcome.seq_restart:
            log.info("report_seq_restarted", node=report.node, seq=report.seq)

    async def on_topology(self, event: TopologyChanged) -> None:
        """Follow a topology change: its rows replayed on the fabric held here (a drain,
        a host added: milliseconds), the store read whole only when they cannot be (a gap
        in revisions, a bulk import). At k=32 a whole read holds this loop ~5 s, long
        enough to miss the lease's renewal, and no report is taken meanwhile."""
        if event.revision <= self.revision:
            return
        fabric = self.fabric
        if fabric is not None:
            try:
                # The copy is ~100,000 new containers at k=32: made with no collection
                # walking them, and kept out of later ones (a collection during the copy
                # held this loop ~0.5 s, and each full one after walked every copy kept).
                with building_long_lived():
                    replayed = fabric.replayed(event.revision, event.changes)
            except NotReplayable as exc:
                log.info("topology_read_whole", revision=event.revision, why=str(exc))
            else:
                await self._take_topology(replayed, f"topology revision {event.revision}")
                return
        await self.reload_topology(f"topology revision {event.revision}")

    async def reload_topology(self, reason: str) -> None:
        with building_long_lived():
            fabric = await self.store.load()
        await self._take_topology(fabric, reason)

    async def _take_topology(self, fabric: Fabric, reason: str) -> None:
        async with self._lock:
            if fabric.revision <= self.revision:
                return
            self.revision, self.fabric = fabric.revision, fabric
            with building_long_lived():
                self.links = links_of(fabric)
                self.tenancy = Tenancy(fabric)
            outcome = self.core.set_topology(self.links, self.clock())
            if self.leading:
                await self._publish(outcome.transitions)
                self._after(outcome)
        for state, count in self.core.counts().items():  # links came and went
            LINKS.labels(state).set(count)
        log.info("topology_loaded", reason=reason, revision=fabric.revision,
                 links=len(self.core.links), transitions=len(outcome.transitions))  # fmt: skip

    async def tick(self) -> None:
        """Reuse the suppressed links whose figure of merit decayed, and bring up the held
        ones whose hold is over (the ticker calls it)."""
        async with self._lock:
            outcome = self.core.tick(self.clock())
            await self._publish(outcome.transitions)
            self._after(outcome)

    # --- outputs --------------------------------------------------------------------------

    async def _publish(
        self, transitions: list[Transition], origins: Mapping[Transition, Origin] | None = None
    ) -> None:
        origins = origins or {}
        events = [self._event(t, origins.get(t)) for t in transitions]
        if self._unpublished:
            await self._retry_unpublished()
        if not events:
            return
        if len(events) == 1:
            await self._send(events[0])
            return
        # One chain per link keeps each link's events in order; links go out side by side.
        chains: dict[int, list[LinkHealthChanged]] = {}
        for event in events:
            chains.setdefault(event.link_id, []).append(event)

        async def chain(items: list[LinkHealthChanged]) -> None:
            for item in items:
                await self._send(item)

        await asyncio.gather(*(chain(c) for c in chains.values()))

    async def _send(self, event: LinkHealthChanged) -> None:
        if self._unpublished and any(e.link_id == event.link_id for e in self._unpublished):
            self._hold(event)  # behind this link's earlier events
            return
        try:
            await self.bus.publish(event)
        except BusError as exc:
            PUBLISH_FAILURES.inc()
            log.error("link_event_not_published", link_id=event.link_id, error=str(exc))
            self._hold(event)
            self._wake.set()
            return
        TRANSITIONS.labels(event.state).inc()

    def _hold(self, event: LinkHealthChanged) -> None:
        """Keep an event to publish once NATS is back; past the bound the oldest goes, and
        that loss is counted and logged, never silent."""
        if len(self._unpublished) >= UNPUBLISHED_LIMIT:
            lost = self._unpublished.popleft()
            UNPUBLISHED_DROPPED.inc()
            log.error("link_event_dropped", link_id=lost.link_id, state=lost.state,
                      held=len(self._unpublished))  # fmt: skip
        self._unpublished.append(event)

    async def _retry_unpublished(self) -> None:
        while self._unpublished:
            event = self._unpublished[0]
            try:
                await self.bus.publish(event)
            except BusError:
                return
            self._unpublished.popleft()
            TRANSITIONS.labels(event.state).inc()
            if not any(e.link_id == event.link_id for e in self._unpublished):
                self.core.resave(event.link_id)  # its machine may be stored again

    @staticmethod
    def _event(t: Transition, origin: Origin | None = None) -> LinkHealthChanged:
        """The event, with the first hops of its failover trace: the agent's detection (on
        the agent's clock), the report's arrival and this decision (on health's)."""
        decided = datetime.fromtimestamp(t.at, UTC)
        trace = Trace(id=new_trace_id())
        if origin is not None:
            if origin.detected_at is not None:
                trace = trace.then("detected", origin.node, at=origin.detected_at)
            trace = trace.then("health_received", "health", at=origin.received_at)
        trace = trace.then("health_decided", "health", at=decided)
        return LinkHealthChanged(
            link_id=t.link_id,
            state=t.state.value,
            previous=t.previous.value if t.previous else None,
            at=decided,
            source=t.source,
            trace=trace,
        )

    async def _answer_once_stored(self, msg: Msg, reply: AgentReportReply, batch: int) -> None:
        try:
            async with asyncio.timeout(ANSWER_WAITS_FOR_STORE_S):
                await self._stored_through(batch)
        except TimeoutError:
            ANSWERED_BEFORE_STORED.inc()
        with contextlib.suppress(Exception):  # the agent asks again if the answer is lost
            await self._reply(msg, reply)

    @staticmethod
    async def _reply(msg: Msg, reply: AgentReportReply) -> None:
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    def _after(self, outcome: Outcome) -> None:
        """Off the critical path: the store, the gauges, the ticker.

        The machine of a link whose event is still unpublished is not stored: a replica
        that takes over from the store then learns the change again from the agents'
        next reports, and publishes it."""
        if self._unpublished:
            waiting = {e.link_id for e in self._unpublished}
            kept: list[HealthRecord] = []
            for record in outcome.records:
                if isinstance(record, LinkStateRecord) and record.link_id in waiting:
                    self.core.resave(record.link_id)
                else:
                    kept.append(record)
            outcome.records = kept
        if outcome.records:
            self._enqueued += 1
            self._records.put_nowait((self._enqueued, outcome.records))
        if outcome.transitions:
            for state, count in self.core.counts().items():
                LINKS.labels(state).set(count)
        if outcome.transitions or outcome.records:
            self._wake.set()  # a machine changed: a reuse or the end of a hold may be due

    async def _writer(self) -> None:
        while not self._stopping:
            last, batch = await self._records.get()
            while not self._records.empty():
                last, more = self._records.get_nowait()
                batch = batch + more
            while True:
                try:
                    await self.store.record_health(batch)
                    break
                except Exception as exc:  # a database outage: keep the batch, try again
                    STORE_ERRORS.inc()
                    log.error("health_records_not_written", records=len(batch), error=str(exc))
                    await asyncio.sleep(1.0)
            self._mark_stored(last)

    async def _ticker(self) -> None:
        while not self._stopping:
            wait = self.core.next_tick(self.clock())
            if self._unpublished:
                wait = min(wait if wait is not None else 1.0, 1.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait if wait is not None else 60.0):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            due = self.core.next_tick(self.clock())
            if (due is not None and due <= 0.01) or self._unpublished:
                if due is not None and due > 0:
                    await asyncio.sleep(due + 0.001)
                await self.tick()
