"""Drains end to end over real NATS and a real store: an operator drains through the topology
API, pathcomp replans make-before-break, stand-in agents report what they applied, and the
drain status says when the element carries no more traffic.

The fabric is leaf_spine(2, 3, 2): two spines, three leaves, two single-homed hosts per leaf.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from fastapi import FastAPI
from fixed_tokens import fixed_token
from standin_agents import StandInAgents

from thorn.auth import hash_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.desired import node_key
from thorn.events import DatapathApplied
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import TokenRole
from thorn.store import Store
from thorn.store.store import sqlite_url
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_pathcomp.service import PathService
from thorn_topology.app import create_app as topology_app

ADMIN, OPERATOR, VIEWER = (
    fixed_token("dr-admin"),
    fixed_token("dr-operator"),
    fixed_token("dr-viewer"),
)
WAIT = 15.0


@dataclass
class Controller:
    topology: httpx.AsyncClient
    pathcomp: httpx.AsyncClient
    service: PathService
    agents: StandInAgents
    bus: Bus
    fabric: Fabric
    store: Store
    settings: Settings

    async def drain(self, path: str) -> float:
        """POST a drain as the operator; when it was committed (monotonic)."""
        response = await self.topology.post(f"/api/v1{path}", headers=auth(OPERATOR))
        assert response.status_code == 200, response.text
        return time.monotonic()

    async def status(self, path: str) -> dict[str, Any]:
        response = await self.pathcomp.get(f"/api/v1/drains{path}", headers=auth(VIEWER))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def watch_until_empty(self, path: str) -> list[tuple[float, dict[str, Any]]]:
        """Poll the status every 20 ms until it carries no traffic; every answer seen."""
        seen: list[tuple[float, dict[str, Any]]] = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            status = await self.status(path)
            seen.append((time.monotonic(), status))
            if not status["carries_traffic"]:
                return seen
            await asyncio.sleep(0.02)
        raise AssertionError(f"{path} still carries traffic: {seen[-1][1]}")

    async def settled(self) -> None:
        """Every agent that applies anything applied what pathcomp wrote for it."""
        deadline = time.monotonic() + WAIT
        acks, silent = self.service.acks, self.agents.silent
        while time.monotonic() < deadline:
            written = {n: r for n, r in self.service.written.items() if n not in silent}
            if written and all(acks.applied.get(n, 0) >= rev for n, rev in written.items()):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the agents did not apply the first programming")

    def red_switch_link(self, src: str, dst: str) -> int:
        plan = self.service.plan
        assert plan is not None
        red = plan.pair(src, dst).red
        assert red is not None
        return red.links[1]


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@asynccontextmanager
async def running(
    nats_url: str, tmp_path: Path, agents_of: Callable[[Bus], StandInAgents] | None = None
) -> AsyncIterator[Controller]:
    """topology and pathcomp on one store and one NATS, with stand-in agents for every node."""
    async with AsyncExitStack() as stack:
        store = await Store.open(sqlite_url(tmp_path))
        stack.push_async_callback(store.close)
        fabric = Fabric.from_document(leaf_spine(2, 3, 2))
        await store.replace(fabric, expected_revision=0, actor="test", detail={})
        for name, role, secret in (
            ("operator", TokenRole.operator, OPERATOR),
            ("viewer", TokenRole.viewer, VIEWER),
        ):
            await store.put_token(name, role, hash_token(secret), "test")
        bus = await stack.enter_async_context(await Bus.connect(nats_url, name="test-drains"))
        await bus.ensure_streams()
        kv = await bus.desired_state()
        for key in await kv.nodes():
            await kv.delete(key)
        agents: StandInAgents = agents_of(bus) if agents_of else StandInAgents(bus, delay=0.05)
        follower = asyncio.create_task(agents.follow())
        stack.push_async_callback(agents.stop, follower)
        settings = Settings(admin_token=ADMIN, data_dir=tmp_path, nats_url="unused")
        topo: FastAPI = topology_app(settings, store=store, bus=bus)
        await stack.enter_async_context(topo.router.lifespan_context(topo))
        paths: FastAPI = pathcomp_app(settings, store=store, bus=bus, lease_seconds=1.0)
        await stack.enter_async_context(paths.router.lifespan_context(paths))
        service: PathService = paths.state.pathcomp
        service.stage_timeout = 5.0
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{n}")
            )
            for n, app in (("topology", topo), ("pathcomp", paths))
        ]
        controller = Controller(
            clients[0], clients[1], service, agents, bus, fabric, store, settings
        )
        await asyncio.sleep(0.2)  # the first programming's reports (0.05 s) are out
        await agents.hello(sorted(fabric.nodes))  # every agent is live for pathcomp
        # The first programming: every agent applies it before a test starts.
        await controller.settled()
        yield controller


@pytest_asyncio.fixture
async def controller(nats_url: str, tmp_path: Path) -> AsyncIterator[Controller]:
    async with running(nats_url, tmp_path) as c:
        yield c


@pytest_asyncio.fixture
async def slow_leaf1(nats_url: str, tmp_path: Path) -> AsyncIterator[Controller]:
    """leaf1's agent takes 0.6 s to apply each write; the others 0.05 s."""
    slow = {"leaf1": 0.6}
    async with running(
        nats_url, tmp_path, lambda bus: StandInAgents(bus, delay=0.05, delays=slow)
    ) as c:
        yield c


