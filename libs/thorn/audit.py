"""The audit trail every service keeps: each write request and each refused authentication.

Two ways into the audit log (`audit_log` in the store):

- A write the store commits writes its own entry in the same transaction (topology writes,
  token operations), so an entry exists exactly when the write does.
- Everything else is written here, after the answer, from what the request's handling noted
  (`AuditNote`): authentication failures (401) and role refusals (403) on any method, and
  every POST, PUT, PATCH or DELETE whose entry the store did not write (refused with a 4xx,
  failed, changed nothing, a dry run, an action that is not a store write such as a plan
  recompute). The `AuditTrail` middleware sees every request under /api/, so a new write
  route cannot be forgotten.

Entries of the second kind are queued and written in batches by `AuditWriter`, off the
request's path: a refused token is answered 401 at once, without waiting for (or reaching)
the database. The queue is bounded; beyond it, entries are counted per (action, outcome,
client) and written as one summarising entry each (`detail.count`), so a flood of bad
requests cannot grow memory or the table without bound. Entries still queued when a process
dies are lost (thorn_audit_pending says how many wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import Counter, Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thorn.events import utcnow
from thorn.model import AuditOutcome
from thorn.store.tokens import AuditRecord

if TYPE_CHECKING:
    from thorn.store import Store

log = structlog.get_logger("thorn.audit")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ANONYMOUS = "anonymous"  # the actor of a request whose token was not recognised
SUMMARY_ACTOR = "audit"  # the actor of an entry that counts others (the queue was full)
# Actors the log names that are no token: a token may not take one of these names.
NOT_TOKENS = frozenset({ANONYMOUS, SUMMARY_ACTOR, "system", "cabling-check"})
MAX_PENDING = 10_000  # entries queued before new ones are only counted
MAX_SUMMARIES = 1_000  # (action, outcome, client) keys counted beyond that; more are dropped
FLUSH_EVERY_S = 1.0
BATCH = 500
ERROR_TEXT_MAX = 300  # of a refused request's `detail`, kept in the entry

ENTRIES = Counter(
    "thorn_audit_entries_total",
    "Audit entries queued by this process (beside those written with a write), by outcome",
    ["outcome"],
)
SUMMARISED = Counter(
    "thorn_audit_summarised_total",
    "Audit entries counted into a summarising entry because the queue was full",
)
DROPPED = Counter(
    "thorn_audit_dropped_total",
    "Audit entries lost: the queue and its summaries were full",
)
WRITE_FAILURES = Counter(
    "thorn_audit_write_failures_total",
    "Failed attempts to write queued audit entries (they stay queued and are retried)",
)
PENDING = Gauge("thorn_audit_pending", "Audit entries queued, not yet written")


@dataclass
class AuditNote:
    """What handling one request tells the audit trail. Set by the auth dependencies and
    the write paths; read by `AuditTrail` once the answer is sent."""

    actor: str | None = None  # the authenticated token's name (or the refused one's, if known)
    action: str | None = None  # e.g. node.create; default: "<METHOD> <route>"
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    recorded: bool = False  # the store wrote the entry with the write itself
    denied: str | None = None  # why authentication or the role refused the request


def note_of(scope: Scope) -> AuditNote | None:
    state = scope.get("state")
    note = state.get("audit") if isinstance(state, dict) else None
    return note if isinstance(note, AuditNote) else None


def outcome_of(status: int) -> AuditOutcome:
    if status in (401, 403):
        return "denied"
    if 400 <= status < 500:
        return "refused"
    if status >= 500 or status == 0:
        return "failed"
    return "ok"


def entry_for(
    method: str,
    path: str,
    route: str | None,
    status: int,
    note: AuditNote,
    *,
    client: str | None,
    at: datetime,
    error: str | None = None,
) -> AuditRecord | None:
    """The entry a request leaves (None: none, or the store wrote it with the write)."""
    if note.recorded:
        return None
    actor = note.actor or ANONYMOUS
    if status in (401, 403):
        action = "auth.failure" if status == 401 else "auth.forbidden"
        detail: dict[str, Any] = {"reason": note.denied or "refused", "status": status}
        return AuditRecord(at=at, actor=actor, action=action, target=f"{method} {path}",
                           outcome="denied", client=client, detail=detail)  # fmt: skip
    if method not in WRITE_METHODS:
        return None
    detail = {**note.detail, "status": status}
    if error:
        detail["error"] = error[:ERROR_TEXT_MAX]
    return AuditRecord(
        at=at, actor=actor, action=note.action or f"{method} {route or path}",
        target=note.target or path, outcome=outcome_of(status), client=client, detail=detail,
    )  # fmt: skip


class AuditWriter:
    """Queues audit entries and writes them in batches, in the background (`run`)."""

    def __init__(
        self, store: Store, *, max_pending: int = MAX_PENDING, clock: Callable[[], datetime]
    ) -> None:
        self.store = store
        self.max_pending = max_pending
        self.clock = clock
        self._pending: list[AuditRecord] = []
        self._summaries: dict[tuple[str, str, str | None], int] = {}
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._failing = False

    def add(self, record: AuditRecord) -> None:
        ENTRIES.labels(record.outcome).inc()
        if len(self._pending) < self.max_pending:
            self._pending.append(record)
        else:
            key = (record.action, record.outcome, record.client)
            if key in self._summaries or len(self._summaries) < MAX_SUMMARIES:
                self._summaries[key] = self._summaries.get(key, 0) + 1
                SUMMARISED.inc()
            else:
                DROPPED.inc()
        PENDING.set(self.pending)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending) + sum(self._summaries.values())

    def _summary_records(self) -> list[AuditRecord]:
        at = self.clock()
        records = []
        for (action, outcome, client), count in self._summaries.items():
            detail = {"count": count, "summarised": True}
            records.append(AuditRecord(at=at, actor=SUMMARY_ACTOR, action=action,
                                       target="(queue full)", outcome=outcome, client=client,
                                       detail=detail))  # fmt: skip
        return records

    async def flush(self) -> None:
        """Write everything queued; on a failure, keep it queued and raise."""
        async with self._flushing:  # one writer at a time: a batch is written once
            await self._flush()

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[:BATCH]
            await self.store.append_audit(batch)
            del self._pending[: len(batch)]
            PENDING.set(self.pending)
        if self._summaries:
            records = self._summary_records()
            await self.store.append_audit(records)
            self._summaries.clear()
            PENDING.set(self.pending)

    async def run(self, every_s: float = FLUSH_EVERY_S) -> None:
        """Write queued entries every `every_s` (or sooner once some are queued), until
        cancelled. A database that fails is retried the next time; said once per outage."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=every_s)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:
                WRITE_FAILURES.inc()
                if not self._failing:
                    log.warning("audit_write_failed", pending=self.pending,
                                error=" ".join(str(exc).split())[:300])  # fmt: skip
                self._failing = True
            else:
                if self._failing:
                    log.info("audit_write_resumed")
                self._failing = False
            await asyncio.sleep(every_s / 4)  # batches entries that arrive together


