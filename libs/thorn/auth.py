"""Bearer tokens with roles. Tokens are random, so a SHA-256 digest is a safe stored form.

A token is `thn_` and 43 characters of the URL-safe base64 alphabet (32 random bytes). A
secret of any other shape is refused (401) before anything is looked up, so junk never
reaches the database. A known token may have expired, or be the old secret of a rotated
token whose overlap has ended: both 401, saying so. Every refusal is noted for the audit
trail (`thorn.audit`) and counted (thorn_auth_failures_total{reason}).

Last use: each process notes a token's use at most once a minute (`TokenUsage`) and writes
those notes in the background, so authentication never waits for a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import structlog
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter

from thorn.audit import AuditNote, keeping_audit, note_of
from thorn.model import TokenRole
from thorn.store.tokens import TokenRecord

if TYPE_CHECKING:
    from thorn.store import Store

TOKEN_PREFIX = "thn_"
TOKEN_SECRET_CHARS = 43  # secrets.token_urlsafe(32)
TOKEN_PATTERN = re.compile(rf"{TOKEN_PREFIX}[A-Za-z0-9_-]{{{TOKEN_SECRET_CHARS}}}")
TOKEN_FORMAT = f"'{TOKEN_PREFIX}' and {TOKEN_SECRET_CHARS} characters of A-Z, a-z, 0-9, '_', '-'"
BOOTSTRAP_TOKEN_NAME = "bootstrap-admin"
LAST_USED_EVERY_S = 60.0  # a token's last use is written at most this often per process

TokenLookup = Callable[[str], Awaitable[TokenRecord | None]]

FAILURES = Counter(
    "thorn_auth_failures_total",
    "Requests refused by authentication (401) or for the token's role (403), by reason: "
    "missing, malformed, unknown, expired, rotated, forbidden",
    ["reason"],
)
log = structlog.get_logger("thorn.auth")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name (written to the audit log), its role, the client's
    address and the request's audit note (None outside a request: internal writers)."""

    name: str
    role: TokenRole
    client: str | None = None
    audit: AuditNote | None = None


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def well_formed(token: str) -> bool:
    """A secret THORN could have made (`new_token`); anything else cannot be a token."""
    return TOKEN_PATTERN.fullmatch(token) is not None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def refusal(record: TokenRecord | None, now: datetime) -> tuple[str, str] | None:
    """Why a looked-up secret is refused at `now` (reason, message), or None: accepted."""
    if record is None:
        return "unknown", "invalid or revoked token"
    if record.old_secret and (record.old_until is None or record.old_until <= now):
        when = f" at {record.old_until.isoformat()}" if record.old_until else ""
        return "rotated", (
            f"token '{record.name}' was rotated: this secret stopped working{when}; "
            "use its new secret"
        )
    if record.expires_at is not None and record.expires_at <= now:
        return "expired", f"token '{record.name}' expired at {record.expires_at.isoformat()}"
    return None


_bearer = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer thn_...`")


def _refuse(
    request: Request, code: int, reason: str, message: str, actor: str | None = None
) -> HTTPException:
    FAILURES.labels(reason).inc()
    note = note_of(request.scope)
    if note is not None:
        note.denied = reason
        note.actor = actor or note.actor
    headers = {"WWW-Authenticate": "Bearer"} if code == status.HTTP_401_UNAUTHORIZED else None
    return HTTPException(code, message, headers=headers)


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    unauthorized = status.HTTP_401_UNAUTHORIZED
    if credentials is None:
        msg = "missing bearer token: send 'Authorization: Bearer <token>'"
        raise _refuse(request, unauthorized, "missing", msg)
    secret = credentials.credentials
    if not well_formed(secret):
        msg = f"malformed token: a THORN token is {TOKEN_FORMAT}"
        raise _refuse(request, unauthorized, "malformed", msg)
    lookup: TokenLookup = request.app.state.token_lookup
    record = await lookup(hash_token(secret))
    now = datetime.now(UTC)
    refused = refusal(record, now)
    if refused is not None:
        reason, msg = refused
        raise _refuse(request, unauthorized, reason, msg, record.name if record else None)
    assert record is not None
    usage: TokenUsage | None = getattr(request.app.state, "token_usage", None)
    if usage is not None:
        usage.seen(record.name, now)
    note = note_of(request.scope)
    if note is not None:
        note.actor = record.name
    client = request.client.host if request.client else None
    return Principal(record.name, record.role, client, note)


def require(role: TokenRole) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits tokens with `role` or a stronger one."""

    async def check(
        request: Request, principal: Annotated[Principal, Depends(current_principal)]
    ) -> Principal:
        if not principal.role.allows(role):
            raise _refuse(
                request, status.HTTP_403_FORBIDDEN, "forbidden",
                f"token '{principal.name}' has role {principal.role.value}; "
                f"this needs {role.value} or higher",
                principal.name,
            )  # fmt: skip
        return principal

    return check


def forbidden(request: Request, principal: Principal, message: str) -> HTTPException:
    """A 403 for a rule beyond the role check (e.g. a token may rotate only itself)."""
    return _refuse(request, status.HTTP_403_FORBIDDEN, "forbidden", message, principal.name)


Viewer = Annotated[Principal, Depends(require(TokenRole.viewer))]
Operator = Annotated[Principal, Depends(require(TokenRole.operator))]
Admin = Annotated[Principal, Depends(require(TokenRole.admin))]


class TokenUsage:
    """When tokens were last used: each token's use is noted at most once per `every_s`
    (per process), and the notes are written in the background (`run`)."""

    def __init__(self, every_s: float = LAST_USED_EVERY_S) -> None:
        self.every_s = every_s
        self._noted: dict[str, datetime] = {}
        self._pending: dict[str, datetime] = {}

    def seen(self, name: str, now: datetime) -> None:
        last = self._noted.get(name)
        if last is None or (now - last).total_seconds() >= self.every_s:
            self._noted[name] = now
            self._pending[name] = now

    def take(self) -> dict[str, datetime]:
        """The uses to write now (and forget)."""
        taken, self._pending = self._pending, {}
        return taken

    def put_back(self, taken: dict[str, datetime]) -> None:
        """Uses a failed write could not record: kept unless a later one came since."""
        for name, at in taken.items():
            if name not in self._pending:
                self._pending[name] = at

    async def run(self, store: Store, every_s: float = 5.0) -> None:
        """Write the noted uses every `every_s` until cancelled; a failed write is retried."""
        while True:
            await asyncio.sleep(every_s)
            await self.write(store)

    async def write(self, store: Store) -> None:
        taken = self.take()
        try:
            await store.tokens_used(taken)
        except Exception as exc:
            self.put_back(taken)
            log.debug("token_last_used_not_written", error=type(exc).__name__)


@asynccontextmanager
async def guarding(app: FastAPI, store: Store) -> AsyncIterator[None]:
    """Tokens checked against `store`, their last use and the audit trail written to it, for
    `app`'s lifetime (its lifespan enters this). The app needs the `AuditTrail` middleware
    (`thorn.audit`) for the trail."""
    app.state.token_lookup = store.token_by_hash
    usage = TokenUsage()
    app.state.token_usage = usage
    async with keeping_audit(store, app.state):
        task = asyncio.create_task(usage.run(store), name="token-last-used")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(Exception):
                await asyncio.wait_for(usage.write(store), timeout=5.0)
