"""Detection end to end on an emulated fabric: nothing is played by the test any more.

The real services run in this process on a nats-server of the test's own
(tests/support/fabric_system.py): health and pathcomp (their apps, with their elections),
and the programmer serving every node of a `leaf_spine(2, 3, 2)` lab, each agent with its
link monitor, its reports and its BFD sessions (single-hop on every routed link, multihop
toward every peer host per colour).
The test only breaks the lab and watches:

- a carrier loss reaches health as the switch agent's report, health publishes the link
  down, pathcomp replans, and the flow across it comes back; the failure is in the history
  with its detection latency, and closed once the link returns;
- a silent drop (carrier up) is seen by BFD: the source host's multihop session on the red
  colour goes down and its agent flips the peer to blue on its own, and health marks the
  link down from the single-hop session;
- health restarts and rebuilds its state from the store and the agents' snapshots without
  publishing a single false "down".

BFD runs at 50 ms x 3 here (about 90 sessions in one process on two shared cores); the
10 ms timers are proven by the BFD runtime's own tests, the FRR interop and the benchmarks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import pytest
from fabric_system import BFD_MS, BFD_MULT, System, flow_on_red, nats, nats_server, system
from fixed_tokens import fixed_token

from thorn.auth import hash_token
from thorn.events import FailoverEvent
from thorn.model import TokenRole
from thorn.store.health import FailureQuery
from thorn_health.app import create_app as health_app
from thorn_lab import faults
from thorn_programmer.app import create_app as programmer_app

__all__ = ["nats", "nats_server", "system"]  # the fixtures, used by name
VIEWER = fixed_token("e2e-viewer")


async def test_carrier_loss_is_detected_replanned_recorded_and_closed(system: System) -> None:
    f = system
    cut, flow = await flow_on_red(f, 5101)
    t0 = time.time_ns()
    await asyncio.to_thread(faults.carrier_loss, f.lab, f.lab_link(cut))
    down = await f.until(lambda: f.link_events(cut, "down", t0), 5, "health: link down")
    print(f"\ncarrier cut -> health.link.{cut} down: {(down[0] - t0) / 1e6:.1f} ms")
    report = await asyncio.to_thread(flow.wait)
    # The switches' kernels move to the routes' backups by themselves (docs/datapath.md,
    # "Switch-local repair"): the cut may cost no packet at all, and never a second gap.
    print(f"carrier cut -> {report.lost} packets lost")
    assert report.lost < report.sent // 2 and report.lost_ranges_total <= 1, report.lost_ranges

    failures = await _failures(f, cut)
    assert failures and failures[0].source_kind == "carrier" and failures[0].ended_at is None
    assert failures[0].detection_latency_ms is not None

    t1 = time.time_ns()
    await asyncio.to_thread(faults.restore, f.lab)
    await f.until(lambda: f.link_events(cut, "up", t1), 10, "health: link up again")
    closed = await _failures(f, cut, closed=True)
    assert closed and closed[0].end_source is not None


async def _failures(f: System, link_id: int, *, closed: bool = False) -> list[Any]:
    for _ in range(100):  # the history is written just after the publish
        _, rows = await f.store.failures(FailureQuery(link_id=link_id, open=not closed))
        if rows:
            return rows
        await asyncio.sleep(0.05)
    return []


@pytest.mark.parametrize("system", ["peers"], indirect=True)
async def test_a_failure_only_the_source_can_see_is_repaired_by_its_own_flip(
    system: System,
) -> None:
    """A silent drop (carrier up) with BFD on peer paths only: no switch can tell health, so
    nothing central happens; the source host's multihop session on red goes down and its
    agent moves the peer to blue on its own."""
    f = system
    cut, flow = await flow_on_red(f, 5102)
    t0 = time.time_ns()
    await asyncio.to_thread(faults.silent_drop, f.lab, f.lab_link(cut))

    def flipped() -> list[tuple[int, FailoverEvent]]:
        return [(at, e) for at, e in f.failovers if at >= t0 and e.node == "host1"
                and "host3" in e.peers]  # fmt: skip

    (at, event), *_ = await f.until(flipped, 5, "host1 flips host3 to blue")
    print(f"\nsilent drop -> local flip {(at - t0) / 1e6:.1f} ms ({event.reason})")
    assert (event.from_colour, event.to_colour) == ("red", "blue")
    assert event.reason.startswith("bfd red to host3 down")
    report = await asyncio.to_thread(flow.wait)
    assert 0 < report.lost < report.sent // 2 and report.lost_ranges_total == 1, report.lost_ranges
    assert f.link_events(cut, "down", t0) == []  # health never knew: the flip alone saved it


@pytest.mark.parametrize("system", ["links"], indirect=True)
async def test_a_silent_drop_is_seen_by_link_bfd_and_flipped_centrally(
    system: System,
) -> None:
    f = system
    cut, flow = await flow_on_red(f, 5103)
    t0 = time.time_ns()
    await asyncio.to_thread(faults.silent_drop, f.lab, f.lab_link(cut))
    down = await f.until(lambda: f.link_events(cut, "down", t0), 5, "health: link down (BFD)")
    source = next(e.source for a, e in f.health if a == down[0] and e.link_id == cut)
    print(f"\nsilent drop -> health.link.{cut} down {(down[0] - t0) / 1e6:.1f} ms ({source})")
    assert source.startswith("bfd:")
    report = await asyncio.to_thread(flow.wait)
    assert 0 < report.lost < report.sent // 2 and report.lost_ranges_total == 1, report.lost_ranges
    moved = [e for at, e in f.failovers if at >= t0 and e.tier in ("source", "central")]
    # No peer sessions, so no source-local flip: what moved host1 was pathcomp's urgent flip,
    # carrying the trace that began with the link BFD's detection. (The switches at the
    # link's ends moved their own routes to their backups too: tier "switch".)
    assert moved and {e.tier for e in moved} == {"central"}
    assert any(e.node == "host1" and e.trace and e.trace.hops[0].step == "detected" for e in moved)


async def test_health_restarts_without_a_false_down(system: System) -> None:
    f = system
    await asyncio.sleep(1.5)  # every agent's snapshot has been through health once
    await f.stop("health")
    t0 = time.time_ns()
    await f.start("health", health_app(f.settings, store=f.store, bus=f.bus))
    await asyncio.sleep(3 * f.settings.report_seconds + 1.0)  # snapshots from every agent
    # Nothing changed in the fabric, so nothing is published: not a "down", not even an "up".
    published = [(e.link_id, e.state, e.source) for at, e in f.health if at >= t0]
    assert published == []


async def test_a_flap_storm_on_a_real_link_is_dampened_not_passed_on(system: System) -> None:
    """30 carrier flaps in about a second: health publishes a few changes, then `flapping`
    (out of service until the penalty decays), and nothing more while the storm goes on,
    so pathcomp replans a few times, not sixty."""
    f = system
    link = f.red_link("host1", "host3")
    end = f.lab_link(link)
    t0 = time.time_ns()
    for _ in range(30):
        await asyncio.to_thread(faults.carrier_loss, f.lab, end)
        await asyncio.sleep(0.01)
        await asyncio.to_thread(faults.restore, f.lab)
        await asyncio.sleep(0.02)
    await f.until(lambda: f.link_events(link, "flapping", t0), 5, "health: link flapping")
    await asyncio.sleep(1.0)  # anything still in flight arrives
    states = [e.state for at, e in f.health if at >= t0 and e.link_id == link]
    # e.g. down, up, down (the penalty, decaying, is just under suppress_at after two flaps),
    # degraded (the flaps cost packets), flapping; undampened it would be 60 changes.
    assert states[-1] == "flapping" and len(states) <= 6, states
    assert len([e for at, e in f.health if at >= t0 and e.link_id != link]) == 0


async def test_a_whole_spine_failing_costs_the_flow_at_most_one_short_gap_and_one_replan(
    system: System,
) -> None:
    """Every neighbour of the dead spine loses carrier at once: the leaves' kernels move to
    the routes' backups by themselves, pathcomp flips whatever still crosses it, and the
    spine's link events are re-protected together, not one replan per link."""
    f = system
    cut, flow = await flow_on_red(f, 5107)
    link = f.fabric.links[cut]
    spine = link.b.node if link.b.node.startswith("spine") else link.a.node
    revision = f.pathcomp.revision
    t0 = time.time_ns()
    await asyncio.to_thread(faults.node_down, f.lab, spine)
    spine_links = [i for i, lk in f.fabric.links.items() if spine in (lk.a.node, lk.b.node)]
    await f.until(lambda: all(f.link_events(i, "down", t0) for i in spine_links), 5,
                  f"health: every link of {spine} down")  # fmt: skip
    report = await asyncio.to_thread(flow.wait)
    print(f"\n{spine} down -> {report.lost} packets lost, gaps {report.lost_ranges}")
    assert report.lost <= 100 and report.lost_ranges_total <= 1, report.lost_ranges
    await f.pathcomp.replanned()
    replans = f.pathcomp.revision - revision
    assert 1 <= replans < len(spine_links), f"{replans} replans for {len(spine_links)} links"
    plan = f.pathcomp.plan
    assert plan is not None
    red = plan.pair("host1", "host3").red
    assert red is not None and spine not in red.nodes


