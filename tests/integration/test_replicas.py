"""Replicas under load, through the one URL: `thorn-run` with two topology, two health and
two pathcomp processes behind the gateway, on one SQLite store and one nats-server, as
`THORN_*_REPLICAS=2 make run` starts them.

Writes (topology's API, through the gateway) and reads (each service's, through the gateway)
flow, agents' reports go to health over NATS, and one replica is killed with SIGKILL mid-load:
a topology replica, the active health replica, the pathcomp leader, one per test. Each test
asserts what the kill may cost: no acknowledged write, no event; errors only for the
requests the killed replica had in flight, answered 502 or 503 at once, never a hang. The
killed replica comes back (thorn-run starts it again) before the next test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats.js.errors
import orjson
import pytest
import pytest_asyncio
from launched import child_on_port
from thorn_stack import Stack, run_stack
from waiting import eventually

from thorn.bus import Bus, DesiredStateConflict, PublishError
from thorn.events import (
    STREAM_HEALTH,
    STREAM_TOPOLOGY,
    AgentReportReply,
    CarrierReport,
    LinkHealthChanged,
    TopologyChanged,
    utcnow,
)
from thorn_gateway.app import CONNECT_TIMEOUT_S
from thorn_programmer.reports import ReportQueue

pytestmark = pytest.mark.nats

LEASE_S = 2.0  # THORN_LEASE_SECONDS: how soon a dead leader's lease runs out
START_S = 120.0  # seven processes starting one after another on 2 shared cores
WAIT_S = 20.0  # bound for what follows by moments (events, takeovers, a replica's return)
LOAD_S = 7.0  # each test's load
KILL_AT_S = 2.5  # into the load
WRITERS, READERS = 2, 2
# A request in flight at a killed replica is answered within the connect timeout of the
# next attempt (a read moves on to another replica); nothing waits for a read timeout.
NO_HANG_S = CONNECT_TIMEOUT_S + 3.0
KEPT_CHANGING = "kept changing under this write"


@dataclass
class Replicas:
    """A running thorn-run and what it started."""

    stack: Stack

    @property
    def api(self) -> str:
        return self.stack.url

    @property
    def nats(self) -> str:
        return str(self.stack.run["nats"])

    def replicas(self, service: str) -> list[str]:
        return [s["url"] for name, s in self.stack.run["services"].items()
                if name == service or name.startswith(f"{service}-")]  # fmt: skip

    def pid_of(self, url: str) -> int:
        pid = child_on_port(self.stack.pid, int(url.rsplit(":", 1)[1]))
        assert pid is not None, f"nothing of thorn-run's listens at {url}"
        return pid


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    settings = {"THORN_LEASE_SECONDS": str(LEASE_S), "THORN_TOPOLOGY_REPLICAS": "2",
                "THORN_HEALTH_REPLICAS": "2", "THORN_PATHCOMP_REPLICAS": "2"}  # fmt: skip
    with run_stack(tmp_path_factory.mktemp("replicas"), False, settings) as running:
        yield Replicas(running)


@pytest_asyncio.fixture
async def http(stack: Replicas) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {stack.stack.admin}"}
    async with httpx.AsyncClient(timeout=30.0, headers=headers) as client:
        yield client


@pytest_asyncio.fixture
async def bus(stack: Replicas) -> AsyncIterator[Bus]:
    creds = stack.stack.nats_creds
    async with await Bus.connect(stack.nats, name="test-replicas", creds=creds) as connected:
        yield connected


@pytest_asyncio.fixture
async def steady(stack: Replicas, http: httpx.AsyncClient) -> Replicas:
    """The stack with every replica up (a killed one is back) and one leader of each kind."""

    async def all_up() -> bool:
        answer = await http.get(f"{stack.api}/healthz")
        return answer.status_code == 200 and answer.json()["status"] == "ok"

    await eventually(all_up, "every replica up behind the gateway", within=START_S, every=0.2)
    for election in ("health", "pathcomp"):
        await eventually(lambda e=election: leads(stack, http, e), f"a {election} leader",  # type: ignore[misc]
                         within=WAIT_S, every=0.2)  # fmt: skip
    return stack


async def leader_of(stack: Replicas, http: httpx.AsyncClient, election: str) -> str | None:
    """The replica (URL) that holds `election`'s lease, by its thorn_leader gauge."""
    leading = []
    for url in stack.replicas(election):
        with contextlib.suppress(httpx.HTTPError):
            for line in (await http.get(f"{url}/metrics")).text.splitlines():
                if line.startswith("thorn_leader{") and f'election="{election}"' in line and \
                        line.endswith(" 1.0"):  # fmt: skip
                    leading.append(url)
    assert len(leading) <= 1, f"two {election} leaders: {leading}"
    return leading[0] if leading else None


