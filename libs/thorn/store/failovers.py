"""Health's failover history in the store: one row per `FailoverEvent` (one node's flip),
the rows of one failover sharing its trace id.

Writes are idempotent: a message of THORN_FAILOVER delivered again (its ack was lost, or
its ack wait ran out while the database was slow) hits the unique (`stream_seq`, `node`,
`at`) and is skipped, so any number of health replicas may consume and write.

A page of the history is a page of traces, not of rows: the filters pick the rows, their
trace ids are grouped and ordered by the trace's start (newest first), and then every row
of the traces on the page is read, so a trace is always shown whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from thorn.health_records import FailoverQuery, FailoverRecord, HopRecord
from thorn.store.schema import HealthFailoverRow

_UNIQUE = ("stream_seq", "node", "at")


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything written here is UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _row(record: FailoverRecord) -> dict[str, Any]:
    return {
        "stream_seq": record.stream_seq,
        "trace_id": record.trace_id,
        "traced": record.traced,
        "node": record.node,
        "tier": record.tier,
        "from_colour": record.from_colour,
        "to_colour": record.to_colour,
        "peers": list(record.peers),
        "reason": record.reason,
        "link_id": record.link_id,
        "kernel_ms": record.kernel_ms,
        "at": record.at,
        "started_at": record.started_at,
        "hops": [
            {"step": h.step, "at": _utc(h.at).isoformat(), "clock": h.clock} for h in record.hops
        ],
    }


def _record(r: Any) -> FailoverRecord:
    return FailoverRecord(
        stream_seq=r["stream_seq"],
        trace_id=r["trace_id"],
        traced=r["traced"],
        node=r["node"],
        tier=r["tier"],
        from_colour=r["from_colour"],
        to_colour=r["to_colour"],
        peers=tuple(r["peers"]),
        reason=r["reason"],
        link_id=r["link_id"],
        kernel_ms=r["kernel_ms"],
        at=_utc(r["at"]),
        started_at=_utc(r["started_at"]),
        hops=tuple(
            HopRecord(step=h["step"], at=_utc(datetime.fromisoformat(h["at"])), clock=h["clock"])
            for h in r["hops"]
        ),
    )


async def write_failovers(conn: AsyncConnection, records: Sequence[FailoverRecord]) -> list[bool]:
    """Insert each record unless it is stored already; True where a row was added."""
    dialect = conn.dialect.name
    added: list[bool] = []
    for record in records:
        if dialect == "postgresql":
            statement: Any = pg_insert(HealthFailoverRow).on_conflict_do_nothing(
                index_elements=list(_UNIQUE)
            )
        else:
            statement = sqlite_insert(HealthFailoverRow).on_conflict_do_nothing(
                index_elements=list(_UNIQUE)
            )
        # RETURNING, not rowcount: drivers disagree on the rowcount of a skipped insert.
        result = await conn.execute(
            statement.values(**_row(record)).returning(HealthFailoverRow.id)
        )
        added.append(result.first() is not None)
    return added


async def read_failover_page(
    conn: AsyncConnection, q: FailoverQuery
) -> tuple[int, list[list[FailoverRecord]]]:
    """(traces matching, this page of traces newest first, each trace's rows in the order
    they were stored)."""
    t = HealthFailoverRow
    where: list[Any] = []
    if q.node is not None:
        where.append(t.node == q.node)
    if q.tier is not None:
        where.append(t.tier == q.tier)
    if q.link_id is not None:
        where.append(t.link_id == q.link_id)
    if q.since is not None:
        where.append(t.started_at >= q.since)
    if q.until is not None:
        where.append(t.started_at < q.until)
    started = func.min(t.started_at).label("started")
    groups = select(t.trace_id, started).where(*where).group_by(t.trace_id)
    total = (await conn.execute(select(func.count()).select_from(groups.subquery()))).scalar_one()
    page = await conn.execute(
        groups.order_by(started.desc(), t.trace_id).limit(q.limit).offset(q.offset)
    )
    ids = [str(r[0]) for r in page]
    if not ids:
        return int(total), []
    rows = (await conn.execute(select(t).where(t.trace_id.in_(ids)).order_by(t.id))).mappings()
    by_trace: dict[str, list[FailoverRecord]] = {i: [] for i in ids}
    for r in rows:
        by_trace[r["trace_id"]].append(_record(r))
    return int(total), [by_trace[i] for i in ids]


async def read_trace(conn: AsyncConnection, trace_id: str) -> list[FailoverRecord]:
    """Every row of one trace, in the order they were stored ([] for an unknown id)."""
    t = HealthFailoverRow
    rows = (await conn.execute(select(t).where(t.trace_id == trace_id).order_by(t.id))).mappings()
    return [_record(r) for r in rows]


__all__ = [
    "FailoverQuery",
    "FailoverRecord",
    "HopRecord",
    "read_failover_page",
    "read_trace",
    "write_failovers",
]
