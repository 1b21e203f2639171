"""Headless (issue 10): the controller dies under traffic, and the data plane does not notice.

health and pathcomp run as real processes, started the way `thorn-run` starts them
(`thorn_run.launcher`), and are killed with SIGKILL: no shutdown of any kind. The nats-server
is the module's own (`EmbeddedNats`), killed with SIGKILL too and started again on its port
with its JetStream store. The programmer serves every node of a `leaf_spine(2, 3, 2)` lab in
this process, with real BFD (tests/support/fabric_system.py), so that its kernel changes can
be counted: every reconcile's adds, replaces and deletes, on every node.

What each test states: the flows running across the kill and the return lose nothing; what
the switches and hosts repair on their own (a leaf's backup route, a host's flip on its
multihop BFD) still repairs a failure while pathcomp is dead; and the return (health's
reload, pathcomp's resync as the new leader, everyone's reconnect to NATS) changes nothing
in any kernel. A fresh lab and system for each test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fabric_controller import stream
from fabric_system import System, flows, outside_gap, running_system, warm

from thorn.config import Settings
from thorn.generators import leaf_spine
from thorn.natsd import EmbeddedNats, free_port
from thorn_lab import faults
from thorn_lab.handle import Lab
from thorn_pathcomp.plan import Plan
from thorn_run import launcher

ADMIN_GAP_MS, SILENT_GAP_MS = 500, 750  # as in test_failover_scenarios.py
START_S = 60.0


class Services:
    """health and pathcomp as `thorn-run` runs them: one process each, logs in a folder."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: dict[str, launcher.Child] = {}

    async def start(self, settings: Settings) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("THORN_")}
        env |= {"THORN_NATS_URL": settings.nats_url, "THORN_DATA_DIR": str(settings.data_dir),
                "THORN_LOG_FORMAT": "json", "THORN_LEASE_SECONDS": str(settings.lease_seconds),
                "THORN_STAGE_ACK_SECONDS": str(settings.stage_ack_seconds)}  # fmt: skip
        for name in ("health", "pathcomp"):
            self.children[name] = launcher._spawn(name, free_port(), env, self.logs)
        for child in self.children.values():
            await asyncio.to_thread(launcher._wait_ready, child, time.monotonic() + START_S)
        await self.logged("health", "health_active", 1)
        await self.logged("pathcomp", "resynced_as_leader", 1)

    def kill(self, name: str) -> None:
        process = self.children[name].process
        process.send_signal(signal.SIGKILL)
        process.wait()

    async def start_again(self, name: str, then: str) -> dict[str, Any]:
        """Start a killed service again (same port and settings) and return the log record
        of `then` (an event it logs once it is back at work)."""
        seen = len(self.records(name, then))
        child = self.children[name]
        child.respawn()
        await asyncio.to_thread(launcher._wait_ready, child, time.monotonic() + START_S)
        return await self.logged(name, then, seen + 1)

    def records(self, name: str, event: str) -> list[dict[str, Any]]:
        lines = self.children[name].log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if f'"{event}"' in line]

    async def logged(self, name: str, event: str, count: int) -> dict[str, Any]:
        deadline = time.monotonic() + START_S
        while len(found := self.records(name, event)) < count:
            assert time.monotonic() < deadline, f"{name} never logged {event}"
            await asyncio.sleep(0.1)
        return found[count - 1]

    def stop(self) -> None:
        launcher._stop(list(self.children.values()))


Headless = tuple[System, Services, EmbeddedNats]


@pytest.fixture
async def system(make_lab: Callable[..., Lab], tmp_path: Path) -> AsyncIterator[Headless]:
    """A fresh system per test: a flip made while pathcomp is away is never reverted (the
    defect test_dual_homed.py's last test shows), so a shared one would not start clean."""
    doc = leaf_spine(2, 3, 2)
    lab = await asyncio.to_thread(make_lab, doc)
    services = Services(tmp_path)
    server = await EmbeddedNats(store_dir=tmp_path / "nats").astart()
    try:
        async with running_system(lab, doc, server.url, tmp_path, elsewhere=services.start) as f:
            f.offline_plan = Plan.compute(f.fabric, summarise=False)  # what pathcomp computes
            yield f, services, server
            for name, child in services.children.items():
                assert child.process.poll() is None, f"{name} left dead"
    finally:
        services.stop()
        await server.astop()


