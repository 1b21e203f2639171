"""Staged writes wait only for agents that are alive, and only until they applied."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from thorn.events import DatapathApplied
from thorn_pathcomp.acks import AgentAcks


def applied(node: str, revision: int) -> DatapathApplied:
    return DatapathApplied(
        node=node, driver="test", key_revision=revision, plan_revision=1, changes=0,
        seconds=0.0, at=datetime.now(UTC),
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_nodes_whose_agents_never_reported_are_not_waited_for() -> None:
    acks = AgentAcks()
    assert await acks.wait({"leaf1": 5}, within=5) == []


async def test_a_live_agent_is_waited_for_until_it_applied_the_revision() -> None:
    acks = AgentAcks()
    await acks.on_applied(applied("leaf1", 3))
    waiting = asyncio.create_task(acks.wait({"leaf1": 5}, within=5))
    await asyncio.sleep(0.01)
    await acks.on_applied(applied("leaf1", 4))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await acks.on_applied(applied("leaf1", 5))
    assert await waiting == []


async def test_the_late_nodes_are_returned_after_the_timeout() -> None:
    acks = AgentAcks()
    await acks.on_applied(applied("leaf1", 1))
    await acks.on_applied(applied("leaf2", 1))
    await acks.on_applied(applied("leaf2", 7))
    assert await acks.wait({"leaf1": 7, "leaf2": 7}, within=0.05) == ["leaf1"]


async def test_an_agent_silent_for_longer_than_live_for_is_no_longer_waited_for() -> None:
    clock = Clock()
    acks = AgentAcks(live_for=60, clock=clock)
    await acks.on_applied(applied("leaf1", 1))
    assert acks.missing({"leaf1": 2}) == ["leaf1"]
    clock.now += 61
    assert acks.missing({"leaf1": 2}) == []


async def test_an_old_report_never_lowers_what_a_node_applied() -> None:
    acks = AgentAcks()
    await acks.on_applied(applied("leaf1", 9))
    await acks.on_applied(applied("leaf1", 4))  # reordered on the wire
    assert acks.applied["leaf1"] == 9


async def test_a_report_that_carries_errors_is_no_acknowledgement() -> None:
    acks = AgentAcks()
    await acks.on_applied(applied("leaf1", 1))
    failed = applied("leaf1", 5).model_copy(update={"errors": ["route 10.224.0.1/32: refused"]})
    await acks.on_applied(failed)
    assert acks.live("leaf1") and acks.missing({"leaf1": 5}) == ["leaf1"]


async def test_an_agent_repeating_its_last_report_stays_live_through_a_quiet_minute() -> None:
    """Agents repeat their last report (a heartbeat) while nothing changes: a plan made
    after a quiet minute still waits for them between stages."""
    clock = Clock()
    acks = AgentAcks(live_for=60, clock=clock)
    await acks.on_applied(applied("leaf1", 1))
    for _ in range(8):  # two minutes of heartbeats every 15 s
        clock.now += 15
        await acks.on_applied(applied("leaf1", 1))
    assert acks.missing({"leaf1": 2}) == ["leaf1"]


async def test_many_writes_waiting_at_once_each_end_when_its_own_nodes_applied() -> None:
    acks = AgentAcks()
    nodes = [f"leaf{n}" for n in range(50)]
    for node in nodes:
        await acks.on_applied(applied(node, 1))
    waits = {node: asyncio.create_task(acks.wait({node: 2}, within=5)) for node in nodes}
    both = asyncio.create_task(acks.wait({"leaf0": 3, "leaf1": 2}, within=5))
    await asyncio.sleep(0.01)
    for node in nodes[:25]:
        await acks.on_applied(applied(node, 2))
    await asyncio.sleep(0.01)
    assert all(waits[n].done() for n in nodes[:25])
    assert not any(waits[n].done() for n in nodes[25:])
    assert not both.done()  # leaf0 is at 2, not 3
    await acks.on_applied(applied("leaf0", 3))
    assert await both == []
    for node in nodes[25:]:
        await acks.on_applied(applied(node, 5))
    assert [await waits[n] for n in nodes] == [[]] * len(nodes)


async def test_a_report_with_errors_ends_no_wait_and_the_next_good_one_counts() -> None:
    acks = AgentAcks()
    await acks.on_applied(applied("leaf1", 1))
    waiting = asyncio.create_task(acks.wait({"leaf1": 2}, within=0.05))
    await asyncio.sleep(0.01)
    failed = applied("leaf1", 2).model_copy(update={"errors": ["route refused"]})
    await acks.on_applied(failed)
    assert await waiting == ["leaf1"]
    await acks.on_applied(applied("leaf1", 2))  # after the wait gave up: nobody to wake
    assert await acks.wait({"leaf1": 2}, within=0.05) == []
