"""The event bus against a real nats-server (JetStream on), started with EmbeddedNats.

Every test on the shared server, the reconnect and the seed-list tests run twice: over plain
NATS and over TLS (a server that speaks only TLS, with a certificate from a local CA that the
bus verifies it with).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
import pytest_asyncio
from pydantic import BaseModel

from thorn import local_ca
from thorn.bus import (
    DISCONNECTS,
    RECONNECTS,
    Bus,
    BusConnectError,
    CaughtUp,
    DesiredStateConflict,
    DesiredStateEntry,
)
from thorn.events import (
    DESIRED_STATE_KV,
    STREAM_FAILOVER,
    STREAM_HEALTH,
    STREAM_PATHS,
    STREAM_TOPOLOGY,
    STREAMS,
    Change,
    Event,
    EventDecodeError,
    FailoverEvent,
    KeyValueSpec,
    LinkHealthChanged,
    PathsChanged,
    TopologyChanged,
    agent_report_subject,
    health_link_subject,
)
from thorn.natsd import (
    EmbeddedNats,
    NatsServerError,
    NatsServerTls,
    _greeting_seen,
    free_port,
    resolve_nats,
)
from thorn.tls import client_context

pytestmark = pytest.mark.nats

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WAIT = 5.0  # upper bound for anything that should take milliseconds


@dataclass(frozen=True)
class Transport:
    """How the tests reach NATS: plain, or TLS with the server's certificate and the
    client's context that verifies it."""

    server: NatsServerTls | None = None
    client: ssl.SSLContext | None = None


@pytest.fixture(scope="module", params=["plain", "tls"])
def transport(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Transport:
    if request.param == "plain":
        return Transport()
    ca = local_ca.ensure(tmp_path_factory.mktemp("tls"))
    return Transport(NatsServerTls(ca.cert, ca.key), client_context(ca.ca, ca_variable="CA"))


@pytest.fixture(scope="module")
def nats_server(
    tmp_path_factory: pytest.TempPathFactory, transport: Transport
) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("js"), tls=transport.server) as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def bus(nats_server: EmbeddedNats, transport: Transport) -> AsyncIterator[Bus]:
    async with await Bus.connect(
        nats_server.url, name="test-bus", tls=transport.client
    ) as connected:
        await connected.ensure_streams()
        yield connected


def link_event(link_id: int, state: str = "down") -> LinkHealthChanged:
    return LinkHealthChanged(link_id=link_id, state=state, previous="up", at=AT, source="bfd")


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Poll `predicate()` until true; fail after WAIT seconds saying what did not happen."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what}: not seen within {WAIT:g} s")
        await asyncio.sleep(0.01)


def counter_value(counter: object, name: str) -> float:
    value = counter.labels(name)._value.get()  # type: ignore[attr-defined]
    assert isinstance(value, float)
    return value


# ------------------------------------------------------------------------ publish / subscribe


async def test_a_published_event_reaches_a_subscriber_as_the_same_typed_event(bus: Bus) -> None:
    received: asyncio.Queue[LinkHealthChanged] = asyncio.Queue()

    async def on_link(event: LinkHealthChanged) -> None:
        await received.put(event)

    sub = await bus.subscribe("health.link.*", on_link, model=LinkHealthChanged)
    try:
        sent = link_event(101)
        seq = await bus.publish(sent)
        async with asyncio.timeout(WAIT):
            got = await received.get()
    finally:
        await sub.unsubscribe()
    assert isinstance(got, LinkHealthChanged)
    assert got == sent
    assert isinstance(seq, int) and seq > 0


async def test_a_subscriber_on_a_wildcard_gets_each_event_decoded_to_its_own_type(
    bus: Bus,
) -> None:
    received: asyncio.Queue[Event] = asyncio.Queue()

    async def on_any(event: Event) -> None:
        await received.put(event)

    sub = await bus.subscribe(">", on_any)
    try:
        sent: list[Event] = [
            TopologyChanged(revision=1, at=AT, actor="t", changes=[]),
            PathsChanged(revision=1, topology_revision=1, at=AT),
            FailoverEvent(
                node="h1",
                peers=["h2"],
                from_colour="red",
                to_colour="blue",
                at=AT,
                reason="x",
                tier="source",
            ),
        ]
        for event in sent:
            await bus.publish(event)
        got: list[Event] = []
        async with asyncio.timeout(WAIT):
            while len(got) < len(sent):
                event = await received.get()
                if event in sent:  # ignore other tests' traffic and KV/JS API subjects
                    got.append(event)
    finally:
        await sub.unsubscribe()
    assert [type(e) for e in got] == [TopologyChanged, PathsChanged, FailoverEvent]


