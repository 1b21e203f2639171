"""The programmer agent end to end: desired state in real NATS KV -> the kernel of two hosts.

What an operator relies on: the agent follows its keys, reports what it applied, fails over
locally without the controller, restarts without touching the datapath, cleans up when its
node leaves the fabric, and shrugs off a broken document.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from prometheus_client import REGISTRY
from twohosts import TwoHosts, documents, hosts_fixture, sh, tx_packets, udp_exchange  # noqa: F401  (hosts_fixture: the `hosts` fixture)

from thorn.bus import Bus, DesiredStateStore
from thorn.events import (
    AGENT_APPLIED_ALL,
    DESIRED_STATE_KV,
    FAILOVER_ALL,
    DatapathApplied,
    Event,
    FailoverEvent,
    FlipCommand,
)
from thorn.model import Colour
from thorn_programmer.agent import NodeAgent
from thorn_programmer.drivers import open_driver
from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.intent import HostIntent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="needs root for network namespaces",
)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-agent") as connected:
        yield connected


@pytest.fixture
async def kv(bus: Bus) -> DesiredStateStore:
    # A bucket per test: agents of other tests never see these keys.
    spec = dataclasses.replace(DESIRED_STATE_KV, bucket=f"test-desired-{uuid.uuid4().hex[:8]}")
    return await bus.desired_state(spec)


class Agents:
    def __init__(self, lab: TwoHosts, kv: DesiredStateStore, bus: Bus) -> None:
        self.agents = {
            h: NodeAgent(h, kv, bus, lambda kind, ns: open_driver(kind, ns, "emulation"),
                         lab.ns[h])
            for h in ("h1", "h2")
        }  # fmt: skip
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(a.run()) for a in self.agents.values()]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def settled(self, node: str, revision: int, within: float = 10) -> None:
        """Wait until `node`'s agent has applied key revision >= `revision`, with its VNIs'
        membership complete (the VNI documents arrive on watches of their own)."""
        agent = self.agents[node]

        def done() -> bool:
            applied = agent.applied
            complete = (
                not isinstance(applied, HostIntent)
                or not applied.local
                or (bool(applied.peers) and not applied.incomplete)
            )
            return agent.status.key_revision >= revision and agent.status.reconciles > 0 and (
                complete
            )  # fmt: skip

        async with asyncio.timeout(within):
            while not done():
                await agent.reconciled.wait()


async def until(check: Callable[[], bool], what: str, within: float = 10.0) -> None:
    for _ in range(int(within / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def put_all(kv: DesiredStateStore, docs: dict[str, bytes]) -> dict[str, int]:
    return {key: await kv.put(key, value) for key, value in docs.items()}


@pytest.fixture
async def agents(hosts: TwoHosts, kv: DesiredStateStore, bus: Bus) -> AsyncIterator[Agents]:
    running = Agents(hosts, kv, bus)
    yield running
    await running.stop()


async def test_agents_follow_desired_state_and_report_it(
    hosts: TwoHosts, kv: DesiredStateStore, bus: Bus, agents: Agents
) -> None:
    reports: list[DatapathApplied] = []

    async def seen(event: Event) -> None:
        assert isinstance(event, DatapathApplied)
        reports.append(event)

    await bus.subscribe(AGENT_APPLIED_ALL, seen)
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await agents.settled("h2", revisions["node.h2"])
    assert await asyncio.to_thread(udp_exchange, hosts) == 20
    await bus.flush()
    await asyncio.sleep(0.1)
    mine = [r for r in reports if r.node == "h1"]
    assert mine and mine[-1].driver == "emulation" and mine[-1].errors == []
    assert mine[-1].key_revision == revisions["node.h1"] and mine[-1].changes > 0


async def test_a_new_plan_moves_traffic_to_blue(
    hosts: TwoHosts, kv: DesiredStateStore, agents: Agents
) -> None:
    await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", 1)
    sh("ip", "-n", hosts.ns["h1"], "link", "set", "dev", "eth1", "down")
    # pathcomp moves both directions off the cut link: each host now sends to the other's blue
    revisions = await put_all(kv, documents(hosts, {"h1": ["h2"], "h2": ["h1"]}))
    await agents.settled("h1", revisions["node.h1"])
    await agents.settled("h2", revisions["node.h2"])
    blue = tx_packets(hosts, "h1", "eth2")
    assert await asyncio.to_thread(udp_exchange, hosts) == 20
    assert tx_packets(hosts, "h1", "eth2") - blue >= 20


async def test_local_failover_flips_without_the_controller(
    hosts: TwoHosts, kv: DesiredStateStore, bus: Bus, agents: Agents
) -> None:
    events: list[Event] = []

    async def seen(event: Event) -> None:
        events.append(event)

    await bus.subscribe(FAILOVER_ALL, seen)
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await agents.settled("h2", revisions["node.h2"])
    sh("ip", "-n", hosts.ns["h1"], "link", "set", "dev", "eth1", "down")
    # Each end detects the cut on its own (carrier, BFD) and flips toward the other.
    seconds = await agents.agents["h1"].flip("h2", "blue", "test: red link cut")
    await agents.agents["h2"].flip("h1", "blue", "test: red link cut")
    assert seconds < 0.5
    assert await asyncio.to_thread(udp_exchange, hosts) == 20
    await bus.flush()
    await asyncio.sleep(0.1)
    flips = sorted((e.node, *e.peers, e.to_colour) for e in events if isinstance(e, FailoverEvent))
    assert flips == [("h1", "h2", "blue"), ("h2", "h1", "blue")]
    # The override outlives a reconcile of the same plan, and that reconcile finds nothing
    # to do: the flip (which renders only the moving peers) left exactly the desired state.
    result = await agents.agents["h1"].reconcile_now()
    assert result is not None and result.applied == [], result
    assert await asyncio.to_thread(udp_exchange, hosts) == 20


async def test_a_restarted_agent_changes_nothing(
    hosts: TwoHosts, kv: DesiredStateStore, bus: Bus, agents: Agents
) -> None:
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await agents.stop()
    again = Agents(hosts, kv, bus)
    again.start()
    try:
        await again.settled("h1", revisions["node.h1"])
        assert again.agents["h1"].status.last_changes == 0
        assert await asyncio.to_thread(udp_exchange, hosts) == 20
    finally:
        await again.stop()


async def test_a_deleted_document_removes_what_thorn_made(
    hosts: TwoHosts, kv: DesiredStateStore, agents: Agents
) -> None:
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await kv.delete("node.h1")
    await agents.settled("h1", revisions["node.h1"] + 1)
    async with NetlinkDatapath.open(hosts.ns["h1"]) as driver:
        left = [o for o in await driver.read() if type(o).__name__ != "Clsact"]
    assert left == []


async def test_a_broken_document_is_ignored_and_the_last_good_one_kept(
    hosts: TwoHosts, kv: DesiredStateStore, agents: Agents
) -> None:
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await kv.put("node.h1", b'{"kind": "host", "node": "h1"}')
    await kv.put("node.h1", b"not json")
    await asyncio.sleep(0.3)
    assert agents.agents["h1"].status.last_errors == []
    assert await asyncio.to_thread(udp_exchange, hosts) == 20


async def test_a_document_of_an_older_leader_term_is_counted_and_ignored(
    hosts: TwoHosts, kv: DesiredStateStore, agents: Agents
) -> None:
    """A deposed pathcomp leader that writes once more (its term is older than the one the
    agent took) changes nothing on the node."""
    docs = documents(hosts)
    for key in ("node.h1", "node.h2"):
        docs[key] = _with_term(docs[key], 9)
    revisions = await put_all(kv, docs)
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    before = REGISTRY.get_sample_value("thorn_programmer_stale_documents_total", {"node": "h1"})
    stale = documents(hosts, {"h1": ["h2"]})["node.h1"]  # would move h1's traffic to blue
    await kv.put("node.h1", _with_term(stale, 8))
    await asyncio.sleep(0.3)
    after = REGISTRY.get_sample_value("thorn_programmer_stale_documents_total", {"node": "h1"})
    assert (after or 0) - (before or 0) == 1
    agent = agents.agents["h1"]
    assert agent.colour_of("h2") == "red"
    result = await agent.reconcile_now()
    assert result is not None and result.applied == []
    assert await asyncio.to_thread(udp_exchange, hosts) == 20


def _with_term(document: bytes, term: int) -> bytes:
    return orjson.dumps({**orjson.loads(document), "term": term})


async def test_a_new_leaders_word_that_every_peer_is_reprotected_reverts_a_central_flip(
    hosts: TwoHosts, kv: DesiredStateStore, bus: Bus, agents: Agents
) -> None:
    """A new pathcomp leader does not know the flips its predecessor made: it tells every
    host that all its peers are re-protected (one flag, not the peer list: 8,191 names a
    host at k=32) on a plan revision newer than theirs, and a flipped peer moves back."""
    revisions = await put_all(kv, documents(hosts))
    agents.start()
    await agents.settled("h1", revisions["node.h1"])
    await agents.settled("h2", revisions["node.h2"])
    h1 = agents.agents["h1"]
    h1.overrides.hold_down = 0.2
    await bus.publish(FlipCommand(node="h1", peers=["h2"], colour=Colour.blue,
                                  element="spine1", plan_revision=3))  # fmt: skip
    await until(lambda: h1.overrides.colours() == {"h2": "blue"}, "h2 flipped to blue")
    blue = tx_packets(hosts, "h1", "eth2")
    assert await asyncio.to_thread(udp_exchange, hosts) == 20
    assert tx_packets(hosts, "h1", "eth2") - blue >= 20  # toward h2 on blue

    await bus.publish(FlipCommand(node="h1", kind="reprotected", every_peer=True,
                                  element="new leader", plan_revision=4))  # fmt: skip
    reconciles = h1.status.reconciles
    await until(lambda: not h1.overrides.colours() and h1.status.reconciles > reconciles,
                "the flip reverted and the kernel reconciled")  # fmt: skip
    red = tx_packets(hosts, "h1", "eth1")
    assert await asyncio.to_thread(udp_exchange, hosts) == 20
    assert tx_packets(hosts, "h1", "eth1") - red >= 20  # back on red
