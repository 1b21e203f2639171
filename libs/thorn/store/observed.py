"""Agents' registrations in the store: per node, the latest registration topology took
and, if a later one was refused, that refusal (with why). One row per node: the latest
wins."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from thorn.store.schema import ObservedNodeRow


@dataclass(frozen=True, slots=True)
class ObservedRecord:
    """A node's stored registration (`observed`: the NodeObservation's JSON, or None when
    only refusals came) and its last refusal."""

    node: str
    run: str | None = None
    seq: int | None = None
    received_at: datetime | None = None
    observed: dict[str, Any] | None = None
    refused_at: datetime | None = None
    refused_error: str | None = None


def _upsert(conn: AsyncConnection, values: dict[str, Any], columns: list[str]) -> Any:
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    statement = insert(ObservedNodeRow).values(**values)
    return statement.on_conflict_do_update(
        index_elements=["node"], set_={c: statement.excluded[c] for c in columns}
    )


async def write_observed(conn: AsyncConnection, record: ObservedRecord) -> None:
    # A registration taken supersedes an earlier refusal: the node's agent sends good ones now.
    values = {
        "node": record.node, "run": record.run, "seq": record.seq,
        "received_at": record.received_at, "observed": record.observed,
        "refused_at": None, "refused_error": None,
    }  # fmt: skip
    await conn.execute(_upsert(conn, values, [k for k in values if k != "node"]))


async def write_refused(conn: AsyncConnection, node: str, error: str, at: datetime) -> None:
    values = {"node": node, "refused_at": at, "refused_error": error[:1000]}
    await conn.execute(_upsert(conn, values, ["refused_at", "refused_error"]))


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # SQLite: naive, UTC


async def read_observed(conn: AsyncConnection) -> list[ObservedRecord]:
    query = select(ObservedNodeRow.__table__).order_by(ObservedNodeRow.node)
    rows = (await conn.execute(query)).mappings()
    return [
        ObservedRecord(**{**r, "received_at": _utc(r["received_at"]),
                            "refused_at": _utc(r["refused_at"])})
        for r in rows
    ]  # fmt: skip
