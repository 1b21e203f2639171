"""PostgreSQL restarting under THORN's writes, on a server of the test's own (pg_server):
`pg_ctl restart -m fast`, and kill -9 of the postmaster then a start (crash recovery).

The real entry points run as subprocesses on it: topology takes a stream of API writes
(fabric imports, node and link adds, drains, tenants, tokens) across the restart, and health
takes agents' reports and failover events (JetStream) while the server is down. Every write
is answered 2xx and is whole in the store, or 503 with Retry-After and is not there at all;
none hangs, none is a 500; the same processes serve writes again once the server is back
(nothing restarts them); what health was handed while the database was away is stored once.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fixed_tokens import fixed_token
from nats.errors import NoRespondersError
from pg_server import PgServer, pg_bin
from service_process import ServiceProcess, service_process

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.events import (
    STREAM_FAILOVER,
    AgentReport,
    AgentReportReply,
    CarrierReport,
    FailoverEvent,
    agent_report_subject,
    utcnow,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import AdminState, TokenRole
from thorn.natsd import EmbeddedNats
from thorn.store import Store

pytestmark = pytest.mark.postgres

ADMIN = fixed_token("restart-admin")
REQUEST_TIMEOUT_S = 30.0  # a request unanswered this long is a hang
REQUEST_BOUND_S = 15.0  # THORN_DB_POOL_TIMEOUT_S (10) and a margin: the longest a 503 may take
STREAM_S = 90.0  # the whole write stream, outage included, ends within this
AFTER_OK = 10  # fabric writes that must succeed after the server is back
# The 503 reasons a restart may give (thorn.store.unavailable).
RESTART_REASONS = {"connection", "read_only"}


def outage_restart(pg: PgServer) -> None:
    pg.restart()


def outage_kill(pg: PgServer) -> None:
    pg.kill_postmaster()
    pg.start()


OUTAGES: dict[str, Callable[[PgServer], None]] = {
    "restart_fast": outage_restart,
    "kill_9": outage_kill,
}


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    if pg_bin() is None:
        missing = "no PostgreSQL server binaries in /usr/lib/postgresql (make test-deps)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(missing)
        pytest.skip(missing)
    with PgServer() as server:
        yield server


@pytest.fixture(scope="module")
def own_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """NATS of this module's own: health's durable consumer sees no other test's events."""
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("nats-restart")) as server:
        yield server.url


# --- the write stream ----------------------------------------------------------------------


@dataclass
class Answer:
    op: str
    status: int  # -1: no answer (a timeout or a broken connection)
    started: float
    ended: float
    retry_after: str | None = None
    detail: str = ""
    reason: str = ""


@dataclass
class Expected:
    """What the store must hold: the effect of every write answered 2xx, and nothing else."""

    revision: int = 0
    gen: int | None = None  # the last import answered 2xx
    extra: list[str] = field(default_factory=list)  # nodes added after it, in order
    links: set[tuple[str, str]] = field(default_factory=set)
    tenants: set[str] = field(default_factory=set)
    drained: bool = False  # spine1
    tokens: set[str] = field(default_factory=lambda: {"bootstrap-admin"})


def generation(gen: int) -> dict[str, Any]:
    """The base fabric, every node labelled with the import that wrote it."""
    doc = leaf_spine(2, 2, 2).model_dump(mode="json")
    for node in doc["nodes"]:
        node["labels"] = {**node.get("labels", {}), "gen": str(gen)}
    return doc


BASE_NODES = {n["name"] for n in generation(0)["nodes"]}
BASE_TENANTS = {t["name"] for t in generation(0)["tenants"]}