async def metric(http: httpx.AsyncClient, url: str, name: str) -> float:
    """A counter of the process at `url` (0 when it has none yet)."""
    for line in (await http.get(f"{url}/metrics")).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rpartition(" ")[2])
    return 0.0


async def leads(stack: Replicas, http: httpx.AsyncClient, election: str) -> bool:
    return await leader_of(stack, http, election) is not None


# --- the load ------------------------------------------------------------------------------


@dataclass
class Answer:
    kind: str  # "write" or "read"
    status: int  # 0: no HTTP answer at all
    started: float
    seconds: float


@dataclass
class Load:
    """Writes of new nodes and reads through the one URL, each write retried until it is
    acknowledged, as a client holding a 502 or 503 would."""

    api: str
    http: httpx.AsyncClient
    prefix: str
    reads: tuple[str, ...]
    answers: list[Answer] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)  # nodes whose create was acknowledged
    contended: int = 0  # writes answered 409 "kept changing" (to be sent again, as it says)

    async def _call(self, kind: str, method: str, path: str, **kw: Any) -> tuple[int, str]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            answer = await self.http.request(method, f"{self.api}{path}", **kw)
            status, text = answer.status_code, answer.text
        except httpx.HTTPError as exc:
            status, text = 0, repr(exc)
        self.answers.append(Answer(kind, status, started, loop.time() - started))
        return status, text

    async def writer(self, w: int, until: float) -> None:
        loop, i = asyncio.get_running_loop(), 0
        while loop.time() < until:
            name, unsure = f"{self.prefix}{w}-{i}", False
            for _ in range(50):  # bounded: a 502/503 is retried after a moment
                status, text = await self._call("write", "POST", "/api/v1/nodes",
                                                json={"name": name, "role": "switch"})  # fmt: skip
                if status == 409 and KEPT_CHANGING in text:
                    self.contended += 1  # both replicas wrote at once, 3 times over: again
                    continue
                if status == 201 or (status == 409 and unsure):  # 409: the lost answer's write
                    self.acked.append(name)
                    break
                assert status in (502, 503), f"write {name}: {status} {text}"
                unsure = True
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"write {name} was never acknowledged")
            i += 1

    async def reader(self, r: int, until: float) -> None:
        loop, i = asyncio.get_running_loop(), r
        while loop.time() < until:
            await self._call("read", "GET", self.reads[i % len(self.reads)])
            i += 1
            await asyncio.sleep(0.02)

    async def run(self, kill: Callable[[], Awaitable[None]], *more: Awaitable[None]) -> float:
        """The load for LOAD_S with `kill` at KILL_AT_S (and `more` alongside); returns when
        the kill happened, on the loop's clock."""
        loop = asyncio.get_running_loop()
        until = loop.time() + LOAD_S
        tasks = [*(self.writer(w, until) for w in range(WRITERS)),
                 *(self.reader(r, until) for r in range(READERS)), *more]  # fmt: skip
        flowing = asyncio.gather(*tasks)
        await asyncio.sleep(KILL_AT_S)
        killed_at = loop.time()
        await kill()
        await flowing
        return killed_at

    def failed(self, kind: str) -> list[Answer]:
        """The answers that were errors (a write's 409 is its lost answer's, or contention)."""
        return [a for a in self.answers if a.kind == kind and not 200 <= a.status < 300
                and not (kind == "write" and a.status == 409)]  # fmt: skip

    def summary(self, killed_at: float) -> dict[str, Any]:
        return {kind: {"answers": sum(a.kind == kind for a in self.answers),
                       "failed": [(a.status, round(a.started - killed_at, 3),
                                   round(a.seconds, 3)) for a in self.failed(kind)],
                       "slowest_s": round(max((a.seconds for a in self.answers
                                               if a.kind == kind), default=0), 3)}
                for kind in ("write", "read")} | {"contended_writes": self.contended}  # fmt: skip