async def _flows(f: System, count: int, port: int) -> list[Any]:
    return await flows(f.lab, [("host1", "host3"), ("host3", "host1"), ("host2", "host5")],
                       count, port)  # fmt: skip


async def _all_delivered(streams: list[Any]) -> None:
    reports = [await asyncio.to_thread(s.wait) for s in streams]
    assert [r.lost for r in reports] == [0] * len(reports), [r.lost_ranges for r in reports]


async def test_health_killed_under_traffic_costs_nothing_and_its_return_changes_nothing(
    system: Headless,
) -> None:
    """Killed, health answers no report for 1.5 s (the agents keep them for later); back,
    it reloads its links from the store and the agents' snapshots and publishes nothing."""
    f, services, _ = system
    running = await _flows(f, 5000, 5401)
    await asyncio.sleep(1.0)
    before, t0 = f.kernel_changes(), time.time_ns()
    services.kill("health")
    await asyncio.sleep(1.5)
    await services.start_again("health", "health_active")
    await asyncio.sleep(2 * f.settings.report_seconds + 0.5)  # every agent's snapshot, twice
    await _all_delivered(running)
    assert f.kernel_changes() == before
    assert [(e.link_id, e.state, e.source) for at, e in f.health if at >= t0] == []


async def test_nats_killed_under_traffic_costs_nothing_and_the_controller_works_after(
    system: Headless,
) -> None:
    """The nats-server dies for 1.5 s: nobody can talk to anybody, nothing is forwarded
    differently. Back on its port with its store, everyone reconnects (no kernel change);
    then a cut the switches cannot repair (spine1 -> leaf3, on host2 -> host5's red path)
    is still reported, flipped centrally and re-protected, and the agents apply it."""
    f, _, server = system
    running = await _flows(f, 5000, 5411)
    await asyncio.sleep(1.0)
    before = f.kernel_changes()
    await asyncio.to_thread(server.kill)
    await asyncio.sleep(1.5)
    await server.astart()
    await f.until(lambda: f.bus.is_connected, 10, "the test's client reconnected")
    await _all_delivered(running)
    # Long enough for a lost lease to pass to a new term, whose leader stamps every document.
    await asyncio.sleep(f.settings.lease_seconds + 0.5)
    await f.applied()
    assert f.kernel_changes() == before

    link = f.red_path("host2", "host5")[2]
    await warm(f.lab, ("host2", "host5"))
    hit = await asyncio.to_thread(stream, f.lab, "host2", "host5", 3000, 5415)
    await asyncio.sleep(1.0)
    t0 = time.time_ns()
    await asyncio.to_thread(faults.carrier_loss, f.lab, f.lab_link(link))
    await f.until(lambda: f.link_events(link, "down", t0), 5, "health: link down")
    report = await asyncio.to_thread(hit.wait)
    assert report.max_gap_ms <= ADMIN_GAP_MS, (report.lost_ranges, f.timeline(t0))
    assert outside_gap(report) == 0, (report.lost_ranges, f.timeline(t0))
    assert any(e.tier == "central" for e in f.moves("host2", "host5", t0)), f.timeline(t0)
    await f.applied()  # the agents' KV watches follow re-protection's documents


