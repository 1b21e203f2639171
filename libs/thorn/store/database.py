"""The database under the store: opening it, and telling its outages from its refusals.

- `open_engine`: the one engine of a process. On PostgreSQL it keeps a pool (size, overflow,
  checkout timeout, recycle), pings a pooled connection before handing it out (a restarted
  server left only dead ones), and gives every session a statement timeout, a connect
  timeout and TCP keepalives, so no request waits on the database without bound.
- `DatabaseUnusable`: the URL cannot give a store at start (unparseable, an unsupported
  driver, no such database, unreachable, someone else's database). One line, password masked.
- `unavailable`: whether an error means "the database is away or too slow now, the same
  request may work in a moment" (the HTTP edge answers 503 with Retry-After), and why.
- `transaction`: one transaction whose outcome is known. A connection that dies while
  COMMIT is on the wire leaves the client not knowing whether it committed; on PostgreSQL
  the transaction's id (taken at BEGIN) is looked up afterwards with `pg_xact_status`, so
  a write is reported committed exactly when it is.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog
from prometheus_client import Counter
from sqlalchemy import Connection, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

log = structlog.get_logger("thorn.store")

COMMITS_IN_DOUBT = Counter(
    "thorn_store_commits_in_doubt_total",
    "Write transactions whose connection died during COMMIT, by what the server said of "
    "them afterwards (committed, aborted, unknown: not learnt in time, answered 503)",
    ["outcome"],
)

# The drivers THORN is built and tested with; a plain URL gets the async one.
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+pysqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+psycopg2": "postgresql+psycopg",
}
# Seconds a client should wait before retrying a request the database could not serve: a
# restart of a local server takes about one (docs/operations.md#postgresql).
RETRY_AFTER_S = 2


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """PostgreSQL connection pool and timeouts (SQLite has one file and no pool)."""

    size: int = 20  # connections kept open
    max_overflow: int = 10  # opened beyond `size` under load, closed when returned
    timeout_s: float = 10.0  # longest wait for a free connection; also for a COMMIT's outcome
    recycle_s: int = 1800  # a connection older than this is replaced at checkout
    statement_timeout_ms: int = 30_000  # the server cancels a statement after this; 0: never
    connect_timeout_s: int = 5  # longest wait to open a connection (libpq: whole seconds)


# --- opening ------------------------------------------------------------------------------


class DatabaseUnusable(Exception):
    """The database at `url` cannot serve as THORN's store; `transient`: it may later (it is
    unreachable or starting), else the setting itself is wrong."""

    def __init__(
        self,
        url: str,
        problem: str,
        reason: str,
        *,
        transient: bool = False,
        variable: str = "THORN_DATABASE_URL",
    ) -> None:
        super().__init__(reason)
        self.url = url  # password masked
        self.problem = problem
        self.reason = reason
        self.transient = transient
        self.variable = variable

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries whole
        return (_unusable, (self.url, self.problem, self.reason, self.transient, self.variable))

    def naming(self, variable: str) -> DatabaseUnusable:
        """The same problem, told as a fault of the setting `variable`."""
        return DatabaseUnusable(
            self.url, self.problem, self.reason, transient=self.transient, variable=variable
        )

    def __str__(self) -> str:
        return f"{self.variable}={self.url}: {self.reason}"


def _unusable(
    url: str, problem: str, reason: str, transient: bool, variable: str
) -> DatabaseUnusable:
    return DatabaseUnusable(url, problem, reason, transient=transient, variable=variable)


def masked(url: str | URL) -> str:
    """`url` with its password as ***; a URL that does not parse is masked by its shape."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (sa_exc.ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def parse_url(url: str) -> URL:
    """The URL with THORN's async driver for it; DatabaseUnusable if it is none of THORN's."""
    if not url.strip():
        raise DatabaseUnusable(
            "''", "unparseable",
            "set but empty: unset it for the SQLite file in THORN_DATA_DIR, or give a URL",
        )  # fmt: skip
    try:
        parsed = make_url(url)
        port = parsed.port  # a port that is not a number fails here
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise DatabaseUnusable(
            masked(url), "unparseable",
            f"not a database URL ({exc}); expected postgresql://user:password@host:5432/db "
            "or sqlite:///path/thorn.db",
        ) from None  # fmt: skip
    if port is not None and not 0 < port < 65536:
        raise DatabaseUnusable(masked(url), "unparseable", f"port {port} is not 1-65535")
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise DatabaseUnusable(
            masked(url), "unsupported_driver",
            f"driver '{parsed.drivername}' is not supported: use postgresql:// (psycopg) or "
            "sqlite:///",
        )  # fmt: skip
    return parsed.set(drivername=driver)


