"""Durable consumers: a JetStream pull consumer that survives restarts, fetching typed
events to acknowledge once handled (at-least-once delivery)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from thorn.bus.metrics import DECODE_ERRORS
from thorn.events import (
    Event,
    EventDecodeError,
    decode,
)

if TYPE_CHECKING:
    from thorn.bus.client import Bus

log = structlog.get_logger("thorn.bus")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event fetched from a durable consumer. Acknowledge it once handled."""

    event: Event
    subject: str
    stream_seq: int
    num_delivered: int
    msg: Msg

    async def ack(self) -> None:
        await self.msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        """Ask for redelivery (after `delay` seconds)."""
        await self.msg.nak(delay=delay)

    async def in_progress(self) -> None:
        """Still working on it: reset the ack timer."""
        await self.msg.in_progress()

    async def term(self) -> None:
        """Never redeliver this message."""
        await self.msg.term()


class DurableConsumer:
    """A bound pull subscription on a durable consumer; `fetch` returns decoded deliveries."""

    def __init__(
        self, bus: Bus, stream: str, name: str, sub: JetStreamContext.PullSubscription
    ) -> None:
        self._bus = bus
        self.stream = stream
        self.name = name
        self._sub = sub

    async def fetch(
        self,
        batch: int = 10,
        max_wait: float = 1.0,
        *,
        on_decode_error: Callable[[EventDecodeError], Awaitable[None]] | None = None,
    ) -> list[Delivery]:
        """Up to `batch` deliveries, waiting at most `max_wait` s for the first; [] if none.

        A message that does not decode is logged, counted, passed to `on_decode_error` if
        given, and terminated (never redelivered): a poison message must not block the
        consumer.
        """
        try:
            msgs = await self._sub.fetch(batch, timeout=max_wait)
        except (nats.errors.TimeoutError, TimeoutError):
            # nats-py raises the builtin one when the wait ran out before the pull was sent
            return []
        out: list[Delivery] = []
        for msg in msgs:
            try:
                event = decode(msg.subject, msg.data)
            except EventDecodeError as exc:
                DECODE_ERRORS.labels(self._bus.name).inc()
                log.warning(
                    "event_decode_failed",
                    connection=self._bus.name,
                    consumer=self.name,
                    subject=msg.subject,
                    error=str(exc),
                )
                await msg.term()
                if on_decode_error is not None:
                    await on_decode_error(exc)
                continue
            meta = msg.metadata
            out.append(
                Delivery(
                    event=event,
                    subject=msg.subject,
                    stream_seq=meta.sequence.stream,
                    num_delivered=meta.num_delivered,
                    msg=msg,
                )
            )
        return out

    async def info(self) -> api.ConsumerInfo:
        return await self._sub.consumer_info()

    async def unsubscribe(self) -> None:
        """Stop fetching through this subscription; the durable consumer stays on the server."""
        await self._sub.unsubscribe()
