"""What health records, as plain values: each link's machine, the failure history and the
failover history.

The health core says what happened as a list of these records (`LinkStateRecord`,
`FailureOpened`, `FailureWorsened`, `FailureClosed`, `LinkForgotten`); the store
(`thorn.store.health`) writes a batch in one transaction and reads them back. No I/O here,
so health's pure core depends on this and never on SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

SourceKind = Literal["carrier", "bfd", "counters", "dampening", "drain", "topology"]
SOURCE_KINDS: tuple[str, ...] = ("carrier", "bfd", "counters", "dampening", "drain", "topology")
FAILURE_STATES: tuple[str, ...] = ("degraded", "down", "flapping")


def source_kind(source: str) -> str:
    """`carrier:leaf1:swp3` -> `carrier`; `dampening` -> `dampening`."""
    return source.partition(":")[0]


@dataclass(frozen=True, slots=True)
class LinkStateRecord:
    """One link's health machine as it stands (see `thorn_health.linkstate.LinkSnapshot`)."""

    link_id: int
    state: str | None
    sources: Mapping[str, bool]
    loss: float
    drained: bool
    suppressed: bool
    penalty: float
    penalty_at: float
    changed_at: datetime | None


@dataclass(frozen=True, slots=True)
class FailureOpened:
    link_id: int
    a_node: str
    a_port: str
    b_node: str
    b_port: str
    state: str
    source: str
    started_at: datetime  # the agent's detection time (or health's, for dampening)
    detected_at: datetime | None  # when the agent saw it (kernel event, BFD state change)
    received_at: datetime  # when health received the report
    detection_latency_ms: float | None  # received_at - detected_at


@dataclass(frozen=True, slots=True)
class FailureWorsened:
    link_id: int
    state: str


@dataclass(frozen=True, slots=True)
class FailureClosed:
    link_id: int
    ended_at: datetime
    source: str


@dataclass(frozen=True, slots=True)
class LinkForgotten:
    """The link left the topology: its machine is dropped (its history stays)."""

    link_id: int


HealthRecord = LinkStateRecord | FailureOpened | FailureWorsened | FailureClosed | LinkForgotten


@dataclass(frozen=True, slots=True)
class Failure:
    """A row of the failure history."""

    id: int
    link_id: int
    a_node: str
    a_port: str
    b_node: str
    b_port: str
    state: str
    source: str
    source_kind: str
    started_at: datetime
    detected_at: datetime | None
    received_at: datetime
    detection_latency_ms: float | None
    ended_at: datetime | None
    end_source: str | None


@dataclass(frozen=True, slots=True)
class FailureQuery:
    link_id: int | None = None
    node: str | None = None
    source_kind: str | None = None
    state: str | None = None
    open: bool | None = None
    since: datetime | None = None  # started at or after
    until: datetime | None = None  # started before
    limit: int = 100
    offset: int = 0


# --- failovers: one record per FailoverEvent (one node's flip), joined by trace -------------


@dataclass(frozen=True, slots=True)
class HopRecord:
    """One hop of a trace: a step, when it happened, and whose clock read that time."""

    step: str
    at: datetime
    clock: str


@dataclass(frozen=True, slots=True)
class FailoverRecord:
    """One stored FailoverEvent. `trace_id` is the event's trace id, or an id of its own for
    an event without a trace (`traced` false); `started_at` is its first hop (or `at`)."""

    stream_seq: int
    trace_id: str
    traced: bool
    node: str
    tier: str
    from_colour: str | None
    to_colour: str
    peers: tuple[str, ...]
    reason: str
    link_id: int | None
    kernel_ms: float
    at: datetime
    started_at: datetime
    hops: tuple[HopRecord, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class FailoverQuery:
    """Filters on the rows; a trace matches when any of its rows does."""

    node: str | None = None
    tier: str | None = None
    link_id: int | None = None
    since: datetime | None = None  # started at or after
    until: datetime | None = None  # started before
    limit: int = 100
    offset: int = 0


__all__ = [
    "FAILURE_STATES",
    "SOURCE_KINDS",
    "FailoverQuery",
    "FailoverRecord",
    "Failure",
    "FailureClosed",
    "FailureOpened",
    "FailureQuery",
    "FailureWorsened",
    "HealthRecord",
    "HopRecord",
    "LinkForgotten",
    "LinkStateRecord",
    "SourceKind",
    "source_kind",
]
