"""RC budgets per tenant over real NATS and a real store (SQLite and PostgreSQL): admins
declare NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT on tenants through the topology API (out-of-range
values are a 422 naming the field and change nothing; the fabric document keeps them), and
health judges each stored failover against the budget of every tenant whose pairs it moved,
and each tenant's p99 over its recent failovers, with a warning when the budget is tighter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from alembic import command
from alembic.config import Config
from fastapi import FastAPI
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY
from rc_tenants import fabric_of_two_tenants
from sqlalchemy import Connection, text
from waiting import eventually

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import STREAM_FAILOVER, FailoverEvent, Trace, new_trace_id, utcnow
from thorn.model import TokenRole
from thorn.store import Store
from thorn.store.store import MIGRATIONS
from thorn_health.app import create_app as health_app
from thorn_health.service import HealthService
from thorn_topology.app import create_app as topology_app

ADMIN = fixed_token("budget-admin")
VIEWER = fixed_token("budget-viewer")


@pytest_asyncio.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-rc-budget") as connected:
        await connected.ensure_streams()
        await connected.js.purge_stream(STREAM_FAILOVER.name)  # an empty failover history
        yield connected


@pytest_asyncio.fixture
async def tenants_store(store: Store) -> Store:
    """Tenants a (timeout 14), b (undeclared), c (18), d (16) with workloads on h1..h3."""
    await store.put_token("viewer", TokenRole.viewer, hash_token(VIEWER), "test")
    await store.replace(
        fabric_of_two_tenants(), expected_revision=0, actor="test", detail={}
    )  # fmt: skip
    return store


async def started(stack: AsyncExitStack, app: FastAPI) -> httpx.AsyncClient:
    await stack.enter_async_context(app.router.lifespan_context(app))
    transport = httpx.ASGITransport(app=app)
    return await stack.enter_async_context(
        httpx.AsyncClient(transport=transport, base_url="http://t")
    )


def settings(tmp: Path) -> Settings:
    return Settings(admin_token=ADMIN, data_dir=tmp, nats_url="unused")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
    return await client.request(method, f"/api/v1{path}", headers=auth(ADMIN), **kw)


# --- declaring the budget (topology) -----------------------------------------------------------


async def test_a_declared_budget_is_shown_with_its_effect_and_null_returns_it_to_ncclS_default(
    store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        topology = await started(stack, topology_app(settings(tmp_path), store=store, bus=bus))
        created = await call(topology, "POST", "/tenants",
                             json={"name": "team-a", "nccl_ib_timeout": 14})  # fmt: skip
        assert created.status_code == 201, created.text
        budget = created.json()["rc_budget"]
        assert (budget["nccl_ib_timeout"], budget["nccl_ib_timeout_declared"]) == (14, True)
        assert (budget["nccl_ib_retry_cnt"], budget["nccl_ib_retry_cnt_declared"]) == (7, False)
        assert round(budget["rc_timeout_ms"], 3) == 67.109
        assert round(budget["retry_budget_ms"], 1) == 536.9
        assert created.json()["nccl_ib_retry_cnt"] is None  # as declared: nothing

        patched = await call(topology, "PATCH", "/tenants/team-a", json={"nccl_ib_retry_cnt": 3})
        assert patched.status_code == 200, patched.text
        assert patched.json()["nccl_ib_timeout"] == 14  # untouched
        assert patched.json()["rc_budget"]["nccl_ib_retry_cnt_declared"] is True
        undeclared = await call(
            topology, "PATCH", "/tenants/team-a", json={"nccl_ib_timeout": None}
        )
        shown = (await call(topology, "GET", "/tenants/team-a")).json()
        assert shown == undeclared.json()
        assert (shown["nccl_ib_timeout"], shown["rc_budget"]["nccl_ib_timeout"]) == (None, 20)
        assert shown["rc_budget"]["nccl_ib_timeout_declared"] is False
        listed = (await call(topology, "GET", "/tenants")).json()["items"]
        assert [t["rc_budget"]["nccl_ib_retry_cnt"] for t in listed] == [3]
        audit = (await call(topology, "GET", "/audit", params={"action": "tenant.update"})).json()
        assert [e["detail"] for e in audit["items"]] == [
            {"nccl_ib_timeout": None}, {"nccl_ib_retry_cnt": 3},
        ]  # fmt: skip


async def test_an_out_of_range_budget_is_a_422_naming_the_field_and_changes_nothing(
    store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        topology = await started(stack, topology_app(settings(tmp_path), store=store, bus=bus))
        declared = {"name": "team-a", "nccl_ib_timeout": 14, "nccl_ib_retry_cnt": 7}
        ok = await call(topology, "POST", "/tenants", json=declared)
        assert ok.status_code == 201
        before = (await call(topology, "GET", "/fabric")).json()
        bad = [("nccl_ib_timeout", 0), ("nccl_ib_timeout", 32), ("nccl_ib_timeout", "soon"),
               ("nccl_ib_retry_cnt", 8), ("nccl_ib_retry_cnt", -1)]  # fmt: skip
        for field, value in bad:
            patched = await call(topology, "PATCH", "/tenants/team-a", json={field: value})
            assert patched.status_code == 422, (field, value, patched.text)
            assert patched.json()["errors"][0]["loc"] == ["body", field]
            assert field in patched.json()["detail"]
            body = {"name": "team-b", field: value}
            created = await call(topology, "POST", "/tenants", json=body)
            assert created.status_code == 422 and created.json()["errors"][0]["loc"] == [
                "body", field,
            ]  # fmt: skip
            document = {**before, "tenants": [{"name": "team-a", field: value}]}
            imported = await call(topology, "POST", "/fabric/import", json=document)
            assert imported.status_code == 422
            assert imported.json()["errors"][0]["loc"] == ["body", "tenants", 0, field]
        after = (await call(topology, "GET", "/fabric")).json()
        assert after == before  # same revision, same tenants: nothing stored
        assert (await store.load()).tenant("team-a").nccl_ib_timeout == 14


async def test_the_fabric_document_round_trips_declared_and_undeclared_budgets(
    tenants_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = topology_app(settings(tmp_path), store=tenants_store, bus=bus)
        topology = await started(stack, app)
        exported = (await call(topology, "GET", "/fabric")).json()
        tenants = {t["name"]: t for t in exported["tenants"]}
        assert (tenants["a"]["nccl_ib_timeout"], tenants["b"]["nccl_ib_timeout"]) == (14, None)
        reimported = await call(topology, "POST", "/fabric/import", json=exported)
        assert reimported.status_code == 200, reimported.text
        again = (await call(topology, "GET", "/fabric")).json()
        assert again["tenants"] == exported["tenants"] and again["revision"] == 2
        b = (await call(topology, "GET", "/tenants/b")).json()["rc_budget"]
        assert b["nccl_ib_timeout_declared"] is False  # still undeclared after the round trip


async def test_the_migration_leaves_existing_tenants_undeclared(database_url: str) -> None:
    store = await Store.open(database_url, migrate=False)
    try:

        def upgrade(conn: Connection, to: str) -> None:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, to)

        async with store.engine.begin() as conn:
            await conn.run_sync(upgrade, "0003")
            await conn.execute(text("INSERT INTO tenants (name, description) VALUES ('old', 'x')"))
        await store.migrate()
        old = (await store.load()).tenant("old")
        assert (old.description, old.nccl_ib_timeout, old.nccl_ib_retry_cnt) == ("x", None, None)
    finally:
        await store.close()


# --- judging failovers (health) ----------------------------------------------------------------


def switch_repair(node: str, prefixes: list[str], gap_ms: float, t0: datetime) -> FailoverEvent:
    """A switch's own repair, detected and applied on its clock `gap_ms` apart."""
    trace = (
        Trace(id=new_trace_id())
        .then("detected", node, at=t0)
        .then("agent_applied", node, at=t0 + timedelta(milliseconds=gap_ms))
    )
    return FailoverEvent(
        node=node, peers=prefixes, from_colour=None, to_colour="backup",
        at=t0 + timedelta(milliseconds=gap_ms), reason="carrier lost on swp1", tier="switch",
        trace=trace,
    )  # fmt: skip


