"""Detection end to end on an emulated fabric: nothing is played by the test any more.

The real services run in this process on a nats-server of the module's own: health and
pathcomp (their apps, with their elections), and the programmer serving every node of a
`leaf_spine(2, 3, 2)` lab, each agent with its link monitor, its reports and its BFD
sessions (single-hop on every routed link, multihop toward every peer host per colour).
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
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from fabric_controller import stream
from fastapi import FastAPI

from thorn.bus import Bus
from thorn.config import Settings
from thorn.desired import node_key
from thorn.events import (
    FAILOVER_ALL,
    HEALTH_LINK_ALL,
    FailoverEvent,
    LinkHealthChanged,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.lab import faults, traffic
from thorn.lab.handle import Lab
from thorn.natsd import EmbeddedNats
from thorn.store import Store
from thorn.store.health import FailureQuery
from thorn.store.store import sqlite_url
from thorn_health.app import create_app as health_app
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_pathcomp.service import PathService
from thorn_programmer.app import create_app as programmer_app
from thorn_programmer.detect import wanted_sessions

BFD_MS, BFD_MULT = 50, 3


class Fabric_:
    """The running system and what it published, with the receive time of each event."""

    def __init__(self, lab: Lab, store: Store, bus: Bus, settings: Settings) -> None:
        self.lab, self.store, self.bus, self.settings = lab, store, bus, settings
        self.health: list[tuple[int, LinkHealthChanged]] = []
        self.failovers: list[tuple[int, FailoverEvent]] = []
        self.apps: dict[str, tuple[FastAPI, AsyncExitStack]] = {}

    async def start(self, name: str, app: FastAPI) -> None:
        stack = AsyncExitStack()
        await stack.enter_async_context(app.router.lifespan_context(app))
        self.apps[name] = (app, stack)

    async def stop(self, name: str) -> None:
        _, stack = self.apps.pop(name)
        await stack.aclose()

    @property
    def pathcomp(self) -> PathService:
        service: PathService = self.apps["pathcomp"][0].state.pathcomp
        return service

    def red_link(self, src: str, dst: str) -> int:
        """The spine-side link of the red path src -> dst (a switch-to-switch link)."""
        plan = self.pathcomp.plan
        assert plan is not None
        red = plan.pair(src, dst).red
        assert red is not None
        return red.links[1]

    def lab_link(self, link_id: int) -> str:
        link = self.fabric.links[link_id]
        return f"{link.a.node}:{link.a.port}"

    fabric: Fabric

    async def until(self, check: Callable[[], Any], within: float, what: str) -> Any:
        deadline = time.monotonic() + within
        while not (found := check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {within} s: {what}")
            await asyncio.sleep(0.02)
        return found

    def link_events(self, link_id: int, state: str, after_ns: int = 0) -> list[int]:
        return [at for at, e in self.health
                if e.link_id == link_id and e.state == state and at >= after_ns]  # fmt: skip

    async def settled(self) -> None:
        """Every agent applied its node's latest document, and every BFD session is up."""
        service = self.pathcomp
        await self.until(lambda: service.plan is not None, 30, "a first plan")
        programmer = self.apps["programmer"][0]
        agents = {a.node: a for a in programmer.state.agents}
        kv = await self.bus.desired_state()
        for _ in range(600):
            revisions = {n: await kv.get(node_key(n)) for n in agents}
            if all(e is not None and agents[n].status.key_revision >= e.revision
                   for n, e in revisions.items()):  # fmt: skip
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("agents behind their desired state")

        def wanted() -> int:
            mode = self.settings.bfd_sessions
            return sum(len(wanted_sessions(a.applied, mode)) for a in agents.values())

        def bfd_up() -> bool:
            sessions = programmer.state.bfd.sessions()
            return len(sessions) == wanted() and all(s.state.name == "UP" for s in sessions)

        try:
            await self.until(bfd_up, 30, "every BFD session up")
        except AssertionError as exc:
            sessions = programmer.state.bfd.sessions()
            states = [(s.netns, s.peer, s.ifname, s.multihop, s.state.name)
                      for s in sessions if s.state.name != "UP"]  # fmt: skip
            raise AssertionError(f"{exc}: {len(sessions)}/{wanted()}: {states}") from None


@pytest.fixture
def nats() -> Iterator[str]:
    """A nats-server per test: no KV bucket, lease or stream of an earlier test is seen."""
    with tempfile.TemporaryDirectory() as store, EmbeddedNats(store_dir=Path(store)) as server:
        yield server.url


