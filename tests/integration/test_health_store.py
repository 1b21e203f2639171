"""Health's tables in the store (SQLite and PostgreSQL): link machines for a restart, and the
failure history with its filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

import thorn.store
from thorn.store import Store
from thorn.store.health import (
    FailureClosed,
    FailureOpened,
    FailureQuery,
    FailureWorsened,
    LinkForgotten,
    LinkStateRecord,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def state(link_id: int, value: str, **sources: bool) -> LinkStateRecord:
    return LinkStateRecord(link_id, value, sources, 0.0, False, False, 1000.0, 1.5e9, T0)


MIGRATIONS = Path(thorn.store.__file__).parent / "migrations" / "versions"


def opened(link_id: int, at: datetime, source: str = "carrier:leaf1:swp1") -> FailureOpened:
    return FailureOpened(
        link_id, "leaf1", f"swp{link_id}", "spine1", f"swp{link_id}", "down", source, at, at,
        at + timedelta(milliseconds=2), 2.0,
    )  # fmt: skip


async def test_the_store_is_at_the_newest_migration(store: Store) -> None:
    async with store.engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    newest = max(p.name[:4] for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
    assert newest >= "0003" and version == newest  # 0003: the failovers' tables


async def test_link_machines_are_kept_one_per_link_and_forgotten_with_the_link(
    store: Store,
) -> None:
    await store.record_health(
        [state(1, "up", **{"carrier:leaf1:swp1": True}), state(2, "up"),
         state(1, "down", **{"carrier:leaf1:swp1": False})]
    )  # fmt: skip
    by_link = {r.link_id: r for r in await store.health_states()}
    assert by_link[1].state == "down" and by_link[1].sources == {"carrier:leaf1:swp1": False}
    assert by_link[1].changed_at == T0 and by_link[1].penalty_at == 1.5e9
    await store.record_health([LinkForgotten(2)])
    assert [r.link_id for r in await store.health_states()] == [1]


async def test_a_failure_opens_worsens_and_closes_and_is_found_by_its_filters(
    store: Store,
) -> None:
    await store.record_health(
        [opened(1, T0), FailureWorsened(1, "flapping"), opened(2, T0 + timedelta(minutes=1),
         "bfd:leaf1:swp2")]
    )  # fmt: skip
    assert await store.open_failures() == {1: "flapping", 2: "down"}
    await store.record_health([FailureClosed(1, T0 + timedelta(minutes=5), "dampening")])
    assert await store.open_failures() == {2: "down"}

    total, rows = await store.failures(FailureQuery())
    assert total == 2 and [r.link_id for r in rows] == [2, 1]  # newest first
    first = rows[1]
    assert (first.state, first.source_kind, first.end_source) == ("flapping", "carrier",
                                                                  "dampening")  # fmt: skip
    assert first.started_at == T0 and first.ended_at == T0 + timedelta(minutes=5)
    assert first.received_at == T0 + timedelta(milliseconds=2)
    assert first.detection_latency_ms == 2.0

    async def ids(**query: object) -> list[int]:
        return [r.link_id for r in (await store.failures(FailureQuery(**query)))[1]]  # type: ignore[arg-type]

    assert await ids(open=True) == [2] and await ids(open=False) == [1]
    assert await ids(source_kind="bfd") == [2] and await ids(state="flapping") == [1]
    assert await ids(node="spine1") == [2, 1] and await ids(node="leaf9") == []
    assert await ids(link_id=1) == [1]
    assert await ids(since=T0 + timedelta(seconds=30)) == [2]
    assert await ids(until=T0 + timedelta(seconds=30)) == [1]
    assert await ids(limit=1, offset=1) == [1]
