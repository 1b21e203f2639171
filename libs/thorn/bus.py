"""The THORN event bus: typed events over NATS core + JetStream, and the desired-state KV.

::

    async with await Bus.connect(url, name="pathcomp") as bus:
        await bus.ensure_streams()
        seq = await bus.publish(PathsChanged(revision=3, topology_revision=7, at=utcnow()))
        await bus.subscribe(HEALTH_LINK_ALL, on_link, model=LinkHealthChanged)
        store = await bus.desired_state()
        await store.put("leaf1", plan_model)

Subjects, streams and schemas come from `thorn.events`. The connection reconnects forever
(short wait between attempts); reconnects, disconnects and publish errors are logged through
structlog and counted in Prometheus counters (`thorn_bus_*_total{connection=<name>}`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from prometheus_client import REGISTRY, Counter
from pydantic import BaseModel

from thorn.events import (
    DESIRED_STATE_KV,
    STREAMS,
    Event,
    EventDecodeError,
    KeyValueSpec,
    StreamSpec,
    decode,
    encode,
    stream_for_subject,
)

log = structlog.get_logger("thorn.bus")

E = TypeVar("E", bound=Event)
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[E], Awaitable[None]]

# JetStream API error codes this module reacts to.
_ERR_STREAM_NAME_IN_USE = 10058  # a stream exists with a different configuration
_ERR_WRONG_LAST_SEQUENCE = (10071, 10164)


# --------------------------------------------------------------------------------------------
# Metrics: created once per process, whatever number of Bus objects or test modules exist.
# --------------------------------------------------------------------------------------------


def _counter(name: str, documentation: str) -> Counter:
    """A labelled Counter registered once: a second call returns the registered one."""
    try:
        return Counter(name, documentation, ["connection"])
    except ValueError:  # already registered (module reloaded, or two copies imported)
        collectors = getattr(REGISTRY, "_names_to_collectors", {})
        existing = collectors.get(name) or collectors.get(f"{name}_total")
        if isinstance(existing, Counter):
            return existing
        raise


RECONNECTS = _counter("thorn_bus_reconnects", "NATS reconnections, by connection name")
DISCONNECTS = _counter("thorn_bus_disconnects", "NATS disconnections, by connection name")
PUBLISH_ERRORS = _counter("thorn_bus_publish_errors", "failed event publishes, by connection")
DECODE_ERRORS = _counter("thorn_bus_decode_errors", "received messages that did not decode")
HANDLER_ERRORS = _counter("thorn_bus_handler_errors", "event handlers that raised")
ASYNC_ERRORS = _counter("thorn_bus_async_errors", "asynchronous errors reported by the client")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class BusError(Exception):
    """Base of the bus's own errors."""


class BusConnectError(BusError):
    """No NATS server could be reached within the connect timeout."""


class PublishError(BusError):
    """An event could not be published (or JetStream did not acknowledge it)."""

    def __init__(self, subject: str, cause: BaseException) -> None:
        super().__init__(f"publish to {subject!r} failed: {type(cause).__name__}: {cause}")
        self.subject = subject


class StreamConfigError(BusError):
    """A THORN stream or bucket exists with a configuration that cannot be updated in place."""


class DesiredStateConflict(BusError):
    """A compare-and-set on a node's desired state lost: the key moved past `expected`."""

    def __init__(self, node: str, expected: int, detail: str = "") -> None:
        what = "not to exist" if expected == 0 else f"at revision {expected}"
        super().__init__(
            f"desired state of {node!r} was expected {what} but has changed"
            + (f" ({detail})" if detail else "")
        )
        self.node = node
        self.expected = expected


# --------------------------------------------------------------------------------------------
# The bus
# --------------------------------------------------------------------------------------------


