"""The scale benchmark's simulated agents (tests/support/sim_agents.py) against a real
nats-server: the programmer's own NodeAgent and Reporter over a null datapath and scripted
ports. What the benchmark times must be what an agent does: a document written to the KV is
rendered, "installed" and acknowledged with its key revision on `agent.applied.<node>`; a
flip from pathcomp moves the peer's tunnel and is reported as a failover; ports are reported
to health, a carrier change at once with its detection time; and a thousand agents fit in
one process because nothing in the agent is per process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
from nats.aio.msg import Msg
from sim_agents import NullDatapath, ScriptedPorts, SimulatedAgent
from waiting import eventually

from thorn.bus import Bus
from thorn.desired import (
    Backup,
    HostState,
    LocalWorkload,
    Route,
    SwitchState,
    VniMember,
    VniState,
    node_key,
    vni_key,
)
from thorn.events import (
    AgentReport,
    AgentReportReply,
    CarrierReport,
    CountersReport,
    DatapathApplied,
    FailoverEvent,
    FlipCommand,
)
from thorn_programmer.kernel import Route as KernelRoute
from thorn_programmer.kernel import TunnelAction
from thorn_programmer.render import BACKUP_METRIC, PRIMARY_METRIC
from thorn_programmer.reports import Reporter

pytestmark = pytest.mark.nats

VNI = 4242


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-sim-agents") as connected:
        await connected.ensure_streams()
        yield connected


class Seen:
    """Events of one type on the bus, as they arrive."""

    def __init__(self) -> None:
        self.events: list[object] = []

    async def take(self, event: object) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[object]:
        return [e for e in self.events if isinstance(e, kind)]


def switch_state(routes: list[Route]) -> SwitchState:
    return SwitchState(node="simleaf1", plan_revision=1, topology_revision=1, routes=routes)


def route(prefix: str, port: str, backup: str | None = None) -> Route:
    return Route(prefix=prefix, colour="red", port=port, neighbour="spine1", via=None, stage=1,
                 backup=Backup(port=backup, neighbour="spine2") if backup else None)  # fmt: skip


def applied(seen: Seen, node: str, revision: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return any(isinstance(e, DatapathApplied) and e.node == node and e.key_revision ==
                   revision and not e.errors for e in seen.events)  # fmt: skip

    return check


async def test_a_switch_document_is_installed_in_the_null_datapath_and_acknowledged(
    bus: Bus,
) -> None:
    kv = await bus.desired_state()
    seen = Seen()
    await bus.subscribe("agent.applied.simleaf1", seen.take, model=DatapathApplied)
    routes = [route("10.224.0.0/28", "swp5", backup="swp6"), route("10.224.0.16/28", "swp6")]
    first = await kv.put(node_key("simleaf1"), switch_state(routes))
    sim = SimulatedAgent("simleaf1", ["swp5", "swp6"], bus, report_seconds=60)
    await sim.start()
    try:
        await eventually(applied(seen, "simleaf1", first), "the first document applied")
        assert isinstance(sim.datapath, NullDatapath) and sim.datapath.kind == "switch"
        installed = sorted((o.prefix, o.dev, o.metric) for o in sim.datapath.installed.values()
                           if isinstance(o, KernelRoute))  # fmt: skip
        assert installed == [("10.224.0.0/28", "swp5", PRIMARY_METRIC),
                             ("10.224.0.0/28", "swp6", BACKUP_METRIC),
                             ("10.224.0.16/28", "swp6", PRIMARY_METRIC)]  # fmt: skip

        second = await kv.put(node_key("simleaf1"), switch_state([route("10.224.0.16/28", "swp5")]))
        await eventually(applied(seen, "simleaf1", second), "the second document applied")
        assert [(o.prefix, o.dev) for o in sim.datapath.installed.values()] == [
            ("10.224.0.16/28", "swp5")
        ]
        [ack] = [e for e in seen.of(DatapathApplied)
                 if isinstance(e, DatapathApplied) and e.key_revision == second]  # fmt: skip
        assert ack.changes == 3  # the primary replaced (another port), the other two deleted
        assert ack.driver == "null"
    finally:
        await sim.stop()


def member(n: int, host: str, k: int) -> VniMember:
    return VniMember(name=f"w{n}", mac=f"06:00:00:00:01:{n:02x}", ip=f"100.64.1.{n}", host=host,
                     red=f"10.224.1.{k}", blue=f"10.240.1.{k}")  # fmt: skip


async def test_a_host_follows_its_vni_and_a_central_flip_moves_the_peers_tunnel(bus: Bus) -> None:
    kv = await bus.desired_state()
    seen = Seen()
    await bus.subscribe("agent.applied.simhost1", seen.take, model=DatapathApplied)
    await bus.subscribe("failover.simhost1", seen.take, model=FailoverEvent)
    await kv.put(vni_key(VNI, 0), VniState(vni=VNI, chunk=0, chunks=1, topology_revision=1,
                 members=[member(1, "simhost1", 1), member(2, "simhost2", 2)]))  # fmt: skip
    state = HostState(
        node="simhost1", plan_revision=1, topology_revision=1,
        teps={"red": "10.224.1.1", "blue": "10.240.1.1"}, routes=[],
        local=[LocalWorkload(name="w1", vni=VNI, vf="vf0", mac="06:00:00:00:01:01",
                             ip="100.64.1.1")],
        vnis=[VNI], blue_peers=[],
    )  # fmt: skip
    revision = await kv.put(node_key("simhost1"), state)
    sim = SimulatedAgent("simhost1", ["eth1"], bus, report_seconds=60)
    await sim.start()
    try:
        await eventually(applied(seen, "simhost1", revision), "the host's document applied")

        def tunnel() -> TunnelAction:
            assert sim.datapath is not None
            [action] = [o for o in sim.datapath.installed.values()
                        if isinstance(o, TunnelAction)]  # fmt: skip
            return action

        assert (tunnel().peer, tunnel().dst) == ("simhost2", "10.224.1.2")

        await bus.publish(FlipCommand(node="simhost1", peers=["simhost2"], colour="blue",
                                      element="link 7", plan_revision=2))  # fmt: skip

        async def flipped() -> bool:
            return bool(seen.of(FailoverEvent))

        await eventually(flipped, "the flip's failover event")
        [event] = seen.of(FailoverEvent)
        assert isinstance(event, FailoverEvent)
        assert (event.tier, event.peers, event.to_colour) == ("central", ["simhost2"], "blue")
        assert tunnel().dst == "10.240.1.2"
    finally:
        await sim.stop()


async def test_ports_are_reported_to_health_a_carrier_loss_at_once_with_its_time(
    bus: Bus,
) -> None:
    reports: list[AgentReport] = []

    async def health(msg: Msg) -> None:  # answers as health does
        report = AgentReport.model_validate_json(msg.data)
        reports.append(report)
        await msg.respond(AgentReportReply(ok=True, applied=len(report.items)).model_dump_json()
                          .encode())  # fmt: skip

    await bus.nc.subscribe("agent.report.simleaf2", cb=health)
    ports = ScriptedPorts(["swp1", "swp2"])
    reporter = Reporter("simleaf2", bus, None, period=60, links=lambda _netns: ports)
    task = asyncio.create_task(reporter.run())
    try:

        async def reported(check: Callable[[], bool]) -> None:
            async def seen() -> bool:
                return check()

            await eventually(seen, "a report")

        await reported(lambda: len(reports) >= 1)
        snapshot = reports[0].items
        assert sorted(i.port for i in snapshot if isinstance(i, CarrierReport)) == ["swp1", "swp2"]
        counters = [i for i in snapshot if isinstance(i, CountersReport)]
        assert {c.port: c.rx_packets for c in counters} == {"swp1": 10_000, "swp2": 10_000}

        before = time.time_ns()
        at_ns = ports.carrier("swp2", False)
        await reported(lambda: len(reports) >= 2)
        [loss] = reports[1].items
        assert isinstance(loss, CarrierReport)
        assert (loss.port, loss.carrier, loss.oper_state) == ("swp2", False, "lowerlayerdown")
        assert loss.detected_at == datetime.fromtimestamp(at_ns / 1e9, UTC)
        assert before <= at_ns <= time.time_ns()
        assert reports[1].seq == reports[0].seq + 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_many_simulated_agents_share_one_process_each_with_its_own_state(bus: Bus) -> None:
    kv = await bus.desired_state()
    seen = Seen()
    await bus.subscribe("agent.applied.>", seen.take, model=DatapathApplied)
    nodes = [f"simsw{n}" for n in range(40)]
    revisions = {}
    for n, node in enumerate(nodes):
        doc = SwitchState(node=node, plan_revision=1, topology_revision=1,
                          routes=[route(f"10.224.{n}.0/28", "swp1")])  # fmt: skip
        revisions[node] = await kv.put(node_key(node), doc)
    sims = [SimulatedAgent(node, ["swp1"], bus, report_seconds=60) for node in nodes]
    for sim in sims:
        await sim.start()
    try:
        for node in nodes:
            await eventually(applied(seen, node, revisions[node]), f"{node} applied")
        for n, sim in enumerate(sims):
            assert sim.datapath is not None
            assert [o.prefix for o in sim.datapath.installed.values()] == [f"10.224.{n}.0/28"]
    finally:
        await asyncio.gather(*(sim.stop() for sim in sims))