class WriteStream:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.answers: list[Answer] = []
        self.expected = Expected()
        self.stop = asyncio.Event()
        self.answered = asyncio.Event()  # set at every answer

    async def call(self, op: str, method: str, path: str, body: Any = None) -> int:
        started = time.monotonic()
        try:
            response = await self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            self.answers.append(Answer(op, -1, started, time.monotonic(), detail=repr(exc)))
            self.answered.set()
            return -1
        answer = Answer(op, response.status_code, started, time.monotonic())
        if response.status_code >= 300:
            error = response.json()
            answer.detail = str(error.get("detail", ""))
            answer.reason = str((error.get("errors") or [{}])[0].get("type", ""))
            answer.retry_after = response.headers.get("retry-after")
        self.answers.append(answer)
        self.answered.set()
        return response.status_code

    async def fabric_writes(self) -> None:
        """One writer, so every write's effect on the fabric is known in advance."""
        e = self.expected
        for i in itertools.count():
            if self.stop.is_set() or i > 5000:
                return
            kind = ("import", "node", "link", "drain", "tenant")[i % 5]
            if kind == "import" or e.gen is None:
                if await self.call("import", "POST", "/api/v1/fabric/import", generation(i)) < 300:
                    e.revision += 1
                    e.gen, e.extra, e.links, e.tenants, e.drained = i, [], set(), set(), False
            elif kind == "node":
                body = {"name": f"x{i}", "role": "switch",
                        "ports": [{"name": "swp1"}, {"name": "swp2"}]}  # fmt: skip
                if await self.call("node", "POST", "/api/v1/nodes", body) < 300:
                    e.revision += 1
                    e.extra.append(f"x{i}")
            elif kind == "link" and len(e.extra) >= 2 and tuple(e.extra[-2:]) not in e.links:
                a, b = e.extra[-2:]
                body = {"a": {"node": a, "port": "swp2"}, "b": {"node": b, "port": "swp1"}}
                if await self.call("link", "POST", "/api/v1/links", body) < 300:
                    e.revision += 1
                    e.links.add((a, b))
            elif kind == "drain":
                verb = "undrain" if e.drained else "drain"
                if await self.call(verb, "POST", f"/api/v1/nodes/spine1/{verb}") < 300:
                    e.revision += 1
                    e.drained = not e.drained
            elif kind == "tenant":
                body = {"name": f"t{i}", "description": f"tenant {i}"}
                if await self.call("tenant", "POST", "/api/v1/tenants", body) < 300:
                    e.revision += 1
                    e.tenants.add(f"t{i}")

    async def token_writes(self) -> None:
        """Beside the fabric writer: tokens live outside the fabric, imports keep them."""
        for i in range(5000):
            if self.stop.is_set():
                return
            body = {"name": f"k{i}", "role": "viewer"}
            if await self.call("token", "POST", "/api/v1/tokens", body) < 300:
                self.expected.tokens.add(f"k{i}")
            await asyncio.sleep(0.01)

    async def reads(self) -> None:
        for _ in range(20000):
            if self.stop.is_set():
                return
            await self.call("read", "GET", "/api/v1/fabric/summary")
            await asyncio.sleep(0.01)

    def fabric_ok_since(self, since: float) -> int:
        return sum(
            1 for a in self.answers
            if a.op not in ("read", "token") and a.started >= since and 200 <= a.status < 300
        )  # fmt: skip

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.answered.clear()
            await self.answered.wait()

    async def across(self, outage: Callable[[], None]) -> tuple[float, float]:
        """Write until 5 fabric writes succeeded, run `outage` (blocking: in a thread), keep
        writing until AFTER_OK more succeeded; (when it began, when the server was back)."""
        tasks = [asyncio.create_task(c()) for c in (self.fabric_writes, self.token_writes,
                                                    self.reads)]  # fmt: skip
        try:
            async with asyncio.timeout(STREAM_S):
                await self.until(lambda: self.fabric_ok_since(0) >= 5)
                down = time.monotonic()
                await asyncio.to_thread(outage)
                up = time.monotonic()
                await self.until(lambda: self.fabric_ok_since(up) >= AFTER_OK)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks)
        return down, up


# --- the checks ------------------------------------------------------------------------------


async def assert_store_holds_exactly(url: str, e: Expected) -> None:
    store = await Store.open(url, migrate=False)
    try:
        fabric = await store.load()  # validates: no link without its ports, ports without node
        assert fabric.revision == e.revision
        assert set(fabric.nodes) == BASE_NODES | set(e.extra)
        assert {fabric.nodes[n].labels.get("gen") for n in BASE_NODES} == {str(e.gen)}
        for name in e.extra:
            assert set(fabric.node_ports[name]) == {"swp1", "swp2"}, name
        extra_links = {
            (link.a.node, link.b.node) for link in fabric.links.values()
            if link.a.node in e.extra
        }  # fmt: skip
        assert extra_links == e.links
        assert (fabric.nodes["spine1"].admin_state is AdminState.drained) is e.drained
        assert set(fabric.tenants) == BASE_TENANTS | e.tenants
        assert {t.name for t in await store.tokens()} == e.tokens
        async with store.engine.connect() as conn:
            result = await conn.exec_driver_sql(
                "SELECT count(*), count(DISTINCT revision), max(revision) FROM audit_log "
                "WHERE revision IS NOT NULL"
            )
            # one audit row per committed revision: none lost, none written twice
            assert tuple(result.one()) == (e.revision, e.revision, e.revision)
    finally:
        await store.close()


