"""Simulated node agents for the scale benchmark (tests/bench/bench_scale.py): the programmer's
own `NodeAgent` and `Reporter`, many to a process, over a datapath and ports that touch no
kernel.

What runs is the agent's real code: the KV watch of `node.<name>` and of its VNIs' chunks,
the documents' decoding and checks (term fencing included), the intent, the production
drivers' rendering (`flower_objects` for a host, `switch_objects` for a switch), the diff
against what is "installed", the `agent.applied.<node>` report pathcomp waits for, the
heartbeat, pathcomp's urgent flips and their failover events; and for health, the report
queue and its requests on `agent.report.<node>`, a snapshot with counters every period and
each carrier change at once. What does not run: netlink (`NullDatapath` keeps THORN's
objects in a dict: what a reconcile would have written is what the next one reads back),
the link monitor (`ScriptedPorts`: the node's fabric ports, all up, counters rising; a
carrier change is scripted), BFD and the registration with topology.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from thorn.bus import Bus
from thorn_programmer.agent import NodeAgent
from thorn_programmer.app import supervised
from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.drivers.netlink import ApplyReport, NetlinkDatapath
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.intent import HostIntent, Intent, SwitchIntent
from thorn_programmer.kernel import Change, KernelObject
from thorn_programmer.monitor import LinkCounters, LinkEvent, MonitorItem, OperState
from thorn_programmer.overrides import Overrides
from thorn_programmer.render import flower_objects, switch_objects
from thorn_programmer.reports import Reporter

PACKETS_PER_SAMPLE = 10_000  # what each up port carries between two snapshots, loss-free


class NullDatapath(NetlinkDatapath):
    """A node's THORN objects in memory: rendered as the production drivers render them,
    "applied" by updating the dict, read back from it. No socket is opened."""

    name = "null"

    def __init__(self, kind: str) -> None:  # the parent's sockets are not made
        self.kind = kind
        # As the driver it stands in for: no better (a host's reconcile reads back).
        real = SwitchRouteDriver if kind == "switch" else FlowerDriver
        self.settles_in_one_pass = real.settles_in_one_pass
        self.netns = None
        self.installed: dict[tuple[object, ...], KernelObject] = {}
        self.applied_changes = 0

    async def setup(self) -> None:
        """Nothing to bring up."""

    def render(self, intent: Intent) -> list[KernelObject]:
        if isinstance(intent, HostIntent):
            return flower_objects(intent)
        assert isinstance(intent, SwitchIntent)
        return switch_objects(intent, {})  # no ports, so no U-turn tables

    async def read(self) -> list[KernelObject]:
        return list(self.installed.values())

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        for change in changes:
            if change.op == "delete":
                self.installed.pop(change.obj.key, None)
            else:
                assert change.new is not None
                self.installed[change.new.key] = change.new
        self.applied_changes += len(changes)
        return ApplyReport(applied=list(changes))


class ScriptedPorts:
    """A `LinkSource` (thorn_programmer.reports) of fixed ports: all up until `carrier`
    says otherwise; an up port's counters rise by PACKETS_PER_SAMPLE per sample, no loss."""

    def __init__(self, ports: Sequence[str]) -> None:
        self.ifindex = {port: n + 2 for n, port in enumerate(ports)}  # 1 is the loopback
        self.up = dict.fromkeys(ports, True)
        self.packets = dict.fromkeys(ports, 0)
        self._queue: asyncio.Queue[MonitorItem | None] = asyncio.Queue()

    def start(self) -> None:
        self._queue = asyncio.Queue()  # a restarted reporter starts from a fresh queue

    def close(self) -> None:
        self._queue.put_nowait(None)

    def _event(self, port: str, at_ns: int) -> LinkEvent:
        up = self.up[port]
        oper = OperState.UP if up else OperState.LOWERLAYERDOWN
        return LinkEvent(port, self.ifindex[port], True, up, oper, False, at_ns, None)

    def sample(self) -> tuple[list[LinkEvent], dict[str, LinkCounters]]:
        at = time.time_ns()
        for port, up in self.up.items():
            if up:
                self.packets[port] += PACKETS_PER_SAMPLE
        counters = {p: LinkCounters(n, n, 0, 0, 0, 0) for p, n in self.packets.items()}
        return [self._event(p, at) for p in self.up], counters

    def carrier(self, port: str, up: bool) -> int:
        """The port's carrier goes `up` or down now, as the kernel would announce it; returns
        the event's time (time.time_ns), which the report carries as its detection time."""
        at = time.time_ns()
        self.up[port] = up
        self._queue.put_nowait(self._event(port, at))
        return at

    def __aiter__(self) -> AsyncIterator[MonitorItem]:
        return self

    async def __anext__(self) -> MonitorItem:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


class SimulatedAgent:
    """One node's agent and reporter on `bus` (the node's own connection, as on a real node)."""

    def __init__(
        self,
        node: str,
        ports: Sequence[str],
        bus: Bus,
        *,
        report_seconds: float = 5.0,
        hold_down: float = 2.0,
    ) -> None:
        self.node = node
        self.bus = bus
        self.ports = ScriptedPorts(ports)
        self.agent: NodeAgent | None = None
        self.datapath: NullDatapath | None = None  # the agent's driver, once it opened one
        self.reporter = Reporter(node, bus, None, period=report_seconds,
                                 links=lambda _netns: self.ports)  # fmt: skip
        self.hold_down = hold_down
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        kv = await self.bus.desired_state()
        overrides = Overrides(None, revertive=True, hold_down=self.hold_down)
        self.agent = NodeAgent(self.node, kv, self.bus, self._driver, None, overrides)
        self._tasks = [
            asyncio.create_task(supervised(self.node, self.agent.run), name=f"agent-{self.node}"),
            asyncio.create_task(supervised(self.node, self.reporter.run),
                                name=f"report-{self.node}"),
        ]  # fmt: skip

    @asynccontextmanager
    async def _driver(self, kind: str, _netns: str | None) -> AsyncIterator[NetlinkDatapath]:
        self.datapath = NullDatapath(kind)
        yield self.datapath

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
