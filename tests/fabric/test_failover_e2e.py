"""End to end on an emulated fabric: pathcomp plans, agents program every lab node from
JetStream KV, workloads talk through THORN's tunnels, and a link cut is survived.

The lab is `leaf_spine(2, 3, 2)`: host1 and host2 on leaf1, host3 and host4 on leaf2,
host5 and host6 on leaf3, two spines. Nothing here detects failures yet (that is the
health service's job): the test plays the detector, by telling pathcomp the link is down
(the central path) or by asking the source agent to flip (the local fast failover).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest

from thorn.bus import Bus, DesiredStateStore
from thorn.desired import node_key
from thorn.events import (
    AGENT_APPLIED_ALL,
    DESIRED_STATE_KV,
    DatapathApplied,
    LinkHealthChanged,
    TopologyChanged,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.lab import faults, traffic
from thorn.lab.handle import Lab
from thorn.store import Store
from thorn.store.store import sqlite_url
from thorn_pathcomp.service import PathService
from thorn_programmer.agent import NodeAgent
from thorn_programmer.drivers import open_driver


class Controller:
    """pathcomp and one agent per lab node, on a KV bucket of this test's own."""

    def __init__(self, lab: Lab, store: Store, bus: Bus, kv: DesiredStateStore) -> None:
        self.lab, self.store, self.bus, self.kv = lab, store, bus, kv
        self.service = PathService(store, kv, bus)  # type: ignore[arg-type]
        self.agents = {
            node: NodeAgent(node, kv, bus, lambda kind, ns: open_driver(kind, ns, "emulation"), ns)
            for node, ns in lab.namespaces().items()
        }

    async def settled(self, within: float = 20) -> None:
        """Every agent has applied the latest document written for its node."""
        for _ in range(int(within / 0.05)):
            late = []
            for node, agent in self.agents.items():
                entry = await self.kv.get(node_key(node))
                if entry is None or agent.status.key_revision < entry.revision:
                    late.append(node)
            if not late:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"agents behind their desired state: {late}")

    def red_link(self, src: str, dst: str) -> int:
        """A switch-to-switch link on the red path src -> dst."""
        assert self.service.plan is not None
        red = self.service.plan.pair(src, dst).red
        assert red is not None
        return red.links[1]

    def pair_avoiding(self, link_id: int) -> tuple[str, str]:
        """Hosts on two different leaves whose red path does not use `link_id`."""
        plan = self.service.plan
        assert plan is not None
        hosts = sorted(plan.graph.attachments)
        for src in hosts:
            for dst in hosts:
                red = plan.pair(src, dst).red if src != dst else None
                if red and link_id not in red.links and red.nodes[1] != red.nodes[-2]:
                    return src, dst
        raise AssertionError("no host pair avoids the link")

    def lab_link(self, link_id: int) -> str:
        link = self.lab_fabric.links[link_id]
        return f"{link.a.node}:{link.a.port}"

    lab_fabric: Fabric


@pytest.fixture
async def controller(
    make_lab: Callable[..., Lab], nats_url: str, tmp_path: Path
) -> AsyncIterator[Controller]:
    doc = leaf_spine(2, 3, 2)
    lab = await asyncio.to_thread(make_lab, doc)  # pyroute2's sync API runs its own loop
    async with AsyncExitStack() as stack:
        store = await Store.open(sqlite_url(tmp_path))
        stack.push_async_callback(store.close)
        fabric = Fabric.from_document(doc)
        await store.replace(fabric, expected_revision=0, actor="test", detail={})
        bus = await stack.enter_async_context(await Bus.connect(nats_url, name="test-e2e"))
        await bus.ensure_streams()
        spec = dataclasses.replace(DESIRED_STATE_KV, bucket=f"test-e2e-{uuid.uuid4().hex[:8]}")
        kv = await bus.desired_state(spec)
        c = Controller(lab, store, bus, kv)
        c.lab_fabric = await store.load()

        async def ack(event: DatapathApplied) -> None:
            await c.service.acks.on_applied(event)

        await bus.subscribe(AGENT_APPLIED_ALL, ack, model=DatapathApplied)
        tasks = [asyncio.create_task(a.run()) for a in c.agents.values()]
        await c.service.recompute("test")
        await c.settled()
        try:
            yield c
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def stream(lab: Lab, src: str, dst: str, count: int, port: int) -> traffic.Stream:
    spec = traffic.StreamSpec(src=f"{src}-vf0", dst=f"{dst}-vf0", rate_pps=1000, count=count,
                              duration_s=count / 1000 + 1, port=port)  # fmt: skip
    return traffic.start(lab, spec)