async def test_a_drained_spine_carries_traffic_until_the_agents_applied_the_plan_that_avoids_it(
    slow_leaf1: Controller,
) -> None:
    c = slow_leaf1
    before = await c.status("/nodes/spine1")
    assert before["in_service"] and before["carries_traffic"]
    assert before["routes_through"]["total"] > 0 and before["admin_state"] == "up"
    drained_at = await c.drain("/nodes/spine1/drain")
    seen = await c.watch_until_empty("/nodes/spine1")
    empty_at, final = seen[-1]
    # Before it was empty, it was seen carrying traffic, then out of the plan but with
    # agents still applying the last stage of the new paths.
    assert seen[0][1]["carries_traffic"]
    waiting = [s for _, s in seen if not s["in_service"] and s["carries_traffic"]]
    assert waiting and all(s["agents_pending"] for s in waiting)
    # The slow leaf1 had to apply its new routes before the last stage was written.
    assert empty_at - drained_at >= 0.6
    # Empty means: no route of the served plan crosses it, and every write made since the
    # drain was applied before the answer said so.
    assert final["routes_through"] == {"red": 0, "blue": 0, "total": 0}
    assert final["admin_state"] == "drained" and final["agents_pending"] == []
    assert final["agents_silent"] == [] and final["hosts_cut_off"] == []
    assert final["since"] is not None and final["out_of_service_plan"] <= final["plan_revision"]
    since_drain = [(node, rev) for at, node, rev in c.agents.writes if at >= drained_at]
    assert since_drain, "the drain rewrote desired state"
    assert max(c.agents.acks[w] for w in since_drain) <= empty_at
    listed = (await c.pathcomp.get("/api/v1/drains", headers=auth(VIEWER))).json()
    assert [(d["kind"], d["element"], d["carries_traffic"]) for d in listed["items"]] == [
        ("node", "spine1", False)
    ]


async def test_a_drained_link_in_use_empties_and_an_undrain_puts_it_back_in_service(
    controller: Controller,
) -> None:
    c = controller
    link = c.red_switch_link("host1", "host3")
    before = await c.status(f"/links/{link}")
    assert before["routes_through"]["red"] > 0 and before["carries_traffic"]
    await c.drain(f"/links/{link}/drain")
    final = (await c.watch_until_empty(f"/links/{link}"))[-1][1]
    assert final["kind"] == "link" and final["element"] == str(link)
    assert not final["in_service"] and final["routes_through"]["total"] == 0
    await c.drain(f"/links/{link}/undrain")
    deadline = time.monotonic() + WAIT
    while (status := await c.status(f"/links/{link}"))["admin_state"] != "up":
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.02)
    assert status["in_service"] and status["carries_traffic"] and status["since"] is None
    listed = (await c.pathcomp.get("/api/v1/drains", headers=auth(VIEWER))).json()
    assert listed["items"] == [] and listed["total"] == 0


async def test_an_element_that_is_not_drained_answers_in_service_and_carrying_traffic(
    controller: Controller,
) -> None:
    link = controller.red_switch_link("host1", "host3")
    status = await controller.status(f"/links/{link}")
    assert status["admin_state"] == "up" and status["in_service"]
    assert status["carries_traffic"] and status["out_of_service_plan"] is None
    host = await controller.status("/nodes/host1")
    # host1 has 5 peers: a red and a blue route to each, and from each.
    assert host["in_service"] and host["routes_through"] == {"red": 10, "blue": 10, "total": 20}