def assert_cost_of_a_kill(load: Load) -> None:
    """What a killed replica may cost the clients of the one URL: the requests it had in
    flight (at most one per client), answered 502 or 503, and nothing that hangs."""
    for kind, clients in (("write", WRITERS), ("read", READERS)):
        failed = load.failed(kind)
        assert len(failed) <= clients, (kind, failed)
        assert {a.status for a in failed} <= {502, 503}, (kind, failed)
        assert max(a.seconds for a in load.answers if a.kind == kind) < NO_HANG_S, kind
    assert load.acked, "no write was acknowledged"


def kill(pid: int) -> Callable[[], Awaitable[None]]:
    async def now() -> None:
        os.kill(pid, signal.SIGKILL)

    return now


async def stored(bus: Bus, stream: str) -> list[bytes]:
    state = (await bus.js.stream_info(stream)).state
    out = []
    for seq in range(state.first_seq, state.last_seq + 1):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            out.append((await bus.js.get_msg(stream, seq)).data or b"")
    return out


async def assert_each_revision_announced_once(bus: Bus, http: httpx.AsyncClient, api: str) -> None:
    """THORN_TOPOLOGY holds topology.changed for every revision of the store, each once:
    revisions contiguous from the first write, no gaps, no duplicates. A write whose
    replica died before sending its event is sent by a survivor's sweep (seconds later)."""
    revision = (await http.get(f"{api}/api/v1/fabric/summary")).json()["revision"]
    seen: Counter[int] = Counter()

    async def complete() -> bool:
        seen.clear()
        for data in await stored(bus, STREAM_TOPOLOGY.name):
            seen[TopologyChanged.model_validate_json(data).revision] += 1
        return set(seen) >= set(range(1, revision + 1))

    await eventually(complete, f"topology.changed for revisions 1..{revision}", within=WAIT_S,
                     every=0.5)  # fmt: skip
    assert sorted(seen) == list(range(1, revision + 1)), "revisions missing or not in the store"
    assert {r: n for r, n in seen.items() if n > 1} == {}, "revisions announced twice"


# --- the tests -----------------------------------------------------------------------------


async def test_thorn_run_starts_each_replica_on_its_own_port_behind_the_one_url(
    steady: Replicas, http: httpx.AsyncClient
) -> None:
    services = {name: s["url"] for name, s in steady.stack.run["services"].items()}
    assert set(services) == {"topology", "topology-2", "health", "health-2", "pathcomp",
                             "pathcomp-2", "gateway"}  # fmt: skip
    assert len(set(services.values())) == len(services)  # a port each
    health = (await http.get(f"{steady.api}/healthz")).json()["services"]
    for service in ("topology", "health", "pathcomp"):
        listed = [r["url"] for r in health[service]["replicas"] if r["status"] == "ok"]
        assert listed == steady.replicas(service), service


