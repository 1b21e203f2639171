"""thornctl tokens and audit: API tokens (admin) and the audit log (operator)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

import typer

from thorn.model import TokenRole
from thornctl.context import All, Limit, Offset, fetch_page, state_of, when
from thornctl.render import Out, page_caption


class AuditOutcomeChoice(StrEnum):
    ok = "ok"
    refused = "refused"
    denied = "denied"
    failed = "failed"


commands = typer.Typer()  # its top-level commands, added to thornctl's root by main.py
tokens_app = typer.Typer(help="API tokens (admin role).", no_args_is_help=True)


# --- tokens and audit ------------------------------------------------------------------------


_DURATION = re.compile(r"^(\d{1,9})([smhdw]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def duration_seconds(value: str | None, option: str) -> int | None:
    """`90s`, `15m`, `12h`, `30d`, `2w`, or plain seconds; BadParameter naming `option`."""
    if value is None:
        return None
    found = _DURATION.match(value.strip())
    if found is None:
        raise typer.BadParameter(
            f"{value!r} is not a duration (e.g. 90s, 15m, 12h, 30d, 2w)", param_hint=option
        )
    return int(found.group(1)) * _SECONDS[found.group(2)]


Ttl = Annotated[
    str | None,
    typer.Option("--ttl", help="Expires this long from now: 90m, 12h, 30d, 2w (at least 60s)."),
]
ExpiresAt = Annotated[
    str | None,
    typer.Option("--expires-at", help="Expires at this ISO 8601 time, with a time zone."),
]


def _expiry(ttl: str | None, expires_at: str | None) -> dict[str, Any]:
    if ttl is not None and expires_at is not None:
        raise typer.BadParameter("give --ttl or --expires-at, not both", param_hint="--ttl")
    if ttl is not None:
        return {"ttl_seconds": duration_seconds(ttl, "--ttl")}
    return {"expires_at": expires_at} if expires_at is not None else {}


@tokens_app.command("list")
def tokens_list(ctx: typer.Context) -> None:
    """List tokens (never their secrets): expiry, last use (to within a minute), rotation."""
    state = state_of(ctx)
    page = fetch_page(state, "/tokens", None, None, True)
    if state.out.data(page):
        return
    tokens: list[dict[str, Any]] = page["items"]
    state.out.table(
        ["NAME", "ROLE", "CREATED", "CREATED BY", "EXPIRES", "LAST USED", "OLD SECRET UNTIL"],
        (
            [
                t["name"], t["role"], _at(t["created_at"]), t["created_by"],
                _at(t.get("expires_at")) + (" (expired)" if t.get("expired") else ""),
                _at(t.get("last_used_at")), _at(t.get("old_secret_until")),
            ]
            for t in tokens
        ),
        caption=f"{len(tokens)} tokens",
    )  # fmt: skip


def _at(iso: str | None) -> str:
    return when(iso, "%Y-%m-%d %H:%M:%SZ") if iso else "-"


@tokens_app.command("create")
def tokens_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Token name (shown in the audit log).")],
    role: Annotated[TokenRole, typer.Option("--role", "-r", case_sensitive=False)],
    ttl: Ttl = None,
    expires_at: ExpiresAt = None,
) -> None:
    """Create a token and print its secret: the only time it is shown. Without --ttl or
    --expires-at it never expires."""
    state = state_of(ctx)
    body = {"name": name, "role": role.value, **_expiry(ttl, expires_at)}
    created: dict[str, Any] = state.client.post("/tokens", json_body=body)
    if state.out.data(created):
        return
    expires = f", expiring {_at(created['expires_at'])}" if created.get("expires_at") else ""
    state.out.line(f"Created token '{created['name']}' with role {created['role']}{expires}.")
    _show_secret(state.out, created["token"])


@tokens_app.command("rotate")
def tokens_rotate(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The token to give a new secret.")],
    overlap: Annotated[
        str,
        typer.Option(
            "--overlap",
            help="How long the old secret keeps working: 0, 10m, 1h, 2d (at most a week).",
        ),
    ] = "1h",
    ttl: Ttl = None,
    expires_at: ExpiresAt = None,
) -> None:
    """Give a token a new secret and print it (shown only this once). The old secret keeps
    working for --overlap, then stops. An admin may rotate any token, any token itself."""
    state = state_of(ctx)
    body = {"overlap_seconds": duration_seconds(overlap, "--overlap"), **_expiry(ttl, expires_at)}
    rotated: dict[str, Any] = state.client.post(
        f"/tokens/{quote(name, safe='')}/rotate", json_body=body
    )
    if state.out.data(rotated):
        return
    old = rotated.get("old_secret_until")
    until = f"works until {_at(old)}" if old else "stopped working now"
    state.out.line(f"Rotated token '{rotated['name']}': its old secret {until}.")
    _show_secret(state.out, rotated["token"])


def _show_secret(out: Out, secret: str) -> None:
    out.line("Its secret, shown only this once (THORN keeps only a hash):")
    out.line()
    out.console.print(f"    {secret}", style="bold", markup=False, soft_wrap=True)
    out.line()
    out.line("Use it as: THORN_TOKEN=<secret> thornctl ...  or  thornctl --token <secret> ...")


@tokens_app.command("revoke")
def tokens_revoke(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Revoke a token: it stops working at once (its old secret too, during a rotation)."""
    state = state_of(ctx)
    result = state.client.delete(f"/tokens/{quote(name, safe='')}")
    if not state.out.data(result):
        state.out.line(f"Revoked token '{name}'.")


@commands.command()
def audit(
    ctx: typer.Context,
    actor: Annotated[str | None, typer.Option("--actor", help="Token name.")] = None,
    action: Annotated[
        str | None,
        typer.Option("--action", help="Prefix, e.g. 'link.', 'node.create' or 'auth.'."),
    ] = None,
    outcome: Annotated[
        AuditOutcomeChoice | None,
        typer.Option("--outcome", help="ok, refused, denied (401/403) or failed."),
    ] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """The audit log, newest first (operator role)."""
    state = state_of(ctx)
    page = fetch_page(state, "/audit", limit, offset, everything, actor=actor, action=action,
                      outcome=outcome.value if outcome else None)  # fmt: skip
    if state.out.data(page):
        return
    state.out.table(
        ["ID", "AT", "ACTOR", "CLIENT", "ACTION", "TARGET", "OUTCOME", "REVISION", "DETAIL"],
        (
            [
                e["id"],
                e["at"],
                e["actor"],
                e.get("client") or "-",
                e["action"],
                e["target"],
                e.get("outcome", "ok"),
                e.get("revision"),
                _short(e.get("detail") or {}),
            ]
            for e in page["items"]
        ),
        caption=page_caption(page, "entries"),
        no_wrap=2,
    )


def _short(detail: dict[str, Any], width: int = 60) -> str:
    text = ", ".join(f"{k}={v}" for k, v in detail.items())
    return text if len(text) <= width else text[: width - 1] + "…"
