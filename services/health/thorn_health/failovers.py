"""Failover timelines (pure): `FailoverEvent`s in, store records and one timeline per trace
out.

Every event of one failover carries the same trace: the hops health and pathcomp added
(detection, report, decision, flip) and then each agent's own (`agent_received`,
`agent_applied`). A timeline merges them: the shared hops once, then each agent's branch,
each hop after the hop it followed on its own event's path.

Each hop names the clock that read its time (a node, or a service). Two hops are only
subtracted when one clock read both: across clocks the difference mixes the latency with
the clocks' offset (NTP keeps hosts within about a millisecond at best, which is the size of
what is measured here), so it is reported as `clocks_differ` instead of a number.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from thorn.events import FailoverEvent
from thorn.health_records import FailoverRecord, HopRecord
from thorn.model import NAME_MAX as NAME

REASON_MAX = 500
COLOUR_MAX = 16
# A central flip's reason names the failed element: "central: link 17".
_LINK_RE = re.compile(r"\blink (\d{1,9})\b")
END_STEP = "agent_applied"
REPROTECTION = "reprotection"  # pathcomp's record of the end of re-protection: no move


class MalformedFailover(ValueError):
    """An event the schema accepts but the store cannot hold as it is; names the field."""


def untraced_id(node: str, at: datetime) -> str:
    """The id of an event without a trace: its node and time (never a trace id, which is
    hex only)."""
    return f"{node}-{at.strftime('%Y%m%dT%H%M%S.%fZ')}"


def link_of(reason: str) -> int | None:
    found = _LINK_RE.search(reason)
    return int(found.group(1)) if found else None


def _text(value: str) -> str:
    return value.replace("\x00", "")  # PostgreSQL text cannot hold NUL


def record_of(event: FailoverEvent, stream_seq: int) -> FailoverRecord:
    """The row to store for `event`, the message at `stream_seq` of THORN_FAILOVER."""
    if len(event.node) > NAME:
        raise MalformedFailover(f"node: longer than {NAME} characters")
    for name, colour in (("from_colour", event.from_colour), ("to_colour", event.to_colour)):
        if colour is not None and len(colour) > COLOUR_MAX:
            raise MalformedFailover(f"{name}: longer than {COLOUR_MAX} characters")
    hops = tuple(HopRecord(h.step, h.at, h.clock) for h in event.trace.hops) if event.trace else ()
    return FailoverRecord(
        stream_seq=stream_seq,
        trace_id=event.trace.id if event.trace else untraced_id(event.node, event.at),
        traced=event.trace is not None,
        node=event.node,
        tier=event.tier,
        from_colour=_text(event.from_colour) if event.from_colour is not None else None,
        to_colour=_text(event.to_colour),
        peers=tuple(event.peers),
        reason=_text(event.reason)[:REASON_MAX],
        link_id=link_of(event.reason),
        kernel_ms=event.kernel_ms,
        at=event.at,
        started_at=hops[0].at if hops else event.at,
        hops=hops,
    )


# --- timelines -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineHop:
    step: str
    at: datetime
    clock: str
    after: int | None  # index of the hop it followed on its event's path
    ms: float | None  # since that hop, when one clock read both
    clocks_differ: bool


@dataclass(frozen=True, slots=True)
class Moved:
    node: str
    peers: list[str]
    from_colour: str | None
    to_colour: str
    tier: str
    reason: str
    kernel_ms: float
    at: datetime


@dataclass(frozen=True, slots=True)
class Timeline:
    id: str
    traced: bool
    started: datetime
    started_clock: str
    tier: str
    sources: list[str]
    pairs_moved: int
    link_id: int | None
    reason: str
    gap_ms_upper_bound: float | None
    gap_clocks_differ: bool
    gap_clocks: list[str]
    hops: list[TimelineHop]
    moved: list[Moved]
    # From pathcomp's receipt of the failure to the end of its re-protection (both on
    # pathcomp's clock); None: not recorded (yet).
    reprotected_ms: float | None = None
    reprotected_nodes: int = 0


def _ms(later: datetime, earlier: datetime) -> float:
    return round((later - earlier).total_seconds() * 1000, 3)


def merge_hops(records: Sequence[FailoverRecord]) -> list[TimelineHop]:
    """Every hop of the trace once, in the order the events were stored: the shared ones,
    then each agent's branch; each with its latency since the hop it followed."""
    merged: list[TimelineHop] = []
    index: dict[tuple[str, datetime, str], int] = {}
    for record in records:
        previous: int | None = None
        for hop in record.hops:
            key = (hop.step, hop.at, hop.clock)
            if key not in index:
                before = merged[previous] if previous is not None else None
                same = before is not None and before.clock == hop.clock
                index[key] = len(merged)
                merged.append(
                    TimelineHop(
                        step=hop.step, at=hop.at, clock=hop.clock, after=previous,
                        ms=_ms(hop.at, before.at) if before is not None and same else None,
                        clocks_differ=before is not None and not same,
                    )
                )  # fmt: skip
            previous = index[key]
    return merged


