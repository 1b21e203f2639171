"""API tokens and the audit log in the store, as functions on one connection.

A token row holds the SHA-256 of its secret (never the secret), its expiry, when it was last
seen in use (written at most once a minute per token per process, by `thorn.auth`), and,
after a rotation, the old secret's digest until the overlap ends.

Audit entries come two ways: inside a write's own transaction (a committed topology write, a
token operation: `write_entry` with the write's connection), or in batches from a service's
`AuditWriter` (authentication failures, refused and failed writes, writes the store does not
record itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from thorn.model import AuditEntry, TokenPublic, TokenRole
from thorn.store.schema import AuditRow, TokenRow

TARGET_MAX = 256  # audit_log.target
CLIENT_MAX = 64  # audit_log.client


def aware(value: datetime | None) -> datetime | None:
    """A stored time as UTC-aware (SQLite hands back naive datetimes; THORN writes UTC)."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _iso(value: datetime | None) -> str | None:
    stamp = aware(value)
    return stamp.isoformat() if stamp is not None else None


# --- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What a secret's digest found: the token, and whether it was the token's old secret
    (kept after a rotation until `old_until`)."""

    name: str
    role: TokenRole
    expires_at: datetime | None = None
    old_secret: bool = False
    old_until: datetime | None = None


async def find(conn: AsyncConnection, token_hash: str) -> TokenRecord | None:
    either = or_(TokenRow.token_hash == token_hash, TokenRow.previous_hash == token_hash)
    query = select(
        TokenRow.name, TokenRow.role, TokenRow.expires_at, TokenRow.token_hash,
        TokenRow.previous_until,
    ).where(either)  # fmt: skip
    row = (await conn.execute(query)).first()
    if row is None:
        return None
    name, role, expires_at, current, previous_until = row
    old = current != token_hash
    return TokenRecord(
        name=name,
        role=TokenRole(role),
        expires_at=aware(expires_at),
        old_secret=old,
        old_until=aware(previous_until) if old else None,
    )


async def exists(conn: AsyncConnection, name: str) -> bool:
    query = select(TokenRow.id).where(TokenRow.name == name)
    return (await conn.execute(query)).first() is not None


async def insert_token(
    conn: AsyncConnection,
    name: str,
    role: TokenRole,
    token_hash: str,
    *,
    actor: str,
    at: datetime,
    expires_at: datetime | None,
) -> dict[str, Any]:
    row = {"name": name, "role": role.value, "token_hash": token_hash, "created_at": at,
           "created_by": actor, "expires_at": expires_at}  # fmt: skip
    await conn.execute(insert(TokenRow), row)
    return row


async def rekey(
    conn: AsyncConnection,
    name: str,
    token_hash: str,
    *,
    at: datetime,
    old_until: datetime | None,
    expires_at: datetime | None,
    role: TokenRole | None = None,
) -> dict[str, Any] | None:
    """Give `name` a new secret. The old one keeps working until `old_until` (None: it
    stops now). Returns the updated row, or None if there is no such token."""
    found = (await conn.execute(select(TokenRow).where(TokenRow.name == name))).mappings().first()
    if found is None:
        return None
    keep_old = old_until is not None and old_until > at
    values: dict[str, Any] = {
        "token_hash": token_hash,
        "rotated_at": at,
        "previous_hash": found["token_hash"] if keep_old else None,
        "previous_until": old_until if keep_old else None,
        "expires_at": expires_at,
    }
    if role is not None:
        values["role"] = role.value
    await conn.execute(update(TokenRow).where(TokenRow.name == name).values(**values))
    return {**found, **values}


async def mark_used(conn: AsyncConnection, used: Mapping[str, datetime]) -> None:
    """Record when each named token was last seen in use; never moves a time backwards
    (another replica may have written a later one)."""
    for name, at in used.items():
        await conn.execute(
            update(TokenRow)
            .where(TokenRow.name == name)
            .where(or_(TokenRow.last_used_at.is_(None), TokenRow.last_used_at < at))
            .values(last_used_at=at)
        )


async def listing(conn: AsyncConnection, now: datetime) -> list[TokenPublic]:
    rows = (await conn.execute(select(TokenRow).order_by(TokenRow.name))).mappings()
    return [public(dict(r), now) for r in rows]


def public(row: Mapping[str, Any], now: datetime) -> TokenPublic:
    expires_at = aware(row.get("expires_at"))
    old_until = aware(row.get("previous_until"))
    return TokenPublic(
        name=row["name"],
        role=TokenRole(row["role"]),
        created_at=_iso(row["created_at"]) or "",
        created_by=row["created_by"],
        expires_at=_iso(expires_at),
        expired=expires_at is not None and expires_at <= now,
        last_used_at=_iso(row.get("last_used_at")),
        rotated_at=_iso(row.get("rotated_at")),
        old_secret_until=_iso(old_until) if old_until is not None and old_until > now else None,
    )


# --- the audit log --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One audit entry to write. `outcome`: ok, refused, denied or failed (`AuditOutcome`)."""

    at: datetime
    actor: str
    action: str
    target: str
    outcome: str = "ok"
    client: str | None = None
    revision: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {
            "at": self.at, "actor": self.actor[:63], "action": self.action[:64],
            "target": self.target[:TARGET_MAX], "outcome": self.outcome,
            "client": self.client[:CLIENT_MAX] if self.client else None,
            "revision": self.revision, "detail": self.detail,
        }  # fmt: skip


async def write_entries(conn: AsyncConnection, records: Sequence[AuditRecord]) -> None:
    if records:
        await conn.execute(insert(AuditRow), [r.row() for r in records])


@dataclass(frozen=True, slots=True)
class AuditQuery:
    limit: int = 100
    offset: int = 0
    actor: str | None = None
    action: str | None = None  # a prefix
    outcome: str | None = None


async def read_entries(conn: AsyncConnection, query: AuditQuery) -> tuple[int, list[AuditEntry]]:
    where = []
    if query.actor is not None:
        where.append(AuditRow.actor == query.actor)
    if query.action is not None:
        where.append(AuditRow.action.startswith(query.action, autoescape=True))
    if query.outcome is not None:
        where.append(AuditRow.outcome == query.outcome)
    total = (
        await conn.execute(select(func.count()).select_from(AuditRow).where(*where))
    ).scalar_one()
    rows = (
        await conn.execute(
            select(AuditRow)
            .where(*where)
            .order_by(AuditRow.id.desc())
            .limit(query.limit)
            .offset(query.offset)
        )
    ).mappings()
    return total, [AuditEntry(**{**dict(r), "at": _iso(r["at"])}) for r in rows]
