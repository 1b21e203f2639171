"""The health service over real NATS and a real store (SQLite and PostgreSQL): agents'
reports become `health.link.<id>` events, replies and failure history; flap storms stay
bounded; drains follow the topology; a restart publishes no false downs; malformed reports
are refused; the API filters and pages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import (
    HEALTH_LINK_ALL,
    AgentReport,
    AgentReportReply,
    BfdReport,
    CarrierReport,
    CountersReport,
    Event,
    LinkHealthChanged,
    TopologyChanged,
    agent_report_subject,
    utcnow,
)
from thorn.events import Change as EventChange
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import TokenRole
from thorn.store import Store
from thorn_health.app import create_app
from thorn_health.service import HealthService

VIEWER = fixed_token("health-viewer")
WAIT = 10.0
# leaf_spine(2, 2, 2): link 5 is leaf1:swp3 -- spine1:swp1, link 6 leaf1:swp4 -- spine2:swp1
UPLINK, OTHER = 5, 6


async def until(check: Callable[[], Any], what: str) -> None:
    for _ in range(int(WAIT / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest_asyncio.fixture
async def fabric_store(store: Store) -> Store:
    fabric = Fabric.from_document(leaf_spine(2, 2, 2))
    await store.replace(fabric, expected_revision=0, actor="test", detail={})
    await store.put_token("viewer", TokenRole.viewer, hash_token(VIEWER), "test")
    return store


@pytest_asyncio.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-health") as connected:
        await connected.ensure_streams()
        yield connected


class Events:
    """Every LinkHealthChanged published while the test runs."""

    def __init__(self) -> None:
        self.seen: list[LinkHealthChanged] = []

    async def __call__(self, event: Event) -> None:
        assert isinstance(event, LinkHealthChanged)
        self.seen.append(event)

    def of(self, link_id: int) -> list[tuple[str | None, str]]:
        return [(e.previous, e.state) for e in self.seen if e.link_id == link_id]


@pytest_asyncio.fixture
async def events(bus: Bus) -> AsyncIterator[Events]:
    collected = Events()
    subscription = await bus.subscribe(HEALTH_LINK_ALL, collected)
    yield collected
    await subscription.unsubscribe()


def settings(tmp: Path, **overrides: Any) -> Settings:
    return Settings(data_dir=tmp, nats_url="unused", **overrides)


async def health(
    stack: AsyncExitStack, store: Store, bus: Bus, tmp: Path, active: bool = True,
    **overrides: Any,
) -> FastAPI:  # fmt: skip
    """A health replica; with `active`, once it takes agent reports."""
    app = create_app(settings(tmp, **overrides), store=store, bus=bus, lease_seconds=1.0)
    await stack.enter_async_context(app.router.lifespan_context(app))
    if active:
        async with asyncio.timeout(WAIT):
            await app.state.health.active.wait()
    return app


def api(app: FastAPI, token: str | None = VIEWER) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://health", headers=headers
    )


class Agent:
    """A node's agent as health sees it: numbered reports sent as requests."""

    def __init__(self, bus: Bus, node: str) -> None:
        self.bus, self.node, self.seq = bus, node, 0

    async def send(self, *items: Any) -> AgentReportReply:
        report = AgentReport(node=self.node, seq=self.seq, sent_at=utcnow(), items=list(items))
        self.seq += 1
        return await self.raw(report.model_dump_json().encode())

    async def raw(self, payload: bytes, subject: str | None = None) -> AgentReportReply:
        msg = await self.bus.nc.request(
            subject or agent_report_subject(self.node), payload, timeout=5
        )
        return AgentReportReply.model_validate_json(msg.data)


