"""Prometheus view of every live BFD runtime's counters, read at scrape time, so the packet
path only bumps plain integers."""

from __future__ import annotations

import weakref
from collections import Counter as Tally
from collections.abc import Iterator
from contextlib import suppress
from typing import Protocol

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from thorn_programmer.bfd.codec import State
from thorn_programmer.bfd.events import DROP_REASONS, Counters, SessionStatus


class _Reporting(Protocol):
    """What the Prometheus collector reads: a BfdManager, or a BfdProcess in front of one."""

    name: str

    def counters(self) -> Counters: ...

    def sessions(self) -> list[SessionStatus]: ...


class _BfdCollector(Collector):
    """Prometheus view of every live manager's counters, read at scrape time, so the packet
    path only bumps plain integers."""

    def __init__(self) -> None:
        self.managers: weakref.WeakSet[_Reporting] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        received = CounterMetricFamily(
            "thorn_bfd_packets_received", "BFD datagrams received", labels=["manager"]
        )
        sent = CounterMetricFamily("thorn_bfd_packets_sent", "BFD packets sent", labels=["manager"])
        send_errors = CounterMetricFamily(
            "thorn_bfd_send_errors", "BFD packets the kernel refused to send", labels=["manager"]
        )
        dropped = CounterMetricFamily(
            "thorn_bfd_packets_dropped",
            "BFD datagrams discarded, by reason",
            labels=["manager", "reason"],
        )
        changes = CounterMetricFamily(
            "thorn_bfd_state_changes", "BFD session state changes, by new state",
            labels=["manager", "state"],
        )  # fmt: skip
        late = CounterMetricFamily(
            "thorn_bfd_late_timers", "BFD timers the runtime ran over 5 ms after they were due",
            labels=["manager"],
        )  # fmt: skip
        excused = CounterMetricFamily(
            "thorn_bfd_stalls_excused", "Stalls of the BFD runtime not counted against the "
            "sessions whose peer it also runs (a lab: every node in one runtime)",
            labels=["manager"],
        )  # fmt: skip
        sessions = GaugeMetricFamily(
            "thorn_bfd_sessions", "BFD sessions by state", labels=["manager", "state"]
        )
        for manager in list(self.managers):
            try:
                counts = manager.counters()
                by_state = Tally(s.state.name.lower() for s in manager.sessions())
            except RuntimeError:
                continue  # closed: its counters died with it
            received.add_metric([manager.name], counts.received)
            sent.add_metric([manager.name], counts.sent)
            send_errors.add_metric([manager.name], counts.send_errors)
            late.add_metric([manager.name], counts.late_timers)
            excused.add_metric([manager.name], counts.stalls_excused)
            for reason in DROP_REASONS:
                dropped.add_metric([manager.name, reason], counts.dropped.get(reason, 0))
            for state in State:
                label = state.name.lower()
                changes.add_metric([manager.name, label], counts.state_changes.get(label, 0))
            for state in State:
                label = state.name.lower()
                sessions.add_metric([manager.name, label], by_state.get(label, 0))
        yield from (received, sent, send_errors, late, excused, dropped, changes, sessions)


COLLECTOR = _BfdCollector()
with suppress(ValueError):  # a second copy of this module (reload): the first one reports
    REGISTRY.register(COLLECTOR)
