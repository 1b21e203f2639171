"""The pathcomp service over a real store and real NATS: it plans at start, serves paths,
writes desired state to JetStream KV, follows health and topology events, and hands the
writer role to another replica when its leader goes away."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import orjson
import pytest
import pytest_asyncio
from fastapi import FastAPI
from fixed_tokens import fixed_token
from new_host import new_host
from prometheus_client import REGISTRY
from pydantic import TypeAdapter
from standin_agents import StandInAgents

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.desired import DesiredState, HostState, SwitchState, node_key
from thorn.events import (
    AGENT_FLIP_ALL,
    FAILOVER_ALL,
    PATHS_CHANGED,
    Event,
    FailoverEvent,
    FlipCommand,
    LinkHealthChanged,
    PathsChanged,
    TopologyChanged,
    Trace,
    new_trace_id,
)
from thorn.events import Change as EventChange
from thorn.fabric import Change, Fabric
from thorn.generators import leaf_spine
from thorn.leader.lease import LEASES_KV
from thorn.model import (
    AdminState,
    LinkUpdate,
    NodeUpdate,
    TokenRole,
)
from thorn.natsd import free_port
from thorn.store import Store
from thorn_pathcomp import service as service_module
from thorn_pathcomp.app import create_app
from thorn_pathcomp.node_documents import HOST_STAGE, DesiredStates, diff
from thorn_pathcomp.plan import Plan, PlanSummary
from thorn_pathcomp.service import Deposed, PathService

ADMIN, VIEWER = fixed_token("pc-admin"), fixed_token("pc-viewer")
WAIT = 10.0
STATE = TypeAdapter(DesiredState)


async def until(check: Callable[[], Any], what: str) -> None:
    for _ in range(int(WAIT / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def replica(stack: AsyncExitStack, store: Store, bus: Bus, tmp: Path) -> FastAPI:
    app = create_app(
        Settings(data_dir=tmp, nats_url="unused"), store=store, bus=bus, lease_seconds=1.0
    )
    await stack.enter_async_context(app.router.lifespan_context(app))
    return app


async def with_agents(stack: AsyncExitStack, store: Store, bus: Bus, tmp: Path,
                      agents: StandInAgents) -> tuple[FastAPI, PathService]:  # fmt: skip
    """A replica whose documents `agents` apply, each agent having said hello."""
    app = await replica(stack, store, bus, tmp)
    follower = asyncio.create_task(agents.follow())
    stack.callback(follower.cancel)
    await agents.hello(sorted((await store.load()).nodes))
    return app, app.state.pathcomp


@pytest_asyncio.fixture
async def fabric_store(store: Store) -> Store:
    fabric = Fabric.from_document(leaf_spine(2, 2, 2, dual_homed=True))
    await store.replace(fabric, expected_revision=0, actor="test", detail={})
    await store.put_token("admin", TokenRole.admin, hash_token(ADMIN), "test")
    await store.put_token("viewer", TokenRole.viewer, hash_token(VIEWER), "test")
    return store


@pytest_asyncio.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-pathcomp") as connected:
        await connected.ensure_streams()
        kv = await connected.desired_state()
        for key in await kv.nodes():
            await kv.delete(key)
        yield connected


async def summarised_plan(api: httpx.AsyncClient) -> dict[str, Any]:
    """GET /plan once its pair counts describe the plan it serves (they are computed after
    the plan is served, and lag it meanwhile)."""
    for _ in range(int(WAIT / 0.02)):
        plan: dict[str, Any] = (await api.get("/api/v1/plan")).json()
        if plan["summary_revision"] == plan["revision"]:
            return plan
        await asyncio.sleep(0.02)
    raise AssertionError(f"the plan's summary never caught up: {plan}")


async def drain_and_announce(store: Store, bus: Bus, link: int) -> int:
    """Drain `link` in the store and announce it as topology does; its new revision."""
    fabric = await store.load()
    revision = await store.commit(
        fabric.drain_link(link), expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id, actor="ops", action="link.drain", target=str(link),
        detail={},
    )  # fmt: skip
    await bus.publish(
        TopologyChanged(revision=revision, at=datetime.now(UTC), actor="ops", changes=[])
    )
    return revision


def client(app: FastAPI, token: str | None = ADMIN) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://pc", headers=headers
    )


async def test_the_plan_is_served_and_every_node_gets_its_desired_state(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            plan = await summarised_plan(api)
            assert plan["revision"] == 1 and plan["unprotected_pairs"] == 0
            assert plan["pairs"] == 2 and plan["stretch"]["red"]["max"] == 0
            paths = (await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})).json()
            assert paths["status"] == "protected"
            assert paths["red"]["nodes"][0] == "host1" and paths["blue"]["nodes"][-1] == "host2"
            assert set(paths["red"]["nodes"][1:-1]).isdisjoint(paths["blue"]["nodes"][1:-1])
        kv = await bus.desired_state()
        fabric = await fabric_store.load()
        for node in fabric.nodes:
            entry = await kv.get(node_key(node))
            assert entry is not None, node
            state = STATE.validate_json(entry.value)
            assert isinstance(state, HostState if node.startswith("host") else SwitchState)


async def test_a_link_failure_reprotects_publishes_and_rewrites_desired_state(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    seen: list[PathsChanged] = []

    async def collect(event: Event) -> None:
        assert isinstance(event, PathsChanged)
        seen.append(event)

    subscription = await bus.subscribe(PATHS_CHANGED, collect)
    records: list[FailoverEvent] = []

    async def record(event: FailoverEvent) -> None:
        records.append(event)

    history = await bus.subscribe(FAILOVER_ALL, record, model=FailoverEvent)
    trace = Trace(id=new_trace_id()).then("detected", "leaf1").then("health_decided", "health")
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        service: PathService = app.state.pathcomp
        async with client(app) as api:
            before = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            used = before.json()["red"]["links"][1]
            switch = before.json()["red"]["nodes"][1]
            kv = await bus.desired_state()
            old_doc = await kv.get(node_key(switch))
            assert old_doc is not None
            await until(service.took_over.is_set, "leading")
            planned = service.revision + 1
            await bus.publish(
                LinkHealthChanged(
                    link_id=used, state="down", previous="up", at=datetime.now(UTC),
                    source="test", trace=trace,
                )
            )  # fmt: skip
            await until(lambda: service.revision == planned, "the next plan revision")
            after = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            assert used not in after.json()["red"]["links"] + after.json()["blue"]["links"]
            assert (await api.get("/api/v1/plan")).json()["kind"] == "incremental"
            await until(lambda: any(e.revision == planned for e in seen), "paths.changed")
            # The end of re-protection closes the failure's trace (no agent here: after the
            # stage timeout, and says who did not acknowledge).
            await until(lambda: any(r.tier == "reprotection" for r in records), "re-protected")
            [done] = [r for r in records if r.tier == "reprotection"]
            assert done.trace is not None and done.trace.id == trace.id
            assert [h.step for h in done.trace.hops][-2:] == ["pathcomp_received", "reprotected"]
            assert done.node == "pathcomp" and switch in done.peers
    await subscription.unsubscribe()
    await history.unsubscribe()


async def test_bad_queries_get_clear_errors(fabric_store: Store, bus: Bus, tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            missing = await api.get("/api/v1/paths", params={"src": "host1", "dst": "nohost"})
            assert missing.status_code == 404
            assert "host 'nohost' not found" in missing.json()["detail"]
            same = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host1"})
            assert same.status_code == 422
            assert (await api.get("/api/v1/paths", params={"src": "host1"})).status_code == 422
        async with client(app, None) as anonymous:
            assert (await anonymous.get("/api/v1/plan")).status_code == 401
        async with client(app, VIEWER) as viewer:
            assert (await viewer.post("/api/v1/plan/recompute")).status_code == 403
        async with client(app) as admin:
            response = await admin.post("/api/v1/plan/recompute")
            assert response.status_code == 200 and response.json()["kind"] == "full"


async def test_a_what_if_answers_what_a_failure_would_do_and_changes_nothing(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        kv = await bus.desired_state()
        written = {n: (await kv.get(n)) for n in await kv.nodes()}
        async with client(app, VIEWER) as viewer:
            before = (await viewer.get("/api/v1/plan")).json()
            answer = await viewer.get("/api/v1/plan/what-if", params={"node": "leaf1"})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            # leaf1's four links: two to the spines, one to each host.
            assert body["nodes"] == ["leaf1"] and len(body["links"]) == 4
            # Two hosts dual-homed to two leaves: red goes over leaf1, so both pairs flip.
            assert (body["flip"], body["lose_protection"], body["cut"]) == (2, 0, 0)
            assert body["after"] == {"degraded": 2}  # single-homed to leaf2 from then on
            assert {(e["src"], e["dst"]) for e in body["examples"]} == {
                ("host1", "host2"), ("host2", "host1")}  # fmt: skip
            unknown = await viewer.get("/api/v1/plan/what-if", params={"node": "spine9"})
            assert unknown.status_code == 404 and "node 'spine9'" in unknown.json()["detail"]
            assert unknown.json()["errors"][0]["loc"] == ["query", "node"]
            bad = await viewer.get("/api/v1/plan/what-if", params={"link": 4242})
            assert bad.status_code == 404 and "link '4242'" in bad.json()["detail"]
            empty = await viewer.get("/api/v1/plan/what-if")
            assert empty.status_code == 422 and "at least one" in empty.json()["detail"]
            # a rule across both parameters, not a missing field (the document has neither
            # required): its type says so, as the API fuzz lane's check expects
            assert empty.json()["errors"][0]["type"] == "value"
            assert (await viewer.get("/api/v1/plan")).json() == before
        assert {n: (await kv.get(n)) for n in await kv.nodes()} == written
        async with client(app, None) as anonymous:
            assert (await anonymous.get("/api/v1/plan/what-if?node=leaf1")).status_code == 401


async def test_another_replica_takes_over_writing_when_the_leader_goes(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as second_stack:
        first_stack = AsyncExitStack()
        first = await replica(first_stack, fabric_store, bus, tmp_path)
        second = await replica(second_stack, fabric_store, bus, tmp_path)
        services: list[PathService] = [first.state.pathcomp, second.state.pathcomp]
        await until(lambda: sum(s.is_leader() for s in services) == 1, "one leader")
        leader = 0 if services[0].is_leader() else 1
        stacks = [first_stack, second_stack]
        await stacks[leader].aclose()  # the leader goes away
        start = asyncio.get_running_loop().time()
        await until(lambda: services[1 - leader].is_leader(), "handover")
        assert asyncio.get_running_loop().time() - start < 5
        if leader == 1:
            await first_stack.aclose()


async def test_killing_the_leader_process_hands_over_within_seconds(
    fabric_store: Store, bus: Bus, tmp_path: Path, database_url: str, nats_url: str
) -> None:
    """A real `thorn-pathcomp` process leads; SIGKILL gives it no chance to resign."""
    port = free_port()
    env = {
        **os.environ,
        "THORN_DATABASE_URL": database_url,
        "THORN_NATS_URL": nats_url,
        "THORN_LISTEN": f"127.0.0.1:{port}",
        "THORN_LEASE_SECONDS": "1.0",
        "THORN_LOG_LEVEL": "warning",
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "thorn-pathcomp"), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(int(WAIT / 0.1)):  # up once it has planned, holding the lease
                with contextlib.suppress(httpx.HTTPError):
                    if (await probe.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        async with AsyncExitStack() as stack:
            follower: PathService = (
                await replica(stack, fabric_store, bus, tmp_path)
            ).state.pathcomp
            assert not follower.is_leader()
            process.send_signal(signal.SIGKILL)
            await process.wait()
            killed = asyncio.get_running_loop().time()
            await until(follower.is_leader, "handover after SIGKILL")
            # The lease the bucket gives: 1 s asked, but an election adopts the max_age of a
            # bucket an earlier test of the session made (and terms live in it: kept).
            lease = (await (await bus.js.key_value(LEASES_KV.bucket)).status()).ttl
            assert asyncio.get_running_loop().time() - killed < lease + 2.0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_recompute_with_nothing_changed_rewrites_nothing(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            again = (await api.post("/api/v1/plan/recompute")).json()
            assert again["kind"] == "full" and again["published_nodes"] == 0


def topology_changes(scope: str) -> float:
    """How many topology changes pathcomp planned in `scope` (its metric's count)."""
    seen = REGISTRY.get_sample_value(
        "thorn_pathcomp_topology_change_seconds_count", {"scope": scope}
    )
    return seen or 0.0


async def commit_and_announce(
    store: Store, bus: Bus, operation: Callable[[Fabric], list[Change]]
) -> int:
    """Commit `operation` in the store and announce it with its rows, as topology does."""
    fabric = await store.load()
    changes = operation(fabric)
    revision = await store.commit(
        changes, expected_revision=fabric.revision, next_link_id=fabric.next_link_id,
        actor="ops", action="test", target="test", detail={},
    )  # fmt: skip
    rows = [EventChange(kind=c.kind, op=c.op, key=c.key,
                        value=c.value.model_dump(mode="json") if c.value else None)
            for c in changes]  # fmt: skip
    await bus.publish(
        TopologyChanged(revision=revision, at=datetime.now(UTC), actor="ops", changes=rows)
    )
    return revision


def as_sets(fabric: Fabric) -> dict[str, Any]:
    """A fabric's document with its lists as sets: the store reads rows in no set order
    (PostgreSQL moves an updated row to the end)."""
    document = fabric.to_document().model_dump(mode="json")
    return {key: {orjson.dumps(item, option=orjson.OPT_SORT_KEYS) for item in value}
            if isinstance(value, list) else value for key, value in document.items()}  # fmt: skip


async def planned_from_rows_as_a_full_plan_would(
    api: httpx.AsyncClient, service: PathService, store: Store, bus: Bus,
    operations: list[tuple[str, Callable[[Fabric], list[Change]]]], scope: str,
) -> None:  # fmt: skip
    """Each operation is planned from its rows in `scope`, and a full plan of the stored
    topology then finds nothing to rewrite: the documents are as built afresh."""
    for what, operation in operations:
        await summarised_plan(api)  # between changes (a spare copy is made then)
        before = topology_changes(scope)
        revision = await commit_and_announce(store, bus, operation)
        await until(
            lambda at=revision: service.fabric is not None and service.fabric.revision == at,
            what,
        )
        assert topology_changes(scope) == before + 1, f"{what}: not planned as {scope}"
        assert service.fabric is not None
        assert as_sets(service.fabric) == as_sets(await store.load())
        again = (await api.post("/api/v1/plan/recompute")).json()
        assert again["published_nodes"] == 0, what


async def test_hosts_coming_and_going_are_planned_from_the_event_rows_as_a_full_plan_would(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            await planned_from_rows_as_a_full_plan_would(
                api, app.state.pathcomp, fabric_store, bus,
                [("host5 joins", new_host),
                 ("host5 leaves", lambda f: f.delete_node("host5", cascade=True))],
                "hosts",
            )  # fmt: skip


def offload_in_software(fabric: Fabric) -> list[Change]:
    """A change of a switch that is not only its admin state."""
    return fabric.update_node("spine1", NodeUpdate(offload="software"))


async def test_drains_and_undrains_advance_the_documents_as_a_full_plan_would_build_them(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    # At k=32 building all 9,472 documents afresh for a drain took seconds and lost the
    # lease; a drain only moves paths, as link failures do, and advances like them.
    fabric = await fabric_store.load()
    spine_link = next(i for i, lk in sorted(fabric.links.items())
                      if {lk.a.node[:5], lk.b.node[:5]} == {"spine", "leaf1"})  # fmt: skip
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            await planned_from_rows_as_a_full_plan_would(
                api, app.state.pathcomp, fabric_store, bus,
                [("spine1 drained", lambda f: f.drain_node("spine1")),
                 ("a leaf's spine link drained", lambda f: f.drain_link(spine_link)),
                 ("spine1 undrained", lambda f: f.undrain_node("spine1")),
                 ("the link undrained", lambda f: f.undrain_link(spine_link))],
                "paths",
            )  # fmt: skip
            before = topology_changes("whole")
            await planned_from_rows_as_a_full_plan_would(
                api, app.state.pathcomp, fabric_store, bus,
                [("a switch's offload policy", offload_in_software)], "whole",
            )  # fmt: skip
            assert topology_changes("whole") == before + 1


async def test_a_host_cut_off_from_the_fabric_is_reported_unreachable(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    fabric = await fabric_store.load()
    changes = []
    for link in [lk for lk in fabric.links.values() if "host2" in (lk.a.node, lk.b.node)]:
        changes += fabric.update_link(link.id, LinkUpdate(admin_state=AdminState.down))
    await fabric_store.commit(
        changes,
        expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id,
        actor="test",
        action="link.update",
        target="host2 links",
        detail={},
    )
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            pair = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            assert pair.status_code == 200
            assert pair.json()["status"] == "unreachable"
            assert pair.json()["red"] is None and pair.json()["blue"] is None
            assert (await summarised_plan(api))["unreachable_pairs"] == 2


async def test_a_drain_announced_on_topology_changed_is_replanned_incrementally(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        service: PathService = app.state.pathcomp
        async with client(app) as api:
            first = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            used = first.json()["blue"]["links"][-1]  # host2's link toward the blue leaf
            revision = await drain_and_announce(fabric_store, bus, used)
            await until(
                lambda: service.fabric is not None and service.fabric.revision == revision,
                "replanned at the new topology revision",
            )
            plan = (await api.get("/api/v1/plan")).json()
            assert plan["kind"] == "incremental" and plan["topology_revision"] == revision
            after = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            assert used not in after.json()["red"]["links"] + after.json()["blue"]["links"]
            # host2 is now single-homed: both colours cross its remaining link.
            assert after.json()["status"] == "degraded"
            assert (await summarised_plan(api))["shared_risk_pairs"] == 2


async def test_a_change_does_not_wait_behind_the_plan_summary_which_then_catches_up(
    fabric_store: Store, bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A summary as long as k=32's (seconds): it runs until it is asked to give way, then
    # summarises for real. Before, the summary held the lock: the drain waited behind it.
    real, started, gave_way = Plan.summarise_unless, threading.Event(), threading.Event()

    def long_summary(plan: Plan, give_way: Callable[[], bool]) -> PlanSummary | None:
        if gave_way.is_set():
            return real(plan, give_way)
        started.set()
        while not give_way():
            time.sleep(0.005)
        gave_way.set()
        return None

    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        service: PathService = app.state.pathcomp
        async with client(app) as api:
            first = await summarised_plan(api)
            used = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
            link = used.json()["blue"]["links"][-1]
            monkeypatch.setattr(Plan, "summarise_unless", long_summary)
            await service.recompute("a summary is due")  # served; its summary runs on
            await asyncio.to_thread(started.wait, WAIT)
            revision = await drain_and_announce(fabric_store, bus, link)
            await until(
                lambda: service.fabric is not None and service.fabric.revision == revision,
                "the drain planned while the summary was running",
            )
            assert gave_way.is_set()
            after = await summarised_plan(api)  # then the summary of the drained plan
            assert after["revision"] > first["revision"] and after["topology_revision"] == revision
            assert (after["protected_pairs"], after["shared_risk_pairs"]) == (0, 2)


async def test_each_stage_waits_until_the_agents_applied_the_one_before(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    agents = StandInAgents(bus, delay=0.2)
    async with AsyncExitStack() as stack:
        app, service = await with_agents(stack, fabric_store, bus, tmp_path, agents)
        await asyncio.sleep(0.3)
        agents.writes.clear()
        async with client(app) as api:
            before = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
        used = before.json()["red"]["links"][1]
        await until(service.took_over.is_set, "leading")
        planned = service.revision + 1
        await bus.publish(LinkHealthChanged(link_id=used, state="down", previous="up",
                                            at=datetime.now(UTC), source="test"))  # fmt: skip
        await until(lambda: service.revision == planned, "the next plan revision")
        await asyncio.sleep(0.3)
    # Writes come in stages: a write follows the acks of every write made before its stage.
    writes = sorted(agents.writes)
    stages: list[list[tuple[float, str, int]]] = []
    for write in writes:
        if stages and write[0] - stages[-1][-1][0] < 0.1:
            stages[-1].append(write)
        else:
            stages.append([write])
    assert len(stages) >= 2, writes
    for earlier, later in itertools.pairwise(stages):
        acked = max(agents.acks[(node, rev)] for _, node, rev in earlier)
        assert later[0][0] >= acked, (earlier, later)


async def test_a_switch_that_died_is_written_but_never_waited_for(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """A whole spine fails and its agent dies with it: re-protection writes the spine's
    document (for when it comes back) but waits for no answer from it, so the failure's
    trace closes long before a stage timeout, and it names no one as late."""
    fabric = await fabric_store.load()
    spine1 = sorted(i for i, lk in fabric.links.items() if "spine1" in (lk.a.node, lk.b.node))
    agents = StandInAgents(bus, delay=0.05, silent={"spine1"})
    records: list[FailoverEvent] = []

    async def record(event: FailoverEvent) -> None:
        records.append(event)

    history = await bus.subscribe(FAILOVER_ALL, record, model=FailoverEvent)
    trace = Trace(id=new_trace_id()).then("detected", "leaf1")
    async with AsyncExitStack() as stack:
        _, service = await with_agents(stack, fabric_store, bus, tmp_path, agents)
        service.stage_timeout = 10.0
        await until(service.took_over.is_set, "leading")
        agents.writes.clear()
        start = time.monotonic()
        for link_id in spine1:  # as health reports a dead switch: one event per link
            await bus.publish(LinkHealthChanged(link_id=link_id, state="down", previous="up",
                                                at=datetime.now(UTC), source="test",
                                                trace=trace))  # fmt: skip
        await until(lambda: any(r.tier == "reprotection" for r in records), "re-protected")
        took = time.monotonic() - start
    await history.unsubscribe()
    assert "spine1" in {node for _, node, _ in agents.writes}
    assert took < service.stage_timeout / 2, "nothing waited for the dead spine's agent"
    done = [r for r in records if r.tier == "reprotection"]
    assert all("not acknowledged" not in r.reason for r in done), [r.reason for r in done]


async def test_a_write_waits_only_for_the_switches_its_routes_lead_to(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """Make-before-break hop by hop: a slow agent delays only the writes whose new routes
    lead into its switch, not every write of the next stage; the failure counts as
    re-protected only once that agent too has applied its document."""
    fabric = await fabric_store.load()
    agents = StandInAgents(bus, delay=0.02)
    reprotected: list[float] = []  # when the re-protection record arrived (monotonic)

    async def record(event: FailoverEvent) -> None:
        if event.tier == "reprotection":
            reprotected.append(time.monotonic())

    history = await bus.subscribe(FAILOVER_ALL, record, model=FailoverEvent)
    async with AsyncExitStack() as stack:
        _, service = await with_agents(stack, fabric_store, bus, tmp_path, agents)
        await until(service.took_over.is_set, "leading")
        # Pick a link whose failure makes a rollout with a switch nothing later depends on.
        link_id, slow = next(
            (lid, node) for lid in sorted(fabric.links)
            if (found := _unwaited_switch(fabric, lid)) is not None
            for node in [found]
        )  # fmt: skip
        agents.delays[slow] = 3.0
        service.stage_timeout = 10.0
        agents.writes.clear()
        planned = service.revision + 1
        await bus.publish(LinkHealthChanged(link_id=link_id, state="down", previous="up",
                                            at=datetime.now(UTC), source="test",
                                            trace=Trace(id=new_trace_id())))  # fmt: skip
        await until(lambda: service.revision == planned, "the next plan revision")
        slow_written = min(at for at, node, _ in agents.writes if node == slow)
        later = [at for at, node, _ in agents.writes if node != slow and at > slow_written]
        slow_revision = max(r for _, node, r in agents.writes if node == slow)
        await until(lambda: reprotected, "re-protected")
        slow_applied = agents.acks.get((slow, slow_revision))  # None: not applied yet
    await history.unsubscribe()
    assert later, "writes after the slow switch's"
    assert max(later) - slow_written < 1.5, "no write waited for the slow agent"
    assert slow_applied is not None and reprotected[0] >= slow_applied, (
        "re-protected only once every agent applied"
    )


def _unwaited_switch(fabric: Fabric, link_id: int) -> str | None:
    """A switch written in the first stage of the rollout `link_id` going down makes, that
    no later switch write depends on (None if there is none)."""
    plan = Plan.compute(fabric)
    states = DesiredStates.build(fabric, plan, 1)
    plan, update = plan.update_links({link_id: False}, fabric.revision)
    new = states.advance(plan, update.recomputed, update.dropped, 2)
    changes = [c for c in diff(states, new) if c.node in new.switch_routes]
    stages = sorted({s for c in changes for s in c.stages if s < HOST_STAGE})
    if len(stages) < 2:
        return None
    first = {c.node for c in changes if stages[0] in c.stages}
    needed = set().union(*(new.depends_on(c.node, s) for c in changes for s in c.stages
                           if s < HOST_STAGE))  # fmt: skip
    later = {c.node for c in changes if any(s > stages[0] for s in c.stages)}
    free = sorted(first - needed - later)
    return free[0] if free else None


async def test_a_silent_agent_delays_a_stage_by_the_timeout_only(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    fabric = await fabric_store.load()
    switches = sorted(n for n, node in fabric.nodes.items() if node.role.value == "switch")
    agents = StandInAgents(bus, delay=0.0, silent=set(switches))
    async with AsyncExitStack() as stack:
        app, service = await with_agents(stack, fabric_store, bus, tmp_path, agents)
        service.stage_timeout = 0.3
        await asyncio.sleep(0.2)
        async with client(app) as api:
            before = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
        used = before.json()["red"]["links"][1]
        await until(service.took_over.is_set, "leading")
        planned = service.revision + 1
        start = time.monotonic()
        await bus.publish(LinkHealthChanged(link_id=used, state="down", previous="up",
                                            at=datetime.now(UTC), source="test"))  # fmt: skip
        await until(lambda: service.revision == planned, "the next plan revision")
        took = time.monotonic() - start
    assert 0.3 <= took < 5, "the plan goes ahead after the stage timeout"


async def test_a_restarted_pathcomp_does_not_plan_over_a_link_health_holds_down(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """Health keeps each link's machine in the store; pathcomp starting (or restarting)
    while a link is down must route around it before any new event arrives."""
    from thorn.store.health import LinkStateRecord

    fabric = await fabric_store.load()
    plan = Plan.compute(fabric)
    red = plan.pair("host1", "host2").red
    assert red is not None
    held = red.links[0]  # host1's link on red (both hosts are dual-homed)
    await fabric_store.record_health([LinkStateRecord(
        link_id=held, state="down", sources={"carrier:leaf1:swp3": False}, loss=0.0,
        drained=False, suppressed=False, penalty=0.0, penalty_at=0.0,
        changed_at=datetime.now(UTC),
    )])  # fmt: skip
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        async with client(app) as api:
            pair = (await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})).json()
            assert pair["red"] is not None
            assert held not in pair["red"]["links"] and held not in pair["blue"]["links"]


async def test_a_new_leader_writes_what_the_dead_leader_left_unfinished(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """A leader that died mid-way through its stages left some nodes on old documents; the
    follower that takes over (it planned too, but wrote nothing) compares the KV with its
    plan and writes those nodes."""
    async with AsyncExitStack() as second_stack:
        first_stack = AsyncExitStack()
        first = await replica(first_stack, fabric_store, bus, tmp_path)
        await until(lambda: first.state.pathcomp.is_leader(), "first leads")
        second = await replica(second_stack, fabric_store, bus, tmp_path)
        follower: PathService = second.state.pathcomp
        assert not follower.is_leader()
        kv = await bus.desired_state()
        stale = orjson.loads((await kv.get(node_key("spine1"))).value)  # type: ignore[union-attr]
        stale["routes"] = stale["routes"][:1]  # the dead leader's half-written stage
        await kv.put(node_key("spine1"), orjson.dumps(stale))
        await first_stack.aclose()
        await until(lambda: follower.is_leader(), "the follower leads")
        assert follower.states is not None
        expected = orjson.loads(follower.states.document("spine1"))["routes"]

        async def repaired() -> bool:
            entry = await kv.get(node_key("spine1"))
            return entry is not None and orjson.loads(entry.value or b"{}")["routes"] == expected

        for _ in range(100):
            if await repaired():
                break
            await asyncio.sleep(0.05)
        assert await repaired()


async def test_a_deposed_leader_cannot_write_over_the_new_leaders_documents(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """Every document carries its writer's term; a new leader stamps them all with its own.
    The old leader, paused past its lease and then resumed mid-write, finds another writer's
    revision under its compare-and-set and stops: the KV keeps the new leader's document."""
    async with AsyncExitStack() as second_stack:
        first_stack = AsyncExitStack()
        first = await replica(first_stack, fabric_store, bus, tmp_path)
        old: PathService = first.state.pathcomp
        await until(lambda: old.is_leader(), "first leads")
        kv = await bus.desired_state()
        old_term = orjson.loads((await kv.get(node_key("spine1"))).value)["term"]  # type: ignore[union-attr]  # fmt: skip
        assert old_term > 0
        second = await replica(second_stack, fabric_store, bus, tmp_path)
        new: PathService = second.state.pathcomp
        await first_stack.aclose()  # the old leader's lease goes; its PathService object stays
        await until(lambda: new.is_leader(), "the second leads")

        async def stamped() -> bool:
            entry = await kv.get(node_key("spine1"))
            return entry is not None and orjson.loads(entry.value or b"{}")["term"] > old_term

        for _ in range(100):
            if await stamped():
                break
            await asyncio.sleep(0.05)
        assert await stamped(), "the new leader's term on every document"
        now = await kv.get(node_key("spine1"))
        assert now is not None
        with pytest.raises(Deposed):
            await old._write("spine1", b'{"stale": true}')  # as if resumed after a pause
        after = await kv.get(node_key("spine1"))
        assert after is not None and after.revision == now.revision


async def test_a_new_leader_continues_the_plan_revisions_and_lets_every_host_revert(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """Flips the old leader made would have been reverted by its `reprotected`; the new
    leader does not know them, so it tells every host, on a plan revision later than any
    the old leader published (agents compare the two)."""
    commands: list[FlipCommand] = []

    async def seen(command: FlipCommand) -> None:
        commands.append(command)

    await bus.subscribe(AGENT_FLIP_ALL, seen, model=FlipCommand)
    async with AsyncExitStack() as second_stack:
        first_stack = AsyncExitStack()
        first = await replica(first_stack, fabric_store, bus, tmp_path)
        old: PathService = first.state.pathcomp
        await until(lambda: old.is_leader() and old.plan is not None, "first leads")
        for _ in range(3):  # the old leader's plans go on: its revisions are ahead
            await old.recompute("test")
        published = old.revision
        second = await replica(second_stack, fabric_store, bus, tmp_path)
        new: PathService = second.state.pathcomp
        await first_stack.aclose()
        before = len(commands)  # the first leader said the same when it took over
        await until(lambda: new.is_leader(), "the second leads")
        assert new.states is not None
        hosts = sorted(new.states.hosts)
        await until(lambda: {c.node for c in commands[before:]} >= set(hosts),
                    "every host told")  # fmt: skip
        for command in commands[before:]:
            assert command.kind == "reprotected" and command.plan_revision > published
            assert command.every_peer and not command.peers  # a flag, not 8,191 names
        assert new.revision > published


async def test_a_recompute_asked_of_a_follower_is_done_by_the_leader(
    fabric_store: Store, bus: Bus, tmp_path: Path
) -> None:
    """Only the leader writes desired state: a follower hands an admin's recompute to it
    (whichever replica the entry point picked) and answers with the leader's plan."""
    async with AsyncExitStack() as stack:
        first = await replica(stack, fabric_store, bus, tmp_path)
        leader: PathService = first.state.pathcomp
        await until(lambda: leader.is_leader() and leader.took_over.is_set(), "first leads")
        second = await replica(stack, fabric_store, bus, tmp_path)
        assert not second.state.pathcomp.is_leader()
        before = leader.revision
        async with client(second) as http:
            answer = await http.post("/api/v1/plan/recompute")
            refused = await http.post("/api/v1/plan/recompute",
                                      headers={"Authorization": f"Bearer {VIEWER}"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["revision"] == leader.revision > before
        assert refused.status_code == 403  # the follower checks the token itself


class CountingKv:
    """The real desired-state bucket, counting the reads and writes in flight at once."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.now, self.most, self.calls = kv, 0, 0, 0

    async def _counted(self, call: Any) -> Any:
        self.now += 1
        self.calls += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0)  # let the others start: only a bound keeps them out
            return await call
        finally:
            self.now -= 1

    async def get(self, node: str) -> Any:
        return await self._counted(self.kv.get(node))

    async def put(self, node: str, value: bytes) -> int:
        return int(await self._counted(self.kv.put(node, value)))

    async def update(self, node: str, value: bytes, *, last: int) -> int:
        return int(await self._counted(self.kv.update(node, value, last=last)))


class StaleLeader(NamedTuple):
    service: PathService
    nodes: list[str]  # every node with a document
    spine_link: int  # a link from a spine to leaf1


@pytest.fixture
async def stale_leader(
    fabric_store: Store, bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[StaleLeader]:
    """A leading replica, its start over, that reads and writes at most two documents at
    once, with every KV document made stale (a dead leader's unfinished term)."""
    monkeypatch.setattr(service_module, "DOCUMENTS_IN_FLIGHT", 2)
    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        service: PathService = app.state.pathcomp
        await until(service.is_leader, "leads")
        await until(service.took_over.is_set, "took over")  # the start's own resync is over
        assert service.states is not None
        kv = await bus.desired_state()
        nodes = sorted(service.states.switch_routes) + sorted(service.states.hosts)
        for node in nodes:
            await kv.put(node_key(node), b'{"stale": true}')
        spine_link = next(i for i, lk in sorted((await fabric_store.load()).links.items())
                          if {lk.a.node[:5], lk.b.node[:5]} == {"spine", "leaf1"})  # fmt: skip
        yield StaleLeader(service, nodes, spine_link)


async def test_a_leader_reads_and_writes_a_bounded_number_of_documents_at_once(
    stale_leader: StaleLeader, fabric_store: Store, bus: Bus
) -> None:
    # At k=32 a switch's document is ~180 KB: all 9,472 written at once queued ~1 GB ahead
    # of the lease's renewal (lost), and a new leader's reads overran the client's input.
    service, nodes, spine_link = stale_leader
    assert service.states is not None
    counting = CountingKv(service.kv)
    service.kv = counting  # type: ignore[assignment]
    kv = await bus.desired_state()
    await service.resync()
    assert counting.calls >= 2 * len(nodes) and counting.most <= 2
    for node in nodes:
        entry = await kv.get(node_key(node))
        assert entry is not None and entry.value == service.states.document(node)
    counting.most = 0
    written = counting.calls
    await commit_and_announce(fabric_store, bus, lambda f: f.drain_link(spine_link))
    await until(lambda: counting.calls > written and service.fabric is not None
                and service.fabric.revision == 2, "the drain written")  # fmt: skip
    assert counting.most <= 2


class HeldReadsKv(CountingKv):
    """The real bucket, whose reads stop after the first `free` ones until `release` is set."""

    def __init__(self, kv: Any, free: int) -> None:
        super().__init__(kv)
        self.free, self.release, self.reads, self.held = free, asyncio.Event(), 0, asyncio.Event()

    async def get(self, node: str) -> Any:
        self.reads += 1
        if self.reads > self.free:
            self.held.set()
            await self.release.wait()
        return await super().get(node)


async def test_a_change_during_a_new_leaders_resync_is_planned_without_waiting_for_it(
    stale_leader: StaleLeader, fabric_store: Store, bus: Bus
) -> None:
    # At k=32 a new leader's resync reads and compares 9,472 documents (~5 s); a host added
    # meanwhile waited for all of it (0.7-1.25 s for its first writes, target 200 ms).
    service, nodes, spine_link = stale_leader
    kv = await bus.desired_state()
    held = HeldReadsKv(service.kv, free=2)  # one chunk read, the next one held
    service.kv = held  # type: ignore[assignment]
    resync = asyncio.create_task(service.resync())
    await asyncio.wait_for(held.held.wait(), WAIT)
    await commit_and_announce(fabric_store, bus, lambda f: f.drain_link(spine_link))
    await until(lambda: service.fabric is not None and service.fabric.revision == 2,
                "the drain planned while the resync is held")  # fmt: skip
    assert not resync.done()
    held.release.set()
    rewritten = await asyncio.wait_for(resync, WAIT)
    # The KV ends up as the plan served after the drain, every document of the new term.
    assert 0 < rewritten < len(nodes)  # the drain itself wrote those it changed
    assert service.states is not None
    for node in nodes:
        entry = await kv.get(node_key(node))
        assert entry is not None and entry.value == service.states.document(node), node


async def test_link_changes_not_yet_in_a_plan_are_counted_until_their_plan_is_adopted(
    fabric_store: Store, bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An admin (and the scale benchmark) reads from it whether re-protection is behind.
    def unplanned() -> float:
        return REGISTRY.get_sample_value("thorn_pathcomp_link_changes_unplanned") or 0.0

    async with AsyncExitStack() as stack:
        app = await replica(stack, fabric_store, bus, tmp_path)
        service: PathService = app.state.pathcomp
        async with client(app) as api:
            pair = await api.get("/api/v1/paths", params={"src": "host1", "dst": "host2"})
        used = pair.json()["red"]["links"][1]
        await until(service.took_over.is_set, "leading")
        gate, real = asyncio.Event(), service._replan

        async def held(events: dict[int, LinkHealthChanged]) -> None:
            await gate.wait()
            await real(events)

        monkeypatch.setattr(service, "_replan", held)
        planned = service.revision + 1
        await bus.publish(LinkHealthChanged(link_id=used, state="down", previous="up",
                                            at=datetime.now(UTC), source="test"))  # fmt: skip
        await until(lambda: unplanned() == 1, "the change counted")
        await asyncio.sleep(0.2)
        assert unplanned() == 1 and service.revision < planned  # held: still unplanned
        gate.set()
        await until(lambda: service.revision == planned, "the next plan revision")
        assert unplanned() == 0