async def failovers(client: httpx.AsyncClient, n: int) -> list[dict[str, Any]]:
    page: dict[str, Any] = {}

    async def enough() -> bool:
        response = await client.get("/api/v1/failovers", headers=auth(VIEWER))
        page.update(response.json())
        return bool(page["total"] >= n)

    await eventually(enough, f"{n} failovers stored")
    items: list[dict[str, Any]] = page["items"]
    return items


async def test_each_failover_is_judged_against_the_budget_of_each_tenant_whose_pairs_it_moved(
    tenants_store: Store, bus: Bus, tmp_path: Path
) -> None:
    t0 = utcnow() - timedelta(minutes=5)
    toward_h2 = switch_repair("leaf1", ["10.0.0.2/32"], 4.0, t0)  # tenant a's pair h1 <-> h2
    shared = Trace(id=new_trace_id()).then("detected", "spine1", at=t0)
    across_clocks = FailoverEvent(
        node="h1", peers=["h2", "h3"], from_colour="red", to_colour="blue", tier="central",
        at=t0 + timedelta(seconds=1), reason="central: link 5",
        trace=shared.then("agent_applied", "h1", at=t0 + timedelta(seconds=1)),
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        health = await started(stack, health_app(settings(tmp_path), store=tenants_store, bus=bus))
        await bus.publish(toward_h2)
        await bus.publish(across_clocks)
        by_tier = {f["tier"]: f for f in await failovers(health, 2)}
        central, switch = by_tier["central"], by_tier["switch"]
        [a] = switch["rc_budget"]
        assert (a["tenant"], a["status"], a["measured_ms"], a["retransmissions"]) == (
            "a", "within_one_timeout", 4.0, 1,
        )  # fmt: skip
        assert a["budget"]["nccl_ib_timeout"] == 14 and a["within_retry_budget"] is True
        assert a["summary"].startswith("failover 4 ms = 6% of one RC timeout at NCCL_IB_TIMEOUT=14")
        shown = await health.get(f"/api/v1/failovers/{central['id']}", headers=auth(VIEWER))
        verdicts = shown.json()["rc_budget"]
        assert [(v["tenant"], v["status"]) for v in verdicts] == [
            ("a", "unmeasured"), ("b", "unmeasured"),
        ]  # fmt: skip
        assert verdicts[0]["unmeasured_reason"] == (
            "the gap's ends were read on different clocks (spine1, h1)"
        )


async def test_a_tenant_whose_budget_is_tighter_than_its_p99_gets_a_warning_and_a_gauge(
    tenants_store: Store, bus: Bus, tmp_path: Path
) -> None:
    t0 = utcnow() - timedelta(minutes=5)
    async with AsyncExitStack() as stack:
        topology = await started(
            stack, topology_app(settings(tmp_path), store=tenants_store, bus=bus)
        )
        health_application = health_app(settings(tmp_path), store=tenants_store, bus=bus)
        health = await started(stack, health_application)
        for i, gap in enumerate((2.0, 3.0, 9.0)):  # toward h3: tenant b's pairs
            await bus.publish(switch_repair("leaf2", ["10.0.0.3/32"], gap, t0 + timedelta(i)))
        await failovers(health, 3)

        async def summary() -> dict[str, Any]:
            response = await health.get("/api/v1/failovers/budget/b", headers=auth(VIEWER))
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

        fine = await summary()  # NCCL's default 20: 9 ms is 0.2% of one 4.3 s timeout
        assert (fine["failovers"], fine["p50_ms"], fine["p99_ms"]) == (3, 3.0, 9.0)
        assert fine["status"] == "within_one_timeout" and fine["warning"] is None
        assert fine["budget"]["nccl_ib_timeout_declared"] is False

        # the admin declares what team b's jobs really run with: one timeout is ~4.2 ms
        patched = await call(topology, "PATCH", "/tenants/b", json={"nccl_ib_timeout": 10})
        assert patched.status_code == 200, patched.text

        async def tightened() -> bool:  # health follows topology.changed
            return bool((await summary())["budget"]["nccl_ib_timeout"] == 10)

        await eventually(tightened, "health to judge with the declared budget")
        tight = await summary()
        assert tight["status"] == "retransmits" and tight["over_rc_timeout"] == 1
        assert tight["warning"].startswith(
            "budget tighter than the measured p99: p99 failover 9 ms"
        )
        assert tight["summary"].startswith(
            "p99 failover 9 ms = 215% of one RC timeout at NCCL_IB_TIMEOUT=10"
        )
        every = (await health.get("/api/v1/failovers/budget", headers=auth(VIEWER))).json()
        assert [s["tenant"] for s in every["items"]] == ["a", "b", "c", "d"]
        assert [s["failovers"] for s in every["items"]] == [0, 3, 0, 0]

        service: HealthService = health_application.state.health
        await service.budgets.refresh_metrics()
        labels = {"tenant": "b"}
        assert REGISTRY.get_sample_value("thorn_health_tenant_rc_budget_warning", labels) == 1
        p99 = REGISTRY.get_sample_value(
            "thorn_health_tenant_failover_seconds", {**labels, "quantile": "0.99"}
        )
        assert p99 == 9e-3

        # bad input: a 4xx naming it
        for params, field in [({"failovers": "0"}, "failovers"), ({"since": "soon"}, "since")]:
            response = await health.get("/api/v1/failovers/budget/b", params=params,
                                        headers=auth(VIEWER))  # fmt: skip
            assert response.status_code == 422
            assert response.json()["errors"][0]["loc"] == ["query", field]
        missing = await health.get("/api/v1/failovers/budget/nobody", headers=auth(VIEWER))
        assert missing.status_code == 404 and "tenant 'nobody' not found" in missing.text
        assert (await health.get("/api/v1/failovers/budget")).status_code == 401
