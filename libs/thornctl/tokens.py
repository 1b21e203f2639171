"""thornctl tokens and audit: API tokens (admin) and the audit log (operator)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from thorn.model import TokenRole
from thornctl.context import All, Limit, Offset, fetch_page, state_of
from thornctl.render import page_caption

commands = typer.Typer()  # its top-level commands, added to thornctl's root by main.py
tokens_app = typer.Typer(help="API tokens (admin role).", no_args_is_help=True)


# --- tokens and audit ------------------------------------------------------------------------


@tokens_app.command("list")
def tokens_list(ctx: typer.Context) -> None:
    """List tokens (never their secrets)."""
    state = state_of(ctx)
    page = fetch_page(state, "/tokens", None, None, True)
    if state.out.data(page):
        return
    tokens: list[dict[str, Any]] = page["items"]
    state.out.table(
        ["NAME", "ROLE", "CREATED", "CREATED BY"],
        ([t["name"], t["role"], t["created_at"], t["created_by"]] for t in tokens),
        caption=f"{len(tokens)} tokens",
    )


@tokens_app.command("create")
def tokens_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Token name (shown in the audit log).")],
    role: Annotated[TokenRole, typer.Option("--role", "-r", case_sensitive=False)],
) -> None:
    """Create a token and print its secret: the only time it is shown."""
    state = state_of(ctx)
    created: dict[str, Any] = state.client.post(
        "/tokens", json_body={"name": name, "role": role.value}
    )
    if state.out.data(created):
        return
    out = state.out
    out.line(f"Created token '{created['name']}' with role {created['role']}.")
    out.line("Its secret, shown only this once (THORN keeps only a hash):")
    out.line()
    out.console.print(f"    {created['token']}", style="bold", markup=False, soft_wrap=True)
    out.line()
    out.line("Use it as: THORN_TOKEN=<secret> thornctl ...  or  thornctl --token <secret> ...")


@tokens_app.command("revoke")
def tokens_revoke(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Revoke a token: it stops working at once."""
    state = state_of(ctx)
    result = state.client.delete(f"/tokens/{quote(name, safe='')}")
    if not state.out.data(result):
        state.out.line(f"Revoked token '{name}'.")


@commands.command()
def audit(
    ctx: typer.Context,
    actor: Annotated[str | None, typer.Option("--actor", help="Token name.")] = None,
    action: Annotated[
        str | None, typer.Option("--action", help="Prefix, e.g. 'link.' or 'node.create'.")
    ] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """The audit log, newest first (operator role)."""
    state = state_of(ctx)
    page = fetch_page(state, "/audit", limit, offset, everything, actor=actor, action=action)
    if state.out.data(page):
        return
    state.out.table(
        ["ID", "AT", "ACTOR", "ACTION", "TARGET", "REVISION", "DETAIL"],
        (
            [
                e["id"],
                e["at"],
                e["actor"],
                e["action"],
                e["target"],
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
