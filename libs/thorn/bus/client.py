"""The bus: one NATS connection with JetStream, speaking THORN's typed events (publish,
subscribe, request), making sure the streams and buckets exist, and handing out durable
consumers and the desired-state KV."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from thorn.bus.consumer import DurableConsumer
from thorn.bus.errors import BusConnectError, PublishError
from thorn.bus.kv import DesiredStateStore
from thorn.bus.metrics import (
    ASYNC_ERRORS,
    DECODE_ERRORS,
    DISCONNECTS,
    HANDLER_ERRORS,
    PUBLISH_ERRORS,
    RECONNECTS,
)
from thorn.bus.streams import ServerView, ensure, server_view
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
from thorn.natsauth.identity import inbox_of
from thorn.natsauth.jwt import JwtError

log = structlog.get_logger("thorn.bus")

E = TypeVar("E", bound=Event)
Handler = Callable[[E], Awaitable[None]]


class Bus:
    """One NATS connection with JetStream, speaking THORN's typed events."""

    def __init__(
        self, nc: NatsClient, name: str, publish_timeout: float, replicas: int = 1
    ) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=publish_timeout)
        self.name = name
        self.publish_timeout = publish_timeout
        self.replicas = replicas
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
        ping_interval: float = 5.0,
        replicas: int = 1,
        tls: ssl.SSLContext | None = None,
        creds: Path | None = None,
    ) -> Bus:
        """Connect to NATS at `url` (one URL, or the seed list of a cluster: comma-separated
        or a sequence; the servers a cluster advertises are added to the list).

        The first connection must succeed within `connect_timeout` (else `BusConnectError`);
        afterwards the client reconnects forever, `reconnect_time_wait` seconds apart, to any
        server it knows. A server that dies without closing its connections (its machine
        lost) is given up after 3 unanswered pings, `ping_interval` s apart. `replicas`: the
        copies of each stream and bucket this bus creates (THORN_NATS_REPLICAS). `tls`: the
        context to verify the servers with (THORN_NATS_CA); given, a server that does not
        speak TLS is refused. `creds`: a .creds file, this connection's NATS identity
        (THORN_NATS_CREDS); read again at every reconnect, so renewed credentials written
        there take effect with `reconnect()`; replies and deliveries then come under the
        identity's own inbox prefix (the only one its permissions let it read).

        Credentials in a URL (user:password@) never reach a log line or an error message.
        """
        if isinstance(url, str):
            servers = [u.strip() for u in url.split(",") if u.strip()]
        else:
            servers = list(url)
        if not servers:
            raise BusConnectError("no NATS server given (THORN_NATS_URL is empty)")
        holder: list[Bus] = []
        last_error: list[str] = []  # the latest failure, for the error if none connects
        # What a server itself said (an -ERR such as 'Authorization Violation'): the reset
        # that often follows it on a loaded machine must not hide it.
        server_said: list[str] = []
        refused: list[bool] = []  # set when this refuses the server it reached
        nc = NatsClient()

        async def on_disconnected() -> None:
            if refused or (holder and holder[0]._closing):
                return  # our own close(), not an outage
            DISCONNECTS.labels(name).inc()
            if holder:
                holder[0]._connected.clear()
            log.warning("nats_disconnected", connection=name)

        async def on_reconnected() -> None:
            RECONNECTS.labels(name).inc()
            if holder:
                holder[0]._connected.set()
            log.info("nats_reconnected", connection=name, server=_server_of(nc))

        async def on_error(exc: Exception) -> None:
            ASYNC_ERRORS.labels(name).inc()
            last_error[:] = [f"{type(exc).__name__}: {exc}"]
            if type(exc) in (nats.errors.Error, nats.errors.AuthorizationError):
                server_said[:] = last_error  # nats-py's type for a server's -ERR line
            log.warning("nats_error", connection=name, error=last_error[0])

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
        if tls is not None:
            options["tls"] = tls
        if creds is not None:
            try:
                inbox = inbox_of(creds)
            except JwtError as exc:
                raise BusConnectError(f"NATS credentials {exc}") from None
            options["user_credentials"] = str(creds)
            if inbox is not None:
                options["inbox_prefix"] = inbox
        try:
            async with asyncio.timeout(connect_timeout):
                await nc.connect(**options)
        except TimeoutError as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            why = f" (last error: {last_error[0]})" if last_error else ""
            if server_said and server_said != last_error:
                why += f" (the server said: {server_said[0]})"
            raise BusConnectError(
                f"could not connect to NATS at {', '.join(map(without_credentials, servers))} "
                f"within {connect_timeout:g} s{why}"
            ) from exc
        if tls is not None and not nc._server_info.get("tls_required"):
            # nats-py goes plain with a server that does not ask for TLS: not with a CA set.
            server = _server_of(nc)
            refused.append(True)
            await nc.close()
            raise BusConnectError(
                f"the NATS server at {server} does not use TLS, but a CA to verify it with was "
                "given (THORN_NATS_CA): refused"
            )
        bus = cls(nc, name, publish_timeout, replicas)
        holder.append(bus)
        log.info("nats_connected", connection=name, server=_server_of(nc), tls=tls is not None)
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
    def server(self) -> ServerView:
        """The connected server and its cluster, as its latest INFO says."""
        return server_view(self._nc)

    @property
    def is_connected(self) -> bool:
        return bool(self._nc.is_connected)

    async def wait_connected(self) -> None:
        """Wait until the connection is up (again). Bound it with `asyncio.timeout`."""
        while not self._nc.is_connected:
            self._connected.clear()
            await self._connected.wait()

    async def reconnect(self) -> None:
        """Drop the connection and connect again at once (to renewed credentials: the creds
        file is read again); subscriptions are made again on the new connection."""
        await self._nc.force_reconnect()

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
        replicas: int | None = None,
    ) -> None:
        """Create each stream and KV bucket, or update it to the spec, with `replicas` copies
        (default: the bus's). Idempotent. Raises `ReplicasError` (nothing created or changed)
        when the cluster cannot hold that many: see `thorn.bus.streams`."""
        await ensure(
            self._js,
            streams=streams,
            buckets=kv,
            replicas=self.replicas if replicas is None else replicas,
            connection=self.name,
            server=self.server,
        )

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

    async def desired_state(
        self, spec: KeyValueSpec = DESIRED_STATE_KV, *, create: bool = True
    ) -> DesiredStateStore:
        """The per-node desired-state bucket (created from `spec` if it does not exist; with
        `create=False`, an agent's, which may not create it: `BucketNotFoundError`)."""
        try:
            kv = await self._js.key_value(spec.bucket)
        except nats.js.errors.BucketNotFoundError:
            if not create:
                raise
            await self.ensure_streams(streams=(), kv=(spec,))
            kv = await self._js.key_value(spec.bucket)
        return DesiredStateStore(kv, spec.bucket)


def without_credentials(url: str) -> str:
    """`url` without its user, password or token (`nats://u:p@host:4222` -> `nats://host:4222`):
    what a log line or an error may show."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return url.rpartition("@")[2]
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}"


def _server_of(nc: NatsClient) -> str | None:
    """The connected server as host:port (nats-py's netloc carries the URL's credentials)."""
    url = nc.connected_url
    if url is None:
        return None
    host = url.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{url.port}" if url.port else host
