"""The whole THORN system on an emulated fabric, for the fabric lane's end-to-end tests.

The real services run in the test's process on a nats-server of the test's own: health and
pathcomp (their apps, with their elections) and the programmer serving every node of a lab,
each agent with its link monitor, its reports and its BFD sessions (single-hop on every
routed link, multihop toward peer hosts per colour). A test only breaks the lab and watches
what the system published (`System.health`, `System.failovers`) and what traffic saw.

The `system` fixture runs it on a fresh `leaf_spine(2, 3, 2)` lab (host1 and host2 on leaf1,
host3 and host4 on leaf2, host5 and host6 on leaf3, two spines); `indirect` parametrisation
picks the BFD sessions (a string: `all`, `links`, `peers`) or overrides settings (a dict).
`running_system` starts the same on any lab (a module's shared one, say). Import the fixtures
into a test module by name; they need the fabric lane's `make_lab`.

BFD runs at 50 ms x 3 (about 90 sessions in one process on two shared cores); the 10 ms timers
are proven by the BFD runtime's own tests, the FRR interop and the benchmarks.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fabric_controller import stream
from fastapi import FastAPI

from thorn.bus import Bus
from thorn.config import Settings
from thorn.desired import node_key
from thorn.events import FAILOVER_ALL, HEALTH_LINK_ALL, FailoverEvent, LinkHealthChanged
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import FabricDocument
from thorn.natsd import EmbeddedNats
from thorn.store import Store
from thorn.store.store import sqlite_url
from thorn_health.app import create_app as health_app
from thorn_lab import faults, traffic
from thorn_lab.handle import Lab
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_pathcomp.plan import Plan
from thorn_pathcomp.service import PathService
from thorn_programmer.agent import KERNEL_CHANGES, NodeAgent
from thorn_programmer.app import create_app as programmer_app
from thorn_programmer.detect import wanted_sessions

__all__ = [
    "BFD_MS",
    "BFD_MULT",
    "System",
    "flap_storm",
    "flow_on_red",
    "flows",
    "nats",
    "nats_server",
    "outside_gap",
    "running_system",
    "system",
    "warm",
    "watch_colour",
]

BFD_MS, BFD_MULT = 50, 3


class System:
    """The running system and what it published, with the receive time of each event."""

    def __init__(self, lab: Lab, store: Store, bus: Bus, settings: Settings) -> None:
        self.lab, self.store, self.bus, self.settings = lab, store, bus, settings
        self.health: list[tuple[int, LinkHealthChanged]] = []
        self.failovers: list[tuple[int, FailoverEvent]] = []
        self.apps: dict[str, tuple[FastAPI, AsyncExitStack]] = {}

    fabric: Fabric

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

    @property
    def agents(self) -> dict[str, NodeAgent]:
        return {a.node: a for a in self.apps["programmer"][0].state.agents}

    offline_plan: Plan | None = None  # the plan, where pathcomp runs in a process of its own

    @property
    def plan(self) -> Plan:
        """The plan pathcomp serves (`offline_plan` where it is not in this process)."""
        plan = self.pathcomp.plan if "pathcomp" in self.apps else self.offline_plan
        assert plan is not None
        return plan

    def red_path(self, src: str, dst: str) -> list[int]:
        """The links of the red path src -> dst in the served plan, from src to dst."""
        plan = self.plan
        red = plan.pair(src, dst).red
        assert red is not None
        return list(red.links)

    def red_link(self, src: str, dst: str) -> int:
        """The sender leaf's uplink on the red path src -> dst (a switch-to-switch link)."""
        return self.red_path(src, dst)[1]

    def lab_link(self, link_id: int) -> str:
        """The link's a end as the lab names it (``node:port``; the leaf's end of a
        leaf-spine link of the generators)."""
        link = self.fabric.links[link_id]
        return f"{link.a.node}:{link.a.port}"

    def end_at(self, link_id: int, node: str) -> str:
        """The end of `link_id` on `node`, as ``node:port``."""
        link = self.fabric.links[link_id]
        end = link.a if link.a.node == node else link.b
        assert end.node == node, f"link {link_id} has no end on {node}"
        return f"{end.node}:{end.port}"

    def kernel_changes(self) -> dict[str, int]:
        """Kernel objects each agent's reconciles have added, replaced or deleted so far."""
        counts = dict.fromkeys(self.agents, 0)
        for metric in KERNEL_CHANGES.collect():
            for sample in metric.samples:
                node = sample.labels.get("node")
                if sample.name.endswith("_total") and node in counts:
                    counts[node] += int(sample.value)
        return counts

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

    async def went(self, link_id: int, state: str, after_ns: int, within: float = 5) -> str:
        """Wait for health to publish `state` for the link (since `after_ns`); its source."""
        at = (await self.until(lambda: self.link_events(link_id, state, after_ns), within,
                               f"health: link {link_id} {state}"))[0]  # fmt: skip
        return next(e.source for t, e in self.health if t == at and e.link_id == link_id)

    def states_of(self, link_id: int, after_ns: int = 0) -> list[str]:
        """The states health published for `link_id` since `after_ns`, in order."""
        return [e.state for at, e in self.health if e.link_id == link_id and at >= after_ns]

    def timeline(self, t0_ns: int) -> str:
        """What health and the agents published since `t0_ns`, ms after it (for messages)."""
        lines = [f"{(at - t0_ns) / 1e6:8.1f} ms health link {e.link_id} {e.state} ({e.source})"
                 for at, e in self.health if at >= t0_ns]  # fmt: skip
        lines += [f"{(at - t0_ns) / 1e6:8.1f} ms {e.node} {e.tier} -> {e.to_colour} "
                  f"{e.peers[:4]} ({e.reason})"
                  for at, e in self.failovers if at >= t0_ns]  # fmt: skip
        return "\n".join(sorted(lines, key=lambda line: float(line.split()[0])))

    def overridden(self) -> dict[str, dict[str, str]]:
        """Per host agent, the peers it sends toward on another colour than its plan says,
        with the reason."""
        return {a.node: {p: f"{o.colour}: {o.reason} (plan {o.plan_revision})"
                         for p, o in a.overrides.by_peer.items()}
                for a in self.agents.values() if a.overrides.by_peer}  # fmt: skip

    def moves(self, node: str, peer: str, after_ns: int = 0) -> list[FailoverEvent]:
        """The failovers `node` published that moved its traffic toward `peer`."""
        return [e for at, e in self.failovers
                if at >= after_ns and e.node == node and peer in e.peers]  # fmt: skip

    async def restored(self, within: float = 20, *, overrides: bool = True) -> None:
        """Undo every fault and wait for the system to be as it started: every link up
        again in health, re-protection done, no agent overriding its plan (unless
        `overrides` is false), all settled."""
        await asyncio.to_thread(faults.restore, self.lab)
        last: dict[int, str] = {}
        for _, e in self.health:
            last[e.link_id] = e.state
        await self.until(lambda: all(self.states_of(i)[-1] == "up" for i in last), within,
                         "every link up again in health")  # fmt: skip
        if "pathcomp" in self.apps:
            await self.pathcomp.replanned(within)
        try:
            await self.until(lambda: not overrides or not self.overridden(), within,
                             "no agent overriding its plan")  # fmt: skip
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.overridden()}") from None
        await self.settled()

    async def settled(self) -> None:
        """Every agent applied its node's latest document (pathcomp wrote one for every
        node), every BFD session is up, and no switch keeps a port withdrawn (a session Up
        again gives its port back after the up hold)."""
        await self.applied()
        programmer = self.apps["programmer"][0]
        agents = self.agents

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
        repairs = programmer.state.repairs
        await self.until(lambda: not any(r.withdrawn for r in repairs.values()), 30,
                         "no switch port withdrawn")  # fmt: skip

    async def applied(self) -> None:
        """Every agent applied its node's latest document (pathcomp wrote one for every
        node), with every member of its VNIs."""
        agents = self.agents
        kv = await self.bus.desired_state()

        def late(revisions: dict[str, Any]) -> list[str]:
            """Agents behind their node's document, or missing some of their VNIs' members."""
            return sorted(
                n for n, e in revisions.items()
                if e is None or agents[n].status.key_revision < e.revision
                or getattr(agents[n].applied, "incomplete", None)
            )  # fmt: skip

        for _ in range(600):
            behind = late({n: await kv.get(node_key(n)) for n in agents})
            if not behind:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"agents behind their desired state (or none yet): {behind}")


