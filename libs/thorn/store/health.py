"""Health's part of the store: each link's machine (so a restart starts where it left off)
and the failure history, as SQL.

The records are plain values (`thorn.health_records`, re-exported here); `Store.record_health`
writes a batch of them in one transaction, in order. A link has at most one open failure
(`ended_at` null), so the later records find it by link id.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from thorn.health_records import (
    FAILURE_STATES,
    SOURCE_KINDS,
    Failure,
    FailureClosed,
    FailureOpened,
    FailureQuery,
    FailureWorsened,
    HealthRecord,
    LinkForgotten,
    LinkStateRecord,
    SourceKind,
    source_kind,
)
from thorn.store.schema import HealthFailureRow, HealthLinkRow


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything written here is UTC.
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- inside one transaction ----------------------------------------------------------------


async def write_records(conn: AsyncConnection, records: Sequence[HealthRecord]) -> None:
    # Only the last state of a link in a batch matters.
    last_state: dict[int, int] = {}
    for i, record in enumerate(records):
        if isinstance(record, LinkStateRecord):
            last_state[record.link_id] = i
    for i, record in enumerate(records):
        if isinstance(record, LinkStateRecord):
            if last_state[record.link_id] != i:
                continue
            await conn.execute(delete(HealthLinkRow).where(HealthLinkRow.link_id == record.link_id))
            await conn.execute(
                insert(HealthLinkRow),
                {
                    "link_id": record.link_id,
                    "state": record.state,
                    "sources": dict(record.sources),
                    "loss": record.loss,
                    "drained": record.drained,
                    "suppressed": record.suppressed,
                    "penalty": record.penalty,
                    "penalty_at": record.penalty_at,
                    "changed_at": record.changed_at,
                },
            )
        elif isinstance(record, FailureOpened):
            row = {
                "link_id": record.link_id,
                "a_node": record.a_node,
                "a_port": record.a_port,
                "b_node": record.b_node,
                "b_port": record.b_port,
                "state": record.state,
                "source": record.source[:200],
                "source_kind": source_kind(record.source)[:16],
                "started_at": record.started_at,
                "detected_at": record.detected_at,
                "received_at": record.received_at,
                "detection_latency_ms": record.detection_latency_ms,
            }
            await conn.execute(insert(HealthFailureRow), row)
        elif isinstance(record, FailureWorsened):
            await conn.execute(
                update(HealthFailureRow).where(_open_of(record.link_id)).values(state=record.state)
            )
        elif isinstance(record, FailureClosed):
            await conn.execute(
                update(HealthFailureRow)
                .where(_open_of(record.link_id))
                .values(ended_at=record.ended_at, end_source=record.source[:200])
            )
        else:
            await conn.execute(delete(HealthLinkRow).where(HealthLinkRow.link_id == record.link_id))


def _open_of(link_id: int) -> Any:
    return (HealthFailureRow.link_id == link_id) & HealthFailureRow.ended_at.is_(None)


async def read_states(conn: AsyncConnection) -> list[LinkStateRecord]:
    rows = (await conn.execute(select(HealthLinkRow))).mappings()
    return [
        LinkStateRecord(
            link_id=r["link_id"],
            state=r["state"],
            sources={str(k): bool(v) for k, v in r["sources"].items()},
            loss=r["loss"],
            drained=r["drained"],
            suppressed=r["suppressed"],
            penalty=r["penalty"],
            penalty_at=r["penalty_at"],
            changed_at=_utc(r["changed_at"]),
        )
        for r in rows
    ]


async def read_open(conn: AsyncConnection) -> dict[int, str]:
    query = select(HealthFailureRow.link_id, HealthFailureRow.state).where(
        HealthFailureRow.ended_at.is_(None)
    )
    return {int(r[0]): str(r[1]) for r in await conn.execute(query)}


async def read_failures(conn: AsyncConnection, q: FailureQuery) -> tuple[int, list[Failure]]:
    t = HealthFailureRow
    where: list[Any] = []
    if q.link_id is not None:
        where.append(t.link_id == q.link_id)
    if q.node is not None:
        where.append(or_(t.a_node == q.node, t.b_node == q.node))
    if q.source_kind is not None:
        where.append(t.source_kind == q.source_kind)
    if q.state is not None:
        where.append(t.state == q.state)
    if q.open is not None:
        where.append(t.ended_at.is_(None) if q.open else t.ended_at.is_not(None))
    if q.since is not None:
        where.append(t.started_at >= q.since)
    if q.until is not None:
        where.append(t.started_at < q.until)
    total = (await conn.execute(select(func.count()).select_from(t).where(*where))).scalar_one()
    rows = (
        await conn.execute(
            select(t)
            .where(*where)
            .order_by(t.started_at.desc(), t.id.desc())
            .limit(q.limit)
            .offset(q.offset)
        )
    ).mappings()
    failures = [
        Failure(
            id=r["id"],
            link_id=r["link_id"],
            a_node=r["a_node"],
            a_port=r["a_port"],
            b_node=r["b_node"],
            b_port=r["b_port"],
            state=r["state"],
            source=r["source"],
            source_kind=r["source_kind"],
            started_at=_utc(r["started_at"]) or r["started_at"],
            detected_at=_utc(r["detected_at"]),
            received_at=_utc(r["received_at"]) or r["received_at"],
            detection_latency_ms=r["detection_latency_ms"],
            ended_at=_utc(r["ended_at"]),
            end_source=r["end_source"],
        )
        for r in rows
    ]
    return int(total), failures


__all__ = [
    "FAILURE_STATES",
    "SOURCE_KINDS",
    "Failure",
    "FailureClosed",
    "FailureOpened",
    "FailureQuery",
    "FailureWorsened",
    "HealthRecord",
    "LinkForgotten",
    "LinkStateRecord",
    "SourceKind",
    "read_states",
    "source_kind",
    "write_records",
]
