"""Health's pure core: agent reports and topology in, link transitions and history out.

Faucet style: no I/O, and time is an argument (`now`, wall-clock seconds, so that a figure
of merit saved before a restart keeps decaying while health is away). Every input returns
an `Outcome`: the transitions to publish on `health.link.<id>`, the records to store, and
what the report held. The service shell does the publishing and the writing.

Mapping a report to links goes through the topology: a carrier item or a single-hop BFD
item names (node, port), and the link with that end is the one it speaks for. Each end and
each session is its own source of the link's machine (`carrier:<node>:<port>`,
`bfd:<node>:<port>`). Multihop BFD sessions (no port) watch paths, not links: they are kept
as sessions (the API lists them) and change no link. Counters give a port's loss from two
successive reports; a link's loss is the worse of its two ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from thorn.events import AgentReport, BfdReport, CarrierReport, CountersReport
from thorn.fabric import Fabric
from thorn.health_records import (
    FailureClosed,
    FailureOpened,
    FailureWorsened,
    HealthRecord,
    LinkForgotten,
    LinkStateRecord,
)
from thorn.model import AdminState
from thorn_health.linkstate import HealthConfig, LinkHealth, LinkSnapshot, LinkState, Transition

# States that make a failure (a row of history) and how bad each is.
SEVERITY = {LinkState.degraded: 1, LinkState.down: 2, LinkState.flapping: 3}


@dataclass(frozen=True, slots=True)
class LinkEnds:
    """A link as health sees the topology: its two ends, and whether an operator took it
    out of service (the link or one of its nodes is not admin `up`)."""

    link_id: int
    a_node: str
    a_port: str
    b_node: str
    b_port: str
    drained: bool = False


def links_of(fabric: Fabric) -> dict[int, LinkEnds]:
    out: dict[int, LinkEnds] = {}
    for link in fabric.links.values():
        drained = link.admin_state is not AdminState.up or any(
            fabric.nodes[end.node].admin_state is not AdminState.up for end in (link.a, link.b)
        )
        out[link.id] = LinkEnds(
            link.id, link.a.node, link.a.port, link.b.node, link.b.port, drained
        )
    return out


@dataclass(frozen=True, slots=True)
class Session:
    """The last state an agent reported for one of its BFD sessions."""

    node: str
    local: str
    peer: str
    port: str | None
    multihop: bool
    state: str
    diag: int
    detected_at: datetime
    link_id: int | None
    tx_interval_ms: float | None = None  # negotiated, as the agent last reported
    detect_time_ms: float | None = None


@dataclass(frozen=True, slots=True)
class CounterSample:
    """What one end of a link counted between two of its agent's reports: the link's drops
    and errors over time (in memory, the last SAMPLES per link)."""

    port: str  # node:port
    at: datetime  # the later report's time (the agent's clock)
    seconds: float
    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int


SAMPLES = 120  # per link, both ends: 10 minutes at the default 10 s report period
_COUNTED = ("rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")


@dataclass(frozen=True, slots=True)
class Detection:
    """Where a transition came from: the agent's detection time and health's receive time."""

    transition: Transition
    detected_at: datetime | None
    received_at: datetime

    @property
    def latency_ms(self) -> float | None:
        if self.detected_at is None:
            return None
        return (self.received_at - self.detected_at).total_seconds() * 1000


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a transition came from: the reporting agent, when it saw it (its clock) and
    when health received the report (health's clock). The start of a failover's trace."""

    node: str
    detected_at: datetime | None
    received_at: datetime


@dataclass
class Outcome:
    transitions: list[Transition] = field(default_factory=list)
    origins: dict[Transition, Origin] = field(default_factory=dict)
    records: list[HealthRecord] = field(default_factory=list)
    applied: int = 0  # items that spoke for a known link, port or session
    unknown: list[str] = field(default_factory=list)  # items naming no known link
    seq_gap: int = 0  # reports this agent's sequence skipped
    seq_restart: bool = False  # the sequence went backwards: the agent restarted
    duplicate: bool = False  # a retried report: only its new items were applied