async def test_a_dead_bfd_child_makes_healthz_say_so_and_comes_back_with_its_sessions(
    system: System,
) -> None:
    f = system
    app = f.apps["programmer"][0]
    bfd = app.state.bfd
    before = len(bfd.sessions())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://programmer") as http:
        assert (await http.get("/healthz")).status_code == 200
        os.kill(bfd.process._process.pid, signal.SIGKILL)
        await f.until(lambda: not bfd.process.alive, 5, "the child is seen gone")
        # A new child takes a Python start-up (~1 s) before it replaces the dead one.
        sick = await http.get("/healthz")
        assert sick.status_code == 503 and "BFD child" in sick.json()["problems"][0]
        await f.until(lambda: bfd.restarts == 1 and bfd.process.alive, 10, "a new child")
        assert (await http.get("/healthz")).status_code == 200

    def all_up_again() -> bool:
        sessions = bfd.sessions()
        return len(sessions) == before and all(s.state.name == "UP" for s in sessions)

    try:
        await f.until(all_up_again, 30, "every session re-added and up")
    except AssertionError as exc:
        states = sorted((s.netns, s.peer, s.state.name) for s in bfd.sessions())
        raise AssertionError(f"{exc}: {len(states)}/{before}: {states}") from None


async def test_a_programmer_restart_under_traffic_loses_nothing_and_changes_nothing(
    system: System,
) -> None:
    """The agents go away and come back while a flow runs: the kernel keeps forwarding, and
    the restarted agents' first reconcile finds nothing to change on any node."""
    f = system
    _, flow = await flow_on_red(f, 5108)
    await f.stop("programmer")
    await f.start("programmer", programmer_app(f.settings, bus=f.bus))
    agents = f.apps["programmer"][0].state.agents
    await f.until(lambda: all(a.status.reconciles >= 1 for a in agents), 20,
                  "every restarted agent reconciled")  # fmt: skip
    changed = {a.node: a.status.last_changes for a in agents if a.status.last_changes}
    assert changed == {}
    report = await asyncio.to_thread(flow.wait)
    assert report.lost == 0, report.lost_ranges


async def test_health_shows_each_bfd_session_with_the_timers_it_negotiated(
    system: System,
) -> None:
    """Sessions come up at slow start's 1 s (RFC 5880 6.8.3) and settle on the configured
    50 ms x 3: health's session list shows the settled timers, as the agents restate them."""
    f = system
    await f.store.put_token("e2e-viewer", TokenRole.viewer, hash_token(VIEWER), "test")
    auth = {"Authorization": f"Bearer {VIEWER}"}
    app = f.apps["health"][0]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://health") as client:
        found: list[dict[str, Any]] = []

        async def settled() -> bool:
            answer = await client.get("/api/v1/health/sessions", params={"multihop": "false",
                                      "limit": 1000}, headers=auth)  # fmt: skip
            found[:] = answer.json()["items"]
            return bool(found) and all(
                s["state"] == "up" and s["tx_interval_ms"] == BFD_MS
                and s["detect_time_ms"] == BFD_MS * BFD_MULT for s in found
            )  # fmt: skip

        deadline = time.monotonic() + 20
        while not await settled():
            assert time.monotonic() < deadline, found[:3]
            await asyncio.sleep(0.2)