def assert_each_answer_whole_or_503(answers: list[Answer]) -> None:
    wrong = [a for a in answers if not (200 <= a.status < 300 or a.status == 503)]
    assert not wrong, f"answers neither 2xx nor 503: {wrong[:5]}"
    for a in answers:
        if a.status == 503:
            assert a.retry_after is not None and int(a.retry_after) >= 1, a
            assert a.reason in RESTART_REASONS and "retry in" in a.detail, a
    slowest = max(answers, key=lambda a: a.ended - a.started)
    assert slowest.ended - slowest.started < REQUEST_BOUND_S, slowest


def report(outage: str, answers: list[Answer], down: float, up: float) -> str:
    failed = [a for a in answers if a.status == 503]
    writes = [a for a in answers if a.op != "read"]
    first_ok = min(a.ended for a in writes if a.started >= up and a.status < 300)
    window = max(a.ended for a in failed) - min(a.started for a in failed) if failed else 0.0
    slowest_503 = max((a.ended - a.started for a in failed), default=0.0)
    return (
        f"{outage}: server away {up - down:.2f} s; {len(failed)} of {len(answers)} requests "
        f"503 over {window:.2f} s ({dict(Counter(a.op for a in failed))}), the slowest 503 "
        f"in {slowest_503 * 1000:.0f} ms; first write answered 2xx {first_ok - up:.3f} s "
        "after the server was back"
    )


# --- topology ----------------------------------------------------------------------------------


@pytest.mark.parametrize("outage", list(OUTAGES))
async def test_writes_across_a_postgres_restart_are_whole_or_503_and_topology_reconnects_itself(
    pg: PgServer, own_nats: str, tmp_path: Path, outage: str
) -> None:
    url = pg.create_database(f"topology_{outage}")
    env = {"THORN_DATABASE_URL": url, "THORN_NATS_URL": own_nats, "THORN_ADMIN_TOKEN": ADMIN,
           "THORN_LOG_LEVEL": "warning"}  # fmt: skip
    with service_process("thorn-topology", env, tmp_path) as topology:
        pid = topology.process.pid
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(
            base_url=topology.url, headers=headers, timeout=REQUEST_TIMEOUT_S
        ) as client:
            stream = WriteStream(client)
            down, up = await stream.across(lambda: OUTAGES[outage](pg))
        # the same process answered before and after: nothing restarted it
        assert topology.process.poll() is None and topology.process.pid == pid
        unavailable = topology_metric(topology)
    answers = stream.answers
    print(report(outage, answers, down, up))
    assert any(a.status == 503 and a.op not in ("read", "token") for a in answers), (
        "no write met the outage: the test did not test it"
    )
    assert unavailable >= sum(1 for a in answers if a.status == 503)
    assert_each_answer_whole_or_503(answers)
    await assert_store_holds_exactly(url, stream.expected)


def topology_metric(service: ServiceProcess) -> float:
    return sum(
        service.metric("thorn_api_store_unavailable_total", reason=r) for r in RESTART_REASONS
    )


# --- health ------------------------------------------------------------------------------------


class Failovers:
    """Agents' failover events on THORN_FAILOVER, each a distinct message."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.sent: set[tuple[str, str]] = set()  # (node, at)
        self.t0 = utcnow()

    async def send(self, n: int) -> None:
        for _ in range(n):
            i = len(self.sent)
            event = FailoverEvent(
                node=f"host{i % 4 + 1}", peers=["host9"], from_colour="red", to_colour="blue",
                at=self.t0 + timedelta(milliseconds=i), reason=f"restart test {i}",
                tier="source", kernel_ms=0.1,
            )  # fmt: skip
            await self.bus.publish(event)
            self.sent.add((event.node, event.at.isoformat()))


async def report_carrier(bus: Bus, seq: int, up: bool) -> AgentReportReply:
    """leaf1's carrier on swp3 (link 5, to spine1), as the agent reports it."""
    item = CarrierReport(port="swp3", admin_up=True, carrier=up,
                         oper_state="up" if up else "down", detected_at=utcnow())  # fmt: skip
    report = AgentReport(node="leaf1", seq=seq, sent_at=utcnow(), items=[item])
    msg = await bus.nc.request(agent_report_subject("leaf1"), report.model_dump_json().encode(),
                               timeout=5)  # fmt: skip
    return AgentReportReply.model_validate_json(msg.data)


