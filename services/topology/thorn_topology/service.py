"""The topology service's shell around the pure `Fabric`: snapshot, writes, events.

Reads are served from an in-memory snapshot of the store, refreshed whenever the store's
revision moves (another replica may have written). A write validates against the snapshot,
commits with compare-and-set on the revision, with its `topology.changed` in the store's
outbox in the same transaction, and then hands the event to the announcer (announcer.py),
which sends it, or finds it left behind by a replica that died, and sends it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import structlog
from prometheus_client import Counter, Gauge

from thorn.auth import Principal
from thorn.events import Change as EventChange
from thorn.events import TopologyChanged, utcnow
from thorn.fabric import Change, Fabric, FabricError, NotFound
from thorn.store import StaleRevision, Store, unavailable
from thorn.watchdog import building_long_lived
from thorn_topology.announcer import Announcer, Publisher
from thorn_topology.export import SerialisedDocument, serialise
from thorn_topology.offload import Base, Commit, Outcome, Source, replace_fabric, worker_pool

log = structlog.get_logger("thorn.topology")

REVISION = Gauge("thorn_topology_revision", "Topology revision this replica serves")
WRITES = Counter("thorn_topology_writes_total", "Committed topology writes", ["action"])
REJECTED = Counter("thorn_topology_rejected_total", "Writes refused by fabric rules", ["action"])
STALE = Counter(
    "thorn_topology_stale_writes_total",
    "Write attempts that lost the revision's compare-and-set to another replica (redone)",
)
# Events carry at most this many change entries; bigger writes are summarised.
MAX_EVENT_CHANGES = 500
WRITE_ATTEMPTS = 5
# After a lost compare-and-set, a random pause of up to this many seconds times the attempt:
# two replicas taking writes back to back otherwise lose to each other again and again.
STALE_BACKOFF_S = 0.01

Operation = Callable[[Fabric], list[Change]]
T = TypeVar("T")


class TopologyService:
    def __init__(self, store: Store, bus: Publisher | None, store_id: int = 0) -> None:
        self.store = store
        self.bus = bus
        self.store_id = store_id
        self.announcer = Announcer(store, bus, store_id) if bus is not None else None
        self._fabric: Fabric | None = None
        self._lock = asyncio.Lock()
        self._document: SerialisedDocument | None = None
        self._pool: ProcessPoolExecutor | None = None  # big fabric work, started on first use
        self._url = store.engine.url.render_as_string(hide_password=False)
        self._warming: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self.announcer is not None:
            self.announcer.start()
        # The snapshot is loaded now, not by the first request: a k=32 fabric takes ~5 s to
        # load, and an admin's first drain after a start waited that long (8 s under load).
        self._warming = asyncio.create_task(self._warm(), name="topology-snapshot")

    async def _warm(self) -> None:
        try:
            async with self._lock:
                fabric = await self._fresh()
            log.info("snapshot_loaded", revision=fabric.revision, nodes=len(fabric.nodes))
        except Exception as exc:  # the database may be away at start: a request loads it
            log.warning("snapshot_not_loaded_at_start", error=str(exc))

    async def stop(self) -> None:
        """Give queued events a moment to go out, then stop the announcer."""
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.announcer is not None:
            await self.announcer.stop()

    # --- reading --------------------------------------------------------------------------

    @property
    def serving_revision(self) -> int | None:
        """The revision of the snapshot held in memory (None: none loaded yet)."""
        return self._fabric.revision if self._fabric is not None else None

    async def _fresh(self) -> Fabric:
        try:
            revision = await self.store.revision()
        except Exception as exc:
            # The database went away under a request that got this far (authenticated, its
            # write perhaps committed): it is answered from this replica's last snapshot. A
            # write that failed dropped the snapshot it had changed, so none is served.
            if self._fabric is None or unavailable(exc) is None:
                raise
            return self._fabric
        if self._fabric is None or self._fabric.revision != revision:
            with building_long_lived():
                self._fabric = await self.store.load()
            REVISION.set(self._fabric.revision)
        return self._fabric

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[Fabric]:
        """The current fabric, for synchronous reads only (do not keep it)."""
        async with self._lock:
            yield await self._fresh()

    async def document(self) -> SerialisedDocument:
        """The whole fabric as an export document, serialised (and gzipped) once per revision."""
        cached = self._document
        if cached is not None and cached.revision == await self.store.revision():
            return cached  # the common case takes no lock: readers never queue behind readers
        async with self._lock:
            fabric = await self._fresh()
            if self._document is None or self._document.revision != fabric.revision:
                self._document = await asyncio.to_thread(serialise, fabric)
            return self._document

    # --- writing --------------------------------------------------------------------------

    async def write(
        self,
        principal: Principal,
        action: str,
        target: str,
        operation: Operation,
        detail: dict[str, Any] | None = None,
    ) -> tuple[int, list[Change]]:
        """Validate and apply one operation; return the new revision and its changes.

        An operation that changes nothing (a PATCH to the current values, a second drain)
        returns the current revision and commits nothing.
        """

        note = principal.audit
        if note is not None:  # names the audit entry of a refusal too
            note.action, note.target = action, target

        async def attempt(fabric: Fabric) -> tuple[int, list[Change]]:
            try:
                changes = operation(fabric)
            except (FabricError, NotFound):
                REJECTED.labels(action).inc()
                raise  # the fabric refused it before changing anything
            if not changes:
                if note is not None:
                    note.detail["unchanged"] = True
                return fabric.revision, changes
            # The compare-and-set makes the new revision this one or none.
            event = self._event(fabric.revision + 1, principal, [_event_change(c) for c in changes])
            revision = await self.store.commit(
                changes,
                expected_revision=fabric.revision,
                next_link_id=fabric.next_link_id,
                actor=principal.name,
                action=action,
                target=target,
                detail=detail or {},
                event=event.model_dump_json(),
                client=principal.client,
            )
            if note is not None:
                note.recorded = True  # the entry was committed with the write
            fabric.revision = revision
            WRITES.labels(action).inc()
            self._announce(event)
            return revision, changes

        return await self._with_retries(attempt)

    async def replace(
        self, principal: Principal, source: Source, *, dry_run: bool, label: str
    ) -> Outcome:
        """Make a whole new fabric the topology, all or nothing (`dry_run`: validate only).

        The worker process reads, validates and writes it; this process then serves it.
        Raises Refused, FabricError, or BrokenProcessPool when the worker died.
        """

        note = principal.audit
        if note is not None:
            note.action, note.target = "fabric.import", "fabric"
            note.detail.update(source=label, dry_run=dry_run)

        async def attempt(current: Fabric) -> Outcome:
            base = Base(current.revision, current.next_link_id)
            event = self._event(
                current.revision + 1,
                principal,
                [EventChange(kind="fabric", op="replace", key=label)],
            )
            pool, data = self.store.pool, event.model_dump_json()
            commit = None if dry_run else Commit(self._url, principal.name, label, pool, data,
                                                 client=principal.client)  # fmt: skip
            try:
                outcome = await self._offload(replace_fabric, source, base, commit)
            except FabricError:
                REJECTED.labels("fabric.import").inc()
                raise
            if outcome.document is None:
                return outcome
            if note is not None:
                note.recorded = True
            self._document = outcome.document
            WRITES.labels("fabric.import").inc()
            self._announce(event)
            self._fabric = None  # load what the worker stored before anyone reads again
            try:
                await self._fresh()
            except Exception as exc:
                if unavailable(exc) is None:
                    raise
                # Stored all the same (the worker's commit was answered): said so, and the
                # next read loads it.
            return outcome

        return await self._with_retries(attempt)

    async def _offload(self, fn: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            self._pool = worker_pool()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except BrokenProcessPool:
            self._pool = None  # the worker died (killed, out of memory): a new one next time
            raise

    async def _with_retries(self, attempt: Callable[[Fabric], Awaitable[T]]) -> T:
        """Run a write under the lock; on a concurrent write elsewhere, reload and redo it."""
        for tries in range(1, WRITE_ATTEMPTS + 1):
            async with self._lock:
                fabric = await self._fresh()
                try:
                    return await attempt(fabric)
                except StaleRevision:
                    self._fabric = None  # another replica wrote first: reload, validate again
                    STALE.inc()
                except (FabricError, NotFound):
                    raise  # refused by the rules: the snapshot was not touched
                except BaseException:
                    self._fabric = None  # unknown state: reload before the next request
                    raise
            await asyncio.sleep(random.uniform(0, STALE_BACKOFF_S * tries))
        raise FabricError.one((), "the topology kept changing under this write; retry", "conflict")

    # --- events ---------------------------------------------------------------------------

    @staticmethod
    def _event(revision: int, principal: Principal, changes: list[EventChange]) -> TopologyChanged:
        """The topology.changed of a write that makes `revision`."""
        if len(changes) > MAX_EVENT_CHANGES:
            changes = [EventChange(kind="fabric", op="update", key=f"{len(changes)} changes")]
        return TopologyChanged(revision=revision, at=utcnow(), actor=principal.name,
                               changes=changes)  # fmt: skip

    def _announce(self, event: TopologyChanged) -> None:
        """Send a committed write's event; called under the write lock, so in order."""
        if self.announcer is not None:
            self.announcer.queue(event)


def _event_change(change: Change) -> EventChange:
    value = change.value.model_dump(mode="json") if change.value is not None else None
    return EventChange(kind=change.kind, op=change.op, key=change.key, value=value)
