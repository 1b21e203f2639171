"""topology.changed, sent once per revision whatever happens to the replica that wrote it.

Every write puts its event in the store's outbox (`topology_outbox`) in the write's own
transaction (`Store.commit(event=...)`), and hands it to this replica's `Announcer`:

- **At once.** One publisher task sends this replica's events in revision order through
  JetStream (stream THORN_TOPOLOGY) with `Nats-Msg-Id: topology-<store_id hex>-<revision>`,
  retrying while NATS is away (50 ms doubling to 2 s; `announce_retry`, counted), and takes
  each acknowledged one out of the outbox.
- **Left behind.** Every `SWEEP_S`, every replica sends what the outbox has held for longer
  than `GRACE_S`: the events of a replica that died between its commit and JetStream's
  acknowledgement (or before it took the event out), oldest first, with the same message id.

A second send of one event within the stream's duplicate window (120 s) is stored once, so
the stream holds each revision exactly once as long as an event is taken out of the outbox
within two minutes of its acknowledgement: a database unreachable longer than that, right
after a send, can let a sweep send it again. Consumers treat the event as a hint and catch up
from the store's revision, so a late event (a swept one arrives after later revisions) or a
repeated one does no harm.

The queue holds `QUEUE_SIZE` events; beyond that an event waits in the outbox for a sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog
from prometheus_client import Counter

from thorn.events import TopologyChanged
from thorn.store import Store

log = structlog.get_logger("thorn.topology")

ANNOUNCE_ERRORS = Counter(
    "thorn_topology_announce_errors_total", "Failed attempts to publish topology.changed"
)
ANNOUNCE_DROPPED = Counter(
    "thorn_topology_announce_dropped_total",
    "topology.changed events not queued here (queue full): a sweep sends them from the outbox",
)
SWEPT = Counter(
    "thorn_topology_announce_swept_total",
    "topology.changed events sent from the outbox by a sweep (their writer had not sent them)",
)
QUEUE_SIZE = 10_000
RETRY_MAX_S = 2.0
DRAIN_TIMEOUT_S = 5.0
SWEEP_S = 2.0  # how often each replica looks for events left in the outbox
GRACE_S = 5.0  # how long an event may wait for its writer before anyone else sends it
SWEEP_BATCH = 500


class Publisher(Protocol):
    async def publish(self, event: TopologyChanged, *, msg_id: str | None = None) -> int | None: ...


class Announcer:
    """This replica's sender of topology.changed (see the module docstring)."""

    def __init__(
        self, store: Store, bus: Publisher, store_id: int, *, grace_s: float = GRACE_S
    ) -> None:
        self.store = store
        self.bus = bus
        self.store_id = store_id
        self.grace_s = grace_s
        self._queue: asyncio.Queue[TopologyChanged] = asyncio.Queue(QUEUE_SIZE)
        self._sent: list[int] = []  # acknowledged, still to be taken out of the outbox
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._publish_forever(), name="topology-announce"),
            asyncio.create_task(self._sweep_forever(), name="topology-announce-sweep"),
        ]

    async def stop(self) -> None:
        """Give queued events a moment to go out, then stop."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                await self._queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._forget_sent()

    def queue(self, event: TopologyChanged) -> None:
        """Send `event` (committed, in the outbox) soon; call in revision order."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:  # NATS away for long: the outbox keeps it for a sweep
            ANNOUNCE_DROPPED.inc()
            log.error("announce_queue_full", revision=event.revision)

    def msg_id(self, revision: int) -> str:
        return f"topology-{self.store_id:x}-{revision}"

    async def _send(self, event: TopologyChanged) -> None:
        """Publish until JetStream acknowledges it."""
        delay = 0.05
        while True:
            try:
                await self.bus.publish(event, msg_id=self.msg_id(event.revision))
                return
            except Exception as exc:
                ANNOUNCE_ERRORS.inc()
                log.warning("announce_retry", revision=event.revision, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _publish_forever(self) -> None:
        while True:
            event = await self._queue.get()
            await self._send(event)
            self._sent.append(event.revision)
            self._queue.task_done()
            if self._queue.empty():  # a burst's events leave the outbox in one statement
                await self._forget_sent()

    async def _forget_sent(self) -> None:
        sent, self._sent = self._sent, []
        try:
            await self.store.announced(sent)
        except Exception as exc:  # the database is away: next time (a sweep may send a copy)
            self._sent = sent + self._sent
            log.warning("announce_outbox_not_cleared", revisions=len(sent), error=str(exc))

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception as exc:  # the database is away: the next sweep
                log.warning("announce_sweep_failed", error=str(exc))

    async def sweep(self) -> int:
        """Send the events the outbox has held for longer than the grace; how many."""
        await self._forget_sent()
        before = datetime.now(UTC) - timedelta(seconds=self.grace_s)
        left = await self.store.unannounced(before=before, limit=SWEEP_BATCH)
        for revision, data in left:
            await self._send(TopologyChanged.model_validate_json(data))
            SWEPT.inc()
            log.warning("announce_swept", revision=revision)
        await self.store.announced([revision for revision, _ in left])
        return len(left)