async def until_active(bus: Bus, seq: Iterator[int]) -> None:
    """Until health takes agent reports: it is the active replica once it holds the lease
    (1 s here; the previous test's replica may still hold it for that long)."""
    for _ in range(100):
        try:
            if (await report_carrier(bus, next(seq), up=True)).ok:
                return
        except (TimeoutError, NoRespondersError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("health did not become the active replica within 10 s")


def stored(pg: PgServer, database: str) -> tuple[int, list[tuple[Any, ...]], list[Any]]:
    """(failover rows, link 5's failures (state, open), link 5's stored machine state)."""
    with psycopg.connect(pg.conninfo(database), connect_timeout=2) as conn:
        failovers = conn.execute("SELECT count(*) FROM health_failovers").fetchone()
        failures = conn.execute(
            "SELECT state, ended_at IS NULL FROM health_failures WHERE link_id = 5"
        ).fetchall()
        machine = conn.execute("SELECT state FROM health_links WHERE link_id = 5").fetchall()
    return int(failovers[0]) if failovers else 0, failures, [m[0] for m in machine]


@pytest.mark.parametrize("outage", list(OUTAGES))
async def test_what_health_takes_while_postgres_is_down_is_stored_once_when_it_is_back(
    pg: PgServer, own_nats: str, tmp_path: Path, outage: str
) -> None:
    database = f"health_{outage}"
    url = pg.create_database(database)
    store = await Store.open(url)
    try:
        await store.replace(Fabric.from_document(leaf_spine(2, 2, 2)), expected_revision=0,
                            actor="test", detail={})  # fmt: skip
        await store.put_token("viewer", TokenRole.viewer, hash_token(fixed_token("viewer")), "test")
    finally:
        await store.close()
    env = {"THORN_DATABASE_URL": url, "THORN_NATS_URL": own_nats, "THORN_LEASE_SECONDS": "1",
           "THORN_LOG_LEVEL": "warning"}  # fmt: skip
    async with await Bus.connect(own_nats, name="test-restart") as bus:
        await bus.ensure_streams()
        await bus.js.purge_stream(STREAM_FAILOVER.name)
        with service_process("thorn-health", env, tmp_path) as health:
            seq = itertools.count()
            await until_active(bus, seq)
            failovers = Failovers(bus)
            await failovers.send(10)
            # The server goes away; meanwhile the agents report and flip.
            if outage == "kill_9":
                await asyncio.to_thread(pg.kill_postmaster)
            else:
                await asyncio.to_thread(pg.stop, "fast")
            assert not pg.accepting()
            assert (await report_carrier(bus, next(seq), up=False)).ok  # link 5 goes down
            await failovers.send(20)
            await asyncio.sleep(2.0)  # health tries to write both, and fails
            assert not pg.accepting()
            await asyncio.to_thread(pg.start)
            await failovers.send(10)

            deadline = time.monotonic() + 60
            while True:
                count, failures, machine = await asyncio.to_thread(stored, pg, database)
                if count == len(failovers.sent) and failures and machine == ["down"]:
                    break
                assert time.monotonic() < deadline, (count, failures, machine, health.log_tail())
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # longer than health's writer waits between attempts
            count, failures, machine = await asyncio.to_thread(stored, pg, database)
            retried = health.metric("thorn_health_failovers_total", result="retried")
            not_written = health.metric("thorn_health_store_errors_total")
            assert health.process.poll() is None
    assert count == len(failovers.sent) == 40
    assert failures == [("down", True)]  # the failure opened once, still open
    assert machine == ["down"]
    assert retried >= 1, "no failover message was redelivered: none met the outage"
    assert not_written >= 1, "health's record writer never met the outage"
