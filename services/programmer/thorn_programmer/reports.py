"""What a node's agent tells health, on `agent.report.<node>`.

- A port's carrier, admin or operational state changes: reported at once, in order (health's
  flap dampening needs every down and up, so changes are never merged).
- Every `period` seconds: a full snapshot, every port's state and counters. Health derives
  loss from successive counters, and a restarted health rebuilds its view within one period.
- BFD session state changes (`bfd(...)`): at once, like carrier.

One report is in flight at a time; what arrives meanwhile goes into the next one, so a burst
of events costs a few requests, not one each. A report nobody answers (health away) is
kept and sent again, oldest first, up to `backlog` items; beyond that the oldest changes are
dropped and the next snapshot restates the truth.

`ReportQueue` is the pure part (items in, reports out); `Reporter` is the shell that owns
the link monitor and talks to NATS. Its ports come from a `LinkSource`: the kernel's
(`LinkMonitor`, what an agent runs), or the scripted ports of the scale benchmark's simulated
agents, which run this same code a thousand times in one process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Protocol

import structlog
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from thorn.bus import Bus, BusError
from thorn.events import (
    AgentReport,
    AgentReportReply,
    BfdReport,
    CarrierReport,
    CountersReport,
    ReportItem,
    utcnow,
)
from thorn_programmer.kernel import TEP_DEVICE
from thorn_programmer.monitor import LinkCounters, LinkEvent, LinkMonitor, MonitorItem, Resync
from thorn_programmer.render import FLOWER_TUNNEL

log = structlog.get_logger("thorn.programmer.reports")

REPORTS = Counter(
    "thorn_programmer_reports_total", "Agent reports sent to health, by outcome",
    ["node", "outcome"],
)  # fmt: skip
REPORT_ITEMS_DROPPED = Counter(
    "thorn_programmer_report_items_dropped_total",
    "Report items dropped because health was away too long (a snapshot restates the truth)",
    ["node"],
)
REPORT_SECONDS = Histogram(
    "thorn_programmer_report_seconds", "Agent report request to health's reply",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)  # fmt: skip

MAX_ITEMS = 1000  # AgentReport's limit per report


def is_fabric_port(ifname: str) -> bool:
    """Ports worth reporting: not the loopback (TEPs) nor a tunnel device THORN made."""
    return ifname != TEP_DEVICE and ifname != FLOWER_TUNNEL and not ifname.startswith("thv")


def _utc(at_ns: int) -> datetime:
    return datetime.fromtimestamp(at_ns / 1e9, UTC)


def carrier_item(event: LinkEvent) -> CarrierReport:
    return CarrierReport(
        port=event.ifname,
        admin_up=event.admin_up and not event.deleted,
        carrier=event.carrier and not event.deleted,
        oper_state="notpresent" if event.deleted else event.oper_state.name.lower(),
        detected_at=_utc(event.at_ns),
    )


def counters_item(port: str, c: LinkCounters, at: datetime) -> CountersReport:
    return CountersReport(
        port=port, rx_packets=c.rx_packets, tx_packets=c.tx_packets, rx_errors=c.rx_errors,
        tx_errors=c.tx_errors, rx_dropped=c.rx_dropped, tx_dropped=c.tx_dropped, at=at,
    )  # fmt: skip


class ReportQueue:
    """Items waiting to be reported, oldest first, with the report sequence numbers."""

    def __init__(self, node: str, backlog: int = 10 * MAX_ITEMS) -> None:
        self.node = node
        self.backlog = backlog
        self.seq = 0
        self.run = uuid.uuid4().hex[:16]  # this queue's run: health tells a retry from a restart
        self.dropped = 0
        self._items: deque[ReportItem] = deque()
        self._inflight = 0  # items of the report being sent that are still at the head
        self._last: dict[str, tuple[bool, bool, str]] = {}  # port -> state last queued
        self._last_ns: dict[str, int] = {}  # port -> when that state was read

    def __len__(self) -> int:
        return len(self._items)

    def link(self, event: LinkEvent) -> bool:
        """Queue a port's change; the kernel repeats unchanged states (e.g. on a counters or
        MTU change), which are not news. Returns whether it was queued."""
        if not is_fabric_port(event.ifname):
            return False
        item = carrier_item(event)
        state = (item.admin_up, item.carrier, item.oper_state)
        if self._last.get(item.port) == state:
            return False
        self._last[item.port], self._last_ns[item.port] = state, event.at_ns
        if event.deleted:
            del self._last[item.port]
        self._add([item])
        return True

    def snapshot(
        self, links: Iterable[LinkEvent], counters: dict[str, LinkCounters], at: datetime
    ) -> None:
        """Every port's state and counters: the truth, whatever was lost before."""
        items: list[ReportItem] = []
        for event in links:
            if not is_fabric_port(event.ifname):
                continue
            # A change read after the dump was taken is newer than the dump: keep it last.
            if self._last_ns.get(event.ifname, 0) <= event.at_ns:
                item = carrier_item(event)
                self._last[item.port] = (item.admin_up, item.carrier, item.oper_state)
                self._last_ns[item.port] = event.at_ns
                items.append(item)
            if event.ifname in counters:
                items.append(counters_item(event.ifname, counters[event.ifname], at))
        self._add(items)

    def add(self, items: Sequence[ReportItem]) -> None:
        self._add(items)

    def _add(self, items: Sequence[ReportItem]) -> None:
        self._items.extend(items)
        excess = len(self._items) - self.backlog
        for _ in range(max(0, excess)):
            self._items.popleft()
            if self._inflight:  # the report in flight carries it: not lost, just not ours
                self._inflight -= 1
            else:
                self.dropped += 1

    def next_report(self) -> AgentReport | None:
        """The next report (up to MAX_ITEMS of the oldest items); None if nothing waits.
        The items stay queued until `sent` says health took them."""
        if not self._items:
            return None
        items = [self._items[i] for i in range(min(MAX_ITEMS, len(self._items)))]
        self._inflight = len(items)
        return AgentReport(node=self.node, seq=self.seq, run=self.run, sent_at=utcnow(),
                           items=items)  # fmt: skip

    def sent(self, report: AgentReport) -> None:
        """Health answered `report`: drop its items (those still queued: the backlog may have
        pushed some out meanwhile, counted there) and move to the next sequence number."""
        for _ in range(min(self._inflight, len(self._items))):
            self._items.popleft()
        self._inflight = 0
        self.seq += 1


