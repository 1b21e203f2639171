"""The pathcomp service's shell around the pure planner: follow events, keep the last good
plan, and (as the elected leader) write desired state to JetStream KV stage by stage.

Every replica computes plans so that any of them answers the REST API; only the leader
writes desired state and publishes `paths.changed`. A new plan replaces the served one only
when it is complete: readers always see the last good plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import orjson
import structlog
from prometheus_client import Counter, Gauge, Histogram

from thorn.bus import DesiredStateConflict, PublishError
from thorn.desired import node_key
from thorn.events import (
    Event,
    FailoverEvent,
    FlipCommand,
    LinkHealthChanged,
    PathsChanged,
    TopologyChanged,
    Trace,
    new_trace_id,
    utcnow,
)
from thorn.fabric import Fabric, NotReplayable
from thorn.model import AdminState, Role
from thorn.store import Store
from thorn.watchdog import building_long_lived, keep_long_lived
from thorn_pathcomp.acks import AgentAcks
from thorn_pathcomp.drains import DrainReport, RouteLoad, pending_agents, route_load
from thorn_pathcomp.flips import link_flips, prepare_flips
from thorn_pathcomp.node_documents import (
    HOST_STAGE,
    DesiredStates,
    HostsMoved,
    NodeChange,
    diff,
)
from thorn_pathcomp.plan import Plan, PlanSummary, PlanUpdate

log = structlog.get_logger("thorn.pathcomp")

PLAN_SECONDS = Histogram(
    "thorn_pathcomp_plan_seconds",
    "Time to compute a plan",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
TOPOLOGY_SECONDS = Histogram(
    "thorn_pathcomp_topology_change_seconds",
    "From a topology.changed event taken to its documents written: `hosts` when only hosts "
    "changed (their documents alone are rebuilt), `paths` when only admin states did (a "
    "drain: the documents advance as for link failures), `whole` otherwise (built afresh)",
    ["scope"],
    buckets=(0.01, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PLAN_REVISION = Gauge("thorn_pathcomp_plan_revision", "Plan revision this replica serves")
UNPLANNED = Gauge(
    "thorn_pathcomp_link_changes_unplanned",
    "Link health changes received and not yet in a plan (waiting or being planned)",
)
UNPROTECTED = Gauge("thorn_pathcomp_unprotected_pairs", "Host pairs without a disjoint backup")
SUMMARIES_GIVEN_WAY = Counter(
    "thorn_pathcomp_summaries_given_way_total",
    "Plan summaries (risks and stretch for GET /plan) stopped for a change, then started again",
)
KV_WRITES = Counter("thorn_pathcomp_kv_writes_total", "Desired-state documents written")
FENCED_WRITES = Counter(
    "thorn_pathcomp_fenced_writes_total",
    "Desired-state writes that found another writer's revision in the KV (compare and set)",
)
CENTRAL_FLIPS = Counter(
    "thorn_pathcomp_central_flips_total", "Urgent flip messages sent to source hosts"
)

# Documents read or written at once. At k=32 a switch's is ~180 KB, and the lease's renewal
# shares the connection: all 9,472 at once queued ~1 GB ahead of it (the lease was lost) and
# a new leader's reads overran the client's 64 MB of pending input (a slow consumer).
DOCUMENTS_IN_FLIGHT = 64
REPLAN_HOLD_SECONDS = 0.02  # how long re-protection waits for a burst of link events

# Health states in which a link carries no traffic for path computation.
OUT_OF_SERVICE = {"down", "flapping", "drained"}


# --- the CPU-bound steps, run in a worker thread (the event loop renews the lease) -------


def _full_plan(fabric: Fabric, overlay: dict[int, bool]) -> Plan:
    """A plan of the whole fabric, with the links health holds out taken out."""
    plan = Plan.compute(fabric, summarise=False)
    if overlay:
        plan, _ = plan.update_links(overlay, fabric.revision)
    return plan


def _updated_plan(
    plan: Plan, fabric: Fabric, moved: set[str] | None, overlay: dict[int, bool]
) -> tuple[Plan, PlanUpdate]:
    """`plan` moved to `fabric` (`moved`: the hosts of a change of hosts only), with the
    links health holds out kept out (in the same step)."""
    return plan.update(fabric, moved, held_out={k for k, up in overlay.items() if not up})


def _to_resync(
    states: DesiredStates, nodes: list[str], entries: list[Entry | None]
) -> tuple[dict[str, int], list[tuple[str, bytes]]]:
    """({node: KV revision} of the documents the KV holds as `states` has them, [(node,
    document)] of those it must be given)."""
    held: dict[str, int] = {}
    stale: list[tuple[str, bytes]] = []
    for node, entry in zip(nodes, entries, strict=True):
        document = states.document(node)
        if entry is not None and _same_document(entry, document):
            held[node] = entry.revision
        else:
            stale.append((node, document))
    return held, stale


def _changes(old: DesiredStates | None, new: DesiredStates, afresh: bool) -> list[NodeChange]:
    """The documents `new` changes, by stage; `afresh`: built, not advanced, from `old`."""
    if old is not None and afresh:
        new.compare_with(old)  # documents built afresh still move destination outward
    return diff(old, new)


class Replayed(NamedTuple):
    """A topology event replayed on the held fabric: the result (None: read the store),
    the hosts it touched (None: not only hosts), whether it set admin states only."""

    fabric: Fabric | None
    moved: set[str] | None = None
    drained: bool = False


class Entry(Protocol):
    @property
    def revision(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...


def _same_document(entry: Entry, document: bytes) -> bool:
    """Whether the KV's value is `document` apart from its plan revision (a new leader's
    counts differently). The term is compared: a new leader stamps every document with its
    own, so that agents can refuse the old leader's."""
    value = entry.value
    if value is None:
        return False
    try:
        old, new = orjson.loads(value), orjson.loads(document)
    except orjson.JSONDecodeError:
        return False
    for doc in (old, new):
        doc.pop("plan_revision", None)
    return bool(old == new)


