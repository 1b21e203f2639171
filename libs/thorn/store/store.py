"""The topology store: the fabric, API tokens and the audit log in SQL.

SQLite (a file in the data directory) by default, PostgreSQL by URL. Every write is one
transaction that (1) bumps the topology revision with compare-and-set, so a writer that
validated against a stale fabric is refused instead of corrupting it, (2) applies the rows,
(3) appends an audit entry naming the actor, and (4) puts the write's topology.changed event
in the outbox (`topology_outbox`), so that an event is never lost with the process that
committed its write.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, delete, insert, inspect, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from thorn.fabric import Change, EntityKind, Fabric, FabricError
from thorn.model import (
    AuditEntry,
    Link,
    Miscabled,
    NodeSpec,
    PortSpec,
    Tenant,
    Tep,
    TokenPublic,
    TokenRole,
    Vni,
    Workload,
)
from thorn.store import failovers, health, observed
from thorn.store import tokens as token_sql
from thorn.store.database import (
    DatabaseUnusable,
    PoolSettings,
    masked,
    open_engine,
    refused_at_start,
    transaction,
)
from thorn.store.schema import (
    LinkRow,
    Meta,
    MiscabledRow,
    NodeRow,
    PortRow,
    TenantRow,
    TepRow,
    TokenRow,
    TopologyOutboxRow,
    VniRow,
    WorkloadRow,
)
from thorn.store.tokens import AuditRecord, TokenRecord

MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x7468_6F72  # "thor": serialises replicas migrating one PostgreSQL database

_TABLES: dict[EntityKind, Any] = {
    "node": NodeRow,
    "port": PortRow,
    "link": LinkRow,
    "tenant": TenantRow,
    "vni": VniRow,
    "workload": WorkloadRow,
    "tep": TepRow,
    "cabling": MiscabledRow,
}
# Children before parents, so deletes never trip a foreign key.
_DELETE_ORDER: list[EntityKind] = [
    "cabling", "workload", "tep", "link", "port", "node", "vni", "tenant",
]  # fmt: skip


class StaleRevision(Exception):
    """Another writer changed the topology since this write was validated."""


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite+aiosqlite:///{data_dir / 'thorn.db'}"


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime) -> str:
    # SQLite hands back naive datetimes; everything the store writes is UTC.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


# --- rows <-> models -------------------------------------------------------------------------


def _row(change: Change) -> dict[str, Any]:
    assert change.value is not None
    data = change.value.model_dump(mode="json")
    if change.kind == "link":
        a, b = data.pop("a"), data.pop("b")
        data.update(a_node=a["node"], a_port=a["port"], b_node=b["node"], b_port=b["port"])
    return data


def _key_filter(kind: EntityKind, key: str) -> list[Any]:
    if kind == "port":
        node, _, name = key.partition(":")
        return [PortRow.node == node, PortRow.name == name]
    if kind == "tep":
        node, _, colour = key.partition("/")
        return [TepRow.node == node, TepRow.colour == colour]
    if kind == "link":
        return [LinkRow.id == int(key)]
    if kind == "cabling":
        return [MiscabledRow.link_id == int(key)]
    if kind == "vni":
        return [VniRow.vni == int(key)]
    table = _TABLES[kind]
    return [table.name == key]


class Store:
    """Async access to the topology store. Create with `await Store.open(url)`."""

    def __init__(self, engine: AsyncEngine, pool: PoolSettings | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.pool = pool or PoolSettings()
        # SQLite: take the write lock at BEGIN. A deferred transaction that reads first and
        # then writes cannot wait for another writer (SQLite refuses the upgrade at once:
        # "database is locked", seen with the bootstrap token beside health's writer).
        self._write_engine = engine.execution_options(thorn_write=True)

    async def store_id(self) -> int:
        """A random number fixed when the store was created: names this store's events."""
        async with self.engine.connect() as conn:
            return await _counter(conn, "store_id")

    @classmethod
    async def open(
        cls,
        url: str,
        migrate: bool = True,
        *,
        pool: PoolSettings | None = None,
        name: str = "thorn",
    ) -> Store:
        """Open the store at `url` and bring its schema to this release's (`migrate`).
        DatabaseUnusable when the URL cannot give a store (it names the problem)."""
        pool = pool or PoolSettings()
        store = cls(open_engine(url, pool, name), pool)
        if migrate:
            try:
                await store.migrate()
            except DBAPIError as exc:
                await store.close()
                refused = refused_at_start(store.engine, exc)
                if refused is None:
                    raise
                raise refused from None
            except BaseException:
                await store.close()
                raise
        return store

    async def close(self) -> None:
        await self.engine.dispose()

    async def migrate(self) -> None:
        """Upgrade the schema to head, as every service does at start; replicas take turns.
        A database with tables but no THORN schema, or at a revision this release does not
        know (a newer release's), is refused untouched."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                # A migration and the wait for another replica's may take longer than any
                # one request may.
                await conn.execute(text("SET LOCAL statement_timeout = 0"))
                await conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
            await conn.run_sync(_upgrade_checked, masked(self.engine.url))

    # --- reading ------------------------------------------------------------------------

    async def revision(self) -> int:
        async with self.engine.connect() as conn:
            return await _counter(conn, "revision")

    async def load(self) -> Fabric:
        """The whole fabric as one consistent snapshot, validated again on the way in."""
        async with self.engine.connect() as conn:
            if self.dialect == "postgresql":
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                revision = await _counter(conn, "revision")
                next_link_id = await _counter(conn, "next_link_id")
                rows = {
                    kind: (await conn.execute(select(table))).mappings().all()
                    for kind, table in _TABLES.items()
                }
        return await asyncio.to_thread(_build_fabric, rows, revision, next_link_id)

    # --- writing ------------------------------------------------------------------------

    async def commit(
        self,
        changes: Sequence[Change],
        *,
        expected_revision: int,
        next_link_id: int,
        actor: str,
        action: str,
        target: str,
        detail: dict[str, Any],
        event: str | None = None,
        client: str | None = None,
    ) -> int:
        """Apply one validated operation; return the new revision, which is always
        `expected_revision + 1`. `event`: the write's topology.changed (JSON, made for that
        revision), put in the outbox in the same transaction; `client`: the caller's address,
        for the audit entry."""
        async with self._writing() as conn:
            revision = await _bump(conn, expected_revision)
            for change in changes:
                await _apply(conn, change)
            await _set_counter(conn, "next_link_id", next_link_id)
            await _audit(conn, actor, action, target, revision, detail, client=client)
            await _outbox(conn, revision, event)
        return revision

    async def replace(
        self,
        fabric: Fabric,
        *,
        expected_revision: int,
        actor: str,
        detail: dict[str, Any],
        event: str | None = None,
        client: str | None = None,
    ) -> int:
        """Replace the whole fabric (bulk import) in one transaction; return the revision
        (`expected_revision + 1`). `event` and `client` as for `commit`."""
        by_kind: dict[EntityKind, list[dict[str, Any]]] = defaultdict(list)
        for change in fabric.all_changes():
            by_kind[change.kind].append(_row(change))
        async with self._writing() as conn:
            revision = await _bump(conn, expected_revision)
            for kind in _DELETE_ORDER:
                await conn.execute(delete(_TABLES[kind]))
            for kind in reversed(_DELETE_ORDER):
                if by_kind[kind]:
                    await conn.execute(insert(_TABLES[kind]), by_kind[kind])
            await _set_counter(conn, "next_link_id", fabric.next_link_id)
            await _audit(conn, actor, "fabric.import", "fabric", revision, detail, client=client)
            await _outbox(conn, revision, event)
        return revision

    # --- the outbox of topology.changed -----------------------------------------------------

    async def unannounced(self, *, before: datetime, limit: int = 500) -> list[tuple[int, str]]:
        """Outbox events committed before `before`, oldest revision first: (revision, JSON)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(TopologyOutboxRow.revision, TopologyOutboxRow.event)
                .where(TopologyOutboxRow.at < before)
                .order_by(TopologyOutboxRow.revision)
                .limit(limit)
            )
            return [(int(revision), str(event)) for revision, event in rows]

    async def announced(self, revisions: Sequence[int]) -> None:
        """Take events JetStream has acknowledged out of the outbox."""
        if not revisions:
            return
        async with self._transaction() as conn:
            await conn.execute(
                delete(TopologyOutboxRow).where(TopologyOutboxRow.revision.in_(revisions))
            )

    def _transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """One transaction whose commit is known to have happened or not (`transaction`)."""
        return transaction(self.engine, self.pool.timeout_s)

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[AsyncConnection]:
        """A topology write transaction; a unique-constraint hit becomes a FabricError."""
        try:
            async with transaction(self._write_engine, self.pool.timeout_s, self.engine) as conn:
                yield conn
        except IntegrityError as err:
            raise FabricError.one(
                (), f"the store refused the write: {err.orig}", "conflict"
            ) from err

    # --- tokens -------------------------------------------------------------------------

    async def add_token(
        self,
        name: str,
        role: TokenRole,
        token_hash: str,
        actor: str,
        *,
        expires_at: datetime | None = None,
        client: str | None = None,
    ) -> TokenPublic:
        at = _now()
        async with self._writing() as conn:
            if await token_sql.exists(conn, name):
                raise FabricError.one(("name",), f"token '{name}' already exists", "conflict")
            row = await token_sql.insert_token(
                conn, name, role, token_hash, actor=actor, at=at, expires_at=expires_at
            )
            detail = {"role": role.value, "expires_at": _iso(expires_at) if expires_at else None}
            await _audit(conn, actor, "token.create", name, None, detail, client=client)
        return token_sql.public(row, at)

    async def rotate_token(
        self,
        name: str,
        token_hash: str,
        *,
        old_until: datetime,
        expires_at: datetime | None,
        actor: str,
        client: str | None = None,
    ) -> TokenPublic | None:
        """Give `name` a new secret; the old one works until `old_until`. None: no such token."""
        at = _now()
        async with self._writing() as conn:
            row = await token_sql.rekey(
                conn, name, token_hash, at=at, old_until=old_until, expires_at=expires_at
            )
            if row is None:
                return None
            detail = {"old_secret_until": _iso(max(old_until, at)),
                      "expires_at": _iso(expires_at) if expires_at else None}  # fmt: skip
            await _audit(conn, actor, "token.rotate", name, None, detail, client=client)
        return token_sql.public(row, at)

    async def put_token(self, name: str, role: TokenRole, token_hash: str, actor: str) -> bool:
        """Create or re-key a token (the bootstrap admin: never expires; a new secret
        replaces the old at once). Return True when it changed."""
        async with self._writing() as conn:
            found = (
                (await conn.execute(select(TokenRow).where(TokenRow.name == name)))
                .mappings()
                .first()
            )
            if (found and found["token_hash"] == token_hash and found["role"] == role.value
                    and found["expires_at"] is None):  # fmt: skip
                return False
            if found:
                await token_sql.rekey(
                    conn, name, token_hash, at=_now(), old_until=None, expires_at=None, role=role
                )
            else:
                await token_sql.insert_token(
                    conn, name, role, token_hash, actor=actor, at=_now(), expires_at=None
                )
            await _audit(conn, actor, "token.bootstrap", name, None, {"role": role.value})
        return True

    async def token_by_hash(self, token_hash: str) -> TokenRecord | None:
        """The token whose current (or, after a rotation, old) secret has this digest."""
        async with self.engine.connect() as conn:
            return await token_sql.find(conn, token_hash)

    async def has_token(self, name: str) -> bool:
        async with self.engine.connect() as conn:
            return await token_sql.exists(conn, name)

    async def tokens(self, now: datetime | None = None) -> list[TokenPublic]:
        async with self.engine.connect() as conn:
            return await token_sql.listing(conn, now or _now())

    async def tokens_used(self, used: Mapping[str, datetime]) -> None:
        """Record when tokens were last seen in use (name -> time)."""
        if used:
            async with self._transaction() as conn:
                await token_sql.mark_used(conn, used)

    async def delete_token(self, name: str, actor: str, *, client: str | None = None) -> bool:
        async with self._writing() as conn:
            result = await conn.execute(delete(TokenRow).where(TokenRow.name == name))
            if not result.rowcount:
                return False
            await _audit(conn, actor, "token.delete", name, None, {}, client=client)
        return True

    # --- audit --------------------------------------------------------------------------

    async def audit(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        actor: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
    ) -> tuple[int, list[AuditEntry]]:
        """The audit log, newest first: (total matching, this page). `action`: a prefix."""
        query = token_sql.AuditQuery(
            limit=limit, offset=offset, actor=actor, action=action, outcome=outcome
        )
        async with self.engine.connect() as conn:
            return await token_sql.read_entries(conn, query)

    async def append_audit(self, records: Sequence[AuditRecord]) -> None:
        """Write audit entries made outside a write's transaction, in one transaction."""
        if records:
            async with self._transaction() as conn:
                await token_sql.write_entries(conn, records)

    # --- health ---------------------------------------------------------------------------

    async def record_health(self, records: Sequence[health.HealthRecord]) -> None:
        """Write health's link states and failure history records, in order, in one
        transaction."""
        if not records:
            return
        async with self._transaction() as conn:
            await health.write_records(conn, records)

    async def health_states(self) -> list[health.LinkStateRecord]:
        """Every link's last health machine state (what a restarted health starts from)."""
        async with self.engine.connect() as conn:
            return await health.read_states(conn)

    async def open_failures(self) -> dict[int, str]:
        """Links with a failure still open, and that failure's state."""
        async with self.engine.connect() as conn:
            return await health.read_open(conn)

    async def failures(self, query: health.FailureQuery) -> tuple[int, list[health.Failure]]:
        """The failure history, newest first: (total matching, this page)."""
        async with self.engine.connect() as conn:
            return await health.read_failures(conn, query)

    # --- failover history (written by health) -------------------------------------------

    async def record_failovers(self, records: Sequence[failovers.FailoverRecord]) -> list[bool]:
        """Store failover events in one transaction; True where a row was added (False: it
        was stored before, a redelivery)."""
        if not records:
            return []
        async with self._transaction() as conn:
            return await failovers.write_failovers(conn, records)

    async def failover_page(
        self, query: failovers.FailoverQuery
    ) -> tuple[int, list[list[failovers.FailoverRecord]]]:
        """A page of failover traces, newest first: (traces matching, each trace's rows)."""
        async with self.engine.connect() as conn:
            return await failovers.read_failover_page(conn, query)

    async def failover_trace(self, trace_id: str) -> list[failovers.FailoverRecord]:
        """Every stored event of one failover trace ([] if none)."""
        async with self.engine.connect() as conn:
            return await failovers.read_trace(conn, trace_id)

    # --- registrations (what agents observe) ----------------------------------------------

    async def put_observed(self, record: observed.ObservedRecord) -> None:
        """Keep `record` as its node's latest registration (the refusal, if any, stays)."""
        async with self._transaction() as conn:
            await observed.write_observed(conn, record)

    async def put_refused(self, node: str, error: str, at: datetime) -> None:
        """Note that `node`'s latest registration was refused; its last good one stays."""
        async with self._transaction() as conn:
            await observed.write_refused(conn, node, error, at)

    async def observed_nodes(self) -> list[observed.ObservedRecord]:
        """Every node's stored registration and last refusal."""
        async with self.engine.connect() as conn:
            return await observed.read_observed(conn)