class AuditTrail:
    """ASGI middleware: after each request under /api/, the entry `entry_for` makes of it,
    queued on the app's `AuditWriter` (`app.state.audit_writer`; none: nothing is kept)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        note = AuditNote()
        scope.setdefault("state", {})["audit"] = note
        status = 0
        body = bytearray()

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400 and len(body) < 4096:
                body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self._keep(scope, status, note, bytes(body))

    @staticmethod
    def _keep(scope: Scope, status: int, note: AuditNote, body: bytes) -> None:
        app = scope.get("app")
        writer: AuditWriter | None = getattr(getattr(app, "state", None), "audit_writer", None)
        if writer is None:
            return
        client = scope.get("client")
        route = getattr(scope.get("route"), "path", None)
        record = entry_for(
            scope["method"], scope["path"], route, status or 500, note,
            client=client[0] if client else None, at=writer.clock(), error=_detail(body),
        )  # fmt: skip
        if record is not None:
            writer.add(record)


def _detail(body: bytes) -> str | None:
    """The `detail` line of an error body (THORN's ErrorBody), if it is one."""
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    detail = parsed.get("detail") if isinstance(parsed, dict) else None
    return detail if isinstance(detail, str) else None


@asynccontextmanager
async def keeping_audit(store: Store, app_state: Any) -> AsyncIterator[AuditWriter]:
    """Run an `AuditWriter` for the app whose state is `app_state` until the block ends;
    whatever is still queued then is written (if the database lets it)."""
    writer = AuditWriter(store, clock=utcnow)
    app_state.audit_writer = writer
    task = asyncio.create_task(writer.run(), name="audit-writer")
    try:
        yield writer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await asyncio.wait_for(writer.flush(), timeout=5.0)
        except Exception as exc:
            log.warning("audit_lost_at_stop", pending=writer.pending, error=type(exc).__name__)