def carrier(port: str, up: bool, detected_at: datetime | None = None) -> CarrierReport:
    return CarrierReport(
        port=port, admin_up=True, carrier=up, oper_state="up" if up else "down",
        detected_at=detected_at or utcnow(),
    )  # fmt: skip


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_carrier_report_publishes_the_change_replies_and_records_the_failure(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1 = Agent(bus, "leaf1")
    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path)
        service: HealthService = app.state.health
        reply = await leaf1.send(carrier("swp3", True), carrier("swp4", True))
        assert reply == AgentReportReply(ok=True, applied=2)
        # the reply comes after the events were acknowledged by JetStream
        detected = utcnow() - timedelta(milliseconds=3)
        assert (await leaf1.send(carrier("swp3", False, detected))).ok
        await until(lambda: len(events.of(UPLINK)) == 2, "two events of the uplink")
        assert events.of(UPLINK) == [(None, "up"), ("up", "down")]
        assert events.of(OTHER) == [(None, "up")]
        assert [e.source for e in events.seen if e.link_id == UPLINK][-1] == "carrier:leaf1:swp3"
        await service.flush()
        async with api(app) as client:
            link = (await client.get(f"/api/v1/health/links/{UPLINK}")).json()
            assert link["state"] == "down" and link["open_failure"] == "down"
            assert link["sources"] == {"carrier:leaf1:swp3": "down"}
            assert link["a"] == {"node": "leaf1", "port": "swp3"}
            page = (await client.get("/api/v1/health/events")).json()
        [failure] = page["items"]
        assert failure["link_id"] == UPLINK and failure["ended_at"] is None
        assert failure["source"] == "carrier:leaf1:swp3" and failure["source_kind"] == "carrier"
        assert (failure["a"], failure["b"]) == (
            {"node": "leaf1", "port": "swp3"}, {"node": "spine1", "port": "swp1"},
        )  # fmt: skip
        assert datetime.fromisoformat(failure["detected_at"]) == detected
        assert 3 <= failure["detection_latency_ms"] < 1000
        # the other end comes back up later: the failure ends at that report
        assert (await leaf1.send(carrier("swp3", True))).ok
        await until(lambda: events.of(UPLINK)[-1] == ("down", "up"), "the uplink back up")
        await service.flush()
        async with api(app) as client:
            [ended] = (await client.get("/api/v1/health/events")).json()["items"]
        assert ended["end_source"] == "carrier:leaf1:swp3" and ended["duration_s"] > 0


async def stored_state(store: Store, link_id: int) -> str | None:
    return {r.link_id: r.state for r in await store.health_states()}.get(link_id)


