"""thornctl health: links' health, their failures over time and the BFD sessions agents
report (health's API, through the one URL)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from thornctl.context import All, Limit, Offset, Since, fetch_page, since_value, state_of, when
from thornctl.render import page_caption

health_app = typer.Typer(
    help="Links' health, failures over time and BFD sessions.", no_args_is_help=True
)


class LinkState(StrEnum):
    up = "up"
    down = "down"
    degraded = "degraded"
    flapping = "flapping"
    drained = "drained"
    unknown = "unknown"


class FailureState(StrEnum):
    degraded = "degraded"
    down = "down"
    flapping = "flapping"


def _end(ref: dict[str, Any]) -> str:
    return f"{ref['node']}:{ref['port']}"


def _link_row(h: dict[str, Any]) -> list[Any]:
    return [h["link_id"], _end(h["a"]), _end(h["b"]), "drained" if h["drained"] else h["state"],
            when(h["since"], "%Y-%m-%d %H:%M:%S"), f"{h['loss'] * 100:.1f}%",
            f"{h['penalty']:.0f}", h["suppressed"]]  # fmt: skip


_LINK_COLUMNS = ["LINK", "A", "B", "STATE", "SINCE (UTC)", "LOSS", "PENALTY", "SUPPRESSED"]


@health_app.command("links")
def health_links(
    ctx: typer.Context,
    state_filter: Annotated[
        LinkState | None, typer.Option("--state", help="Only links in this state.")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", help="Only links at this node.")] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """Each link's health: state, since when, loss and flap dampening."""
    state = state_of(ctx)
    page = fetch_page(state, "/health/links", limit, offset, everything,
                      state=state_filter.value if state_filter else None, node=node)  # fmt: skip
    if state.out.data(page):
        return
    state.out.table(_LINK_COLUMNS, (_link_row(h) for h in page["items"]),
                    caption=page_caption(page, "links"))  # fmt: skip


def _event_row(e: dict[str, Any]) -> list[Any]:
    lasted = "ongoing" if e["duration_s"] is None else f"{e['duration_s']:.2f} s"
    latency = "-" if e["detection_latency_ms"] is None else f"{e['detection_latency_ms']:.1f}"
    return [e["id"], e["link_id"], e["state"], e["source"], when(e["started_at"]), latency,
            lasted]  # fmt: skip


_EVENT_COLUMNS = ["ID", "LINK", "STATE", "SOURCE", "STARTED (UTC)", "DETECTED MS", "LASTED"]


@health_app.command("link")
def health_link(
    ctx: typer.Context, link_id: Annotated[int, typer.Argument(metavar="LINK", min=0)]
) -> None:
    """One link's health and its latest failures."""
    state = state_of(ctx)
    shown: dict[str, Any] = state.client.get(f"/health/links/{link_id}")
    if state.out.data(shown):
        return
    out = state.out
    out.fields(
        [
            ("state", "drained" if shown["drained"] else shown["state"]),
            ("since", when(shown["since"])),
            ("ends", f"{_end(shown['a'])} - {_end(shown['b'])}"),
            ("sources", shown["sources"]),
            ("loss", f"{shown['loss'] * 100:.1f}%"),
            ("flap penalty", f"{shown['penalty']:.0f}" + (
                f" (suppressed, reuse in {shown['reuse_in_s']:.0f} s)" if shown["suppressed"]
                else "")),
            ("open failure", shown["open_failure"]),
        ],
        title=f"Link {link_id}",
    )  # fmt: skip
    counters = shown.get("counters") or []
    if counters:
        out.line()
        out.table(
            ["PORT", "UNTIL (UTC)", "SECONDS", "PACKETS", "DROPPED", "ERRORS"],
            ([c["port"], when(c["at"], "%H:%M:%S"), f"{c['seconds']:.0f}",
              c["rx_packets"] + c["tx_packets"], c["rx_dropped"] + c["tx_dropped"],
              c["rx_errors"] + c["tx_errors"]] for c in counters[-10:]),
            caption="drops and errors per report interval, the latest 10",
        )  # fmt: skip
    events = state.client.get("/health/events", link_id=link_id, limit=10)
    if events["items"]:
        out.line()
        out.table(_EVENT_COLUMNS, (_event_row(e) for e in events["items"]),
                  caption=page_caption(events, "failures"))  # fmt: skip


@health_app.command("events")
def health_events(
    ctx: typer.Context,
    link: Annotated[int | None, typer.Option("--link", min=0, help="Of this link.")] = None,
    node: Annotated[str | None, typer.Option("--node", help="At this node.")] = None,
    state_filter: Annotated[
        FailureState | None, typer.Option("--state", help="Only in this state.")
    ] = None,
    open_only: Annotated[bool, typer.Option("--open", help="Only failures still open.")] = False,
    since: Since = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """Link failures over time, newest first: state, who detected it, how fast, how long."""
    state = state_of(ctx)
    page = fetch_page(
        state, "/health/events", limit, offset, everything, link_id=link, node=node,
        state=state_filter.value if state_filter else None, open=True if open_only else None,
        since=since_value(since),
    )  # fmt: skip
    if state.out.data(page):
        return
    state.out.table(_EVENT_COLUMNS, (_event_row(e) for e in page["items"]),
                    caption=page_caption(page, "failures"))  # fmt: skip


@health_app.command("sessions")
def health_sessions(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option("--node", help="Reported by this node.")] = None,
    state_filter: Annotated[
        str | None, typer.Option("--state", help="Only in this BFD state (up, down, ...).")
    ] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """The BFD sessions agents report: peer, state, diagnostic, the link each guards and
    the timers it negotiated (transmit interval, detection time)."""
    state = state_of(ctx)
    page = fetch_page(state, "/health/sessions", limit, offset, everything, node=node,
                      state=state_filter)  # fmt: skip
    if state.out.data(page):
        return
    state.out.table(
        ["NODE", "LOCAL", "PEER", "PORT", "MULTIHOP", "STATE", "DIAG", "LINK", "TX MS",
         "DETECT MS"],
        ([s["node"], s["local"], s["peer"], s["port"], s["multihop"], s["state"], s["diag"],
          s["link_id"], s["tx_interval_ms"], s["detect_time_ms"]] for s in page["items"]),
        caption=page_caption(page, "sessions"),
    )  # fmt: skip
