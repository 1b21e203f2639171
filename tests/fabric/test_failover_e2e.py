"""End to end on an emulated fabric: pathcomp plans, agents program every lab node from
JetStream KV, workloads talk through THORN's tunnels, and a link cut is survived.

The lab is `leaf_spine(2, 3, 2)`: host1 and host2 on leaf1, host3 and host4 on leaf2,
host5 and host6 on leaf3, two spines. Nothing here detects failures (that is the
health service's job, tested end to end in test_detection_e2e.py): the test plays the
detector, by telling pathcomp the link is down (the central path: urgent flips, then
re-protection) or by asking the source agent to flip (the local fast failover).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fabric_controller import Controller, controller, stream

from thorn.events import (
    LinkHealthChanged,
    TopologyChanged,
)
from thorn_lab import faults, traffic

__all__ = ["controller"]  # the fixture, used by name


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


async def test_a_cut_link_costs_the_hit_flow_at_most_a_short_gap_and_others_nothing(
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
    # The hit flow lost at most one short run: the switch's backup route (the kernel drops
    # the dead route at once) and pathcomp's urgent flip to blue, before any re-protection.
    assert hit_report.lost <= 20 and hit_report.lost_ranges_total <= 1, hit_report.lost_ranges
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