async def test_a_report_is_answered_once_what_it_changed_is_in_the_store(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A standby takes over from the store: an answered report must already be there, or a
    kill of the active replica right after its answer would lose it."""
    write = fabric_store.record_health

    async def slow_write(records: Any) -> None:  # the real write, 0.2 s late
        await asyncio.sleep(0.2)
        await write(records)

    monkeypatch.setattr(fabric_store, "record_health", slow_write)
    leaf1 = Agent(bus, "leaf1")
    async with AsyncExitStack() as stack:
        await health(stack, fabric_store, bus, tmp_path)
        assert (await leaf1.send(carrier("swp3", True))).ok
        assert await stored_state(fabric_store, UPLINK) == "up"
        assert (await leaf1.send(carrier("swp3", False))).ok
        assert await stored_state(fabric_store, UPLINK) == "down"


async def test_while_the_database_is_away_reports_are_still_answered_and_stored_later(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    write = fabric_store.record_health
    away = True

    async def write_unless_away(records: Any) -> None:
        if away:
            raise OSError("the database is away")
        await write(records)

    monkeypatch.setattr(fabric_store, "record_health", write_unless_away)
    leaf1 = Agent(bus, "leaf1")
    early = metric("thorn_health_reports_answered_before_stored_total")
    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path)
        assert (await leaf1.send(carrier("swp3", False))).ok
        await until(lambda: events.of(UPLINK)[-1:] == [(None, "down")], "the uplink down")
        assert metric("thorn_health_reports_answered_before_stored_total") == early + 1
        assert await stored_state(fabric_store, UPLINK) is None
        away = False
        async with asyncio.timeout(WAIT):
            await app.state.health.flush()
        assert await stored_state(fabric_store, UPLINK) == "down"


async def test_a_flap_storm_publishes_a_bounded_number_of_events_then_the_link_is_reused(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1 = Agent(bus, "leaf1")
    async with AsyncExitStack() as stack:
        await health(stack, fabric_store, bus, tmp_path, health_half_life_seconds=0.3)
        assert (await leaf1.send(carrier("swp3", True))).ok
        for _ in range(100):  # 200 reports, one flap each, as fast as the agent can send
            await leaf1.send(carrier("swp3", False))
            await leaf1.send(carrier("swp3", True))
        await bus.flush()
        # the first down is held through the storm (up again, never for the up hold), and
        # the penalty makes it flapping
        assert events.of(UPLINK) == [(None, "up"), ("up", "down"), ("down", "flapping")]
        # quiet now: three half-lives later (6,000 -> 750 points) the link is reused, up
        await until(lambda: events.of(UPLINK)[-1] == ("flapping", "up"), "reuse")
        assert len(events.of(UPLINK)) == 4
        assert [e.source for e in events.seen if e.link_id == UPLINK][-1] == "dampening"


async def test_a_drained_link_or_node_is_published_as_drained(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1 = Agent(bus, "leaf1")
    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path)
        assert (await leaf1.send(carrier("swp3", True), carrier("swp4", True))).ok
        fabric = await fabric_store.load()
        changes = fabric.drain_link(UPLINK)
        revision = await fabric_store.commit(
            changes, expected_revision=fabric.revision, next_link_id=fabric.next_link_id,
            actor="test", action="link.drain", target=str(UPLINK), detail={},
        )  # fmt: skip
        await bus.publish(TopologyChanged(revision=revision, at=utcnow(), actor="test"))
        await until(lambda: events.of(UPLINK)[-1:] == [("up", "drained")], "drained")
        # a report while drained changes nothing that anyone acts on
        assert (await leaf1.send(carrier("swp3", False))).ok
        await bus.flush()
        assert events.of(UPLINK)[-1] == ("up", "drained")
        async with api(app) as client:
            drained = (await client.get("/api/v1/health/links?state=drained")).json()
            assert [i["link_id"] for i in drained["items"]] == [UPLINK]
            assert (await client.get("/api/v1/health/events")).json()["total"] == 0


async def commit_with_rows(
    store: Store, bus: Bus, fabric: Fabric, operation: Callable[[Fabric], Any]
) -> int:
    """An operation on `fabric` (the store's) committed and announced as the topology
    service does: with its rows."""
    changes = operation(fabric)
    revision = await store.commit(
        changes, expected_revision=fabric.revision, next_link_id=fabric.next_link_id,
        actor="test", action="test", target="test", detail={},
    )  # fmt: skip
    rows = [
        EventChange(kind=c.kind, op=c.op, key=c.key,
                    value=c.value.model_dump(mode="json") if c.value is not None else None)
        for c in changes
    ]  # fmt: skip
    await bus.publish(TopologyChanged(revision=revision, at=utcnow(), actor="test", changes=rows))
    return revision


async def test_a_topology_change_is_followed_by_replaying_its_rows_not_reading_the_store(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At k=32 a whole read of the store held health's loop ~5 s (its lease lost, reports
    waiting): an itemised change is replayed on the fabric health holds. A gap in revisions
    (an event missed) is still read from the store."""
    reads: list[int] = []
    load = fabric_store.load

    async def counted() -> Fabric:
        reads.append(1)
        return await load()

    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path)
        monkeypatch.setattr(fabric_store, "load", counted)  # the real store, its reads counted
        service: HealthService = app.state.health
        await commit_with_rows(fabric_store, bus, await load(), lambda f: f.drain_link(UPLINK))
        await until(lambda: [s for _, s in events.of(UPLINK)][-1:] == ["drained"], "drained")
        assert reads == [] and service.fabric is not None
        assert service.fabric.links[UPLINK].admin_state.value == "drained"
        # One change health never hears of, then one it does: the second cannot be replayed.
        fabric = await load()
        await fabric_store.commit(fabric.undrain_link(UPLINK), expected_revision=fabric.revision,
                                  next_link_id=fabric.next_link_id, actor="test",
                                  action="link.undrain", target=str(UPLINK), detail={})  # fmt: skip
        revision = await commit_with_rows(fabric_store, bus, await load(),
                                          lambda f: f.drain_link(OTHER))  # fmt: skip
        await until(lambda: service.revision == revision, "the store read")
        assert len(reads) == 1
        assert events.of(UPLINK)[-1][0] == "drained"  # back in service: the store's view
        assert events.of(OTHER)[-1][1] == "drained"


@pytest.mark.parametrize(
    ("payload", "subject", "error"),
    [
        (b"{not json", None, "not a valid AgentReport: payload: Invalid JSON"),
        (b'{"node": "leaf1", "seq": 0, "sent_at": "2026-11-30T10:00:00Z", "items": '
         b'[{"kind": "carrier", "port": "swp3", "admin_up": true, "oper_state": "up", '
         b'"detected_at": "2026-11-30T10:00:00Z"}]}', None,
         "items.0.carrier.carrier: Field required"),
        (b'{"node": "leaf1", "seq": -1, "sent_at": "2026-11-30T10:00:00Z", "items": []}', None,
         "seq: Input should be greater than or equal to 0"),
        (None, "agent.report.leaf2", "node: 'leaf1' does not match the subject's node 'leaf2'"),
        (b"many", None, "items: 3 items, more than this health's limit of 2"),
    ],
    ids=["bad-json", "missing-field", "bad-seq-and-no-items", "wrong-subject", "too-many-items"],
)  # fmt: skip
async def test_a_malformed_report_is_refused_naming_the_field_and_nothing_is_applied(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path,
    payload: bytes | None, subject: str | None, error: str,
) -> None:  # fmt: skip
    leaf1 = Agent(bus, "leaf1")
    good = AgentReport(node="leaf1", seq=0, sent_at=utcnow(), items=[carrier("swp3", False)])
    if payload is None:
        payload = good.model_dump_json().encode()
    elif payload == b"many":
        payload = good.model_copy(update={"items": [carrier("swp3", False)] * 3}).model_dump_json(
        ).encode()  # fmt: skip
    refused = metric("thorn_health_reports_total", result="refused")
    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path, health_max_items=2)
        reply = await leaf1.raw(payload, subject)
        assert not reply.ok and reply.applied == 0
        assert reply.error is not None and error in reply.error
        assert metric("thorn_health_reports_total", result="refused") == refused + 1
        await bus.flush()
        assert events.seen == []
        async with api(app) as client:
            assert (await client.get(f"/api/v1/health/links/{UPLINK}")).json()["state"] == (
                "unknown"
            )