@pytest.fixture
def nats_server() -> Iterator[EmbeddedNats]:
    """A nats-server per test: no KV bucket, lease or stream of an earlier test is seen.
    Tests may kill and restart it (same port, same JetStream store)."""
    with tempfile.TemporaryDirectory() as store, EmbeddedNats(store_dir=Path(store)) as server:
        yield server


@pytest.fixture
def nats(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@asynccontextmanager
async def running_system(
    lab: Lab,
    doc: FabricDocument,
    nats_url: str,
    data_dir: Path,
    *,
    elsewhere: Callable[[Settings], Awaitable[None]] | None = None,
    **settings: Any,
) -> AsyncIterator[System]:
    """health, pathcomp and the programmer for every node of `lab` (built from `doc`),
    settled; `settings` override the test defaults (BFD 50 ms x 3 on links and peers).
    With `elsewhere`, health and pathcomp are not started here: it is called once the
    store holds the fabric, to start them (as processes, say) with these settings."""
    chosen = Settings(
        nats_url=nats_url, lab=lab.prefix, datapath="emulation", data_dir=data_dir,
        bfd_sessions="all", bfd_interval_ms=BFD_MS, bfd_multiplier=BFD_MULT,
        report_seconds=1.0, lease_seconds=3.0, stage_ack_seconds=2.0,
    ).model_copy(update=settings)  # fmt: skip
    async with AsyncExitStack() as stack:
        store = await Store.open(sqlite_url(data_dir))
        stack.push_async_callback(store.close)
        await store.replace(Fabric.from_document(doc), expected_revision=0, actor="test",
                            detail={})  # fmt: skip
        bus = await stack.enter_async_context(await Bus.connect(nats_url, name="test-system"))
        await bus.ensure_streams()
        f = System(lab, store, bus, chosen)
        f.fabric = await store.load()

        async def on_health(event: LinkHealthChanged) -> None:
            f.health.append((time.time_ns(), event))

        async def on_failover(event: FailoverEvent) -> None:
            f.failovers.append((time.time_ns(), event))

        await bus.subscribe(HEALTH_LINK_ALL, on_health, model=LinkHealthChanged)
        await bus.subscribe(FAILOVER_ALL, on_failover, model=FailoverEvent)
        try:
            if elsewhere is not None:
                await elsewhere(chosen)
            else:
                await f.start("health", health_app(chosen, store=store, bus=bus))
                await f.start("pathcomp", pathcomp_app(chosen, store=store, bus=bus))
            await f.start("programmer", programmer_app(chosen, bus=bus))
            await f.settled()
            yield f
        finally:
            for name in ("programmer", "pathcomp", "health"):
                if name in f.apps:
                    await _stop_or_explain(f, name)
            await asyncio.to_thread(faults.restore, lab)


STOP_S = 20.0  # a service's shutdown; past it every task's stack is printed


async def _stop_or_explain(f: System, name: str) -> None:
    stopping = asyncio.ensure_future(f.stop(name))
    done, _ = await asyncio.wait({stopping}, timeout=STOP_S)
    if not done:
        for task in asyncio.all_tasks():
            print(f"--- task {task.get_name()}: {task!r}")
            task.print_stack(file=sys.stdout)
        raise AssertionError(f"{name} did not stop within {STOP_S:.0f} s")
    stopping.result()


@pytest.fixture
async def system(
    make_lab: Callable[..., Lab], nats: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[System]:
    """The whole system on a fresh `leaf_spine(2, 3, 2)` lab; `indirect` parametrisation
    picks the BFD sessions (a string) or overrides settings (a dict)."""
    doc = leaf_spine(2, 3, 2)
    lab = await asyncio.to_thread(make_lab, doc)
    param = getattr(request, "param", {})
    overrides = {"bfd_sessions": param} if isinstance(param, str) else dict(param)
    async with running_system(lab, doc, nats, tmp_path, **overrides) as f:
        yield f


async def warm(lab: Lab, *pairs: tuple[str, str]) -> None:
    """A few packets per (src, dst) host pair, all delivered: ARP is resolved before a
    test's clock starts."""
    for src, dst in pairs:
        report = await asyncio.to_thread(traffic.run, lab, traffic.StreamSpec(
            src=f"{src}-vf0", dst=f"{dst}-vf0", rate_pps=500, count=20, duration_s=1))  # fmt: skip
        assert report.received == 20, (src, dst, report.lost_ranges)


async def flows(
    lab: Lab, pairs: list[tuple[str, str]], count: int, port: int
) -> list[traffic.Stream]:
    """A 1 kHz stream of `count` packets per (src, dst) host pair, on ports `port`,
    `port + 1`, ...; ARP is resolved first."""
    await warm(lab, *pairs)
    return [
        await asyncio.to_thread(stream, lab, src, dst, count, port + n)
        for n, (src, dst) in enumerate(pairs)
    ]


async def flow_on_red(f: System, port: int) -> tuple[int, traffic.Stream]:
    """A 3 s flow host1 -> host3 under way (ARP resolved first), and the switch-to-switch
    link its red path takes out of leaf1."""
    (flow,) = await flows(f.lab, [("host1", "host3")], 3000, port)
    await asyncio.sleep(1.0)
    return f.red_link("host1", "host3"), flow


@asynccontextmanager
async def watch_colour(agent: NodeAgent, peer: str) -> AsyncIterator[list[str]]:
    """The colours `agent` sends toward `peer` with, each change as it happens (polled every
    2 ms while the block runs; the first item is the colour at the start)."""
    seen = [agent.colour_of(peer) or "none"]

    async def poll() -> None:
        while True:
            now = agent.colour_of(peer) or "none"
            if now != seen[-1]:
                seen.append(now)
            await asyncio.sleep(0.002)

    task = asyncio.create_task(poll(), name=f"watch-{agent.node}-{peer}")
    try:
        yield seen
    finally:
        task.cancel()


def _storm(prefix: str, end: str, flaps: int, down_s: float, period_s: float) -> None:
    # Real-time, as the traffic meter's threads: a busy machine must not stretch the storm.
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    lab = Lab.open(prefix)
    begin = time.monotonic()
    for k in range(flaps):
        time.sleep(max(0.0, begin + k * period_s - time.monotonic()))
        faults.carrier_loss(lab, end)
        time.sleep(down_s)
        faults.restore(lab)


async def flap_storm(lab: Lab, end: str, flaps: int, down_s: float, period_s: float) -> float:
    """`end` (``node:port``) loses carrier `flaps` times, for `down_s` each, one flap every
    `period_s`; returns the seconds the storm took. It runs in a forked child of its own, so
    that its timing does not wait for this process's busy event loop (and GIL)."""
    child = multiprocessing.get_context("fork").Process(
        target=_storm, args=(lab.prefix, end, flaps, down_s, period_s), name="lab-flaps"
    )
    start = time.monotonic()
    child.start()
    await asyncio.to_thread(child.join)
    assert child.exitcode == 0, f"the flap storm failed (exit code {child.exitcode})"
    return time.monotonic() - start


def outside_gap(report: traffic.TrafficReport) -> int:
    """Packets lost outside the flow's first lost run (its second and later runs); runs
    past the report's first 20 count one packet each, at least what they lost."""
    listed = report.lost_ranges[1:]
    unlisted = max(0, report.lost_ranges_total - len(report.lost_ranges))
    return sum(last - first + 1 for first, last in listed) + unlisted
