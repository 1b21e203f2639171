"""The database failing under one request, on the real PostgreSQL server: a connection cut
at COMMIT (the outcome is looked up, so the answer is the truth), a statement held past
THORN_DB_STATEMENT_TIMEOUT_MS by another connection's lock, no pooled connection free within
THORN_DB_POOL_TIMEOUT_S. Each is a 503 with Retry-After naming why, counted, and leaves the
store as it was; a commit that did happen is reported as done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url
from tcp_proxy import CommitCutter

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import TOPOLOGY_CHANGED, TopologyChanged
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import NodeSpec, Role, TokenRole
from thorn.store import PoolSettings, Store, StoreUnavailable
from thorn_topology.app import create_app

pytestmark = pytest.mark.postgres

ADMIN = fixed_token("outage-admin")
NODE = {"name": "extra1", "role": "switch", "ports": [{"name": "swp1"}]}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def seeded(url: str, pool: PoolSettings | None = None) -> Store:
    store = await Store.open(url, pool=pool)
    await store.replace(Fabric.from_document(leaf_spine(2, 2, 2)), expected_revision=0,
                        actor="test", detail={})  # fmt: skip
    await store.put_token("admin", TokenRole.admin, hash_token(ADMIN), "test")
    return store


async def add_node(store: Store, fabric: Fabric, name: str) -> int:
    return await store.commit(
        fabric.add_node(NodeSpec(name=name, role=Role.switch)),
        expected_revision=fabric.revision, next_link_id=fabric.next_link_id,
        actor="test", action="node.create", target=name, detail={},
    )  # fmt: skip


@asynccontextmanager
async def cut_store(postgres_url: str, timeout_s: float = 10.0) -> AsyncIterator[
    tuple[Store, CommitCutter]
]:  # fmt: skip
    """A store that reaches the server through a CommitCutter."""
    url = make_url(postgres_url)
    assert url.host is not None
    async with CommitCutter(url.host, url.port or 5432) as cutter:
        through = url.set(port=cutter.port).render_as_string(hide_password=False)
        store = await seeded(through, PoolSettings(timeout_s=timeout_s))
        try:
            yield store, cutter
        finally:
            await store.close()


# --- a connection lost at COMMIT --------------------------------------------------------------


async def test_a_commit_whose_answer_was_lost_is_looked_up_and_reported_committed(
    postgres_url: str,
) -> None:
    committed = sample("thorn_store_commits_in_doubt_total", outcome="committed")
    async with cut_store(postgres_url) as (store, cutter):
        fabric = await store.load()
        cutter.cut_at_commit("after")
        revision = await add_node(store, fabric, "extra1")
        assert cutter.cuts == 1
        loaded = await store.load()
    assert revision == loaded.revision == 2 and "extra1" in loaded.nodes
    assert sample("thorn_store_commits_in_doubt_total", outcome="committed") == committed + 1


async def test_a_commit_the_server_never_got_is_store_unavailable_and_writes_nothing(
    postgres_url: str,
) -> None:
    aborted = sample("thorn_store_commits_in_doubt_total", outcome="aborted")
    async with cut_store(postgres_url) as (store, cutter):
        fabric = await store.load()
        cutter.cut_at_commit("before")
        with pytest.raises(StoreUnavailable) as caught:
            await add_node(store, fabric, "extra1")
        assert cutter.cuts == 1 and caught.value.reason == "connection"
        loaded = await store.load()
    assert loaded.revision == 1 and "extra1" not in loaded.nodes
    assert sample("thorn_store_commits_in_doubt_total", outcome="aborted") == aborted + 1


async def test_a_commit_whose_outcome_cannot_be_learnt_in_time_says_so(
    postgres_url: str,
) -> None:
    """The server committed, but stays out of reach for longer than the pool timeout: the
    answer is commit_unknown (read it back), never a claim that nothing was written."""
    async with cut_store(postgres_url, timeout_s=0.5) as (store, cutter):
        fabric = await store.load()
        cutter.cut_at_commit("after")
        cutter.refusing = True
        with pytest.raises(StoreUnavailable) as caught:
            await add_node(store, fabric, "extra1")
        assert caught.value.reason == "commit_unknown" and "read it back" in str(caught.value)
        cutter.refusing = False
        assert "extra1" in (await store.load()).nodes  # it had committed


# --- through the API --------------------------------------------------------------------------


@asynccontextmanager
async def topology(store: Store, nats_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The real topology app on `store`, in this process."""
    async with await Bus.connect(nats_url, name="test-outages") as bus:
        await bus.ensure_streams()
        app = create_app(Settings(data_dir=tmp_path, nats_url="unused"), store=store, bus=bus)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://topology", headers=headers
            ) as client:
                yield client