def database_url(url: str) -> str:
    """Pick the async driver for a plain SQLite or PostgreSQL URL."""
    return parse_url(url).render_as_string(hide_password=False)


def open_engine(url: str, pool: PoolSettings, name: str = "thorn") -> AsyncEngine:
    """The engine for `url`; `name` shows in pg_stat_activity as the application."""
    parsed = parse_url(url)
    if parsed.drivername.startswith("sqlite"):
        if parsed.database and parsed.database != ":memory:":
            try:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseUnusable(masked(parsed), "unusable_path", str(exc)) from None
        engine = create_async_engine(parsed, connect_args={"timeout": 30})
        _sqlite_pragmas(engine)
        return engine
    given = set(parsed.query)  # what the URL sets itself wins over the settings
    connect_args: dict[str, Any] = {
        "connect_timeout": pool.connect_timeout_s,
        "application_name": name,
        # A server that vanished (host down, network cut) is noticed in about 40 s of
        # silence instead of the kernel's two hours, on idle and busy connections alike.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    if "options" not in given:
        connect_args["options"] = f"-c statement_timeout={pool.statement_timeout_ms}"
    return create_async_engine(
        parsed,
        pool_size=pool.size,
        max_overflow=pool.max_overflow,
        pool_timeout=pool.timeout_s,
        pool_recycle=pool.recycle_s,
        pool_pre_ping=True,
        connect_args={k: v for k, v in connect_args.items() if k not in given},
    )


def refused_at_start(engine: AsyncEngine, exc: sa_exc.DBAPIError) -> DatabaseUnusable | None:
    """What a failed first connection says of the URL, or None when it is not about the
    connection (a bug, or a migration that failed)."""
    state = _sqlstate(exc)
    url = masked(engine.url)
    reason = _one_line(str(exc.orig), engine.url.password)
    # libpq reports a refusal during connection as text only, without its SQLSTATE.
    if state == "3D000" or re.search(r'FATAL: database ".*" does not exist', reason):
        return DatabaseUnusable(url, "no_such_database", reason)
    if state in ("28000", "28P01") or re.search(_AUTH_REFUSED, reason):
        return DatabaseUnusable(url, "authentication_failed", reason)
    if state in ("57P03", "53300") or re.search(_NOT_ACCEPTING, reason):
        return DatabaseUnusable(url, "not_accepting", reason, transient=True)
    if state is None and isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return DatabaseUnusable(url, "unreachable", reason, transient=True)
    return None


_AUTH_REFUSED = (
    r'FATAL: (password authentication failed|no pg_hba\.conf entry|role ".*" does not exist)'
    r"|fe_sendauth: no password supplied"
)
_NOT_ACCEPTING = (
    r"FATAL: (the database system is (starting up|shutting down|in recovery mode)"
    r"|sorry, too many clients)"
)


def _one_line(message: str, password: str | None) -> str:
    line = " ".join(message.split())
    return line.replace(password, "***") if password else line


# --- outages --------------------------------------------------------------------------------


class StoreUnavailable(Exception):
    """The store could not do it now; the same request may work in a moment."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


_OPERATIONAL = (
    sa_exc.OperationalError, sa_exc.InterfaceError, psycopg.OperationalError,
    psycopg.InterfaceError,
)  # fmt: skip
_REASONS = {
    "57014": "statement_timeout",  # query_canceled: the session's statement_timeout
    "55P03": "lock_timeout",
    "57P01": "connection",  # admin_shutdown: the server is stopping or restarting
    "57P02": "connection",  # crash_shutdown: another backend crashed
    "57P03": "connection",  # cannot_connect_now: starting up or shutting down
    "40001": "contention",  # serialization_failure
    "40P01": "contention",  # deadlock_detected
}


def unavailable(exc: BaseException) -> str | None:
    """Why `exc` means the database cannot serve this now (retry soon), or None when it
    means something else (a bug, bad data): those are not the client's to retry."""
    if isinstance(exc, StoreUnavailable):
        return exc.reason
    if isinstance(exc, sa_exc.TimeoutError):
        return "pool_timeout"  # every pooled connection stayed busy for the pool timeout
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return "connection"
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    state = getattr(orig, "sqlstate", None)
    if state == "25006":
        return "read_only"  # a standby, or a primary being demoted
    if not isinstance(exc, _OPERATIONAL) and not isinstance(orig, _OPERATIONAL):
        return None
    if state in _REASONS:
        return _REASONS[state]
    if isinstance(orig, psycopg.Error) and (state is None or state.startswith("08")):
        return "connection"  # lost, refused or timed out: no answer from the server
    if state is not None and state.startswith("53"):
        return "overloaded"  # too many connections, out of memory, disk full
    if state is None and "locked" in str(orig):
        return "locked"  # SQLite: another writer held the file past the busy timeout
    return "unavailable"


def _sqlstate(exc: sa_exc.DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, outcome_wait_s: float, base: AsyncEngine | None = None
) -> AsyncIterator[AsyncConnection]:
    """`async with` one transaction, committed at the end unless the body raises.

    On PostgreSQL a commit whose connection is lost is looked up on a new connection (of
    `base`, default `engine`) for up to `outcome_wait_s`: committed is success, aborted or
    never seen is StoreUnavailable, and so is not finding out in time (reason
    commit_unknown: the write may have happened)."""
    async with engine.connect() as conn:
        await conn.begin()
        xid = None
        if conn.dialect.name == "postgresql":
            xid = str((await conn.execute(text("SELECT pg_current_xact_id()"))).scalar_one())
        yield conn
        try:
            await conn.commit()
        except sa_exc.DBAPIError as exc:
            if xid is None or unavailable(exc) != "connection":
                raise
            committed = await _commit_outcome(base or engine, xid, outcome_wait_s)
            if committed:
                return
            raise StoreUnavailable(
                "connection", "the connection to the database was lost; nothing was written"
            ) from exc


async def _commit_outcome(engine: AsyncEngine, xid: str, within_s: float) -> bool:
    """Whether transaction `xid` committed, asked of the server until it answers (it may be
    restarting) for up to `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    status: str | None = None
    while True:
        try:
            async with engine.connect() as conn:
                status = (
                    await conn.execute(
                        text("SELECT pg_xact_status(CAST(:xid AS xid8))"), {"xid": xid}
                    )
                ).scalar()
        except sa_exc.DBAPIError as exc:
            if _sqlstate(exc) == "22023":
                # "transaction ID is in the future": nothing of it reached this server's WAL
                # (it crashed before, or this is a standby promoted without it).
                status = "aborted"
            elif unavailable(exc) is None:
                raise
            else:
                status = None  # still away
        if status in ("committed", "aborted"):
            COMMITS_IN_DOUBT.labels(status).inc()
            log.warning("commit_in_doubt_resolved", xid=xid, outcome=status)
            return status == "committed"
        # "in progress": that backend has not yet noticed its client is gone
        if loop.time() >= deadline:
            COMMITS_IN_DOUBT.labels("unknown").inc()
            log.error("commit_in_doubt_unresolved", xid=xid, waited_s=within_s)
            raise StoreUnavailable(
                "commit_unknown",
                "the connection to the database was lost during COMMIT and the database did "
                f"not say within {within_s:g} s whether it committed: read it back before "
                "retrying",
            )
        await asyncio.sleep(0.1)


def _sqlite_pragmas(engine: AsyncEngine) -> None:
    """Foreign keys on, WAL for concurrent readers, and real BEGINs for snapshot reads."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below drive transactions
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("thorn_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