def _gap(records: Sequence[FailoverRecord]) -> tuple[float | None, bool, list[str]]:
    """From the first hop (detection) to the last flip applied: every pair moved was on its
    new colour by then. An upper bound over the pairs of detection -> repair; the time from
    the failure to its detection is not in it. Only computed when one clock read both ends."""
    first = next((r.hops[0] for r in records if r.hops), None)
    if first is None:
        return None, False, []
    ends: list[HopRecord] = []
    for record in records:
        if not record.hops:
            continue
        applied = [h for h in record.hops if h.step == END_STEP]
        ends.append(applied[-1] if applied else record.hops[-1])
    clocks = list(dict.fromkeys([first.clock, *(e.clock for e in ends)]))
    if len(clocks) > 1:
        return None, True, clocks
    return max(_ms(e.at, first.at) for e in ends), False, clocks


def timeline(records: Sequence[FailoverRecord]) -> Timeline:
    """The timeline of one trace from its stored events (at least one), in stored order."""
    if not records:
        raise ValueError("a timeline needs at least one event")
    hops = merge_hops(records)  # every hop, the end of re-protection's too
    plans = [r for r in records if r.tier == REPROTECTION]
    moves = [r for r in records if r.tier != REPROTECTION]
    # What moved traffic makes the timeline; one of re-protection alone names pathcomp.
    gap, differ, clocks = _gap(moves) if moves else (None, False, [])
    records = moves or records
    head = records[0]
    earliest = min(records, key=lambda r: r.at)  # no hops: the event's own time, its clock
    return Timeline(
        id=head.trace_id,
        traced=head.traced,
        started=hops[0].at if hops else earliest.at,
        started_clock=hops[0].clock if hops else earliest.node,
        tier=head.tier,
        sources=sorted({r.node for r in records}),
        # A re-protection's "peers" are the nodes it rewrote: no pair moved by them.
        pairs_moved=sum(len(r.peers) for r in moves),
        link_id=next((r.link_id for r in records if r.link_id is not None), None),
        reason=head.reason,
        gap_ms_upper_bound=gap,
        gap_clocks_differ=differ,
        gap_clocks=clocks,
        hops=hops,
        moved=[
            Moved(
                node=r.node, peers=list(r.peers), from_colour=r.from_colour,
                to_colour=r.to_colour, tier=r.tier, reason=r.reason, kernel_ms=r.kernel_ms,
                at=r.at,
            )
            for r in records
        ],
        reprotected_ms=_reprotected_ms(plans),
        reprotected_nodes=max((len(r.peers) for r in plans), default=0),
    )  # fmt: skip


def _reprotected_ms(plans: Sequence[FailoverRecord]) -> float | None:
    """pathcomp_received -> reprotected, both read on pathcomp's clock."""
    for record in plans:
        steps = {h.step: h for h in record.hops}
        begin, end = steps.get("pathcomp_received"), steps.get("reprotected")
        if begin is not None and end is not None and begin.clock == end.clock:
            return _ms(end.at, begin.at)
    return None
