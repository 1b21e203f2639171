"""The failover history over real NATS and a real store (SQLite and PostgreSQL): agents'
`FailoverEvent`s on THORN_FAILOVER are stored by health (a durable pull consumer) and
answered at GET /api/v1/failovers as one timeline per trace: merged hops, latencies only
on one clock, filters, pages, 4xx naming the field; a malformed message is dropped and
counted, a failed write retried, a redelivery stored once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from fastapi import FastAPI
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY
from sqlalchemy.exc import DataError

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import STREAM_FAILOVER, FailoverEvent, Trace, new_trace_id, utcnow
from thorn.model import TokenRole
from thorn.store import Store
from thorn.store.failovers import FailoverQuery, FailoverRecord
from thorn_health.app import create_app
from thorn_health.recorder import CONSUMER
from thorn_health.service import HealthService

VIEWER = fixed_token("failover-viewer")
WAIT = 10.0


async def until(check: Callable[[], Any], what: str) -> None:
    for _ in range(int(WAIT / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def metric(result: str) -> float:
    return REGISTRY.get_sample_value("thorn_health_failovers_total", {"result": result}) or 0.0


@pytest_asyncio.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-failovers") as connected:
        await connected.ensure_streams()
        # The stream and health's durable outlive a test: start from an empty history.
        await connected.js.purge_stream(STREAM_FAILOVER.name)
        yield connected


@pytest_asyncio.fixture
async def viewer_store(store: Store) -> Store:
    await store.put_token("viewer", TokenRole.viewer, hash_token(VIEWER), "test")
    return store


async def health(stack: AsyncExitStack, store: Store, bus: Bus, tmp: Path) -> FastAPI:
    settings = Settings(data_dir=tmp, nats_url="unused")
    app = create_app(settings, store=store, bus=bus, lease_seconds=1.0)
    await stack.enter_async_context(app.router.lifespan_context(app))
    return app


def api(app: FastAPI, token: str | None = VIEWER) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://health", headers=headers
    )


async def get(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(f"/api/v1/failovers{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def listed(client: httpx.AsyncClient, n: int, **params: Any) -> Any:
    """The list once it holds `n` failovers (health stores them a moment after publishing)."""
    page: dict[str, Any] = {}

    async def enough() -> bool:
        page.update(await get(client, "", **params))
        return bool(page["total"] >= n)

    await until(enough, f"{n} failovers listed")
    assert page["total"] == n, page
    return page


class Scene:
    """One link failure seen by spine1, repaired centrally at host1 and host2 (one trace),
    and a later source-local flip at host3 without a trace."""

    def __init__(self) -> None:
        self.t0 = utcnow().replace(microsecond=0) - timedelta(minutes=5)
        self.trace_id = new_trace_id()
        shared = (
            Trace(id=self.trace_id)
            .then("detected", "spine1", at=self.ms(0))
            .then("health_received", "health", at=self.ms(1.2))
            .then("health_decided", "health", at=self.ms(1.5))
            .then("pathcomp_received", "pathcomp", at=self.ms(1.9))
            .then("pathcomp_decided", "pathcomp", at=self.ms(2.2))
        )
        self.host1 = self.central("host1", ["host3", "host4"], shared, 2.6, 3.1)
        self.host2 = self.central("host2", ["host3"], shared, 2.7, 3.5)
        self.local = FailoverEvent(
            node="host3", peers=["host1"], from_colour="blue", to_colour="red",
            at=self.ms(60_000), reason="bfd blue to host1 down (control_detection_time_expired)",
            tier="source", kernel_ms=0.2,
        )  # fmt: skip

    def ms(self, n: float) -> datetime:
        return self.t0 + timedelta(milliseconds=n)

    def central(
        self, node: str, peers: list[str], shared: Trace, received: float, applied: float
    ) -> FailoverEvent:
        trace = shared.then("agent_received", node, at=self.ms(received))
        return FailoverEvent(
            node=node, peers=peers, from_colour="red", to_colour="blue",
            at=self.ms(applied + 0.1), reason="central: link 5", tier="central",
            kernel_ms=0.4, trace=trace.then("agent_applied", node, at=self.ms(applied)),
        )  # fmt: skip

    async def publish(self, bus: Bus) -> None:
        for event in (self.host1, self.host2, self.local):
            await bus.publish(event)

    @property
    def local_id(self) -> str:
        return f"host3-{self.local.at.strftime('%Y%m%dT%H%M%S.%fZ')}"


async def test_two_agents_of_one_trace_are_one_failover_with_merged_hops_and_honest_latencies(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    scene = Scene()
    async with AsyncExitStack() as stack:
        app = await health(stack, viewer_store, bus, tmp_path)
        await scene.publish(bus)
        async with api(app) as client:
            page = await listed(client, 2)
            local, central = page["items"]  # newest first
            assert central["id"] == scene.trace_id and central["traced"] is True
            assert datetime.fromisoformat(central["started"]) == scene.t0
            assert central["started_clock"] == "spine1"
            assert (central["tier"], central["sources"], central["pairs_moved"]) == (
                "central", ["host1", "host2"], 3,
            )  # fmt: skip
            assert central["link_id"] == 5 and central["reason"] == "central: link 5"
            # detection on spine1's clock, the flips on the hosts': no number is made up
            assert central["gap_ms_upper_bound"] is None and central["gap_clocks_differ"] is True
            assert central["gap_clocks"] == ["spine1", "host1", "host2"]
            assert local["id"] == scene.local_id and local["traced"] is False
            assert (local["tier"], local["sources"], local["pairs_moved"]) == (
                "source", ["host3"], 1,
            )  # fmt: skip
            assert local["gap_ms_upper_bound"] is None and local["gap_clocks_differ"] is False
            assert datetime.fromisoformat(local["started"]) == scene.local.at

            shown = await get(client, f"/{scene.trace_id}")
            hops = [(h["step"], h["clock"], h["after"], h["ms"], h["clocks_differ"])
                    for h in shown["hops"]]  # fmt: skip
            assert hops == [
                ("detected", "spine1", None, None, False),
                ("health_received", "health", 0, None, True),
                ("health_decided", "health", 1, 0.3, False),
                ("pathcomp_received", "pathcomp", 2, None, True),
                ("pathcomp_decided", "pathcomp", 3, 0.3, False),
                ("agent_received", "host1", 4, None, True),
                ("agent_applied", "host1", 5, 0.5, False),
                ("agent_received", "host2", 4, None, True),
                ("agent_applied", "host2", 7, 0.8, False),
            ]
            assert [datetime.fromisoformat(h["at"]) for h in shown["hops"]][:2] == [
                scene.ms(0),
                scene.ms(1.2),
            ]
            assert [(m["node"], m["peers"], m["tier"]) for m in shown["moved"]] == [
                ("host1", ["host3", "host4"], "central"), ("host2", ["host3"], "central"),
            ]  # fmt: skip
            assert shown["moved"][0]["kernel_ms"] == 0.4 and shown["tier"] == "central"
            alone = await get(client, f"/{scene.local_id}")
            assert alone["hops"] == [] and [m["node"] for m in alone["moved"]] == ["host3"]
            assert alone["moved"][0]["from_colour"] == "blue"


async def test_failovers_filter_page_and_refuse_bad_filters_naming_the_field(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    scene = Scene()
    async with AsyncExitStack() as stack:
        app = await health(stack, viewer_store, bus, tmp_path)
        await scene.publish(bus)
        async with api(app) as client:
            await listed(client, 2)

            async def ids(**params: Any) -> list[str]:
                return [i["id"] for i in (await get(client, "", **params))["items"]]

            assert await ids(node="host2") == [scene.trace_id]
            assert await ids(node="host3") == [scene.local_id]  # a peer is not a source
            assert await ids(tier="central") == [scene.trace_id]
            assert await ids(tier="source") == [scene.local_id]
            assert await ids(tier="switch") == []
            assert await ids(link=5) == [scene.trace_id] and await ids(link=6) == []
            middle = scene.ms(30_000).isoformat()
            assert await ids(since=middle) == [scene.local_id]
            assert await ids(until=middle) == [scene.trace_id]
            assert await ids(since=scene.t0.isoformat(), until=middle) == [scene.trace_id]
            first = await get(client, "", limit=1)
            second = await get(client, "", limit=1, offset=1)
            assert [i["id"] for i in first["items"]] == [scene.local_id] and first["total"] == 2
            assert [i["id"] for i in second["items"]] == [scene.trace_id]
            assert (second["limit"], second["offset"]) == (1, 1)
            assert (await get(client, "", offset=2))["items"] == []

            for params, field in [
                ({"tier": "psychic"}, "tier"),
                ({"link": "-1"}, "link"),
                ({"link": "five"}, "link"),
                ({"since": "yesterday"}, "since"),
                ({"since": "2026-12-01T10:00:00"}, "since"),  # no timezone
                ({"until": "0.5"}, "until"),  # a number, not a time (was 1970: the fuzz lane)
                ({"since": "1764842400"}, "since"),
                ({"since": middle, "until": scene.t0.isoformat()}, "until"),
                ({"node": "n" * 64}, "node"),
                ({"limit": "0"}, "limit"),
                ({"offset": "-1"}, "offset"),
                ({"offset": str(2**63)}, "offset"),  # past the store's integers: was a 500
                ({"link": str(2**63)}, "link"),
            ]:
                response = await client.get("/api/v1/failovers", params=params)
                assert response.status_code == 422, (params, response.text)
                assert response.json()["errors"][0]["loc"] == ["query", field], params
            missing = await client.get("/api/v1/failovers/0123456789abcdef")
            assert missing.status_code == 404
            assert "failover '0123456789abcdef' not found" in missing.json()["detail"]
        async with api(app, None) as anonymous:
            assert (await anonymous.get("/api/v1/failovers")).status_code == 401
            assert (await anonymous.get(f"/api/v1/failovers/{scene.trace_id}")).status_code == 401


async def test_a_malformed_failover_message_is_dropped_and_counted_and_the_next_is_stored(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    malformed = metric("malformed")
    scene = Scene()
    async with AsyncExitStack() as stack:
        app = await health(stack, viewer_store, bus, tmp_path)
        await bus.js.publish("failover.x", b"{not json")
        # valid JSON, but the node does not match the subject
        await bus.js.publish("failover.x", scene.local.model_dump_json().encode())
        # a valid event whose node is longer than the store's names
        long = scene.local.model_copy(update={"node": "n" * 70})
        await bus.js.publish(long.subject, long.model_dump_json().encode())
        await bus.publish(scene.local)
        async with api(app) as client:
            page = await listed(client, 1)
            assert [i["id"] for i in page["items"]] == [scene.local_id]
        assert metric("malformed") == malformed + 3

        # terminated, not left for redelivery: nothing pending on health's consumer
        async def settled() -> bool:
            info = await bus.js.consumer_info(STREAM_FAILOVER.name, CONSUMER)
            return bool(info.num_ack_pending == 0 and info.num_pending == 0)

        await until(settled, "health's consumer to have nothing pending")
        async with api(app) as client:
            assert (await get(client, ""))["total"] == 1


async def test_a_failed_write_is_retried_after_a_delay_and_stored_once(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    retried = metric("retried")
    scene = Scene()
    async with AsyncExitStack() as stack:
        app = await health(stack, viewer_store, bus, tmp_path)
        service: HealthService = app.state.health
        service.failovers.retry_base = 0.2
        real = viewer_store.record_failovers
        calls: list[float] = []

        async def flaky(records: list[FailoverRecord]) -> list[bool]:
            calls.append(asyncio.get_running_loop().time())
            if len(calls) == 1:
                raise OSError("the database is away")
            return await real(records)

        viewer_store.record_failovers = flaky  # type: ignore[method-assign]
        await bus.publish(scene.local)
        async with api(app) as client:
            await listed(client, 1)
        assert metric("retried") == retried + 1
        assert len(calls) == 2 and calls[1] - calls[0] >= 0.15  # nak'ed with the delay


async def test_a_row_the_database_refuses_is_dropped_and_the_rest_of_its_batch_is_stored(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    malformed = metric("malformed")
    scene = Scene()
    async with AsyncExitStack() as stack:
        app = await health(stack, viewer_store, bus, tmp_path)
        real = viewer_store.record_failovers
        batches: list[int] = []

        async def picky(records: list[FailoverRecord]) -> list[bool]:
            batches.append(len(records))
            if any(r.node == "host2" for r in records):
                raise DataError("INSERT ...", {}, ValueError("value the database refuses"))
            return await real(records)

        viewer_store.record_failovers = picky  # type: ignore[method-assign]
        # published before health's next fetch: one batch of three
        await app.state.health.failovers.stop()
        await scene.publish(bus)
        await app.state.health.failovers.start()
        async with api(app) as client:
            page = await listed(client, 2)
        assert {i["id"] for i in page["items"]} == {scene.trace_id, scene.local_id}
        assert page["items"][1]["sources"] == ["host1"]  # host2's event was dropped
        assert batches[0] == 3 and metric("malformed") == malformed + 1


async def test_a_redelivered_message_is_stored_once_and_a_recreated_streams_sequence_is_not(
    store: Store,
) -> None:
    scene = Scene()
    from thorn_health.failovers import record_of

    first = record_of(scene.host1, stream_seq=1)
    assert await store.record_failovers([first]) == [True]
    assert await store.record_failovers([first]) == [False]  # its ack was lost: delivered again
    # the stream was recreated: sequence 1 again, but another message
    again = record_of(scene.local, stream_seq=1)
    assert await store.record_failovers([again, record_of(scene.host2, 2)]) == [True, True]
    total, traces = await store.failover_page(FailoverQuery())
    assert total == 2 and [len(t) for t in traces] == [1, 2]
    assert [r.node for r in await store.failover_trace(scene.trace_id)] == ["host1", "host2"]


async def test_two_replicas_share_the_history_and_store_every_event_once(
    viewer_store: Store, bus: Bus, tmp_path: Path
) -> None:
    scene = Scene()
    events = [
        scene.local.model_copy(update={"at": scene.ms(1000 + i), "node": f"host{i % 4 + 1}"})
        for i in range(40)
    ]
    async with AsyncExitStack() as stack:
        first = await health(stack, viewer_store, bus, tmp_path)
        await health(stack, viewer_store, bus, tmp_path)  # a standby consumes too
        for event in events:
            await bus.publish(event)
        async with api(first) as client:
            page = await listed(client, 40, limit=1000)
        assert sorted(i["id"] for i in page["items"]) == sorted(
            f"{e.node}-{e.at.strftime('%Y%m%dT%H%M%S.%fZ')}" for e in events
        )
        total, traces = await viewer_store.failover_page(FailoverQuery(limit=1000))
        assert total == 40 and all(len(t) == 1 for t in traces)