class Bus:
    """One NATS connection with JetStream, speaking THORN's typed events."""

    def __init__(self, nc: NatsClient, name: str, publish_timeout: float) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=publish_timeout)
        self.name = name
        self.publish_timeout = publish_timeout
        self._connected = asyncio.Event()
        self._connected.set()
        self._closing = False

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        *,
        name: str = "thorn",
        connect_timeout: float = 10.0,
        reconnect_time_wait: float = 0.25,
        publish_timeout: float = 5.0,
        ping_interval: float = 20.0,
    ) -> Bus:
        """Connect to NATS at `url` (one URL or several of a cluster).

        The first connection must succeed within `connect_timeout` (else `BusConnectError`);
        afterwards the client reconnects forever, `reconnect_time_wait` seconds apart.
        """
        servers = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
        holder: list[Bus] = []
        nc = NatsClient()

        async def on_disconnected() -> None:
            if holder and holder[0]._closing:
                return  # our own close(), not an outage
            DISCONNECTS.labels(name).inc()
            if holder:
                holder[0]._connected.clear()
            log.warning("nats_disconnected", connection=name)

        async def on_reconnected() -> None:
            RECONNECTS.labels(name).inc()
            if holder:
                holder[0]._connected.set()
            url_now = nc.connected_url.netloc if nc.connected_url else None
            log.info("nats_reconnected", connection=name, server=url_now)

        async def on_error(exc: Exception) -> None:
            ASYNC_ERRORS.labels(name).inc()
            log.warning("nats_error", connection=name, error=f"{type(exc).__name__}: {exc}")

        async def on_closed() -> None:
            log.info("nats_closed", connection=name)

        # reconnect_time_wait/ping_interval are typed int upstream but used as float seconds.
        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": reconnect_time_wait,
            "connect_timeout": min(2.0, connect_timeout),
            "ping_interval": ping_interval,
            "max_outstanding_pings": 3,
            "disconnected_cb": on_disconnected,
            "reconnected_cb": on_reconnected,
            "error_cb": on_error,
            "closed_cb": on_closed,
        }
        try:
            async with asyncio.timeout(connect_timeout):
                await nc.connect(**options)
        except TimeoutError as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            raise BusConnectError(
                f"could not connect to NATS at {', '.join(servers)} within {connect_timeout:g} s"
            ) from exc
        bus = cls(nc, name, publish_timeout)
        holder.append(bus)
        server = nc.connected_url.netloc if nc.connected_url else None
        log.info("nats_connected", connection=name, server=server)
        return bus

    # -------------------------------------------------------------------------------- state

    @property
    def nc(self) -> NatsClient:
        """The underlying nats-py client, for what the bus does not wrap."""
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        return self._js

    @property
    def is_connected(self) -> bool:
        return bool(self._nc.is_connected)

    async def wait_connected(self) -> None:
        """Wait until the connection is up (again). Bound it with `asyncio.timeout`."""
        while not self._nc.is_connected:
            self._connected.clear()
            await self._connected.wait()

    async def flush(self) -> None:
        """Round-trip to the server: everything sent before has been processed by it."""
        await self._nc.flush()

    async def close(self) -> None:
        """Flush what is pending and close the connection. Safe to call twice."""
        self._closing = True
        if not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------- streams and buckets

    async def ensure_streams(
        self,
        streams: Sequence[StreamSpec] = STREAMS,
        *,
        kv: Sequence[KeyValueSpec] = (DESIRED_STATE_KV,),
        replicas: int = 1,
    ) -> None:
        """Create each stream and KV bucket, or update it to the spec. Idempotent."""
        for spec in streams:
            await self._ensure_stream(spec, replicas)
        for kv_spec in kv:
            await self._ensure_kv(kv_spec, replicas)

    async def _ensure_stream(self, spec: StreamSpec, replicas: int) -> None:
        config = api.StreamConfig(
            name=spec.name,
            description=spec.description,
            subjects=list(spec.subjects),
            retention=api.RetentionPolicy.LIMITS,
            max_age=spec.max_age,
            max_bytes=spec.max_bytes,
            storage=api.StorageType(spec.storage),
            discard=api.DiscardPolicy.OLD,
            duplicate_window=spec.duplicate_window,
            num_replicas=replicas,
        )
        try:
            await self._js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(config)
            log.info("stream_created", stream=spec.name, subjects=list(spec.subjects))
            return
        try:
            await self._js.update_stream(config)
        except nats.js.errors.APIError as exc:
            raise StreamConfigError(f"stream {spec.name} cannot be updated: {exc}") from exc

    async def _ensure_kv(self, spec: KeyValueSpec, replicas: int) -> KeyValue:
        config = api.KeyValueConfig(
            bucket=spec.bucket,
            description=spec.description,
            history=spec.history,
            max_value_size=spec.max_value_size,
            max_bytes=spec.max_bytes,
            storage=api.StorageType(spec.storage),
            replicas=replicas,
        )
        try:
            return await self._js.create_key_value(config)
        except nats.js.errors.APIError as exc:
            if exc.err_code != _ERR_STREAM_NAME_IN_USE:
                raise
        # The bucket exists with other settings: bring the limits in line with the spec.
        kv = await self._js.key_value(spec.bucket)
        info = await self._js.stream_info(f"KV_{spec.bucket}")
        current = info.config
        current.description = spec.description
        current.max_msgs_per_subject = spec.history
        current.max_msg_size = spec.max_value_size
        current.max_bytes = spec.max_bytes
        try:
            await self._js.update_stream(current)
        except nats.js.errors.APIError as exc:
            raise StreamConfigError(f"KV bucket {spec.bucket} cannot be updated: {exc}") from exc
        return kv

    # ------------------------------------------------------------------------------- publish

    async def publish(
        self, event: Event, *, msg_id: str | None = None, ack_timeout: float | None = None
    ) -> int | None:
        """Publish an event on its subject.

        A subject stored by a THORN stream goes through JetStream and waits for the stream's
        acknowledgement: the return value is the stream sequence. Other subjects (agent
        reports) are core NATS fire-and-forget: returns None. `msg_id` sets `Nats-Msg-Id`, so
        a retried publish is stored once within the stream's duplicate window. `ack_timeout`
        (default: the bus's `publish_timeout`) bounds the wait for the stream's acknowledgement.
        Raises `PublishError` (counted in `thorn_bus_publish_errors_total`).
        """
        subject = event.subject
        payload = encode(event)
        headers = {api.Header.MSG_ID.value: msg_id} if msg_id else None
        spec = stream_for_subject(subject)
        try:
            if spec is None:
                await self._nc.publish(subject, payload, headers=headers)
                return None
            ack = await self._js.publish(
                subject,
                payload,
                timeout=ack_timeout if ack_timeout is not None else self.publish_timeout,
                stream=spec.name,
                headers=headers,
            )
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            PUBLISH_ERRORS.labels(self.name).inc()
            log.warning(
                "publish_failed",
                connection=self.name,
                subject=subject,
                error=f"{type(exc).__name__}: {exc}",
            )
            raise PublishError(subject, exc) from exc
        seq: int = ack.seq
        return seq

    async def request(self, event: Event, *, reply_within: float = 1.0) -> bytes:
        """Send an event as a core-NATS request and return the raw reply (the caller knows
        the reply's model). Raises `PublishError` when nobody answers in `reply_within` s
        or the connection fails."""
        subject = event.subject
        # nats-py waits with asyncio.wait_for, which on Python 3.11 can swallow a cancel that
        # lands as the reply arrives: the caller would never stop. Shielded, the request runs
        # to its end (reply or timeout) in a task of its own, and a cancel reaches the caller.
        request = asyncio.ensure_future(
            self._nc.request(subject, encode(event), timeout=reply_within)
        )
        try:
            msg = await asyncio.shield(request)
        except asyncio.CancelledError:
            request.cancel()
            raise
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            PUBLISH_ERRORS.labels(self.name).inc()
            raise PublishError(subject, exc) from exc
        return msg.data

    # ----------------------------------------------------------------------------- subscribe

    @overload
    async def subscribe(
        self,
        subject: str,
        handler: Handler[Event],
        *,
        queue: str = "",
        on_decode_error: Callable[[EventDecodeError], Awaitable[None]] | None = None,
    ) -> Subscription: ...

    @overload
    async def subscribe(
        self,
        subject: str,
        handler: Handler[E],
        *,
        model: type[E],
        queue: str = "",
        on_decode_error: Callable[[EventDecodeError], Awaitable[None]] | None = None,
    ) -> Subscription: ...

    async def subscribe(
        self,
        subject: str,
        handler: Handler[Any],
        *,
        model: type[Event] | None = None,
        queue: str = "",
        on_decode_error: Callable[[EventDecodeError], Awaitable[None]] | None = None,
    ) -> Subscription:
        """Core-NATS subscription delivering typed events to `handler`.

        Each message is decoded by its subject (`thorn.events.decode`); with `model`, an event
        of another type is a decode error too. A message that does not decode is logged,
        counted and passed to `on_decode_error` if given; the handler never sees it. A handler
        that raises is logged and counted; the subscription carries on.
        """
        name = self.name

        async def deliver(msg: Msg) -> None:
            try:
                event = decode(msg.subject, msg.data)
                if model is not None and not isinstance(event, model):
                    raise EventDecodeError(
                        msg.subject, f"expected {model.__name__}, got {type(event).__name__}"
                    )
            except EventDecodeError as exc:
                DECODE_ERRORS.labels(name).inc()
                log.warning(
                    "event_decode_failed", connection=name, subject=msg.subject, error=str(exc)
                )
                if on_decode_error is not None:
                    await on_decode_error(exc)
                return
            try:
                await handler(event)
            except Exception:
                HANDLER_ERRORS.labels(name).inc()
                log.exception("event_handler_failed", connection=name, subject=msg.subject)

        return await self._nc.subscribe(subject, queue=queue, cb=deliver)

    # ------------------------------------------------------------------------ durable (pull)

    async def durable_consumer(
        self,
        stream: str | StreamSpec,
        durable: str,
        *,
        filter_subject: str | None = None,
        deliver_policy: Literal["all", "new", "last", "last_per_subject"] = "all",
        ack_wait: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 1000,
    ) -> DurableConsumer:
        """A JetStream durable pull consumer, created or updated to these settings (idempotent).

        Consumers of the same durable name share its position: a restarted service resumes
        where it acknowledged last.
        """
        stream_name = stream.name if isinstance(stream, StreamSpec) else stream
        config = api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            deliver_policy=api.DeliverPolicy(deliver_policy),
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            filter_subject=filter_subject,
        )
        await self._js.add_consumer(stream_name, config)
        sub = await self._js.pull_subscribe_bind(durable=durable, stream=stream_name)
        return DurableConsumer(self, stream_name, durable, sub)

    # ------------------------------------------------------------------------ desired state

    async def last(self, stream: StreamSpec, subject: str, model: type[E]) -> E | None:
        """The last event stored on `subject` in `stream` (None: none, or no such stream)."""
        try:
            message = await self._js.get_last_msg(stream.name, subject)
        except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
            return None
        return model.model_validate_json(message.data or b"")

    async def desired_state(self, spec: KeyValueSpec = DESIRED_STATE_KV) -> DesiredStateStore:
        """The per-node desired-state bucket (created from `spec` if it does not exist)."""
        try:
            kv = await self._js.key_value(spec.bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await self._ensure_kv(spec, replicas=1)
        return DesiredStateStore(kv, spec.bucket)


# --------------------------------------------------------------------------------------------
# Durable consumer
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Desired-state KV
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DesiredStateEntry:
    """One node's desired state at `revision` (the KV stream sequence).

    `value` is None for a delete/purge. `initial` is True for entries a watch delivered as part
    of its starting snapshot, False for live updates and plain `get`s.
    """

    node: str
    value: bytes | None
    revision: int
    operation: Literal["put", "delete", "purge"] = "put"
    initial: bool = False

    @property
    def deleted(self) -> bool:
        return self.operation != "put"

    def decode(self, model: type[M]) -> M:
        """The value parsed as a pydantic model (JSON)."""
        if self.value is None:
            raise ValueError(f"desired state of {self.node!r} was deleted at {self.revision}")
        return model.model_validate_json(self.value)


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Watch marker: every entry of the starting snapshot has been delivered before this."""


CAUGHT_UP = CaughtUp()


def _as_bytes(value: bytes | BaseModel) -> bytes:
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    return bytes(value)


def _operation(op: str | None) -> Literal["put", "delete", "purge"]:
    if op == KV_DEL:
        return "delete"
    if op == KV_PURGE:
        return "purge"
    return "put"


class DesiredStateStore:
    """Per-node desired datapath state: one key per node, a few revisions of history."""

    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self._kv = kv
        self.bucket = bucket

    @property
    def kv(self) -> KeyValue:
        return self._kv

    async def put(self, node: str, value: bytes | BaseModel) -> int:
        """Store the node's desired state unconditionally; returns the new revision."""
        revision: int = await self._kv.put(node, _as_bytes(value))
        return revision

    async def get(self, node: str) -> DesiredStateEntry | None:
        """The node's current desired state, or None if it has none (never set or deleted)."""
        try:
            entry = await self._kv.get(node)
        except nats.js.errors.KeyNotFoundError:
            return None
        assert entry.revision is not None
        return DesiredStateEntry(node=node, value=entry.value, revision=entry.revision)

    async def update(self, node: str, value: bytes | BaseModel, *, last: int) -> int:
        """Compare-and-set: write only if the node's current revision is `last`.

        `last=0` means "only if the node has no desired state yet". Returns the new revision;
        raises `DesiredStateConflict` when someone else wrote in between.
        """
        try:
            if last == 0:
                revision: int = await self._kv.create(node, _as_bytes(value))
            else:
                revision = await self._kv.update(node, _as_bytes(value), last=last)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise DesiredStateConflict(node, last, exc.description or "") from exc
        return revision

    async def create(self, node: str, value: bytes | BaseModel) -> int:
        """Write only if the node has no desired state yet (`DesiredStateConflict` otherwise)."""
        return await self.update(node, value, last=0)

    async def delete(self, node: str, *, last: int | None = None) -> None:
        """Remove the node's desired state (optionally only if still at revision `last`)."""
        try:
            await self._kv.delete(node, last=last)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _ERR_WRONG_LAST_SEQUENCE:
                raise DesiredStateConflict(node, last or 0, exc.description or "") from exc
            raise

    async def nodes(self) -> list[str]:
        """Nodes that currently have a desired state."""
        try:
            keys: list[str] = await self._kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        return sorted(keys)

    def watch(self, node: str | None = None) -> DesiredStateWatch:
        """Watch one node's key (or all): current values, then `CAUGHT_UP`, then live updates.

        ::

            async with store.watch("leaf1") as watch:
                async for item in watch:
                    if isinstance(item, CaughtUp): ...   # snapshot complete (maybe empty)
                    else: apply(item)                     # a DesiredStateEntry
        """
        return DesiredStateWatch(self._kv, node)


class DesiredStateWatch:
    """Async iterator of `DesiredStateEntry | CaughtUp`; also an async context manager.

    The snapshot holds each matching key's latest value (keys whose latest operation is a
    delete are left out); `CAUGHT_UP` follows it exactly once, even when it is empty; then
    every change arrives live, deletes included. The watch starts on first use.
    """

    def __init__(self, kv: KeyValue, node: str | None) -> None:
        self._kv = kv
        self._keys = node if node is not None else ">"
        self._watcher: KeyValue.KeyWatcher | None = None
        self._caught_up = False
        self._stopped = False

    async def start(self) -> Self:
        if self._watcher is None:
            self._watcher = await self._kv.watch(self._keys)
        return self

    async def stop(self) -> None:
        self._stopped = True
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            with contextlib.suppress(nats.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]  # untyped upstream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> DesiredStateEntry | CaughtUp:
        if self._stopped:
            raise StopAsyncIteration
        await self.start()
        assert self._watcher is not None
        while True:
            entry = await self._watcher.__anext__()  # type: ignore[no-untyped-call]
            if entry is None:
                if self._caught_up:
                    continue
                self._caught_up = True
                return CAUGHT_UP
            operation = _operation(entry.operation)
            if not self._caught_up and operation != "put":
                continue  # a deleted key is not part of the current state
            assert entry.revision is not None
            return DesiredStateEntry(
                node=entry.key,
                value=entry.value if operation == "put" else None,
                revision=entry.revision,
                operation=operation,
                initial=not self._caught_up,
            )

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


__all__ = [
    "CAUGHT_UP",
    "DECODE_ERRORS",
    "DISCONNECTS",
    "PUBLISH_ERRORS",
    "RECONNECTS",
    "Bus",
    "BusConnectError",
    "BusError",
    "CaughtUp",
    "Delivery",
    "DesiredStateConflict",
    "DesiredStateEntry",
    "DesiredStateStore",
    "DesiredStateWatch",
    "DurableConsumer",
    "PublishError",
    "StreamConfigError",
]