def assert_503(response: httpx.Response, reason: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "2"
    body = response.json()
    assert body["errors"][0]["loc"] == ["database"] and body["errors"][0]["type"] == reason
    assert "nothing was changed" in body["detail"] and "retry in 2 s" in body["detail"]


async def test_a_write_committed_just_before_the_database_went_away_is_answered_201(
    postgres_url: str, nats_url: str, tmp_path: Path
) -> None:
    """The COMMIT was answered, then the database went away before the response was built:
    the client hears 201 from the snapshot the write made, not a 503 saying nothing was."""
    async with (
        cut_store(postgres_url) as (store, cutter),
        topology(store, nats_url, tmp_path) as client,
    ):
        # the snapshot is loaded (a read transaction, ended by a COMMIT of its own)
        assert (await client.get("/api/v1/fabric/summary")).status_code == 200
        cutter.cut_at_commit("dark")
        created = await client.post("/api/v1/nodes", json=NODE)
        assert cutter.cuts == 1 and cutter.refusing
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "extra1"
        cutter.refusing = False
        assert "extra1" in (await store.load()).nodes


async def test_an_import_committed_just_before_the_database_went_away_is_answered_and_announced(
    postgres_url: str, nats_url: str, tmp_path: Path
) -> None:
    """The worker process's COMMIT of an import was answered, then the database went away
    before topology reloaded: 200, and topology.changed goes out for the revision."""
    announced: list[TopologyChanged] = []

    async def collect(event: TopologyChanged) -> None:
        announced.append(event)

    async with cut_store(postgres_url) as (store, cutter), await Bus.connect(nats_url) as bus:
        subscription = await bus.subscribe(TOPOLOGY_CHANGED, collect, model=TopologyChanged)
        async with topology(store, nats_url, tmp_path) as client:
            assert (await client.get("/api/v1/fabric/summary")).status_code == 200
            cutter.cut_at_commit("dark")
            doc = leaf_spine(2, 3, 2).model_dump(mode="json")
            imported = await client.post("/api/v1/fabric/import", json=doc)
            assert cutter.cuts == 1 and cutter.refusing
            assert imported.status_code == 200, imported.text
            revision = imported.json()["summary"]["revision"]
            for _ in range(100):  # published from topology's outbox a moment later
                if any(e.revision == revision for e in announced):
                    break
                await asyncio.sleep(0.05)
            assert [e.revision for e in announced] == [revision]
            cutter.refusing = False
            loaded = await store.load()
        await subscription.unsubscribe()
    assert loaded.revision == revision == 2 and len(loaded.nodes) == 2 + 3 + 6


async def test_a_write_held_past_the_statement_timeout_is_a_503_and_writes_nothing(
    postgres_url: str, nats_url: str, tmp_path: Path
) -> None:
    counted = sample("thorn_api_store_unavailable_total", reason="statement_timeout")
    store = await seeded(postgres_url, PoolSettings(statement_timeout_ms=300))
    conninfo = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    try:
        async with topology(store, nats_url, tmp_path) as client:
            with psycopg.connect(conninfo) as other:
                # Another session holds the revision row's table: reads go on, writes wait.
                other.execute("LOCK TABLE meta IN EXCLUSIVE MODE")
                start = time.monotonic()
                held = await client.post("/api/v1/nodes", json=NODE)
                waited = time.monotonic() - start
                assert (await client.get("/api/v1/fabric/summary")).status_code == 200
                other.rollback()
            assert_503(held, "statement_timeout")
            assert 0.3 <= waited < 5.0
            loaded = await store.load()
            assert loaded.revision == 1 and "extra1" not in loaded.nodes
            assert (await client.post("/api/v1/nodes", json=NODE)).status_code == 201
    finally:
        await store.close()
    assert sample("thorn_api_store_unavailable_total", reason="statement_timeout") == counted + 1


async def test_no_free_connection_within_the_pool_timeout_is_a_503(
    postgres_url: str, nats_url: str, tmp_path: Path
) -> None:
    counted = sample("thorn_api_store_unavailable_total", reason="pool_timeout")
    store = await seeded(postgres_url, PoolSettings(size=1, max_overflow=0, timeout_s=0.3))
    try:
        async with topology(store, nats_url, tmp_path) as client:
            async with store.engine.connect():  # the pool's only connection, held
                start = time.monotonic()
                starved = await client.post("/api/v1/nodes", json=NODE)
                waited = time.monotonic() - start
            assert_503(starved, "pool_timeout")
            assert 0.3 <= waited < 5.0
            assert "extra1" not in (await store.load()).nodes
            assert (await client.post("/api/v1/nodes", json=NODE)).status_code == 201
    finally:
        await store.close()
    assert sample("thorn_api_store_unavailable_total", reason="pool_timeout") == counted + 1
