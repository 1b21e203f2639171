"""Draining a spine on an emulated fabric (fabric lane, root): the flows crossing it move off
make-before-break without losing a packet, the drain status turns to "carries no traffic"
only once the agents installed the paths that avoid it, and from then on the spine's ports
really forward nothing (their kernel counters stay flat while the flow goes on).

The lab is `leaf_spine(2, 3, 2)` under pathcomp and one programmer agent per node
(`fabric_controller.py`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from datetime import UTC, datetime

from fabric_controller import Controller, controller, stream

from thorn.events import TopologyChanged
from thorn_lab import traffic
from thorn_pathcomp.drains import DrainReport

__all__ = ["controller"]  # the fixture, used by name


def port_counters(namespace: str) -> dict[str, tuple[int, int]]:
    """(rx, tx) packets of every interface but lo in a namespace, from the kernel."""
    out = subprocess.run(
        ["ip", "-n", namespace, "-s", "-j", "link", "show"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {
        link["ifname"]: (link["stats64"]["rx"]["packets"], link["stats64"]["tx"]["packets"])
        for link in json.loads(out)
        if link["ifname"] != "lo"
    }


def forwarded(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    return sum(after[p][1] - before[p][1] for p in after)


async def test_draining_a_spine_under_traffic_loses_nothing_and_empties_the_spine(
    controller: Controller,
) -> None:
    c, lab, store = controller, controller.lab, controller.store
    assert c.service.plan is not None
    red = c.service.plan.pair("host1", "host3").red
    assert red is not None
    spine = red.nodes[2]  # host1, leaf1, <spine>, leaf2, host3
    spine_ns = lab.namespaces()[spine]
    warm = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
        src="host1-vf0", dst="host3-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
    assert warm.received == 20

    flow = await asyncio.to_thread(stream, lab, "host1", "host3", 6000, 5006)  # 6 s at 1000 pps
    await asyncio.sleep(0.8)
    sample = port_counters(spine_ns)
    await asyncio.sleep(0.2)
    assert forwarded(sample, port_counters(spine_ns)) >= 150, "the flow crosses the spine"
    before = await c.service.drain_report("node", spine)
    assert before.in_service and before.carries_traffic and sum(before.routes) > 0

    # The operator's drain, as the topology service commits and announces it.
    fabric = await store.load()
    revision = await store.commit(
        fabric.drain_node(spine), expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id, actor="test", action="node.drain", target=spine,
        detail={},
    )  # fmt: skip
    replan = asyncio.create_task(c.service.on_topology(
        TopologyChanged(revision=revision, at=datetime.now(UTC), actor="test", changes=[])
    ))  # fmt: skip
    seen: list[DrainReport] = []
    deadline = time.monotonic() + 20
    while True:
        report = await c.service.drain_report("node", spine)
        seen.append(report)
        if not report.carries_traffic:
            break
        assert time.monotonic() < deadline, report
        await asyncio.sleep(0.01)
    await replan
    assert seen[0].carries_traffic  # it was not empty the moment it was drained
    assert report.admin_state == "drained" and report.routes == (0, 0)
    assert report.agents_pending == () and report.agents_silent == ()
    # The answer is true: every agent has installed the paths around the spine...
    for node, agent in c.agents.items():
        assert agent.status.key_revision >= c.service.written.get(node, 0), node

    # ...and the spine forwards nothing more while the flow goes on (>= 2 s of it left).
    empty = port_counters(spine_ns)
    await asyncio.sleep(1.0)
    assert forwarded(empty, port_counters(spine_ns)) == 0, (empty, port_counters(spine_ns))

    report_flow = await asyncio.to_thread(flow.wait)
    assert report_flow.sent == 6000
    assert report_flow.lost == 0, report_flow.lost_ranges  # make-before-break: not one lost