async def test_a_live_agent_that_has_not_applied_holds_the_answer_and_a_silent_one_is_named(
    nats_url: str, tmp_path: Path
) -> None:
    """leaf2's agent is alive but never applies anything; leaf3's agent never reported at all."""

    def agents(bus: Bus) -> StandInAgents:
        return StandInAgents(bus, delay=0.05, silent={"leaf2"}, absent={"leaf3"})

    async with running(nats_url, tmp_path, agents) as c:
        c.service.stage_timeout = 0.2
        await c.drain("/nodes/spine2/drain")
        deadline = time.monotonic() + WAIT
        # The others apply the new paths; leaf2 never does.
        while (status := await c.status("/nodes/spine2"))["agents_pending"] != ["leaf2"]:
            assert time.monotonic() < deadline, json.dumps(status)
            await asyncio.sleep(0.02)
        assert not status["in_service"] and status["routes_through"]["total"] == 0
        assert status["carries_traffic"]
        assert status["agents_silent"] == ["leaf3"]
        await asyncio.sleep(0.5)  # still waiting: nothing times this answer out
        assert (await c.status("/nodes/spine2"))["carries_traffic"]
        # leaf2 catches up: the answer turns.
        revision = c.service.written["leaf2"]
        await c.bus.publish(DatapathApplied(
            node="leaf2", driver="test", key_revision=revision, plan_revision=0, changes=1,
            seconds=0.0, at=datetime.now(UTC)))  # fmt: skip
        await c.watch_until_empty("/nodes/spine2")


async def test_unknown_elements_bad_ids_and_missing_tokens_get_clear_errors(
    controller: Controller,
) -> None:
    api = controller.pathcomp
    missing = await api.get("/api/v1/drains/links/9999", headers=auth(VIEWER))
    assert missing.status_code == 404 and "link 9999 not found" in missing.json()["detail"]
    nobody = await api.get("/api/v1/drains/nodes/nosuch", headers=auth(VIEWER))
    assert nobody.status_code == 404 and "node 'nosuch' not found" in nobody.json()["detail"]
    bad = await api.get("/api/v1/drains/links/abc", headers=auth(VIEWER))
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["loc"] == ["path", "link_id"]
    assert (await api.get("/api/v1/drains", headers=auth(None))).status_code == 401
    paged = await api.get("/api/v1/drains", params={"limit": 0}, headers=auth(VIEWER))
    assert paged.status_code == 422 and paged.json()["errors"][0]["loc"] == ["query", "limit"]


async def test_a_replica_that_does_not_write_gives_the_same_answer_from_the_kv(
    controller: Controller,
) -> None:
    """Any replica answers: one that does not lead reads the written revisions from the KV."""
    c = controller
    async with AsyncExitStack() as stack:
        app = pathcomp_app(c.settings, store=c.store, bus=c.bus, lease_seconds=1.0)
        await stack.enter_async_context(app.router.lifespan_context(app))
        follower: PathService = app.state.pathcomp
        assert not follower.is_leader() and follower.written == {}
        api = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")
        )
        await c.agents.hello(sorted(c.fabric.nodes))  # the follower hears every agent too
        c.agents.silent.add("leaf1")  # alive, but it does not apply the drain's writes
        c.service.stage_timeout = 0.2
        link = c.red_switch_link("host1", "host3")
        await c.drain(f"/links/{link}/drain")
        path = f"/api/v1/drains/links/{link}"

        async def follower_says() -> dict[str, Any]:
            body: dict[str, Any] = (await api.get(path, headers=auth(VIEWER))).json()
            return body

        deadline = time.monotonic() + WAIT
        while (status := await follower_says())["agents_pending"] != ["leaf1"]:
            assert time.monotonic() < deadline, json.dumps(status)
            await asyncio.sleep(0.02)
        assert status["carries_traffic"] and not status["in_service"]
        # The revision leaf1 must report is the one in the KV (the follower wrote nothing);
        # the leader may still write leaf1's later stages, so leaf1 reports what is there.
        kv = await c.bus.desired_state()
        while (status := await follower_says())["carries_traffic"]:
            assert time.monotonic() < deadline, json.dumps(status)
            entry = await kv.get(node_key("leaf1"))
            assert entry is not None
            await c.bus.publish(DatapathApplied(
                node="leaf1", driver="test", key_revision=entry.revision, plan_revision=0,
                changes=1, seconds=0.0, at=datetime.now(UTC)))  # fmt: skip
            await asyncio.sleep(0.05)
        assert status["admin_state"] == "drained" and status["agents_pending"] == []
