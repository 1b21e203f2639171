"""Health's failover history writer: every `FailoverEvent` of THORN_FAILOVER into the store,
through the durable pull consumer `thorn-health-failovers` (created or updated at start).

Each message is acknowledged only after its row is committed. A message that is not a valid
FailoverEvent, or that the database refuses as data, is counted, logged and terminated: it
can never succeed, and it must not hold the others back. A write that fails because the
database is away is nak'ed with a delay that doubles per delivery (1 s up to 30 s), so an
outage delays the history and loses none of it (the stream keeps 30 days).

Every replica consumes, active or standby: the messages are shared out by the durable, and
the write is idempotent (unique on the stream sequence, node and time), which a single
consumer needs anyway, since a message whose ack was lost is delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from prometheus_client import Counter
from sqlalchemy.exc import DataError, IntegrityError

from thorn.bus import Bus, Delivery, DurableConsumer
from thorn.events import FAILOVER_ALL, STREAM_FAILOVER, EventDecodeError, FailoverEvent
from thorn.health_records import FailoverRecord
from thorn.store import Store
from thorn_health.failovers import MalformedFailover, record_of

log = structlog.get_logger("thorn.health.failovers")

CONSUMER = "thorn-health-failovers"

FAILOVERS = Counter(
    "thorn_health_failovers_total",
    "FailoverEvents read from THORN_FAILOVER, by result (stored; duplicate: stored before; "
    "malformed: terminated; retried: nak'ed after a failed write)",
    ["result"],
)


class FailoverRecorder:
    def __init__(
        self,
        store: Store,
        bus: Bus,
        *,
        batch: int = 100,
        max_wait: float = 1.0,
        retry_base: float = 1.0,
        retry_max: float = 30.0,
        ack_wait: float = 30.0,
    ) -> None:
        self.store = store
        self.bus = bus
        self.batch = batch
        self.max_wait = max_wait
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.ack_wait = ack_wait
        self._consumer: DurableConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            await self._open()
        except Exception as exc:  # the loop keeps trying: history waits, health serves
            log.warning("failover_consumer_not_ready", error=str(exc))
        self._task = asyncio.create_task(self._run(), name="health-failovers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5.0)
            self._task = None
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.unsubscribe()
            self._consumer = None

    async def _open(self) -> None:
        self._consumer = await self.bus.durable_consumer(
            STREAM_FAILOVER, CONSUMER, filter_subject=FAILOVER_ALL, ack_wait=self.ack_wait
        )

    async def _run(self) -> None:
        while True:
            try:
                if self._consumer is None:
                    await self._open()
                assert self._consumer is not None
                deliveries = await self._consumer.fetch(
                    self.batch, self.max_wait, on_decode_error=self._undecodable
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away, or the consumer was deleted: make it again
                log.warning("failover_fetch_failed", error=str(exc))
                self._consumer = None
                await asyncio.sleep(self.retry_base)
                continue
            if deliveries:
                await self.handle(deliveries)

    @staticmethod
    async def _undecodable(_: EventDecodeError) -> None:
        FAILOVERS.labels("malformed").inc()  # the bus logged and terminated it

    async def handle(self, deliveries: list[Delivery]) -> None:
        """Store a batch of deliveries, then acknowledge each as its fate is known."""
        todo: list[tuple[Delivery, FailoverRecord]] = []
        for delivery in deliveries:
            try:
                if not isinstance(delivery.event, FailoverEvent):
                    raise MalformedFailover(f"not a FailoverEvent: {type(delivery.event).__name__}")
                todo.append((delivery, record_of(delivery.event, delivery.stream_seq)))
            except MalformedFailover as exc:
                await self._refuse(delivery, str(exc))
        if not todo:
            return
        try:
            added = await self.store.record_failovers([r for _, r in todo])
        except (DataError, IntegrityError):
            # Some row the database refuses: find it, store the others.
            for delivery, record in todo:
                await self._one(delivery, record)
            return
        except Exception as exc:  # the database is away: the stream keeps them meanwhile
            for delivery, _ in todo:
                await self._retry(delivery, exc)
            return
        for (delivery, _), new in zip(todo, added, strict=True):
            await self._done(delivery, new)

    async def _one(self, delivery: Delivery, record: FailoverRecord) -> None:
        try:
            [new] = await self.store.record_failovers([record])
        except (DataError, IntegrityError) as exc:
            await self._refuse(delivery, f"the store refused it: {exc.orig}")
        except Exception as exc:
            await self._retry(delivery, exc)
        else:
            await self._done(delivery, new)

    async def _done(self, delivery: Delivery, new: bool) -> None:
        FAILOVERS.labels("stored" if new else "duplicate").inc()
        try:
            await delivery.ack()
        except Exception as exc:  # redelivered later, and then found stored
            log.warning("failover_ack_failed", seq=delivery.stream_seq, error=str(exc))

    async def _refuse(self, delivery: Delivery, error: str) -> None:
        FAILOVERS.labels("malformed").inc()
        log.warning("failover_malformed", subject=delivery.subject, seq=delivery.stream_seq,
                    error=error)  # fmt: skip
        with contextlib.suppress(Exception):
            await delivery.term()

    async def _retry(self, delivery: Delivery, exc: Exception) -> None:
        FAILOVERS.labels("retried").inc()
        doublings = min(max(delivery.num_delivered - 1, 0), 16)
        delay = min(self.retry_max, self.retry_base * 2**doublings)
        log.error("failover_not_stored", seq=delivery.stream_seq, retry_in_s=delay,
                  error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        with contextlib.suppress(Exception):
            await delivery.nak(delay=delay)