class KeyValue(Protocol):
    async def put(self, node: str, value: bytes) -> int: ...

    async def update(self, node: str, value: bytes, *, last: int) -> int: ...

    async def get(self, node: str) -> Entry | None: ...


class Deposed(Exception):
    """Another leader wrote a document since this replica last did, and this one is not the
    leader any more: it stops writing (the new leader has resynced)."""


class Publisher(Protocol):
    async def publish(self, event: Event, *, msg_id: str | None = None) -> int | None: ...


@dataclass
class PlanStatus:
    revision: int
    topology_revision: int
    compute_seconds: float
    kind: str  # "full" or "incremental"
    recomputed_groups: int
    published_nodes: int


class PathService:
    def __init__(
        self,
        store: Store,
        kv: KeyValue | None,
        bus: Publisher | None,
        is_leader: Callable[[], bool] = lambda: True,
        acks: AgentAcks | None = None,
        stage_timeout: float = 2.0,
        term: Callable[[], int | None] = lambda: 0,
    ) -> None:
        self.store = store
        # The leader's term (the election's fencing token), stamped on every document it
        # writes: agents refuse documents of a term older than one they have taken, so a
        # paused old leader that writes once more changes nothing.
        self.term = term
        self.acks = acks or AgentAcks()
        self.stage_timeout = stage_timeout
        self.kv = kv
        self.bus = bus
        self.is_leader = is_leader
        self._in_flight = asyncio.Semaphore(DOCUMENTS_IN_FLIGHT)  # documents being written
        self.fabric: Fabric | None = None
        self.plan: Plan | None = None
        self.states: DesiredStates | None = None
        self.status: PlanStatus | None = None
        self.revision = 0
        self.link_states: dict[int, bool] = {}  # health's view, on top of admin states
        self._vni_written: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        # Work that holds or waits for the lock (`_changing`): a running summary gives way.
        self._changes = 0
        self._no_changes = asyncio.Event()
        self._no_changes.set()
        # Risks and stretch for GET /plan, of the plan served at `summary_revision` (None:
        # none yet); computed after a plan is served (`_summarise_later`), so they can lag it.
        self.summary: PlanSummary | None = None
        self.summary_revision: int | None = None
        self._summariser: asyncio.Task[None] | None = None
        self._stopping = False
        # A copy of the held fabric, made between changes (the fabric it copies, the copy):
        # the next change replays its rows on it instead of copying then (~30 ms at k=32).
        self._spare: tuple[Fabric, Fabric] | None = None
        # For drain reports: the plan revision at which each node's document last changed,
        # the KV revision this replica last wrote for it, and since which plan (and when)
        # each link or node has been out of service ((kind, name) -> (plan revision, time)).
        self.changed_at: dict[str, int] = {}
        self._received_at: dict[int, datetime] = {}  # link -> its latest event's arrival
        self._background: set[asyncio.Task[None]] = set()
        self.took_over = asyncio.Event()  # set once this replica, leading, has `take_over`
        self.written: dict[str, int] = {}
        self.out_since: dict[tuple[str, str], tuple[int, datetime]] = {}
        self._load: tuple[Plan, RouteLoad] | None = None
        # Link health changes waiting for re-protection, and the replanner that takes them.
        self._pending: dict[int, LinkHealthChanged] = {}
        self._wake = asyncio.Event()
        self._planning: dict[int, LinkHealthChanged] = {}  # being planned now
        self._idle = asyncio.Event()
        self._idle.set()
        self._replanner: asyncio.Task[None] | None = None
        self._closing = False
        self._flipped: dict[str, set[str]] = {}  # source host -> peers flipped, until re-protected
        # node -> KV revision of the last rollout's last write to it (cut-off nodes left out):
        # re-protection is over once every one of them is applied.
        self._last_writes: dict[str, int] = {}
        self._health_loaded = False

    # --- computing --------------------------------------------------------------------------

    async def recompute(self, reason: str) -> PlanStatus:
        """A full plan from the store's current topology (start, admin request, big changes)."""
        async with self._changing():
            with building_long_lived():  # no collection walks a big fabric
                fabric = await self.store.load()
            if not self._health_loaded:
                await self._load_health()
            start = time.perf_counter()
            with building_long_lived():  # the plan and its documents, frozen unwalked
                overlay = self._health_overlay(fabric)
                plan = await asyncio.to_thread(_full_plan, fabric, overlay)
                seconds = time.perf_counter() - start
                PLAN_SECONDS.labels("full").observe(seconds)
                states = await asyncio.to_thread(
                    DesiredStates.build, fabric, plan, self.revision + 1
                )
            return await self._adopt(fabric, plan, states, None, seconds, "full", reason, vnis=True)

    async def _load_health(self) -> None:
        """Health's current view of every link, from the store (health keeps each link's
        machine there): a restarted pathcomp must not plan over links health holds down.
        Events received since (link_states already set) are newer and win."""
        try:
            records = await self.store.health_states()
        except Exception as exc:  # health's tables may not exist yet: plan on admin states
            log.warning("health_states_unreadable", error=str(exc))
            return
        for r in records:
            if r.state is not None:
                self.link_states.setdefault(r.link_id, r.state not in OUT_OF_SERVICE)
        self._health_loaded = True
        down = sorted(k for k, up in self.link_states.items() if not up)
        log.info("health_states_loaded", links=len(records), out_of_service=down[:20])

    def _health_overlay(self, fabric: Fabric) -> dict[int, bool]:
        """Links health reports out of service (health can take links out, never put an
        admin-down link back)."""
        return {k: False for k, up in self.link_states.items() if not up and k in fabric.links}

    async def on_topology(self, event: TopologyChanged) -> None:
        """Replan incrementally: a drain or a new link recomputes only what it touches, and a
        change of hosts only (one joining, one leaving) rewrites only their documents and
        their switches' routes toward them. The event's rows are replayed on the fabric
        held here; the store is read whole only when they cannot be (a gap in revisions, a
        bulk import)."""
        if self.fabric is not None and event.revision <= self.fabric.revision:
            return  # already planned at this revision or later
        if self.plan is None:
            await self.recompute(f"topology revision {event.revision}")
            return
        async with self._changing():
            assert self.plan is not None
            received = time.perf_counter()
            fabric, moved, drained = self._replayed(event)
            if fabric is None:
                with building_long_lived():  # no collection walks a big fabric
                    fabric = await self.store.load()
                if fabric.revision <= (self.fabric.revision if self.fabric else -1):
                    return
            start = time.perf_counter()
            with building_long_lived():  # the new plan and documents, frozen unwalked
                plan, update = await asyncio.to_thread(
                    _updated_plan, self.plan, fabric, moved, self._health_overlay(fabric)
                )
                seconds = time.perf_counter() - start
                kind = "full" if update.full else "incremental"
                PLAN_SECONDS.labels(kind).observe(seconds)
                # Hosts only, or admin states only (a drain: paths move as when links
                # fail): advance the documents; else build them afresh, staged from the old.
                held = self.states if not update.full else None
                if held is not None and (moved is not None or drained):
                    hosts = None if moved is None else HostsMoved.of(fabric, moved, held.topology)
                    states = await asyncio.to_thread(
                        held.advance, plan, update.recomputed, update.dropped,
                        self.revision + 1, hosts,
                    )  # fmt: skip
                else:
                    held, moved = None, None
                    states = await asyncio.to_thread(
                        DesiredStates.build, fabric, plan, self.revision + 1
                    )
            states_s = time.perf_counter() - start - seconds
            log.info(
                "topology_replanned",
                revision=fabric.revision,
                replay_ms=round((start - received) * 1000, 1),
                plan_ms=round(seconds * 1000, 1),
                states_ms=round(states_s * 1000, 1),
            )
            await self._adopt(
                fabric,
                plan,
                states,
                update,
                seconds,
                kind,
                f"topology revision {fabric.revision}",
                vnis=True,
                fresh=held is None,
            )
            scope = "whole" if held is None else "hosts" if moved is not None else "paths"
            TOPOLOGY_SECONDS.labels(scope).observe(time.perf_counter() - received)

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """Hold the lock for a change of plan; while any waits for it or holds it, a
        summary in progress gives way (it would hold the GIL from the change)."""
        self._changes += 1
        self._no_changes.clear()
        try:
            async with self._lock:
                yield
        finally:
            self._changes -= 1
            if not self._changes:
                self._no_changes.set()

    def _summarise_later(self) -> None:
        """Between changes: a spare copy of the held fabric for the next change, then the
        risks and stretch of the served plan. Both after the plan is served: a summary of
        every host pair takes ~2 s of CPU at k=32, and the next change (a host added, the
        next link of a dying switch) must not wait behind it."""
        if self._summariser is None or self._summariser.done():
            self._summariser = asyncio.create_task(
                self._summarise_served(), name="pathcomp-summary"
            )

    async def _summarise_served(self) -> None:
        while True:
            await self._no_changes.wait()
            fabric = self.fabric
            if fabric is not None and (self._spare is None or self._spare[0] is not fabric):
                with building_long_lived():
                    spare = await asyncio.to_thread(fabric.copy)
                if self.fabric is fabric:
                    self._spare = (fabric, spare)
                continue
            plan, status = self.plan, self.status
            if plan is None or status is None or self.summary_revision == status.revision:
                return
            with building_long_lived():  # ~2 s of allocations at k=32, none walked
                summary = await asyncio.to_thread(
                    plan.summarise_unless, lambda: self._changes > 0 or self._stopping
                )
            if summary is None or self.plan is not plan:
                SUMMARIES_GIVEN_WAY.inc()
                continue  # a change came: summarise what it serves, once it is done
            plan.summary = summary
            self.summary, self.summary_revision = summary, status.revision
            UNPROTECTED.set(summary.unprotected_pairs)

    def _replayed(self, event: TopologyChanged) -> Replayed:
        """The held fabric moved to the event's revision by its rows, with what they touch;
        no fabric when it cannot be (then read the store)."""
        fabric = self.fabric
        if fabric is None:
            return Replayed(None)
        # The served plan's fabric stays as it is until the new one is adopted: replay on a
        # copy, the spare one made since the last change if there is one.
        spare, self._spare = self._spare, None
        try:
            new = fabric.replayed(
                event.revision,
                event.changes,
                spare[1] if spare is not None and spare[0] is fabric else None,
            )
        except NotReplayable as exc:
            log.info("topology_read_whole", revision=event.revision, why=str(exc))
            return Replayed(None)
        moved = fabric.hosts_touched(event.changes)
        return Replayed(new, moved, moved is None and fabric.admin_states_only(event.changes))

    async def on_link_health(self, event: LinkHealthChanged) -> None:
        """A link's health changed: first the urgent flips (a link going out of service),
        then re-protection, coalesced with any other link changes that arrive meanwhile."""
        received = utcnow()
        up = event.state not in OUT_OF_SERVICE
        if self.link_states.get(event.link_id) == up:
            return
        self.link_states[event.link_id] = up
        self._received_at[event.link_id] = received
        if not up:
            await self._flip_now(event, received)
        self._pending[event.link_id] = event
        UNPLANNED.set(len(self._pending) + len(self._planning))
        self._idle.clear()
        self._wake.set()
        if self._replanner is None or self._replanner.done():
            self._replanner = asyncio.create_task(self._replan_links(), name="pathcomp-replan")

    async def _flip_now(self, event: LinkHealthChanged, received: datetime) -> None:
        """Tier 3 of failover: one urgent flip per affected source host, from the served
        plan, before anything is recomputed (the leader only: one voice toward agents)."""
        states, bus = self.states, self.bus
        if states is None or bus is None or not self.is_leader():
            return
        start = time.perf_counter()
        flips = link_flips(states, event.link_id)
        trace = event.trace or Trace(id=new_trace_id())
        trace = trace.then("pathcomp_received", "pathcomp", at=received)
        trace = trace.then("pathcomp_decided", "pathcomp")
        element = f"link {event.link_id}"
        sent = 0
        for flip in flips:
            command = FlipCommand(
                node=flip.node, peers=list(flip.peers), colour=flip.colour, element=element,
                plan_revision=self.revision, trace=trace,
            )  # fmt: skip
            try:
                await bus.publish(command)
                sent += 1
            except PublishError as exc:  # the agent's own BFD is the next line of defence
                log.error("central_flip_not_sent", node=flip.node, error=str(exc))
            self._flipped.setdefault(flip.node, set()).update(flip.peers)
        CENTRAL_FLIPS.inc(sent)
        log.info("central_flips", link_id=event.link_id, state=event.state, trace=trace.id,
                 sources=sent, pairs=sum(len(f.peers) for f in flips),
                 ms=round((time.perf_counter() - start) * 1000, 3))  # fmt: skip

    async def _replan_links(self) -> None:
        """Re-protection for link health changes: whatever arrived while the previous
        replan ran is applied as one update (a whole switch failing is one replan)."""
        while not self._closing:
            await self._wake.wait()
            if self._closing:
                return
            # A short hold, as routers throttle SPF runs (RFC 8405): the other links of a
            # failing switch arrive within milliseconds and join this replan. The urgent
            # flips went out before; only re-protection waits.
            await asyncio.sleep(REPLAN_HOLD_SECONDS)
            self._wake.clear()
            events, self._pending = self._pending, {}
            if not events:
                self._idle.set()
                continue
            self._planning = events
            try:
                await self._replan(events)
            except Exception:  # keep serving the last good plan; the next change retries
                log.exception("replan_failed", links=sorted(events))
            finally:
                self._planning = {}
                UNPLANNED.set(len(self._pending))
            if not self._pending:
                self._idle.set()

    async def _replan(self, events: dict[int, LinkHealthChanged]) -> None:
        asked = time.perf_counter()
        async with self._changing():
            locked = time.perf_counter()
            if self.plan is None or self.states is None or self.fabric is None:
                return
            fabric = self.fabric
            changes = {
                link_id: self.link_states[link_id]
                and fabric.links[link_id].admin_state.value == "up"
                and link_id not in fabric.miscabled  # health's up does not undo the check
                for link_id in events
                if link_id in fabric.links
            }
            if not changes:
                return
            start = time.perf_counter()
            with building_long_lived():  # the new plan and documents, frozen unwalked
                plan, update = await asyncio.to_thread(
                    self.plan.update_links, changes, fabric.revision
                )
                states = await asyncio.to_thread(
                    self.states.advance, plan, update.recomputed, update.dropped, self.revision + 1
                )
            seconds = time.perf_counter() - start
            PLAN_SECONDS.labels("incremental").observe(seconds)
            reason = ", ".join(f"link {i} {e.state}" for i, e in sorted(events.items()))
            log.info("replan_computed", reason=reason, ms=round(seconds * 1000, 1),
                     lock_wait_ms=round((locked - asked) * 1000, 1))  # fmt: skip
            await self._adopt(
                fabric, plan, states, update, seconds, "incremental", reason, vnis=False
            )
            # Waiting for the agents' acks is done off the lock: the next replan (the other
            # links of a failing switch, a restore) must not wait behind a late agent.
            nodes = sorted(n for n, at in self.changed_at.items() if at == self.revision)
            self._after(self._reprotected(events, reason, dict(self._last_writes), nodes,
                                          self.revision))  # fmt: skip

    def _after(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name="pathcomp-reprotected")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reprotected(self, events: dict[int, LinkHealthChanged], reason: str,
                           last_writes: dict[str, int], nodes: list[str],
                           revision: int) -> None:  # fmt: skip
        """Once every node the replan wrote has applied its last write (or the stage timeout
        passed): flipped sources may move back, and each failure's trace gets its last hop."""
        late = await self.acks.wait(last_writes, self.stage_timeout)
        await self._tell_reprotected(revision)
        await self._record_reprotection(events, reason, nodes, late)

    async def _record_reprotection(self, events: dict[int, LinkHealthChanged], reason: str,
                                   nodes: list[str], late: list[str]) -> None:  # fmt: skip
        """The end of re-protection, as the last hop of each failure's trace: the nodes
        this plan rewrote have applied it (or the stage timeout passed: `late`)."""
        if self.bus is None or not self.is_leader():
            return
        traced = {i: e for i, e in events.items() if e.trace is not None}
        if not nodes or not traced:
            return
        for link_id, event in sorted(traced.items()):
            assert event.trace is not None
            trace = event.trace
            received = self._received_at.get(link_id)
            if received is not None:
                trace = trace.then("pathcomp_received", "pathcomp", at=received)
            record = FailoverEvent(
                node="pathcomp", peers=nodes, from_colour=None, to_colour="planned",
                at=utcnow(), reason=f"re-protection: {reason}"
                + (f" (not acknowledged: {', '.join(late[:5])})" if late else ""),
                tier="reprotection", trace=trace.then("reprotected", "pathcomp"),
            )  # fmt: skip
            try:
                await self.bus.publish(record)
            except PublishError as exc:  # the history misses one hop; the plan stands
                log.warning("reprotection_not_recorded", link_id=link_id, error=str(exc))

    async def _tell_reprotected(self, revision: int) -> None:
        """The new plan is written and applied (the caller waited for the last stage, the
        hosts' own documents): sources flipped earlier may move back to their preferred
        colour (revertive agents do, after their hold-down)."""
        if self.bus is None or not self._flipped:
            return
        if not self.is_leader():  # kept: this replica, leading again, tells them later
            return
        flipped, self._flipped = self._flipped, {}
        for node, peers in sorted(flipped.items()):
            command = FlipCommand(node=node, kind="reprotected", peers=sorted(peers),
                                  element="re-protection", plan_revision=revision)  # fmt: skip
            try:
                await self.bus.publish(command)
            except PublishError as exc:
                log.warning("reprotected_not_sent", node=node, error=str(exc))

    async def _write(self, node: str, document: bytes) -> int:
        """Write `node`'s document only over the revision this replica wrote last (compare
        and set): a write by another leader in between is seen here, never overwritten by a
        replica that lost the lease."""
        assert self.kv is not None
        last = self.written.get(node)
        if last is None:
            return await self.kv.put(node_key(node), document)
        try:
            return await self.kv.update(node_key(node), document, last=last)
        except DesiredStateConflict:
            FENCED_WRITES.inc()
            if not self.is_leader():
                raise Deposed(node) from None
            # Still the leader (the key was written by hand, or by a leader this one
            # outlived): its plan is the one to serve.
            log.warning("desired_state_written_by_someone_else", node=node)
            return await self.kv.put(node_key(node), document)

    async def take_over(self, last_published: int) -> None:
        """This replica just became leader: its plan revisions continue after the last one
        any leader published (agents compare a flip's plan revision with a re-protection's,
        and a restarted or long-following replica counts from elsewhere), and every host
        hears that this plan re-protects all its peers, so flips the previous leader made
        (and would have reverted) are reverted too. An agent whose own BFD sees a peer's
        preferred path down keeps that flip."""
        async with self._changing():
            self.revision = max(self.revision, last_published) + 1
            states, bus = self.states, self.bus
        if states is None or bus is None or not self.is_leader():
            return
        told = 0
        for host in sorted(states.hosts):
            command = FlipCommand(node=host, kind="reprotected", every_peer=True,
                                  element="new leader", plan_revision=self.revision)  # fmt: skip
            try:
                await bus.publish(command)
                told += 1
            except PublishError as exc:
                log.warning("reprotected_not_sent", node=host, error=str(exc))
        log.info("took_over", plan_revision=self.revision, hosts_told=told)
        self.took_over.set()

    async def replanned(self, within: float = 30.0) -> None:
        """Wait until every link change received so far is planned and written (tests)."""
        await asyncio.wait_for(self._idle.wait(), within)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._summariser is not None:
            self._stopping = True  # the summary's thread gives way at its next group
            self._summariser.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._summariser
        if self._replanner is not None:
            # The flag as well as the cancel: on Python 3.11 a cancel that lands as a
            # nats-py wait_for completes (a KV write mid-replan) is swallowed, and the loop
            # would go back to waiting for the next link event for ever (seen in the fabric
            # lane: the service's stop hung). The flag ends it at its next turn.
            self._closing = True
            self._wake.set()
            self._replanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replanner

    async def _adopt(
        self,
        fabric: Fabric,
        plan: Plan,
        states: DesiredStates,
        update: PlanUpdate | None,
        seconds: float,
        kind: str,
        reason: str,
        *,
        vnis: bool,
        fresh: bool = False,
    ) -> PlanStatus:
        old = self.states
        comparing = time.perf_counter()
        # Off the event loop: at k=32 comparing 9,472 documents takes seconds, and a loop
        # held that long misses the lease's renewal (the lease is lost, a resync follows).
        changes = await asyncio.to_thread(_changes, old, states, fresh or update is None)
        # The next failure's flips are made while the rollout waits for agents (up to a
        # second after a k=32 drain), and are ready before this plan is the one served.
        flips_ready = asyncio.ensure_future(asyncio.to_thread(prepare_flips, plan))
        published = 0
        stage_timings: list[dict[str, float]] = []  # for the log: where a rollout's time goes
        adopting = time.perf_counter()
        states.term = self.term() or 0
        try:
            if self.is_leader() and self.kv is not None:
                if vnis:
                    documents = await asyncio.to_thread(states.vni_documents)
                    for key, document in documents.items():
                        if self._vni_written.get(key) != document:  # unchanged: not rewritten
                            await self.kv.put(key, document)
                            self._vni_written[key] = document
                            published += 1
                published += await self._roll_out(states, changes, plan.graph.cut_off(),
                                                  stage_timings)  # fmt: skip
                KV_WRITES.inc(published)
            rolled_out = time.perf_counter()
        finally:
            await flips_ready  # a worker thread: it ends whatever happens here
        flips_waited_ms = (time.perf_counter() - rolled_out) * 1000
        self.revision += 1
        for change in changes:
            self.changed_at[change.node] = self.revision
        self.fabric, self.plan, self.states = fabric, plan, states
        self._track_out_of_service(fabric, plan)
        self.status = PlanStatus(
            self.revision,
            fabric.revision,
            seconds,
            kind,
            len(update.recomputed) if update else len(plan.trees),
            published,
        )
        PLAN_REVISION.set(self.revision)
        self._summarise_later()
        log.info(
            "plan_adopted",
            revision=self.revision,
            topology_revision=fabric.revision,
            kind=kind,
            reason=reason,
            seconds=round(seconds, 4),
            published=published,
            compare_ms=round((adopting - comparing) * 1000, 1),
            rollout_ms=round((rolled_out - adopting) * 1000, 1),
            flips_wait_ms=round(flips_waited_ms, 1),
            stages=stage_timings,
        )
        if self.is_leader() and self.bus is not None:
            event = PathsChanged(
                revision=self.revision, topology_revision=fabric.revision, at=utcnow()
            )
            try:
                await self.bus.publish(event)
            except Exception as exc:  # the documents are written; agents watch the KV
                log.error("paths_changed_not_published", error=str(exc))
        # The next failure's urgent flips must not wait behind a full collection of the plan.
        keep_long_lived()
        return self.status

    async def _roll_out(self, states: DesiredStates, changes: list[NodeChange],
                        cut_off: set[str], timings: list[dict[str, float]]) -> int:  # fmt: skip
        """Write the changed documents stage by stage (destination outward); returns how
        many were written. A switch's write of a stage waits only for the agents of the
        neighbours its new routes point at (`DesiredStates.depends_on`), once they applied
        what this rollout wrote for them: waiting for every agent of the stage before, as
        first built, made a whole stage wait for its slowest agent, often a dying switch's
        that nothing points at any more. Hosts (and the removals after them) still wait for
        every switch. Agents of nodes the plan cuts off are never waited for: nothing
        forwards through them, and a dead node's agent never answers."""
        stages = sorted({s for c in changes for s in c.stages})
        prior: dict[str, int] = {}  # node -> KV revision this rollout last wrote for it
        published = 0

        async def one(node: str, stage: int, deps: set[str]) -> tuple[str, int]:
            waited = {d: prior[d] for d in deps if d in prior and d not in cut_off}
            if waited and (late := await self.acks.wait(waited, self.stage_timeout)):
                log.warning("stage_not_acknowledged", stage=stage, node=node, late=late[:10],
                            count=len(late))  # fmt: skip
            # Rendered only once it may be written: a stage's documents all at once were
            # ~225 MB at k=32's start (every node), on top of the plan.
            async with self._in_flight:
                document = await asyncio.to_thread(states.document_at, node, stage)
                revision = await self._write(node, document)
            self.written[node] = revision  # the next write compares with this one
            return node, revision

        for stage in stages:
            if not self.is_leader():  # lost the lease mid-write: the new leader resyncs
                log.warning("leadership_lost_while_writing", stage=stage)
                break
            begun = time.perf_counter()
            nodes = [c.node for c in changes if stage in c.stages]
            if stage >= HOST_STAGE:
                # Hosts and removals wait for every switch, once for the whole stage (each
                # of k=32's 8,192 hosts waiting on its own held the loop for seconds).
                deps: dict[str, set[str]] = {n: set() for n in nodes}
                every = {d: r for d, r in prior.items() if d not in cut_off}
                if every and (late := await self.acks.wait(every, self.stage_timeout)):
                    log.warning("stage_not_acknowledged", stage=stage, late=late[:10],
                                count=len(late))  # fmt: skip
            else:  # hop by hop, walked off the loop (seconds for a k=32 stage)
                deps = await asyncio.to_thread(
                    lambda: {n: states.depends_on(n, stage) for n in nodes}  # noqa: B023
                )
            try:
                written = dict(await asyncio.gather(*(one(n, stage, deps[n]) for n in nodes)))
            except Deposed as exc:
                log.warning("deposed_while_writing", stage=stage, node=str(exc))
                break
            published += len(written)
            prior.update(written)
            timings.append({"stage": stage, "nodes": len(written),
                            "ms": round((time.perf_counter() - begun) * 1000, 1)})  # fmt: skip
        # Every node's last write, not the last stage's alone: a node nothing depends on may
        # still be applying an earlier stage.
        self._last_writes = {n: r for n, r in prior.items() if n not in cut_off}
        return published

    async def resync(self) -> int:
        """On becoming leader: write every document the KV does not hold as this replica's
        plan has it (a dead leader's unfinished stages, or a term that saw other events),
        switches first and hosts last. Returns the documents written.

        A chunk's documents are read without the lock and compared and written under it: at
        k=32 the pass reads and compares 9,472 documents (~5 s), and a change arriving
        meanwhile (a host added) must not wait for all of it. A chunk compares with the plan
        served when it holds the lock; a document a change wrote after the chunk's read
        compares as stale and is written once more, as the same plan has it."""
        async with self._changing():
            if self.states is None or self.kv is None or not self.is_leader():
                return 0
            self.states.term = self.term() or 0  # a new term: every document is stamped again
            batches = (sorted(self.states.switch_routes), sorted(self.states.hosts))
            kv = self.kv
        written = 0
        for batch in batches:
            for at in range(0, len(batch), DOCUMENTS_IN_FLIGHT):
                nodes = batch[at : at + DOCUMENTS_IN_FLIGHT]
                entries = await asyncio.gather(*(kv.get(node_key(n)) for n in nodes))
                async with self._changing():
                    if self.states is None or not self.is_leader():
                        return written
                    written += await self._resync_chunk(self.states, kv, nodes, entries)
        KV_WRITES.inc(written)
        log.info("resynced_as_leader", documents=written, plan_revision=self.revision)
        return written

    async def _resync_chunk(
        self, states: DesiredStates, kv: KeyValue, nodes: list[str], entries: list[Entry | None]
    ) -> int:
        """Under the lock: write those of `nodes` whose read `entries` differ from the plan
        (a node a change removed since the pass began is left to that change)."""
        kept = [(n, e) for n, e in zip(nodes, entries, strict=True)
                if n in states.hosts or n in states.switch_routes]  # fmt: skip
        # Off the loop (at k=32 the loop must keep renewing the new lease).
        held, stale = await asyncio.to_thread(
            _to_resync, states, [n for n, _ in kept], [e for _, e in kept]
        )
        for node, revision in held.items():  # later writes compare with the newest
            self.written[node] = max(revision, self.written.get(node, 0))
        revisions = await asyncio.gather(
            *(kv.put(node_key(node), document) for node, document in stale)
        )
        for (node, _), revision in zip(stale, revisions, strict=True):
            self.written[node] = revision
        return len(stale)

    # --- drains -----------------------------------------------------------------------------

    def _track_out_of_service(self, fabric: Fabric, plan: Plan) -> None:
        """Remember since which plan each link and node has been out of service."""
        out = {("link", str(link_id)) for link_id in plan.graph.excluded if link_id in fabric.links}
        up = AdminState.up
        out |= {("node", n) for n, nd in fabric.nodes.items() if nd.admin_state is not up}
        now = utcnow()
        self.out_since = {key: self.out_since.get(key, (self.revision, now)) for key in out}

    async def route_load(self) -> RouteLoad:
        """Routes per link and switch of the served plan (computed once per plan)."""
        plan = self.plan
        assert plan is not None
        if self._load is None or self._load[0] is not plan:
            self._load = (plan, await asyncio.to_thread(route_load, plan))
        return self._load[1]

    def drained(self) -> list[tuple[str, str]]:
        """(kind, name) of every drained link (by id) and node (by name) in the served plan."""
        fabric = self.fabric
        if fabric is None:
            return []
        links = sorted(i for i, lk in fabric.links.items() if lk.admin_state is AdminState.drained)
        nodes = sorted(n for n, nd in fabric.nodes.items() if nd.admin_state is AdminState.drained)
        return [("link", str(i)) for i in links] + [("node", n) for n in nodes]

    async def drain_report(self, kind: str, name: str) -> DrainReport:
        """Whether link `name` (an id) or node `name` still carries traffic.

        Raises NotFound for an element the served plan's topology does not have; the
        caller checks that a plan exists.
        """
        fabric, plan, status = self.fabric, self.plan, self.status
        assert fabric is not None and plan is not None and status is not None
        load = await self.route_load()
        isolated = set(plan.graph.groups.get((), []))
        if kind == "link":
            link = fabric.link(int(name))
            admin_state = link.admin_state
            in_service = link.id not in plan.graph.excluded
            routes = load.link(link.id)
            cut = {end.node for end in (link.a, link.b) if end.node in isolated}
        else:
            node = fabric.node(name)
            admin_state = node.admin_state
            in_service = admin_state is AdminState.up
            if node.role is Role.switch:
                routes = load.switch(name)
            else:  # a host's routes: each crosses exactly one of its links
                own = [load.link(a.link_id) for a in plan.graph.attachments.get(name, [])]
                routes = (sum(r for r, _ in own), sum(b for _, b in own))
            cut = {
                end.node
                for lk in fabric.links.values()
                if name in (lk.a.node, lk.b.node)
                for end in (lk.a, lk.b)
                if end.node in isolated
            }
        since = self.out_since.get((kind, name)) if not in_service else None
        pending: tuple[str, ...] = ()
        silent: tuple[str, ...] = ()
        if since is not None:
            nodes = sorted(n for n, at in self.changed_at.items() if at >= since[0])
            written = await self._written_revisions(nodes)
            live = {n for n in nodes if self.acks.live(n)}
            pending, silent = pending_agents(written, self.acks.applied, live)
        return DrainReport(
            kind=kind, element=name, admin_state=admin_state.value, in_service=in_service,
            routes=routes, plan_revision=status.revision,
            topology_revision=status.topology_revision,
            out_of_service_plan=since[0] if since else None, since=since[1] if since else None,
            agents_pending=pending, agents_silent=silent, hosts_cut_off=tuple(sorted(cut)),
            replanning=self._lock.locked(),
        )  # fmt: skip

    async def _written_revisions(self, nodes: list[str]) -> dict[str, int]:
        """The KV revision of each node's desired state: what this replica wrote, else (a
        replica that does not lead: another one writes) what the KV holds now."""
        mine = self.written if self.is_leader() else {}
        out = {n: mine[n] for n in nodes if n in mine}
        missing = [n for n in nodes if n not in out]
        if missing and self.kv is not None:
            kv = self.kv
            entries = await asyncio.gather(*(kv.get(node_key(n)) for n in missing))
            out.update({n: e.revision for n, e in zip(missing, entries, strict=True) if e})
        return out