async def test_publish_to_a_streamed_subject_returns_increasing_stream_sequences(
    bus: Bus,
) -> None:
    first = await bus.publish(link_event(102))
    second = await bus.publish(link_event(102, "up"))
    assert first is not None and second is not None
    assert second > first


class _AgentHello(Event):
    """A test-only event on a subject that no THORN stream stores."""

    subject_pattern: ClassVar[str] = "agent.report.>"
    node: str

    @property
    def subject(self) -> str:
        return agent_report_subject(self.node)


async def test_publish_to_a_subject_without_a_stream_is_core_nats_and_returns_none(
    bus: Bus,
) -> None:
    assert await bus.publish(_AgentHello(node="host-a")) is None


async def test_a_message_that_does_not_decode_goes_to_on_decode_error_not_the_handler(
    bus: Bus,
) -> None:
    handled: list[Event] = []
    errors: asyncio.Queue[EventDecodeError] = asyncio.Queue()

    async def on_link(event: LinkHealthChanged) -> None:
        handled.append(event)

    sub = await bus.subscribe(
        health_link_subject(103), on_link, model=LinkHealthChanged, on_decode_error=errors.put
    )
    try:
        await bus.nc.publish(health_link_subject(103), b'{"link_id": "not a number"}')
        async with asyncio.timeout(WAIT):
            error = await errors.get()
        # the subscription is still alive: a good event right after is handled
        await bus.publish(link_event(103))
        await eventually(lambda: len(handled) == 1, "good event handled")
    finally:
        await sub.unsubscribe()
    assert error.subject == "health.link.103"
    assert "health.link.103" in str(error)
    assert handled == [link_event(103)]


async def test_a_handler_that_raises_does_not_stop_the_subscription(bus: Bus) -> None:
    seen: list[int] = []

    async def flaky(event: LinkHealthChanged) -> None:
        seen.append(event.link_id)
        if len(seen) == 1:
            raise RuntimeError("boom")

    sub = await bus.subscribe(health_link_subject(104), flaky, model=LinkHealthChanged)
    try:
        await bus.publish(link_event(104))
        await bus.publish(link_event(104, "up"))
        await eventually(lambda: len(seen) == 2, "both events handled")
    finally:
        await sub.unsubscribe()


# ---------------------------------------------------------------------------------- JetStream


async def test_a_new_durable_consumer_reads_back_events_published_before_it_existed(
    bus: Bus,
) -> None:
    flip = FailoverEvent(
        node="durable-host", peers=["h9"], from_colour="red", to_colour="blue", at=AT,
        reason="bfd", tier="source",
    )  # fmt: skip
    seq = await bus.publish(flip)

    consumer = await bus.durable_consumer(
        STREAM_FAILOVER, "test-history", filter_subject=flip.subject
    )
    deliveries = await consumer.fetch(10, max_wait=WAIT)
    assert [d.event for d in deliveries] == [flip]
    assert deliveries[0].stream_seq == seq
    assert deliveries[0].subject == "failover.durable-host"
    await deliveries[0].ack()
    await consumer.unsubscribe()


async def test_a_durable_consumer_resumes_after_its_last_acknowledged_event(bus: Bus) -> None:
    subject_link = 105
    filter_subject = health_link_subject(subject_link)
    first = await bus.durable_consumer(STREAM_HEALTH, "test-resume", filter_subject=filter_subject)
    await bus.publish(link_event(subject_link, "down"))
    got = await first.fetch(10, max_wait=WAIT)
    assert [d.event for d in got] == [link_event(subject_link, "down")]
    await got[0].ack()
    await bus.flush()
    await first.unsubscribe()

    await bus.publish(link_event(subject_link, "up"))
    # "re-created" by a restarted service with the same name and settings
    again = await bus.durable_consumer(STREAM_HEALTH, "test-resume", filter_subject=filter_subject)
    got = await again.fetch(10, max_wait=WAIT)
    assert [d.event for d in got] == [link_event(subject_link, "up")]
    await got[0].ack()
    assert await again.fetch(10, max_wait=0.1) == []
    await again.unsubscribe()


