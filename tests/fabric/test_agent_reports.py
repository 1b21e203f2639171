"""An agent's reports to health, over real NATS, from a lab's real carrier changes.

A stand-in for health answers `agent.report.<node>` requests the way health does
(`AgentReportReply`) and keeps what it received, so these tests look at exactly what an
agent tells health: a snapshot first, each carrier change in order and at once, and nothing
lost while health is away.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from thorn.bus import Bus
from thorn.events import AgentReport, AgentReportReply, CarrierReport, CountersReport
from thorn_lab import faults
from thorn_lab.handle import Lab
from thorn_programmer.reports import Reporter

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="needs root for network namespaces",
)


class StandInHealth:
    """Answers reports like health and keeps them, with their arrival time (time.time_ns)."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, AgentReport]] = []
        self.sub: Subscription | None = None
        self.arrived = asyncio.Event()

    async def start(self, bus: Bus, node: str) -> None:
        async def answer(msg: Msg) -> None:
            at = time.time_ns()
            report = AgentReport.model_validate_json(msg.data)
            self.reports.append((at, report))
            self.arrived.set()
            reply = AgentReportReply(ok=True, applied=len(report.items))
            await msg.respond(reply.model_dump_json().encode())

        self.sub = await bus.nc.subscribe(f"agent.report.{node}", cb=answer)

    async def stop(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()
            self.sub = None

    def carriers(self, port: str) -> list[tuple[int, CarrierReport]]:
        return [
            (at, item)
            for at, report in self.reports
            for item in report.items
            if isinstance(item, CarrierReport) and item.port == port
        ]

    async def wait_for(self, seen: Callable[[], bool], within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            while not seen():
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    async with await Bus.connect(nats_url, name="test-reports") as connected:
        yield connected


@pytest.fixture
def lab(shared_lab: Lab) -> Lab:
    return shared_lab


@pytest.fixture
async def running(lab: Lab, bus: Bus) -> AsyncIterator[tuple[Reporter, StandInHealth]]:
    health = StandInHealth()
    await health.start(bus, "leaf1")
    reporter = Reporter("leaf1", bus, lab.namespace("leaf1"), period=60.0)
    task = asyncio.create_task(reporter.run())
    try:
        await health.wait_for(lambda: bool(health.reports))
        yield reporter, health
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await health.stop()
        await asyncio.to_thread(faults.restore, lab)


def _uplink(lab: Lab) -> tuple[str, str]:
    """leaf1's interface toward spine1, and that end as `node:port` (for faults)."""
    ends = lab.link("leaf1--spine1")
    return ends.near.ifname, f"{ends.near.node}:{ends.near.port}"


async def test_the_first_report_is_a_snapshot_of_every_fabric_port(
    lab: Lab, running: tuple[Reporter, StandInHealth]
) -> None:
    _, health = running
    first = health.reports[0][1]
    ports = {p.name for n in lab.fabric.nodes if n.name == "leaf1" for p in n.ports}
    carried = {i.port for i in first.items if isinstance(i, CarrierReport)}
    counted = {i.port for i in first.items if isinstance(i, CountersReport)}
    assert ports <= carried and ports <= counted
    assert "lo" not in carried
    assert first.node == "leaf1" and first.seq == 0
    assert all(i.carrier for i in first.items if isinstance(i, CarrierReport) and i.port in ports)


async def test_carrier_loss_at_the_far_end_is_reported_at_once_then_its_return(
    lab: Lab, running: tuple[Reporter, StandInHealth]
) -> None:
    _, health = running
    port, near_end = _uplink(lab)
    cut_ns = time.time_ns()
    await asyncio.to_thread(faults.carrier_loss, lab, near_end)
    await health.wait_for(lambda: any(not i.carrier for _, i in health.carriers(port)))
    arrived, lost = next((at, i) for at, i in health.carriers(port) if not i.carrier)
    print(
        f"\ncut -> kernel event {(lost.detected_at.timestamp() * 1e9 - cut_ns) / 1e6:.2f} ms,"
        f" -> health {(arrived - cut_ns) / 1e6:.2f} ms"
    )
    assert lost.detected_at.timestamp() * 1e9 >= cut_ns - 1e6
    await asyncio.to_thread(faults.restore, lab)
    await health.wait_for(lambda: health.carriers(port)[-1][1].carrier)
    states = [i.carrier for _, i in health.carriers(port)]
    assert states[-2:] == [False, True]
    seqs = [r.seq for _, r in health.reports]
    assert seqs == list(range(len(seqs)))


async def test_changes_made_while_health_is_away_arrive_in_order_when_it_returns(
    lab: Lab, bus: Bus, running: tuple[Reporter, StandInHealth]
) -> None:
    reporter, health = running
    port, near_end = _uplink(lab)
    await health.stop()
    for _ in range(3):
        await asyncio.to_thread(faults.carrier_loss, lab, near_end)
        await _until(lambda: not _carrier(lab, port))
        await asyncio.to_thread(faults.restore, lab)
        await _until(lambda: _carrier(lab, port))
    # Kept, not lost: the agent sees each flap (a loaded machine may take a moment).
    await _until(lambda: len(reporter.queue) >= 6)
    before = len(health.reports)
    await health.start(bus, "leaf1")
    await health.wait_for(lambda: sum(1 for _ in health.carriers(port)) >= 7, within=15)
    after = [i.carrier for at, r in health.reports[before:] for i in r.items
             if isinstance(i, CarrierReport) and i.port == port]  # fmt: skip
    assert after[:6] == [False, True] * 3


def _carrier(lab: Lab, port: str) -> bool:
    with lab.rtnl("leaf1") as rtnl:
        return rtnl.links()[port].carrier


async def _until(check: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise TimeoutError("the lab did not reach the state in time")
        await asyncio.sleep(0.01)
