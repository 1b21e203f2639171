"""Link monitoring for node agents: one `LinkMonitor` per network namespace, plus counters."""

from thorn_programmer.monitor.link import (
    DumpInterrupted,
    LinkMonitor,
    MonitorItem,
    sample_counters,
)
from thorn_programmer.monitor.parse import (
    LinkCounters,
    LinkEvent,
    OperState,
    Resync,
    counter_deltas,
    parse_counters,
    parse_link,
)

__all__ = [
    "DumpInterrupted",
    "LinkCounters",
    "LinkEvent",
    "LinkMonitor",
    "MonitorItem",
    "OperState",
    "Resync",
    "counter_deltas",
    "parse_counters",
    "parse_link",
    "sample_counters",
]