async def test_a_durable_consumer_terminates_a_message_that_does_not_decode(bus: Bus) -> None:
    subject = health_link_subject(106)
    await bus.js.publish(subject, b"garbage")
    await bus.publish(link_event(106))
    consumer = await bus.durable_consumer(STREAM_HEALTH, "test-poison", filter_subject=subject)
    refused: list[EventDecodeError] = []

    async def on_decode_error(exc: EventDecodeError) -> None:
        refused.append(exc)

    got = await consumer.fetch(10, max_wait=WAIT, on_decode_error=on_decode_error)
    assert [d.event for d in got] == [link_event(106)]
    assert [e.subject for e in refused] == [subject]  # told, and still terminated below
    await got[0].ack()
    await bus.flush()
    # The server applies acks and terms asynchronously: poll its view, bounded.
    for _ in range(int(WAIT / 0.02)):
        if (await consumer.info()).num_ack_pending == 0:
            break
        await asyncio.sleep(0.02)
    # the garbage was terminated, not left for redelivery
    assert await consumer.fetch(10, max_wait=0.2) == []
    await consumer.unsubscribe()


async def test_ensure_streams_is_idempotent_and_keeps_stored_messages(bus: Bus) -> None:
    await bus.publish(PathsChanged(revision=9, topology_revision=9, at=AT))
    before = {s.name: (await bus.js.stream_info(s.name)).state.messages for s in STREAMS}

    await bus.ensure_streams()
    await bus.ensure_streams()

    for spec in STREAMS:
        info = await bus.js.stream_info(spec.name)
        assert info.config.subjects == list(spec.subjects)
        assert info.config.max_age == spec.max_age
        assert info.config.max_bytes == spec.max_bytes
        assert info.state.messages == before[spec.name]


async def test_ensure_streams_restores_a_stream_whose_limits_drifted(bus: Bus) -> None:
    info = await bus.js.stream_info(STREAM_PATHS.name)
    drifted = info.config
    drifted.max_age = 600.0
    await bus.js.update_stream(drifted)

    await bus.ensure_streams()

    assert (await bus.js.stream_info(STREAM_PATHS.name)).config.max_age == STREAM_PATHS.max_age


async def test_topology_changes_keep_their_change_list_through_the_stream(bus: Bus) -> None:
    change = TopologyChanged(
        revision=42,
        at=AT,
        actor="import",
        changes=[
            Change(kind="node", op="create", key="leaf9"),
            Change(kind="link", op="replace", key="leaf9:e1-spine1:e9"),
        ],
    )
    seq = await bus.publish(change)
    consumer = await bus.durable_consumer(STREAM_TOPOLOGY, "test-topology", deliver_policy="last")
    got = await consumer.fetch(1, max_wait=WAIT)
    assert got[0].event == change
    assert got[0].stream_seq == seq
    await got[0].ack()
    await consumer.unsubscribe()


async def test_ensure_streams_raises_a_drifted_bucket_history_back_to_the_spec(bus: Bus) -> None:
    spec = KeyValueSpec(
        bucket="test-kv-drift", description="t", history=5, max_value_size=1024, max_bytes=1 << 20
    )
    await bus.js.create_key_value(bucket=spec.bucket, history=1)

    await bus.ensure_streams(streams=(), kv=(spec,))

    status = await (await bus.js.key_value(spec.bucket)).status()
    assert status.history == 5


async def test_ensure_streams_sets_an_existing_buckets_consumer_limit_to_the_spec(bus: Bus) -> None:
    spec = KeyValueSpec(bucket="test-kv-consumers", description="t", history=1,
                        max_value_size=1024, max_bytes=1 << 20, max_consumers=5000)  # fmt: skip
    await bus.js.create_key_value(bucket=spec.bucket, history=1)  # the server's default limit

    await bus.ensure_streams(streams=(), kv=(spec,))

    assert (await bus.js.stream_info(f"KV_{spec.bucket}")).config.max_consumers == 5000


