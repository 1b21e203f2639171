"""thornctl failovers: each failover's hops, latencies and clocks, and tenants' RC budgets
against them (health's API)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import quote

import typer

from thornctl.context import All, Limit, Offset, fetch_page, since_value, state_of, when
from thornctl.render import declared, page_caption

failovers_app = typer.Typer(
    help="Failovers: each trace's hops, latencies and clocks (from health).",
    no_args_is_help=True,
)


class FailoverTier(StrEnum):
    switch = "switch"
    source = "source"
    central = "central"
    reprotection = "reprotection"


def _gap(item: dict[str, Any]) -> str:
    if item["gap_ms_upper_bound"] is not None:
        return f"<= {item['gap_ms_upper_bound']:.3f} ms"
    if item["gap_clocks_differ"]:
        return "clocks differ: " + ", ".join(item["gap_clocks"])
    return "-"


@failovers_app.command("list")
def failovers_list(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option("--node", help="With this source node.")] = None,
    tier: Annotated[FailoverTier | None, typer.Option("--tier", case_sensitive=False)] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Started after: 15m, 2h, 7d ago, or an ISO 8601 time."),
    ] = None,
    link: Annotated[int | None, typer.Option("--link", min=0, help="Naming this link.")] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """Failovers, one per trace, newest first (from health)."""
    state = state_of(ctx)
    page = fetch_page(
        state, "/failovers", limit, offset, everything, node=node,
        tier=tier.value if tier else None, since=since_value(since), link=link,
    )  # fmt: skip
    if state.out.data(page):
        return
    state.out.table(
        ["ID", "STARTED", "TIER", "SOURCES", "PAIRS", "LINK", "GAP"],
        ([f["id"], when(f["started"]), f["tier"], f["sources"],
          f["pairs_moved"] if f["tier"] != "reprotection" else "-",  # it rewrote nodes
          f["link_id"], _gap(f)] for f in page["items"]),
        caption=page_caption(page, "failovers"),
        no_wrap=2,
    )  # fmt: skip


def _hop_ms(hop: dict[str, Any]) -> str:
    if hop["ms"] is not None:
        return f"{hop['ms']:.3f}"
    return "clocks differ" if hop["clocks_differ"] else "-"


def _after(hops: list[dict[str, Any]], hop: dict[str, Any]) -> str | None:
    return None if hop["after"] is None else f"{hop['after']} {hops[hop['after']]['step']}"


def _reprotected(shown: dict[str, Any]) -> str:
    ms = shown.get("reprotected_ms")
    if ms is None:
        return "not recorded"
    return f"{ms:.1f} ms after pathcomp heard of it ({shown['reprotected_nodes']} nodes rewritten)"


@failovers_app.command("show")
def failovers_show(
    ctx: typer.Context,
    failover_id: Annotated[str, typer.Argument(metavar="ID", help="A failover's (trace) id.")],
) -> None:
    """One failover: every hop with its latency and whose clock read it, and what moved."""
    state = state_of(ctx)
    shown: dict[str, Any] = state.client.get(f"/failovers/{quote(failover_id, safe='')}")
    if state.out.data(shown):
        return
    out = state.out
    out.fields(
        [
            ("id", shown["id"]),
            ("started", f"{when(shown['started'])} ({shown['started_clock']}'s clock)"),
            ("tier", shown["tier"]),
            ("link", shown.get("link_id")),
            ("reason", shown["reason"]),
            ("pairs moved", shown["pairs_moved"]),
            ("gap", _gap(shown)),
            ("re-protected", _reprotected(shown)),
            ("RC budget", _budget_line(shown)),
        ],
        title=f"Failover {shown['id']}",
    )
    hops: list[dict[str, Any]] = shown["hops"]
    if hops:
        out.line()
        out.table(
            ["#", "STEP", "AT", "CLOCK", "+MS", "AFTER"],
            ([i, h["step"], when(h["at"], "%H:%M:%S.%f"), h["clock"], _hop_ms(h), _after(hops, h)]
             for i, h in enumerate(hops)),
            caption="+MS: since the hop it followed, only when one clock read both",
            no_wrap=3,
        )  # fmt: skip
    out.line()
    out.table(
        ["NODE", "PEERS", "FROM", "TO", "TIER", "KERNEL MS"],
        ([m["node"], m["peers"], m["from_colour"], m["to_colour"], m["tier"],
          f"{m['kernel_ms']:.3f}"] for m in shown["moved"]),
    )  # fmt: skip
    verdicts: list[dict[str, Any]] = shown.get("rc_budget") or []
    if verdicts:
        out.line()
        out.table(
            ["TENANT", "NCCL_IB_TIMEOUT", "RETRY_CNT", "STATUS", "VERDICT"],
            ([v["tenant"], declared(v["budget"], "nccl_ib_timeout"),
              declared(v["budget"], "nccl_ib_retry_cnt"), v["status"], v["summary"]]
             for v in verdicts),
            caption="each tenant whose pairs it moved, against its RC budget; (default): not"
            " declared, NCCL's default applies",
        )  # fmt: skip


_SEVERITY = ["unmeasured", "within_one_timeout", "retransmits", "exceeds_retry_budget"]


def _budget_line(shown: dict[str, Any]) -> str:
    """One line on the verdicts: how many tenants, and the worst status among them."""
    verdicts: list[dict[str, Any]] = shown.get("rc_budget") or []
    if shown["tier"] == "reprotection":
        return "- (moved no pair)"
    if not verdicts:
        return "no tenant's workloads on the pairs it moved"
    worst = max((v["status"] for v in verdicts), key=_SEVERITY.index)
    return f"{len(verdicts)} tenant(s), worst: {worst} (below)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@failovers_app.command("budget")
def failovers_budget(
    ctx: typer.Context,
    tenant: Annotated[
        str | None, typer.Argument(help="One tenant (default: every tenant).", show_default=False)
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Failovers started after: 15m, 2h, 7d ago, or ISO 8601."),
    ] = None,
    failovers: Annotated[
        int | None,
        typer.Option("--failovers", min=1, max=10_000, help="At most this many, the newest."),
    ] = None,
) -> None:
    """Each tenant's RC budget against the failovers that touched it (default: the last 7
    days): p50, p99, and a warning when the budget is tighter than the p99."""
    state = state_of(ctx)
    params: dict[str, Any] = {"since": since_value(since), "failovers": failovers}
    if tenant is not None:
        items = [state.client.get(f"/failovers/budget/{quote(tenant, safe='')}", **params)]
        shown: Any = items[0]
    else:
        shown = fetch_page(state, "/failovers/budget", None, None, True, **params)
        items = shown["items"]
    if state.out.data(shown):
        return
    state.out.table(
        ["TENANT", "NCCL_IB_TIMEOUT", "RETRY_CNT", "RC TIMEOUT MS", "FAILOVERS", "MEASURED",
         "P50 MS", "P99 MS", "STATUS"],
        ([s["tenant"], declared(s["budget"], "nccl_ib_timeout"),
          declared(s["budget"], "nccl_ib_retry_cnt"), f"{s['budget']['rc_timeout_ms']:.3f}",
          s["failovers"], s["measured"], _ms(s["p50_ms"]), _ms(s["p99_ms"]), s["status"]]
         for s in items),
        caption="(default): not declared, NCCL's default applies",
    )  # fmt: skip
    for s in items:
        state.out.line(f"{s['tenant']}: {s['summary']}")
    for s in items:
        if s["warning"]:
            state.out.warn(f"{s['tenant']}: {s['warning']}")