def loss_fraction(
    previous: CountersReport, current: CountersReport, min_packets: int
) -> tuple[float | None, bool]:
    """(loss between two counter reports of a port, whether `current` becomes the baseline).

    Loss is the packets errored or dropped over all packets (sent, received, errored,
    dropped) between the two reports. A counter that went backwards (reset, a new device) only
    restarts the baseline; fewer than `min_packets` packets keep the old baseline and say
    nothing yet, so an idle port is not judged on three packets.
    """

    def lost(c: CountersReport) -> int:
        return c.rx_errors + c.tx_errors + c.rx_dropped + c.tx_dropped

    packets = (current.rx_packets - previous.rx_packets) + (
        current.tx_packets - previous.tx_packets
    )
    errors = lost(current) - lost(previous)
    fields = ("rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
    if any(getattr(current, f) < getattr(previous, f) for f in fields):
        return None, True
    total = packets + errors
    if total < min_packets or total <= 0:
        return None, False
    return min(1.0, errors / total), True


class HealthCore:
    def __init__(self, config: HealthConfig | None = None, *, min_packets: int = 100) -> None:
        self.config = config or HealthConfig()
        self.min_packets = min_packets
        self.ends: dict[int, LinkEnds] = {}
        self.links: dict[int, LinkHealth] = {}
        self.by_port: dict[tuple[str, str], int] = {}
        self.changed_at: dict[int, datetime] = {}
        self.sessions: dict[tuple[str, str, str, str | None], Session] = {}
        self.counters: dict[tuple[str, str], CountersReport] = {}
        self._last_counters: dict[tuple[str, str], CountersReport] = {}
        self.samples: dict[int, deque[CounterSample]] = {}
        self.port_loss: dict[tuple[str, str], float] = {}
        self.last_seq: dict[str, int] = {}
        self.last_run: dict[str, str] = {}  # node -> the run of its last report
        self.last_count: dict[str, int] = {}  # node -> items in its last report
        self.open_failures: dict[int, LinkState] = {}
        self._restored: dict[int, LinkStateRecord] = {}
        self._saved: dict[int, tuple[object, ...]] = {}
        self._touched: set[int] = set()  # links whose machine may need saving
        # Links that may wait on time (down: maybe held; suppressed: a reuse to come). Only
        # a transition or a new machine makes one so; the ticker looks at these alone (a
        # walk of every machine per wake cost ~50 ms at k=32's 24,576 links, many a second).
        self._may_wait: set[int] = set()
        self._counts = {s.value: 0 for s in LinkState} | {"unknown": 0}

    # --- start: what the store remembers, then the topology --------------------------------

    def restore(self, states: Iterable[LinkStateRecord], open_failures: Mapping[int, str]) -> None:
        """The machines and open failures a previous run left in the store; they become the
        links' machines when `set_topology` finds the links still there."""
        self._restored = {r.link_id: r for r in states}
        self.open_failures = {k: LinkState(v) for k, v in open_failures.items()}

    def set_topology(self, links: Mapping[int, LinkEnds], now: float) -> Outcome:
        """Follow the topology: new links get a machine (the stored one if any), removed ones
        are dropped (an open failure of theirs is closed), drains are applied."""
        out = Outcome()
        received = _at(now)
        for link_id in [k for k in self.ends if k not in links]:
            self._count(self.links[link_id].state, -1)
            del self.ends[link_id], self.links[link_id]
            self.changed_at.pop(link_id, None)
            self._saved.pop(link_id, None)
            if self.open_failures.pop(link_id, None) is not None:
                out.records.append(FailureClosed(link_id, received, "topology"))
            out.records.append(LinkForgotten(link_id))
        for link_id in [k for k in self._restored if k not in links]:
            del self._restored[link_id]
            if self.open_failures.pop(link_id, None) is not None:
                out.records.append(FailureClosed(link_id, received, "topology"))
            out.records.append(LinkForgotten(link_id))
        for link_id, ends in links.items():
            link = self.links.get(link_id)
            if link is None:
                link = self.links[link_id] = self._machine(link_id, now)
                self._count(link.state, +1)
                self._may_wait.add(link_id)
            self.ends[link_id] = ends
            self._touched.add(link_id)
            if link.drained != ends.drained:
                self._note(out, link.set_drained(ends.drained, now), None, received)
        self.by_port = {}
        for link_id, ends in self.ends.items():
            self.by_port[(ends.a_node, ends.a_port)] = link_id
            self.by_port[(ends.b_node, ends.b_port)] = link_id
        for key in [k for k in self.port_loss if k not in self.by_port]:
            del self.port_loss[key]
        for key in [k for k in self._last_counters if k not in self.by_port]:
            del self._last_counters[key]
        for gone in [k for k in self.samples if k not in self.ends]:
            del self.samples[gone]
        out.records += self.dirty()
        return out

    def _machine(self, link_id: int, now: float) -> LinkHealth:
        record = self._restored.pop(link_id, None)
        if record is None:
            return LinkHealth(link_id, self.config)
        if record.changed_at is not None:
            self.changed_at[link_id] = record.changed_at
        snapshot = LinkSnapshot(
            LinkState(record.state) if record.state else None, record.sources, record.loss,
            record.drained, record.suppressed, record.penalty, record.penalty_at,
        )  # fmt: skip
        link = LinkHealth.restore(link_id, snapshot, now, self.config)
        self._saved[link_id] = _key(link.snapshot())
        return link

    # --- reports --------------------------------------------------------------------------

    def apply(self, report: AgentReport, now: float) -> Outcome:
        """Apply a (valid) agent report: each item in order."""
        out = Outcome()
        received = _at(now)
        node = report.node
        last = self.last_seq.get(node)
        items = report.items
        if report.run and self.last_run.get(node) == report.run and last == report.seq:
            # A retry of the report just applied (its reply was lost): the items it already
            # carried are not applied twice, only those added since.
            items = items[self.last_count.get(node, 0) :]
            out.duplicate = True
        elif last is not None:
            if report.seq > last + 1:
                out.seq_gap = report.seq - last - 1
            elif report.seq < last:
                out.seq_restart = True
        self.last_seq[node], self.last_run[node] = report.seq, report.run
        self.last_count[node] = len(report.items)
        for item in items:
            if isinstance(item, CarrierReport):
                link_id = self.by_port.get((node, item.port))
                if link_id is None:
                    out.unknown.append(f"carrier {node}:{item.port}")
                    continue
                up = item.carrier and item.admin_up
                self._touched.add(link_id)
                transitions = self.links[link_id].observe(f"carrier:{node}:{item.port}", up, now)
                self._note(out, transitions, item.detected_at, received, node)
                out.applied += 1
            elif isinstance(item, BfdReport):
                self._bfd(node, item, now, received, out)
            else:
                self._counters(node, item, now, received, out)
        out.records += self.dirty()
        return out

    def _bfd(
        self, node: str, item: BfdReport, now: float, received: datetime, out: Outcome
    ) -> None:
        single = not item.multihop and item.port is not None
        link_id = self.by_port.get((node, item.port)) if single and item.port else None
        self.sessions[(node, item.local, item.peer, item.port)] = Session(
            node, item.local, item.peer, item.port, item.multihop, item.state, item.diag,
            item.detected_at, link_id, item.tx_interval_ms, item.detect_time_ms,
        )  # fmt: skip
        if not single:
            out.applied += 1  # a path's session: kept, changes no link
            return
        if link_id is None:
            out.unknown.append(f"bfd {node}:{item.port}")
            return
        out.applied += 1
        self._touched.add(link_id)
        link = self.links[link_id]
        source = f"bfd:{node}:{item.port}"
        if item.state == "admin_down":  # RFC 5880 6.8.16: not a failure; stop listening
            transitions = link.forget(source, now)
        elif item.state == "init":  # coming up: keeps whatever it said before
            return
        else:
            transitions = link.observe(source, item.state == "up", now)
        self._note(out, transitions, item.detected_at, received, node)

    def _counters(
        self, node: str, item: CountersReport, now: float, received: datetime, out: Outcome
    ) -> None:
        port = (node, item.port)
        link_id = self.by_port.get(port)
        if link_id is None:
            out.unknown.append(f"counters {node}:{item.port}")
            return
        out.applied += 1
        self._sample(link_id, node, item)
        previous = self.counters.get(port)
        if previous is None:
            self.counters[port] = item
            return
        loss, rebase = loss_fraction(previous, item, self.min_packets)
        if rebase:
            self.counters[port] = item
        if loss is None:
            return
        self.port_loss[port] = loss
        ends = self.ends[link_id]
        worst = max(
            self.port_loss.get((ends.a_node, ends.a_port), 0.0),
            self.port_loss.get((ends.b_node, ends.b_port), 0.0),
        )
        transitions = self.links[link_id].observe_loss(worst, now, f"counters:{node}:{item.port}")
        self._note(out, transitions, item.at, received, node)

    def _sample(self, link_id: int, node: str, item: CountersReport) -> None:
        last = self._last_counters.get((node, item.port))
        self._last_counters[(node, item.port)] = item
        if last is None or item.at <= last.at:
            return
        deltas = [getattr(item, f) - getattr(last, f) for f in _COUNTED]
        if min(deltas) < 0:
            return  # the counters restarted (a reboot, a new device): no interval to tell
        samples = self.samples.get(link_id)
        if samples is None:
            samples = self.samples[link_id] = deque(maxlen=SAMPLES)
        seconds = (item.at - last.at).total_seconds()
        samples.append(CounterSample(f"{node}:{item.port}", item.at, seconds, *deltas))

    # --- time -----------------------------------------------------------------------------

    def next_tick(self, now: float) -> float | None:
        """Seconds until a suppressed link may be reused or a held one come up (None: none
        waits on time)."""
        waits = [w for link in self._waiting() if (w := link.wake_in(now)) is not None]
        return min(waits) if waits else None

    def tick(self, now: float) -> Outcome:
        out = Outcome()
        received = _at(now)
        for link in self._waiting():
            self._touched.add(link.link_id)
            self._note(out, link.tick(now), None, received)
        out.records += self.dirty()
        return out

    def _waiting(self) -> list[LinkHealth]:
        """The machines that may wait on time: suppressed, or down (maybe held)."""
        down = LinkState.down
        found = (self.links.get(i) for i in sorted(self._may_wait))
        waiting = [link for link in found if link and (link.suppressed or link.state is down)]
        self._may_wait = {link.link_id for link in waiting}
        return waiting

    # --- bookkeeping ----------------------------------------------------------------------

    def _note(
        self,
        out: Outcome,
        transitions: list[Transition],
        detected_at: datetime | None,
        received: datetime,
        node: str | None = None,
    ) -> None:
        for t in transitions:
            out.transitions.append(t)
            if node is not None:
                out.origins[t] = Origin(node, detected_at, received)
            self._count(t.previous, -1)
            self._count(t.state, +1)
            self._touched.add(t.link_id)
            self._may_wait.add(t.link_id)
            self.changed_at[t.link_id] = received
            self._history(out, Detection(t, detected_at, received))

    def _history(self, out: Outcome, d: Detection) -> None:
        t = d.transition
        now_bad = t.state in SEVERITY
        open_state = self.open_failures.get(t.link_id)
        if now_bad and open_state is None:
            ends = self.ends[t.link_id]
            self.open_failures[t.link_id] = t.state
            out.records.append(
                FailureOpened(
                    t.link_id, ends.a_node, ends.a_port, ends.b_node, ends.b_port, t.state,
                    t.source, d.detected_at or d.received_at, d.detected_at, d.received_at,
                    d.latency_ms,
                )
            )  # fmt: skip
        elif now_bad and open_state is not None:
            if SEVERITY[t.state] > SEVERITY[open_state]:
                self.open_failures[t.link_id] = t.state
                out.records.append(FailureWorsened(t.link_id, t.state))
        elif open_state is not None:
            del self.open_failures[t.link_id]
            out.records.append(FailureClosed(t.link_id, d.detected_at or d.received_at, t.source))

    def resave(self, link_id: int) -> None:
        """Offer this link's machine for saving again with the next outcome (its last record
        was not stored)."""
        self._saved.pop(link_id, None)
        self._touched.add(link_id)

    def dirty(self) -> list[LinkStateRecord]:
        """Records of the machines that changed in what a restart needs (not every loss
        figure: counters re-derive it)."""
        records: list[LinkStateRecord] = []
        touched, self._touched = self._touched, set()
        for link_id in sorted(touched):
            link = self.links.get(link_id)
            if link is None:
                continue
            snapshot = link.snapshot()
            key = _key(snapshot)
            if self._saved.get(link_id) == key or (
                link_id not in self._saved and snapshot.state is None
            ):
                continue  # unchanged, or nothing a restart needs yet
            self._saved[link_id] = key
            records.append(
                LinkStateRecord(
                    link_id, snapshot.state.value if snapshot.state else None,
                    dict(snapshot.sources), snapshot.loss, snapshot.drained,
                    snapshot.suppressed, snapshot.penalty, snapshot.penalty_at,
                    self.changed_at.get(link_id),
                )
            )  # fmt: skip
        return records

    def counts(self) -> dict[str, int]:
        """Links by state ("unknown": no report yet), kept as transitions happen."""
        return dict(self._counts)

    def _count(self, state: LinkState | None, delta: int) -> None:
        self._counts[state.value if state else "unknown"] += delta


def _key(snapshot: LinkSnapshot) -> tuple[object, ...]:
    return (
        snapshot.state,
        tuple(sorted(snapshot.sources.items())),
        snapshot.drained,
        snapshot.suppressed,
        snapshot.penalty_at,
    )


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


__all__ = [
    "SEVERITY",
    "Detection",
    "HealthCore",
    "LinkEnds",
    "Outcome",
    "Session",
    "links_of",
    "loss_fraction",
]