SERVER_DEFAULT_MAX_CONSUMERS = 1000  # per stream, since nats-server 2.15


async def test_the_desired_state_bucket_takes_more_watches_than_the_servers_default_limit(
    bus: Bus,
) -> None:
    """Every agent watches its node's key (and a host its VNIs): a fabric of more than a
    thousand nodes needs more consumers on the bucket than the server allows by default."""
    info = await bus.js.stream_info(f"KV_{DESIRED_STATE_KV.bucket}")
    assert info.config.max_consumers == DESIRED_STATE_KV.max_consumers
    kv = await bus.desired_state()
    watches = []
    try:
        for n in range(SERVER_DEFAULT_MAX_CONSUMERS + 1):
            watches.append(await kv.watch(f"node.scale{n}").start())
        info = await bus.js.stream_info(f"KV_{DESIRED_STATE_KV.bucket}")
        assert info.state.consumer_count >= SERVER_DEFAULT_MAX_CONSUMERS + 1
    finally:
        await asyncio.gather(*(w.stop() for w in watches))


# ------------------------------------------------------------------------- desired-state KV


class _Plan(BaseModel):
    colour: str
    vnis: list[int]


async def test_desired_state_put_then_get_returns_the_value_and_its_revision(bus: Bus) -> None:
    store = await bus.desired_state()
    revision = await store.put("kv-leaf1", _Plan(colour="red", vnis=[100, 200]))
    entry = await store.get("kv-leaf1")
    assert entry is not None
    assert entry.revision == revision
    assert entry.decode(_Plan) == _Plan(colour="red", vnis=[100, 200])
    assert "kv-leaf1" in await store.nodes()


async def test_nodes_lists_every_node_with_a_desired_state_and_none_deleted(bus: Bus) -> None:
    store = await bus.desired_state(_watch_bucket("test-nodes"))
    for n in range(30):
        await store.put(f"n{n:02}", b"x" * 2000)
    await store.delete("n07")
    # asked again and again: nats-py's own listing came back short now and then (nats.py#842)
    for _ in range(50):
        assert await store.nodes() == [f"n{n:02}" for n in range(30) if n != 7]


async def test_desired_state_of_an_unknown_node_is_none(bus: Bus) -> None:
    store = await bus.desired_state()
    assert await store.get("kv-never-written") is None


async def test_compare_and_set_with_a_stale_revision_raises_a_conflict(bus: Bus) -> None:
    store = await bus.desired_state()
    first = await store.put("kv-cas", b"one")
    second = await store.update("kv-cas", b"two", last=first)
    assert second > first

    with pytest.raises(DesiredStateConflict) as info:
        await store.update("kv-cas", b"three", last=first)
    assert info.value.node == "kv-cas"
    assert info.value.expected == first
    entry = await store.get("kv-cas")
    assert entry is not None and entry.value == b"two"


async def test_create_only_succeeds_when_the_node_has_no_state_yet(bus: Bus) -> None:
    store = await bus.desired_state()
    await store.create("kv-create", b"first")
    with pytest.raises(DesiredStateConflict):
        await store.create("kv-create", b"second")
    await store.delete("kv-create")
    assert await store.get("kv-create") is None
    await store.create("kv-create", b"after delete")  # a deleted node counts as new


def _watch_bucket(name: str) -> KeyValueSpec:
    return KeyValueSpec(
        bucket=name, description="test", history=5, max_value_size=1 << 20, max_bytes=1 << 24
    )


