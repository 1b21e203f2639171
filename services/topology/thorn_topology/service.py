"""The topology service's shell around the pure `Fabric`: snapshot, writes, events.

Reads are served from an in-memory snapshot of the store, refreshed whenever the store's
revision moves (another replica may have written). A write validates against the snapshot,
commits with compare-and-set on the revision, and only then queues `topology.changed`; one
publisher task sends the queue in revision order and retries while NATS is away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import structlog
from prometheus_client import Counter, Gauge

from thorn.auth import Principal
from thorn.events import Change as EventChange
from thorn.events import TopologyChanged, utcnow
from thorn.fabric import Change, Fabric, FabricError, NotFound
from thorn.store import StaleRevision, Store, unavailable
from thorn.watchdog import building_long_lived
from thorn_topology.export import SerialisedDocument, serialise
from thorn_topology.offload import Base, Commit, Outcome, Source, replace_fabric, worker_pool

log = structlog.get_logger("thorn.topology")

REVISION = Gauge("thorn_topology_revision", "Topology revision this replica serves")
WRITES = Counter("thorn_topology_writes_total", "Committed topology writes", ["action"])
REJECTED = Counter("thorn_topology_rejected_total", "Writes refused by fabric rules", ["action"])
ANNOUNCE_ERRORS = Counter(
    "thorn_topology_announce_errors_total", "Failed attempts to publish topology.changed"
)
ANNOUNCE_DROPPED = Counter(
    "thorn_topology_announce_dropped_total", "topology.changed events dropped (queue full)"
)
# Events carry at most this many change entries; bigger writes are summarised.
MAX_EVENT_CHANGES = 500
WRITE_ATTEMPTS = 3
OUTBOX_SIZE = 10_000
RETRY_MAX_S = 2.0
DRAIN_TIMEOUT_S = 5.0

Operation = Callable[[Fabric], list[Change]]
T = TypeVar("T")


class Publisher(Protocol):
    async def publish(self, event: TopologyChanged, *, msg_id: str | None = None) -> int | None: ...


class TopologyService:
    def __init__(self, store: Store, bus: Publisher | None, store_id: int = 0) -> None:
        self.store = store
        self.bus = bus
        self.store_id = store_id
        self._fabric: Fabric | None = None
        self._lock = asyncio.Lock()
        self._document: SerialisedDocument | None = None
        self._outbox: asyncio.Queue[TopologyChanged] = asyncio.Queue(OUTBOX_SIZE)
        self._publisher: asyncio.Task[None] | None = None
        self._pool: ProcessPoolExecutor | None = None  # big fabric work, started on first use
        self._url = store.engine.url.render_as_string(hide_password=False)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self.bus is not None:
            self._publisher = asyncio.create_task(self._publish_forever(self.bus))

    async def stop(self) -> None:
        """Give queued events a moment to go out, then stop the publisher."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._publisher is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._outbox.join()
        self._publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._publisher

    # --- reading --------------------------------------------------------------------------

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

        async def attempt(fabric: Fabric) -> tuple[int, list[Change]]:
            try:
                changes = operation(fabric)
            except (FabricError, NotFound):
                REJECTED.labels(action).inc()
                raise  # the fabric refused it before changing anything
            if not changes:
                return fabric.revision, changes
            revision = await self.store.commit(
                changes,
                expected_revision=fabric.revision,
                next_link_id=fabric.next_link_id,
                actor=principal.name,
                action=action,
                target=target,
                detail=detail or {},
            )
            fabric.revision = revision
            WRITES.labels(action).inc()
            self._announce(revision, principal, [c.summary for c in changes])
            return revision, changes

        return await self._with_retries(attempt)

    async def replace(
        self, principal: Principal, source: Source, *, dry_run: bool, label: str
    ) -> Outcome:
        """Make a whole new fabric the topology, all or nothing (`dry_run`: validate only).

        The worker process reads, validates and writes it; this process then serves it.
        Raises Refused, FabricError, or BrokenProcessPool when the worker died.
        """

        async def attempt(current: Fabric) -> Outcome:
            base = Base(current.revision, current.next_link_id)
            commit = None if dry_run else Commit(self._url, principal.name, label, self.store.pool)
            try:
                outcome = await self._offload(replace_fabric, source, base, commit)
            except FabricError:
                REJECTED.labels("fabric.import").inc()
                raise
            if outcome.document is None:
                return outcome
            self._document = outcome.document
            WRITES.labels("fabric.import").inc()
            self._announce(
                outcome.document.revision,
                principal,
                [{"kind": "fabric", "op": "replace", "key": label}],
            )
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
        for _ in range(WRITE_ATTEMPTS):
            async with self._lock:
                fabric = await self._fresh()
                try:
                    return await attempt(fabric)
                except StaleRevision:
                    self._fabric = None  # another replica wrote first: reload, validate again
                except (FabricError, NotFound):
                    raise  # refused by the rules: the snapshot was not touched
                except BaseException:
                    self._fabric = None  # unknown state: reload before the next request
                    raise
        raise FabricError.one((), "the topology kept changing under this write; retry", "conflict")

    # --- events ---------------------------------------------------------------------------

    def _announce(self, revision: int, principal: Principal, changes: list[dict[str, str]]) -> None:
        """Queue topology.changed; called under the write lock, so the queue is in order."""
        if len(changes) > MAX_EVENT_CHANGES:
            changes = [{"kind": "fabric", "op": "update", "key": f"{len(changes)} changes"}]
        event = TopologyChanged(
            revision=revision,
            at=utcnow(),
            actor=principal.name,
            changes=[EventChange.model_validate(c) for c in changes],
        )
        if self.bus is None:
            return
        try:
            self._outbox.put_nowait(event)
        except asyncio.QueueFull:  # NATS away for long: consumers catch up from the revision
            ANNOUNCE_DROPPED.inc()
            log.error("announce_dropped", revision=revision)

    async def _publish_forever(self, bus: Publisher) -> None:
        while True:
            event = await self._outbox.get()
            delay = 0.05
            while True:
                try:
                    msg_id = f"topology-{self.store_id:x}-{event.revision}"
                    await bus.publish(event, msg_id=msg_id)
                    break
                except Exception as exc:
                    ANNOUNCE_ERRORS.inc()
                    log.warning("announce_retry", revision=event.revision, error=str(exc))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
            self._outbox.task_done()