# --- helpers that run inside one transaction ---------------------------------------------


async def _counter(conn: AsyncConnection, key: str) -> int:
    return int((await conn.execute(select(Meta.value).where(Meta.key == key))).scalar_one())


async def _set_counter(conn: AsyncConnection, key: str, value: int) -> None:
    await conn.execute(update(Meta).where(Meta.key == key).values(value=value))


async def _bump(conn: AsyncConnection, expected: int) -> int:
    result = await conn.execute(
        update(Meta)
        .where(Meta.key == "revision", Meta.value == expected)
        .values(value=Meta.value + 1)
    )
    if result.rowcount != 1:
        raise StaleRevision(f"the topology is no longer at revision {expected}")
    return expected + 1


async def _apply(conn: AsyncConnection, change: Change) -> None:
    table = _TABLES[change.kind]
    if change.op == "create":
        await conn.execute(insert(table), _row(change))
    elif change.op == "update":
        await conn.execute(
            update(table).where(*_key_filter(change.kind, change.key)).values(**_row(change))
        )
    else:
        await conn.execute(delete(table).where(*_key_filter(change.kind, change.key)))


async def _audit(
    conn: AsyncConnection,
    actor: str,
    action: str,
    target: str,
    revision: int | None,
    detail: dict[str, Any],
    *,
    client: str | None = None,
) -> None:
    """The audit entry of a write, in the write's own transaction: committed with it."""
    record = AuditRecord(
        at=_now(), actor=actor, action=action, target=target, client=client, revision=revision,
        detail=detail,
    )  # fmt: skip
    await token_sql.write_entries(conn, [record])