async def test_watch_yields_current_values_then_caught_up_then_live_updates(bus: Bus) -> None:
    store = await bus.desired_state(_watch_bucket("test-watch-order"))
    await store.put("a", b"a1")
    await store.put("b", b"b1")
    await store.put("a", b"a2")  # only the latest value of a key is current
    await store.put("gone", b"x")
    await store.delete("gone")  # a deleted key is not part of the snapshot

    async with store.watch() as watch:
        snapshot: list[DesiredStateEntry] = []
        async with asyncio.timeout(WAIT):
            async for item in watch:
                if isinstance(item, CaughtUp):
                    break
                snapshot.append(item)
        assert [(e.node, e.value, e.initial) for e in snapshot] == [
            ("b", b"b1", True),
            ("a", b"a2", True),
        ]

        await store.put("c", b"c1")
        await store.delete("a")
        live: list[DesiredStateEntry | CaughtUp] = []
        async with asyncio.timeout(WAIT):
            while len(live) < 2:
                item = await anext(watch)
                live.append(item)
    assert not any(isinstance(e, CaughtUp) for e in live), "CAUGHT_UP is sent only once"
    assert [
        (e.node, e.operation, e.value, e.initial) for e in live if not isinstance(e, CaughtUp)
    ] == [
        ("c", "put", b"c1", False),
        ("a", "delete", None, False),
    ]


async def test_watch_of_an_empty_bucket_says_caught_up_first(bus: Bus) -> None:
    store = await bus.desired_state(_watch_bucket("test-watch-empty"))
    async with store.watch() as watch, asyncio.timeout(WAIT):
        assert isinstance(await anext(watch), CaughtUp)
        await store.put("n1", b"v")
        item = await anext(watch)
    assert isinstance(item, DesiredStateEntry)
    assert (item.node, item.value, item.initial) == ("n1", b"v", False)


async def test_watch_of_one_node_sees_only_that_node(bus: Bus) -> None:
    store = await bus.desired_state(_watch_bucket("test-watch-one"))
    await store.put("mine", b"1")
    await store.put("other", b"1")
    async with store.watch("mine") as watch, asyncio.timeout(WAIT):
        first = await anext(watch)
        assert isinstance(await anext(watch), CaughtUp)
        await store.put("other", b"2")
        await store.put("mine", b"2")
        live = await anext(watch)
    assert isinstance(first, DesiredStateEntry) and first.node == "mine"
    assert isinstance(live, DesiredStateEntry) and (live.node, live.value) == ("mine", b"2")


# ---------------------------------------------------------------------------------- reconnect


async def test_the_bus_reconnects_after_a_server_restart_and_publishes_again(
    tmp_path: Path, transport: Transport
) -> None:
    server = EmbeddedNats(store_dir=tmp_path / "js", tls=transport.server)
    await server.astart()
    try:
        bus = await Bus.connect(server.url, name="test-reconnect", reconnect_time_wait=0.05,
                                tls=transport.client)  # fmt: skip
        async with bus:
            await bus.ensure_streams()
            before = await bus.publish(link_event(200))
            reconnects = counter_value(RECONNECTS, "test-reconnect")
            disconnects = counter_value(DISCONNECTS, "test-reconnect")
            port = server.port

            await server.arestart()  # same port, same store directory

            assert server.port == port
            await eventually(
                lambda: counter_value(RECONNECTS, "test-reconnect") > reconnects, "reconnect"
            )
            async with asyncio.timeout(WAIT):
                await bus.wait_connected()
            after = await bus.publish(link_event(200, "up"))

            assert counter_value(DISCONNECTS, "test-reconnect") > disconnects
            assert before is not None and after == before + 1  # the stream survived on disk
    finally:
        await server.astop()


async def test_connect_to_a_port_with_no_server_fails_within_the_timeout() -> None:
    port = free_port()
    with pytest.raises(BusConnectError, match=str(port)):
        await Bus.connect(f"nats://127.0.0.1:{port}", connect_timeout=0.5)


async def test_a_servers_refusal_stays_in_the_error_when_later_attempts_end_in_resets() -> None:
    """Under load a refused client often reads a reset instead of the server's -ERR (it
    writes its PING after the server closed). What the server said once must still be in
    the error, however many resets came after it."""
    attempts = 0
    info = b'INFO {"server_id":"scripted","version":"2.10.0","proto":1,"max_payload":1048576}\r\n'

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.write(info)
        await writer.drain()
        await reader.readline()  # CONNECT
        if attempts == 1:  # as nats-server answers a wrong password
            writer.write(b"-ERR 'Authorization Violation'\r\n")
            await writer.drain()
        else:  # the -ERR lost to the reset
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(BusConnectError) as refused:
            await Bus.connect(f"nats://127.0.0.1:{port}", connect_timeout=1.5,
                              reconnect_time_wait=0.05)  # fmt: skip
    finally:
        server.close()
    assert attempts > 2
    assert "Authorization Violation" in str(refused.value)
    assert "last error: Connection" in str(refused.value)  # and what happened last