class LinkSource(Protocol):
    """A node's ports as `LinkMonitor` gives them: started, iterated for changes, sampled for
    the periodic snapshot (from a worker thread), closed."""

    def start(self) -> None: ...

    def close(self) -> None: ...

    def sample(self) -> tuple[list[LinkEvent], dict[str, LinkCounters]]: ...

    def __aiter__(self) -> AsyncIterator[MonitorItem]: ...


class Reporter:
    """Runs one node's link monitor and sends its reports (see the module's docstring).
    `links` opens the node's link source for its namespace (the kernel's by default)."""

    def __init__(
        self,
        node: str,
        bus: Bus,
        netns: str | None,
        *,
        period: float = 5.0,
        timeout: float = 1.0,
        on_link: Callable[[LinkEvent], None] | None = None,
        links: Callable[[str | None], LinkSource] = LinkMonitor,
    ) -> None:
        self.node = node
        self.bus = bus
        self.netns = netns
        self.period = period
        self.timeout = timeout
        self.queue = ReportQueue(node)
        self.on_link = on_link
        self.links = links
        self._wake = asyncio.Event()

    def bfd(self, item: BfdReport) -> None:
        """Report a BFD session's change (called on the event loop)."""
        self.queue.add([item])
        self._wake.set()

    async def run(self) -> None:
        monitor = self.links(self.netns)
        monitor.start()
        tasks = [
            asyncio.create_task(self._follow(monitor), name=f"report-links-{self.node}"),
            asyncio.create_task(self._snapshots(monitor), name=f"report-snap-{self.node}"),
        ]
        try:
            await self._send_loop()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            monitor.close()

    async def _follow(self, monitor: LinkSource) -> None:
        async for item in monitor:
            if isinstance(item, Resync):
                continue  # the dump's LinkEvents follow, and `link` keeps only real changes
            if self.on_link is not None:
                self.on_link(item)
            if self.queue.link(item):
                self._wake.set()

    async def _snapshots(self, monitor: LinkSource) -> None:
        while True:
            links, counters = await asyncio.to_thread(monitor.sample)
            self.queue.snapshot(links, counters, utcnow())
            self._wake.set()
            await asyncio.sleep(self.period)

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (report := self.queue.next_report()) is not None:
                if not await self._send(report):
                    await asyncio.sleep(min(self.period, 1.0))  # health away: retry later
                    self._wake.set()
                    break
            if self.queue.dropped:
                REPORT_ITEMS_DROPPED.labels(self.node).inc(self.queue.dropped)
                self.queue.dropped = 0

    async def _send(self, report: AgentReport) -> bool:
        start = time.perf_counter()
        try:
            raw = await self.bus.request(report, reply_within=self.timeout)
        except BusError as exc:
            REPORTS.labels(self.node, "unanswered").inc()
            log.debug("report_unanswered", node=self.node, error=str(exc))
            return False
        REPORT_SECONDS.observe(time.perf_counter() - start)
        try:
            reply = AgentReportReply.model_validate_json(raw)
        except ValidationError:
            REPORTS.labels(self.node, "bad_reply").inc()
            log.error("report_bad_reply", node=self.node, reply=raw[:200])
            self.queue.sent(report)  # not ours to resend forever
            return True
        if not reply.ok:
            # A refusal names what health did not accept: a bug on one side, not a retry.
            REPORTS.labels(self.node, "refused").inc()
            log.error("report_refused", node=self.node, seq=report.seq, error=reply.error)
        else:
            REPORTS.labels(self.node, "applied").inc()
        self.queue.sent(report)
        return True