async def _pathcomp_away_then_back(
    f: System,
    services: Services,
    cut: Callable[[Lab, str], object],
    pair: tuple[str, str],
    where: int,
    gap_ms: int,
) -> list[Any]:
    """With pathcomp dead, `cut` the red path of `pair` at link `where` under a flow;
    restore it; the flips it caused revert on their own; then start pathcomp again under
    traffic, which changes no kernel. Returns the pair's failovers."""
    src, dst = pair
    link = f.red_path(src, dst)[where]
    await warm(f.lab, pair)
    hit = await asyncio.to_thread(stream, f.lab, src, dst, 3000, 5421 + where)
    await asyncio.sleep(0.5)
    services.kill("pathcomp")
    await asyncio.sleep(0.5)
    t0 = time.time_ns()
    await asyncio.to_thread(cut, f.lab, f.lab_link(link))
    await f.until(lambda: f.link_events(link, "down", t0), 5, "health: link down")
    report = await asyncio.to_thread(hit.wait)
    print(f"\npathcomp dead, {f.lab_link(link)} cut: gap {report.max_gap_ms} ms")
    assert report.max_gap_ms <= gap_ms, (report.lost_ranges, f.timeline(t0))
    assert outside_gap(report) == 0, (report.lost_ranges, f.timeline(t0))
    moves = f.moves(src, dst, t0)

    t1 = time.time_ns()
    await asyncio.to_thread(faults.restore, f.lab)
    await f.until(lambda: f.link_events(link, "up", t1), 10, "health: link up again")
    await f.settled()
    await asyncio.sleep(1.0)  # health's writer has stored the link's state
    # The sources' own flips go back by themselves once their red sessions are Up again
    # (after the hold-down), pathcomp or not: only then is the kernel as pathcomp left it.
    await f.until(lambda: not f.overridden(), 15, "every flip reverted without pathcomp")
    running = await _flows(f, 5000, 5431 + where)
    await asyncio.sleep(0.5)
    before = f.kernel_changes()
    resync = await services.start_again("pathcomp", "resynced_as_leader")
    await asyncio.sleep(1.0)
    await f.applied()  # a new leader stamps every document with its term: agents reconcile
    print(f"pathcomp back: {resync['documents']} documents rewritten as leader")
    await _all_delivered(running)
    assert f.kernel_changes() == before
    return moves


async def test_with_pathcomp_dead_a_silent_drop_is_repaired_without_it(
    system: Headless,
) -> None:
    """spine1 -> leaf2 drops everything while pathcomp is dead. Two tiers race, neither
    needing the controller: spine1's link BFD goes down and spine1 withdraws its route down
    to leaf2, leaving it to its U-turn backup (tier 1); host1's multihop BFD toward host3 on
    red goes down and host1 flips host3 to blue itself (tier 2). No central flip; pathcomp's
    return changes no kernel."""
    f, services, _ = system
    moves = await _pathcomp_away_then_back(
        f, services, faults.silent_drop, ("host1", "host3"), 2, SILENT_GAP_MS
    )
    assert {e.tier for e in moves} <= {"source"}, [(e.tier, e.reason) for e in moves]


async def test_with_pathcomp_dead_a_spine_repairs_a_cut_of_its_last_hop_down_by_a_u_turn(
    system: Headless,
) -> None:
    """spine1's link down to leaf2 on host1 -> host3's red path loses carrier while
    pathcomp is dead. spine1 has no neighbour nearer to leaf2, but its kernel falls back to
    the route's U-turn backup at once: another leaf, whose own route would send the packet
    straight back up and whose U-turn rule sends it up to spine2 instead. host1 needs no
    flip at all; pathcomp's return changes no kernel."""
    f, services, _ = system
    moves = await _pathcomp_away_then_back(
        f, services, faults.carrier_loss, ("host1", "host3"), 2, ADMIN_GAP_MS
    )
    assert moves == [], [(e.tier, e.reason) for e in moves]


async def test_with_pathcomp_dead_a_leaf_repairs_a_cut_uplink_on_its_own(
    system: Headless,
) -> None:
    """leaf1's uplink on host1 -> host3's red path loses carrier while pathcomp is dead:
    leaf1's kernel moves to its backup route (tier 1) before any BFD could tell, and no
    flip is needed for that direction. pathcomp's return changes no kernel."""
    f, services, _ = system
    moves = await _pathcomp_away_then_back(
        f, services, faults.carrier_loss, ("host1", "host3"), 1, ADMIN_GAP_MS
    )
    assert [e for e in moves if e.tier == "central"] == []  # nobody there to flip