async def test_a_topology_replica_killed_under_load_loses_no_acknowledged_write_or_event(
    steady: Replicas, http: httpx.AsyncClient, bus: Bus
) -> None:
    victim = steady.replicas("topology")[1]
    load = Load(steady.api, http, "topo", ("/api/v1/fabric/summary", "/api/v1/nodes?limit=5"))
    killed_at = await load.run(kill(steady.pid_of(victim)))
    print(json.dumps({"killed": "topology", **load.summary(killed_at)}))

    assert_cost_of_a_kill(load)
    for name in load.acked:
        assert (await http.get(f"{steady.api}/api/v1/nodes/{name}")).status_code == 200, name
    await assert_each_revision_announced_once(bus, http, steady.api)
    survivor = steady.replicas("topology")[0]  # the killed one may still be starting again
    swept = await metric(http, survivor, "thorn_topology_announce_swept_total")
    print(json.dumps({"events_sent_by_the_survivor_s_sweep": swept}))  # the killed write's


async def test_the_active_health_replica_killed_under_load_loses_no_acknowledged_report(
    steady: Replicas, http: httpx.AsyncClient, bus: Bus
) -> None:
    active = await leader_of(steady, http, "health")
    assert active is not None
    fabric = (await http.get(f"{steady.api}/api/v1/links?limit=1000")).json()["items"]
    hosts = sorted((k for k in fabric if k["a"]["node"].startswith("host")),
                   key=lambda k: k["id"])  # fmt: skip
    queues: dict[str, ReportQueue] = {}
    acked: list[tuple[int, bool, float]] = []  # (link, carrier, when health answered)
    unanswered: list[str] = []

    async def report(link: dict[str, Any], carrier: bool) -> None:
        """One agent report of a host port's carrier, sent again (same sequence number)
        until health answers it, as the agent's report queue does."""
        node, port = link["a"]["node"], link["a"]["port"]
        queue = queues.setdefault(node, ReportQueue(node))
        queue.add([CarrierReport(port=port, admin_up=True, carrier=carrier,
                                 oper_state="up" if carrier else "down",
                                 detected_at=utcnow())])  # fmt: skip
        for _ in range(200):  # bounded: the standby takes over within a lease
            sent = queue.next_report()
            assert sent is not None
            try:
                raw = await bus.request(sent, reply_within=1.0)
            except PublishError as exc:  # nobody answers while the lease changes hands
                unanswered.append(str(exc)[:80])
                await asyncio.sleep(0.1)
                continue
            reply = AgentReportReply.model_validate_json(raw)
            assert reply.ok, reply.error
            queue.sent(sent)
            acked.append((link["id"], carrier, asyncio.get_running_loop().time()))
            return
        raise AssertionError(f"{node}'s report was never answered: {unanswered[-3:]}")

    async def agents(until: float) -> None:
        """Each host link down, then up again, one after another."""
        for link in hosts:
            for carrier in (False, True):
                if asyncio.get_running_loop().time() > until:
                    return
                await report(link, carrier)
                await asyncio.sleep(0.1)

    load = Load(steady.api, http, "hlth", ("/api/v1/health/links?limit=5",
                                           "/api/v1/health/events?limit=5"))  # fmt: skip
    until = asyncio.get_running_loop().time() + LOAD_S
    killed_at = await load.run(kill(steady.pid_of(active)), agents(until))
    survivor = await leader_of(steady, http, "health")
    answered_at = [at for _, _, at in acked]
    print(json.dumps({"killed": "health (active)", "reports": len(acked),
                      "unanswered_tries": len(unanswered),
                      "longest_wait_for_an_answer_s": round(max(
                          b - a for a, b in itertools.pairwise(answered_at)), 2),
                      **load.summary(killed_at)}))  # fmt: skip

    assert_cost_of_a_kill(load)
    assert survivor not in (None, active), "the standby took the reports over"
    assert any(at > killed_at for _, _, at in acked), "no report was answered after the kill"
    # Health publishes (and JetStream stores) a report's events before it answers.
    events = map(LinkHealthChanged.model_validate_json, await stored(bus, STREAM_HEALTH.name))
    downs = {link for link, carrier, _ in acked if not carrier}
    assert downs <= {e.link_id for e in events if e.state == "down"}
    # And the survivor's view (the store's, on either replica) is each link's last report.
    last = {link: carrier for link, carrier, _ in acked}
    reported_down = {link for link, carrier in last.items() if not carrier}

    async def as_reported() -> bool:
        page = (await http.get(f"{steady.api}/api/v1/health/links",
                               params={"state": "down", "limit": "1000"})).json()  # fmt: skip
        return {i["link_id"] for i in page["items"]} & set(last) == reported_down

    await eventually(as_reported, "health's view of each link as last reported", within=WAIT_S)