async def _outbox(conn: AsyncConnection, revision: int, event: str | None) -> None:
    if event is not None:
        await conn.execute(insert(TopologyOutboxRow), {"revision": revision, "event": event,
                                                       "at": _now()})  # fmt: skip


def _build_fabric(
    rows: dict[EntityKind, Sequence[Any]], revision: int, next_link_id: int
) -> Fabric:
    fabric = Fabric(revision, next_link_id)
    ports: dict[str, list[PortSpec]] = defaultdict(list)
    for r in rows["port"]:
        ports[r["node"]].append(
            PortSpec.model_validate({k: v for k, v in r.items() if k != "node"})
        )
    for r in rows["tenant"]:
        fabric.add_tenant(Tenant.model_validate(dict(r)))
    for r in rows["vni"]:
        fabric.add_vni(Vni.model_validate(dict(r)))
    for r in rows["node"]:
        fabric.add_node(NodeSpec.model_validate({**r, "ports": ports[r["name"]]}))
    for r in sorted(rows["link"], key=lambda r: r["id"]):
        link = Link.model_validate(
            {
                "id": r["id"],
                "a": {"node": r["a_node"], "port": r["a_port"]},
                "b": {"node": r["b_node"], "port": r["b_port"]},
                "srlgs": r["srlgs"],
                "admin_state": r["admin_state"],
            }
        )
        fabric.add_link(link, link_id=link.id)
    for r in rows["tep"]:
        fabric.add_tep(Tep.model_validate(dict(r)))
    for r in rows["workload"]:
        fabric.add_workload(Workload.model_validate(dict(r)))
    for r in rows["cabling"]:
        fabric.miscabled[r["link_id"]] = Miscabled.model_validate(dict(r))
    fabric.next_link_id = max(fabric.next_link_id, next_link_id)
    return fabric


def _config(conn: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def _upgrade(conn: Connection, revision: str = "head") -> None:
    command.upgrade(_config(conn), revision)


def _upgrade_checked(conn: Connection, url: str) -> None:
    """`_upgrade`, unless the database holds something else than a THORN store."""
    tables = set(inspect(conn).get_table_names())
    if tables and "alembic_version" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (" ..." if len(tables) > 5 else "")
        raise DatabaseUnusable(
            url, "not_thorn",
            f"the database holds tables that are not a THORN store ({shown}) and was left "
            "untouched: point the URL at THORN's own database (an empty one is set up)",
        )  # fmt: skip
    if "alembic_version" in tables:
        at = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        scripts = ScriptDirectory.from_config(_config())
        known = {s.revision for s in scripts.walk_revisions()}
        if unknown := [r for r in at if r not in known]:
            head = scripts.get_current_head()
            raise DatabaseUnusable(
                url, "unknown_schema",
                f"the database is at schema revision {', '.join(unknown)}, which this release "
                f"(schema {head}) does not know: a newer THORN's database, or another "
                "application's; it was left untouched",
            )  # fmt: skip
    _upgrade(conn)
