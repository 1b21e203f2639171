"""thornctl tenants: tenants and the RC budget (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT) of
their jobs."""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import quote

import typer

from thornctl.context import All, Limit, Offset, fetch_page, state_of
from thornctl.render import Out, declared, page_caption

_INT = re.compile(r"[+-]?\d+")

tenants_app = typer.Typer(
    help="Tenants and the RC budget (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT) of their jobs.",
    no_args_is_help=True,
)


def _tenant_rows(t: dict[str, Any]) -> list[Any]:
    budget = t["rc_budget"]
    return [t["name"], declared(budget, "nccl_ib_timeout"),
            declared(budget, "nccl_ib_retry_cnt"), f"{budget['rc_timeout_ms']:.3f}",
            f"{budget['retry_budget_ms']:.3f}", t["description"]]  # fmt: skip


_TENANT_COLUMNS = [
    "NAME", "NCCL_IB_TIMEOUT", "RETRY_CNT", "RC TIMEOUT MS", "RETRY BUDGET MS", "DESCRIPTION"
]  # fmt: skip


@tenants_app.command("list")
def tenants_list(
    ctx: typer.Context, limit: Limit = None, offset: Offset = None, everything: All = False
) -> None:
    """Tenants with the RC budget of their jobs ((default): not declared, NCCL's)."""
    state = state_of(ctx)
    page = fetch_page(state, "/tenants", limit, offset, everything)
    if state.out.data(page):
        return
    state.out.table(
        _TENANT_COLUMNS, (_tenant_rows(t) for t in page["items"]),
        caption=page_caption(page, "tenants"),
    )  # fmt: skip


@tenants_app.command("show")
def tenants_show(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """One tenant and its RC budget."""
    state = state_of(ctx)
    shown: dict[str, Any] = state.client.get(f"/tenants/{quote(name, safe='')}")
    if not state.out.data(shown):
        _show_tenant(state.out, shown)


def _show_tenant(out: Out, t: dict[str, Any]) -> None:
    budget = t["rc_budget"]
    out.fields(
        [
            ("description", t["description"]),
            ("NCCL_IB_TIMEOUT", declared(budget, "nccl_ib_timeout")),
            ("NCCL_IB_RETRY_CNT", declared(budget, "nccl_ib_retry_cnt")),
            ("one RC timeout", f"{budget['rc_timeout_ms']:.3f} ms"),
            ("last retransmission", f"{budget['last_retransmission_ms']:.3f} ms after a loss"),
            ("retry budget", f"{budget['retry_budget_ms']:.3f} ms (then IBV_WC_RETRY_EXC_ERR)"),
        ],
        title=f"Tenant {t['name']}",
    )


def budget_value(raw: str | None, option: str) -> int | str | None:
    """--timeout / --retry-cnt: a whole number, or `default` (undeclared: NCCL's default).
    None: not given. The server checks the range and names the field."""
    if raw is None:
        return None
    text = raw.strip().lower()
    if text == "default":
        return "default"
    if not _INT.fullmatch(text):
        raise typer.BadParameter(f"'{raw}' is not a whole number or 'default'", param_hint=option)
    return int(text)


@tenants_app.command("budget")
def tenants_budget(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", metavar="N|default", help="NCCL_IB_TIMEOUT of its jobs, 1-31."),
    ] = None,
    retry_cnt: Annotated[
        str | None,
        typer.Option("--retry-cnt", metavar="N|default", help="NCCL_IB_RETRY_CNT, 0-7."),
    ] = None,
) -> None:
    """Declare the NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT a tenant's jobs run with (admin role);
    `default` returns one to undeclared (NCCL's default)."""
    state = state_of(ctx)
    body: dict[str, Any] = {}
    for key, raw, option in (
        ("nccl_ib_timeout", timeout, "--timeout"),
        ("nccl_ib_retry_cnt", retry_cnt, "--retry-cnt"),
    ):
        value = budget_value(raw, option)
        if value is not None:
            body[key] = None if value == "default" else value
    if not body:
        raise typer.BadParameter("give --timeout, --retry-cnt or both", param_hint="--timeout")
    shown: dict[str, Any] = state.client.patch(f"/tenants/{quote(name, safe='')}", body)
    if not state.out.data(shown):
        _show_tenant(state.out, shown)