# ------------------------------------------------------------------------------ EmbeddedNats


def test_a_free_port_is_one_outgoing_connections_are_never_given() -> None:
    """A picked port is bound later by a child: meanwhile the kernel gives outgoing
    connections ports of its ephemeral range only, so one below it cannot be taken that way."""
    low, _ = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(20)]
    assert all(1024 <= port < low for port in ports), ports
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))  # and it is free


def test_embedded_server_reports_the_reason_when_it_cannot_start() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(NatsServerError, match=r"(?i)address already in use"):
            EmbeddedNats(port=port, startup_timeout=5).start()


def test_embedded_server_with_a_missing_binary_says_so() -> None:
    with pytest.raises(NatsServerError, match="does not exist"):
        EmbeddedNats(binary="/nonexistent/nats-server").start()


def test_embedded_server_stops_and_removes_its_temporary_store() -> None:
    with EmbeddedNats() as server:
        store = server.store_dir
        assert server.running and store.is_dir()
        assert server.url.startswith("nats://127.0.0.1:")
    assert not server.running
    assert not store.exists()


def test_embedded_server_spawned_after_a_crash_keeps_its_port_store_and_given_log(
    tmp_path: Path,
) -> None:
    """What thorn-run's supervisor relies on: `spawn()` after a crash, without waiting."""
    server = EmbeddedNats(store_dir=tmp_path / "js", log_dir=tmp_path / "logs", new_session=True)
    server.start()
    try:
        port = server.port
        assert server.returncode is None
        server.kill()
        assert server.returncode == -9
        server.spawn()
        assert server.port == port and server.store_dir == tmp_path / "js"
        assert server.pid is not None and os.getsid(server.pid) == server.pid  # own session
        deadline = time.monotonic() + WAIT
        while not _greeting_seen("127.0.0.1", port, timeout=0.5):
            assert server.returncode is None, server.log_tail()
            assert time.monotonic() < deadline, "the spawned server never accepted clients"
            time.sleep(0.02)
    finally:
        server.stop()
    assert server.log_path == tmp_path / "logs" / "nats-server.log"
    assert "Server is ready" in server.log_path.read_text()  # a given log dir is kept
    assert (tmp_path / "js").is_dir()


async def test_resolve_nats_uses_a_given_url_as_is() -> None:
    async with resolve_nats("nats://nats.example:4222") as url:
        assert url == "nats://nats.example:4222"


async def test_resolve_nats_without_a_url_runs_an_embedded_server_for_the_block() -> None:
    async with resolve_nats(None) as url, await Bus.connect(url, name="test-resolve") as bus:
        assert bus.is_connected
    with pytest.raises(BusConnectError):
        await Bus.connect(url, connect_timeout=0.3)


async def test_a_comma_separated_url_lists_the_servers_of_a_cluster(
    nats_server: EmbeddedNats, transport: Transport
) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    async with await Bus.connect(f"{dead}, {nats_server.url}", name="test-cluster",
                                 tls=transport.client) as bus:  # fmt: skip
        assert bus.is_connected


async def test_rewriting_every_document_keeps_one_set_in_the_desired_state_bucket(
    bus: Bus,
) -> None:
    # A staged rollout writes a node several times; with 5 revisions kept, a k=32 fabric's
    # rollouts filled the bucket's 1 GiB and the server refused every write after.
    kv = await bus.desired_state()
    stream = f"KV_{DESIRED_STATE_KV.bucket}"
    before = (await bus.js.stream_info(stream)).state.bytes
    document = b"x" * 100_000
    nodes = [f"bucket-size-{n}" for n in range(20)]
    for _ in range(5):
        for node in nodes:
            await kv.put(node, document)
    grown = (await bus.js.stream_info(stream)).state.bytes - before
    assert grown < 1.5 * len(nodes) * len(document)  # one set, not five
