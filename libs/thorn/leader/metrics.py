"""The election's Prometheus metrics (registered once per process)."""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge

# --------------------------------------------------------------------------------------------
# Metrics (registered once per process)
# --------------------------------------------------------------------------------------------

_M = TypeVar("_M", Counter, Gauge)


def _metric(kind: type[_M], name: str, documentation: str, labels: list[str]) -> _M:
    try:
        return kind(name, documentation, labels)
    except ValueError:  # already registered (module reloaded, or two copies imported)
        collectors = getattr(REGISTRY, "_names_to_collectors", {})
        existing = collectors.get(name) or collectors.get(f"{name}_total")
        if isinstance(existing, kind):
            return existing
        raise


LEADER = _metric(Gauge, "thorn_leader", "1 while this candidate leads", ["election", "candidate"])
TRANSITIONS = _metric(
    Counter,
    "thorn_leader_transitions",
    "leadership transitions (became_leader, lost_leadership)",
    ["election", "candidate", "transition"],
)