async def test_a_restarted_health_rebuilds_its_state_without_false_downs(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1, spine1 = Agent(bus, "leaf1"), Agent(bus, "spine1")
    async with AsyncExitStack() as stack:
        first = await health(stack, fabric_store, bus, tmp_path)
        ports = [carrier(p, True) for p in ("swp1", "swp2", "swp3", "swp4")]
        assert (await leaf1.send(*ports)).ok
        assert (await spine1.send(carrier("swp1", True), carrier("swp2", True))).ok
        assert (await spine1.send(carrier("swp1", False))).ok  # the uplink fails at spine1
        await until(lambda: events.of(UPLINK)[-1:] == [("up", "down")], "the uplink down")
        await first.state.health.flush()
    before = len(events.seen)

    async with AsyncExitStack() as stack:
        second = await health(stack, fabric_store, bus, tmp_path)
        service: HealthService = second.state.health
        # agents resend their full snapshots (every port's carrier), with fresh sequences
        leaf1.seq = spine1.seq = 0
        ports = [carrier(p, True) for p in ("swp1", "swp2", "swp3", "swp4")]
        assert (await leaf1.send(*ports)).ok
        assert (await spine1.send(carrier("swp1", False), carrier("swp2", True))).ok
        await bus.flush()
        assert events.seen[before:] == []  # nothing changed: nothing is published
        async with api(second) as client:
            link = (await client.get(f"/api/v1/health/links/{UPLINK}")).json()
            assert link["state"] == "down" and link["open_failure"] == "down"
            assert (await client.get("/api/v1/health/events?open=true")).json()["total"] == 1
        # the repair after the restart closes the failure the first run opened
        assert (await spine1.send(carrier("swp1", True))).ok
        await until(lambda: events.of(UPLINK)[-1] == ("down", "up"), "the uplink back up")
        assert [e.state for e in events.seen[before:]] == ["up"]
        await service.flush()
        async with api(second) as client:
            [failure] = (await client.get("/api/v1/health/events")).json()["items"]
        assert failure["ended_at"] is not None and failure["end_source"] == "carrier:spine1:swp1"


async def test_the_api_filters_and_pages_links_events_and_sessions(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1, leaf2 = Agent(bus, "leaf1"), Agent(bus, "leaf2")
    async with AsyncExitStack() as stack:
        app = await health(stack, fabric_store, bus, tmp_path, link_up_hold_ms=0)
        service: HealthService = app.state.health
        start = utcnow()
        # links 1-2 (hosts), 5-6 (uplinks) on leaf1; 3-4, 7-8 on leaf2
        await leaf1.send(*(carrier(p, True) for p in ("swp1", "swp2", "swp3", "swp4")))
        await leaf2.send(*(carrier(p, True) for p in ("swp1", "swp2", "swp3", "swp4")))
        await leaf1.send(carrier("swp1", False), carrier("swp3", False))
        path_session = BfdReport(
            local="10.224.0.2", peer="10.224.0.1", multihop=True, state="down", diag=1,
            detected_at=utcnow(), tx_interval_ms=10.0, detect_time_ms=30.0,
        )  # fmt: skip
        link_session = BfdReport(
            local="10.0.1.0", peer="10.0.1.1", port="swp3", state="down", diag=1,
            detected_at=utcnow(),
        )  # fmt: skip
        await leaf2.send(
            carrier("swp9", False), path_session, link_session
        )  # swp9: no such port, counted
        await leaf1.send(carrier("swp1", True))
        middle = utcnow()
        await leaf2.send(carrier("swp1", False))
        await service.flush()
        async with api(app) as client:

            async def get(path: str, **params: Any) -> Any:
                response = await client.get(f"/api/v1/health/{path}", params=params)
                assert response.status_code == 200, response.text
                return response.json()

            down = await get("links", state="down")
            assert [i["link_id"] for i in down["items"]] == [3, 5, 7]
            assert (await get("links", state="down", node="leaf1"))["total"] == 1
            first = await get("links", limit=3)
            second = await get("links", limit=3, offset=3)
            assert first["total"] == 8 and [i["link_id"] for i in first["items"]] == [1, 2, 3]
            assert [i["link_id"] for i in second["items"]] == [4, 5, 6]
            # failure history: 1 (ended), 5, 7 (BFD), 3 (open), newest first
            every = await get("events")
            assert [i["link_id"] for i in every["items"]] == [3, 7, 5, 1]
            assert [i["link_id"] for i in (await get("events", open="true"))["items"]] == [3, 7, 5]
            assert [i["link_id"] for i in (await get("events", source="bfd"))["items"]] == [7]
            assert [i["link_id"] for i in (await get("events", node="leaf1"))["items"]] == [5, 1]
            assert (await get("events", link_id=1))["items"][0]["ended_at"] is not None
            assert [i["link_id"] for i in (await get("events", since=middle.isoformat()))[
                "items"]] == [3]  # fmt: skip
            window = await get("events", since=start.isoformat(), until=middle.isoformat())
            assert window["total"] == 3
            paged = await get("events", limit=2, offset=1)
            assert [i["link_id"] for i in paged["items"]] == [7, 5] and paged["total"] == 4
            sessions = await get("sessions", multihop="true")
            assert [(s["node"], s["peer"], s["link_id"]) for s in sessions["items"]] == [
                ("leaf2", "10.224.0.1", None)
            ]
            timers = sessions["items"][0]
            assert (timers["tx_interval_ms"], timers["detect_time_ms"]) == (10.0, 30.0)
            # One link's drops and errors over time, from its agents' counter reports.
            t = utcnow()
            for seconds, packets, dropped in ((0, 1000, 0), (10, 3000, 7)):
                await leaf2.send(CountersReport(
                    port="swp2", rx_packets=packets, tx_packets=packets, rx_errors=0,
                    tx_errors=0, rx_dropped=dropped, tx_dropped=0,
                    at=t + timedelta(seconds=seconds)))  # fmt: skip
            await service.flush()
            one = await client.get("/api/v1/health/links/4")
            assert one.status_code == 200, one.text
            [sample] = one.json()["counters"]
            assert (sample["port"], sample["seconds"], sample["rx_packets"],
                    sample["rx_dropped"]) == ("leaf2:swp2", 10.0, 2000, 7)  # fmt: skip
            assert (await get("sessions", node="leaf2"))["total"] == 2

            for path, params, field in [
                ("links", {"state": "sideways"}, "state"),
                ("links", {"limit": "0"}, "limit"),
                ("events", {"since": "yesterday"}, "since"),
                ("events", {"since": "2026-11-30T10:00:00"}, "since"),  # no timezone
                ("events", {"source": "psychic"}, "source"),
                ("events", {"link_id": "-1"}, "link_id"),
                # past the store's integers: an OverflowError, a 500 (the API fuzz lane)
                ("events", {"offset": str(2**63)}, "offset"),
                ("events", {"link_id": str(2**63)}, "link_id"),
                ("events", {"since": middle.isoformat(), "until": start.isoformat()}, "until"),
                ("sessions", {"state": "maybe"}, "state"),
            ]:
                response = await client.get(f"/api/v1/health/{path}", params=params)
                assert response.status_code == 422, (path, params, response.text)
                assert response.json()["errors"][0]["loc"] == ["query", field]
            missing = await client.get("/api/v1/health/links/999")
            assert missing.status_code == 404 and "link 999" in missing.json()["detail"]
        async with api(app, None) as anonymous:
            assert (await anonymous.get("/api/v1/health/links")).status_code == 401
        metrics = (await httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://health"
        ).get("/metrics")).text  # fmt: skip
        for name in (
            "thorn_health_reports_total", "thorn_health_report_items_total",
            "thorn_health_transitions_total", "thorn_health_report_publish_seconds_bucket",
            "thorn_health_links",
        ):  # fmt: skip
            assert name in metrics


async def test_sequence_gaps_are_counted(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1 = Agent(bus, "leaf1")
    gaps = metric("thorn_health_seq_gaps_total")
    async with AsyncExitStack() as stack:
        await health(stack, fabric_store, bus, tmp_path)
        await leaf1.send(carrier("swp3", True))
        leaf1.seq += 4  # four reports lost on the way
        assert (await leaf1.send(carrier("swp3", True))).ok
    assert metric("thorn_health_seq_gaps_total") == gaps + 4


def test_contradictory_dampening_settings_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="THORN_HEALTH_REUSE_AT"):
        create_app(settings(tmp_path, health_reuse_at=3000.0))


async def test_a_standby_replica_serves_the_stored_view_and_takes_over_without_false_downs(
    fabric_store: Store, bus: Bus, events: Events, tmp_path: Path
) -> None:
    leaf1, spine1 = Agent(bus, "leaf1"), Agent(bus, "spine1")
    async with AsyncExitStack() as standby_stack, AsyncExitStack() as first_stack:
        first = await health(first_stack, fabric_store, bus, tmp_path)
        second = await health(standby_stack, fabric_store, bus, tmp_path, active=False)
        standby: HealthService = second.state.health
        assert not standby.active.is_set()
        ports = [carrier(p, True) for p in ("swp1", "swp2", "swp3", "swp4")]
        assert (await leaf1.send(*ports)).ok
        assert (await spine1.send(carrier("swp1", False), carrier("swp2", True))).ok
        await until(lambda: events.of(UPLINK)[-1:] == [("up", "down")], "the uplink down")
        assert not standby.active.is_set()  # the active replica took every report
        await first.state.health.flush()
        # the standby answers from the store
        await until(
            lambda: standby.core.links[UPLINK].state is not None, "the standby's refreshed view"
        )
        async with api(second) as client:
            link = (await client.get(f"/api/v1/health/links/{UPLINK}")).json()
            assert link["state"] == "down" and link["open_failure"] == "down"
        before = len(events.seen)

        await first_stack.aclose()  # the active replica goes away (and hands over)
        async with asyncio.timeout(WAIT):
            await standby.active.wait()
        # agents' next snapshots agree with what was published: nothing new goes out
        assert (await leaf1.send(*ports)).ok
        assert (await spine1.send(carrier("swp1", False), carrier("swp2", True))).ok
        await bus.flush()
        assert events.seen[before:] == []
        assert (await spine1.send(carrier("swp1", True))).ok
        await until(lambda: events.of(UPLINK)[-1] == ("down", "up"), "the uplink back up")
        assert [(e.link_id, e.state) for e in events.seen[before:]] == [(UPLINK, "up")]