async def test_the_pathcomp_leader_killed_under_load_is_followed_by_a_higher_term_that_fences_it(
    steady: Replicas, http: httpx.AsyncClient, bus: Bus
) -> None:
    leader = await leader_of(steady, http, "pathcomp")
    assert leader is not None
    kv = await bus.desired_state()
    before = await kv.get("node.spine1")
    assert before is not None and before.value is not None
    old_term = orjson.loads(before.value)["term"]
    load = Load(steady.api, http, "path", ("/api/v1/plan", "/api/v1/drains"))
    loop = asyncio.get_running_loop()
    took_over: list[float] = []

    async def taken_over() -> bool:
        if await leader_of(steady, http, "pathcomp") in (None, leader):
            return False
        took_over.append(loop.time())
        return True

    async def watch() -> None:  # from the kill on, while the load runs
        await asyncio.sleep(KILL_AT_S)
        await eventually(taken_over, "the other pathcomp leading", within=WAIT_S, every=0.1)

    killed_at = await load.run(kill(steady.pid_of(leader)), watch())
    print(json.dumps({"killed": "pathcomp (leader)",
                      "new_leader_after_s": round(took_over[0] - killed_at, 2),
                      **load.summary(killed_at)}))  # fmt: skip
    assert_cost_of_a_kill(load)

    async def restamped() -> bool:  # the new leader writes every document with its term
        entry = await kv.get("node.spine1")
        return entry is not None and orjson.loads(entry.value or b"{}")["term"] > old_term

    await eventually(restamped, "spine1's document written by a higher term", within=WAIT_S)
    now = await kv.get("node.spine1")
    assert now is not None and now.value is not None
    new_term = orjson.loads(now.value)["term"]
    # The new leader writes desired state as the fabric changes: a drained leaf-spine link
    # moves the leaf's routes (the host links are down since the health test).
    links = (await http.get(f"{steady.api}/api/v1/links?limit=1000")).json()["items"]
    link = next(k for k in links if k["a"]["node"].startswith("leaf"))
    node = f"node.{link['a']['node']}"
    written = await kv.get(node)
    assert written is not None
    drained = await http.post(f"{steady.api}/api/v1/links/{link['id']}/drain")
    assert drained.status_code == 200, drained.text

    async def rewritten() -> bool:
        entry = await kv.get(node)
        return entry is not None and entry.revision != written.revision and \
            orjson.loads(entry.value or b"{}")["term"] == new_term  # fmt: skip

    await eventually(rewritten, f"{node} rewritten by the new leader", within=WAIT_S)
    # The dead leader's late write: its compare-and-set on the revision it last wrote is
    # refused (the agents also refuse any document of an older term than one they took).
    with pytest.raises(DesiredStateConflict):
        await kv.update("node.spine1", before.value, last=before.revision)
    kept = await kv.get("node.spine1")
    assert kept is not None and orjson.loads(kept.value or b"{}")["term"] == new_term


async def test_every_write_s_event_is_in_the_stream_once_after_all_the_kills(
    steady: Replicas, http: httpx.AsyncClient, bus: Bus
) -> None:
    created = await http.post(f"{steady.api}/api/v1/tenants", json={"name": "after-kills"})
    assert created.status_code == 201, created.text
    await assert_each_revision_announced_once(bus, http, steady.api)