async def test_workloads_talk_through_thorn_tunnels_across_the_fabric(
    controller: Controller,
) -> None:
    lab = controller.lab
    for src, dst in (("host1", "host3"), ("host4", "host2"), ("host1", "host2")):
        report = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
            src=f"{src}-vf0", dst=f"{dst}-vf0", rate_pps=500, count=100, duration_s=2))  # fmt: skip
        assert report.received == 100, (src, dst, report.lost_ranges)
    errors = {n: a.status.last_errors for n, a in controller.agents.items() if a.status.last_errors}
    assert errors == {}


async def test_a_cut_link_is_replanned_and_untouched_flows_never_stop(
    controller: Controller,
) -> None:
    lab = controller.lab
    cut = controller.red_link("host1", "host3")
    bystander = controller.pair_avoiding(cut)
    for src, dst in (("host1", "host3"), bystander):  # resolve ARP before the clock starts
        warm = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
            src=f"{src}-vf0", dst=f"{dst}-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
        assert warm.received == 20
    hit = await asyncio.to_thread(stream, lab, "host1", "host3", 3000, 5001)
    other = await asyncio.to_thread(stream, lab, *bystander, 3000, 5002)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(faults.link_down, lab, controller.lab_link(cut))
    await asyncio.sleep(0.05)  # detection, played by the test
    await controller.service.on_link_health(LinkHealthChanged(
        link_id=cut, state="down", previous="up", at=datetime.now(UTC), source="test"))  # fmt: skip
    await controller.settled()
    hit_report = await asyncio.to_thread(hit.wait)
    other_report = await asyncio.to_thread(other.wait)
    # The hit flow lost one run of packets, then came back on the re-protected path.
    assert 0 < hit_report.lost < hit_report.sent and hit_report.lost_ranges_total == 1
    assert hit_report.lost_ranges[0][1] < hit_report.sent - 100
    # Make-before-break: a flow whose path did not use the link never lost a packet.
    assert other_report.lost == 0, (bystander, other_report.lost_ranges)


async def test_the_source_agent_fails_over_locally_on_its_own(controller: Controller) -> None:
    lab = controller.lab
    cut = controller.red_link("host1", "host3")
    warm = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
        src="host1-vf0", dst="host3-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
    assert warm.received == 20
    hit = await asyncio.to_thread(stream, lab, "host1", "host3", 2000, 5003)
    await asyncio.sleep(0.7)
    # Carrier stays up: only probes (BFD) can see this one.
    await asyncio.to_thread(faults.silent_drop, lab, controller.lab_link(cut))
    await asyncio.sleep(0.03)  # BFD's detection time, played by the test
    await controller.agents["host1"].flip("host3", "blue", "test: red path black-holed")
    report = await asyncio.to_thread(hit.wait)
    assert 0 < report.lost < 200 and report.lost_ranges_total == 1, report.lost_ranges


async def test_draining_a_link_in_use_moves_its_flows_without_losing_a_packet(
    controller: Controller,
) -> None:
    """Make-before-break: the drained link still works, so a flow on it must move off it
    (the new routes installed destination outward, each stage after the agents applied the
    one before) without a single loss."""
    lab, store = controller.lab, controller.store
    used = controller.red_link("host1", "host3")
    warm = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
        src="host1-vf0", dst="host3-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
    assert warm.received == 20
    flow = await asyncio.to_thread(stream, lab, "host1", "host3", 3000, 5004)
    await asyncio.sleep(1.0)
    fabric = await store.load()
    revision = await store.commit(
        fabric.drain_link(used), expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id, actor="test", action="link.drain",
        target=str(used), detail={},
    )  # fmt: skip
    await controller.service.on_topology(
        TopologyChanged(revision=revision, at=datetime.now(UTC), actor="test", changes=[])
    )
    await controller.settled()
    assert controller.service.plan is not None
    red = controller.service.plan.pair("host1", "host3").red
    assert red is not None and used not in red.links
    report = await asyncio.to_thread(flow.wait)
    assert report.lost == 0, report.lost_ranges