@pytest.fixture
async def system(
    make_lab: Callable[..., Lab], nats: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Fabric_]:
    """The whole system on a fresh lab; `indirect` parametrisation picks the BFD sessions."""
    doc = leaf_spine(2, 3, 2)
    lab = await asyncio.to_thread(make_lab, doc)
    settings = Settings(
        nats_url=nats, lab=lab.prefix, datapath="emulation", data_dir=tmp_path,
        bfd_sessions=getattr(request, "param", "all"), bfd_interval_ms=BFD_MS,
        bfd_multiplier=BFD_MULT,
        report_seconds=1.0, lease_seconds=3.0, stage_ack_seconds=2.0,
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        store = await Store.open(sqlite_url(tmp_path))
        stack.push_async_callback(store.close)
        await store.replace(Fabric.from_document(doc), expected_revision=0, actor="test",
                            detail={})  # fmt: skip
        bus = await stack.enter_async_context(await Bus.connect(nats, name="test-detect"))
        await bus.ensure_streams()
        f = Fabric_(lab, store, bus, settings)
        f.fabric = await store.load()

        async def on_health(event: LinkHealthChanged) -> None:
            f.health.append((time.time_ns(), event))

        async def on_failover(event: FailoverEvent) -> None:
            f.failovers.append((time.time_ns(), event))

        await bus.subscribe(HEALTH_LINK_ALL, on_health, model=LinkHealthChanged)
        await bus.subscribe(FAILOVER_ALL, on_failover, model=FailoverEvent)
        await f.start("health", health_app(settings, store=store, bus=bus))
        await f.start("pathcomp", pathcomp_app(settings, store=store, bus=bus))
        await f.start("programmer", programmer_app(settings, bus=bus))
        try:
            await f.settled()
            yield f
        finally:
            for name in ("programmer", "pathcomp", "health"):
                if name in f.apps:
                    await f.stop(name)
            await asyncio.to_thread(faults.restore, lab)


async def flow_on_red(f: Fabric_, port: int) -> tuple[int, traffic.Stream]:
    """A 3 s flow host1 -> host3 under way (ARP resolved first), and the switch-to-switch
    link its red path takes."""
    warm = await asyncio.to_thread(traffic.run, f.lab, traffic.StreamSpec(
        src="host1-vf0", dst="host3-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
    assert warm.received == 20
    flow = await asyncio.to_thread(stream, f.lab, "host1", "host3", 3000, port)
    await asyncio.sleep(1.0)
    return f.red_link("host1", "host3"), flow


async def test_carrier_loss_is_detected_replanned_recorded_and_closed(system: Fabric_) -> None:
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


async def _failures(f: Fabric_, link_id: int, *, closed: bool = False) -> list[Any]:
    for _ in range(100):  # the history is written just after the publish
        _, rows = await f.store.failures(FailureQuery(link_id=link_id, open=not closed))
        if rows:
            return rows
        await asyncio.sleep(0.05)
    return []


@pytest.mark.parametrize("system", ["peers"], indirect=True)
async def test_a_failure_only_the_source_can_see_is_repaired_by_its_own_flip(
    system: Fabric_,
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
    system: Fabric_,
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
    moved = [e for at, e in f.failovers if at >= t0]
    # No peer sessions, so no source-local flip: what moved host1 was pathcomp's urgent flip,
    # carrying the trace that began with the link BFD's detection.
    assert moved and {e.tier for e in moved} == {"central"}
    assert any(e.node == "host1" and e.trace and e.trace.hops[0].step == "detected" for e in moved)


async def test_health_restarts_without_a_false_down(system: Fabric_) -> None:
    f = system
    await asyncio.sleep(1.5)  # every agent's snapshot has been through health once
    await f.stop("health")
    t0 = time.time_ns()
    await f.start("health", health_app(f.settings, store=f.store, bus=f.bus))
    await asyncio.sleep(3 * f.settings.report_seconds + 1.0)  # snapshots from every agent
    # Nothing changed in the fabric, so nothing is published: not a "down", not even an "up".
    published = [(e.link_id, e.state, e.source) for at, e in f.health if at >= t0]
    assert published == []


async def test_a_flap_storm_on_a_real_link_is_dampened_not_passed_on(system: Fabric_) -> None:
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
    system: Fabric_,
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
    system: Fabric_,
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
    system: Fabric_,
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
