"""thornctl nodes, links and drains: the fabric's elements, draining and undraining them, and
whether each still carries traffic (pathcomp's answer, waited for with `--wait`)."""

from __future__ import annotations

import time
from typing import Annotated, Any
from urllib.parse import quote

import typer

from thorn.model import AdminState, Role
from thornctl.context import All, Limit, Offset, State, fetch_page, state_of
from thornctl.errors import CliError, ExitCode
from thornctl.render import Out, page_caption

commands = typer.Typer()  # its top-level commands, added to thornctl's root by main.py
nodes_app = typer.Typer(help="Fabric nodes (hosts and switches).", no_args_is_help=True)
links_app = typer.Typer(help="Links between ports; drain and undrain.", no_args_is_help=True)


# --- nodes -----------------------------------------------------------------------------------


@nodes_app.command("list")
def nodes_list(
    ctx: typer.Context,
    role: Annotated[Role | None, typer.Option("--role", case_sensitive=False)] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-l", metavar="KEY=VALUE", help="Repeat to AND."),
    ] = None,
    admin_state: Annotated[AdminState | None, typer.Option("--state", case_sensitive=False)] = None,
    prefix: Annotated[str | None, typer.Option("--prefix", help="Name prefix.")] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """List nodes, sorted by name."""
    state = state_of(ctx)
    for item in label or []:
        if "=" not in item:
            raise typer.BadParameter(f"'{item}' is not KEY=VALUE", param_hint="--label")
    page = fetch_page(
        state,
        "/nodes",
        limit,
        offset,
        everything,
        role=role.value if role else None,
        label=label or None,
        admin_state=admin_state.value if admin_state else None,
        name_prefix=prefix,
    )
    if state.out.data(page):
        return
    state.out.table(
        ["NAME", "ROLE", "STATE", "MGMT ADDRESS", "LABELS"],
        (
            [n["name"], n["role"], n["admin_state"], n.get("mgmt_address"), n.get("labels")]
            for n in page["items"]
        ),
        caption=page_caption(page, "nodes"),
    )


@nodes_app.command("show")
def nodes_show(ctx: typer.Context, name: Annotated[str, typer.Argument(help="Node name.")]) -> None:
    """A node with its ports and links."""
    state = state_of(ctx)
    node: dict[str, Any] = state.client.get(f"/nodes/{quote(name, safe='')}")
    if state.out.data(node):
        return
    out = state.out
    out.fields(
        [(k, node.get(k)) for k in ("name", "role", "admin_state", "mgmt_address", "labels")]
    )
    out.line()
    out.table(
        ["PORT", "MAC", "ADDRESS", "SPEED (Mb/s)"],
        ([p["name"], p.get("mac"), p.get("address"), p.get("speed_mbps")] for p in node["ports"]),
        caption=f"{len(node['ports'])} ports",
    )
    links = state.client.pages("/links", limit=None, offset=None, everything=True, node=name)
    rows = []
    for lk in links["items"]:
        near, far = (lk["a"], lk["b"]) if lk["a"]["node"] == name else (lk["b"], lk["a"])
        rows.append(
            [lk["id"], near["port"], f"{far['node']}:{far['port']}", lk["admin_state"], lk["srlgs"]]
        )
    out.line()
    out.table(
        ["LINK", "PORT", "PEER", "STATE", "SRLGS"], rows, caption=page_caption(links, "links")
    )


NodeName = Annotated[str, typer.Argument(metavar="NAME", help="Node name.", show_default=False)]
Wait = Annotated[
    bool,
    typer.Option("--wait", help="Then poll path computation until it carries no traffic."),
]
WaitTimeout = Annotated[
    float,
    typer.Option(
        "--timeout", min=0.0, help="With --wait: give up after this many seconds (exit 75)."
    ),
]
Interval = Annotated[
    float, typer.Option("--interval", min=0.05, help="With --wait: seconds between polls.")
]


def _show_node(out: Out, node: dict[str, Any], title: str) -> None:
    out.fields(
        [(k, node.get(k)) for k in ("name", "role", "admin_state", "mgmt_address")], title=title
    )


@nodes_app.command("drain")
def nodes_drain(
    ctx: typer.Context,
    name: NodeName,
    wait: Wait = False,
    timeout: WaitTimeout = 120.0,
    interval: Interval = 0.5,
) -> None:
    """Drain a switch: path computation leaves it out of every path (operator role)."""
    state = state_of(ctx)
    node: dict[str, Any] = state.client.post(f"/nodes/{quote(name, safe='')}/drain")
    if wait:
        _drain_and_wait(state, "node", name, node, timeout, interval)
    elif not state.out.data(node):
        _show_node(state.out, node, f"Node {name} drained")


@nodes_app.command("undrain")
def nodes_undrain(ctx: typer.Context, name: NodeName) -> None:
    """Return a drained node to service (operator role)."""
    state = state_of(ctx)
    node: dict[str, Any] = state.client.post(f"/nodes/{quote(name, safe='')}/undrain")
    if not state.out.data(node):
        _show_node(state.out, node, f"Node {name} back in service")


@nodes_app.command("status")
def nodes_status(ctx: typer.Context, name: NodeName) -> None:
    """Whether a node still carries traffic (from path computation)."""
    state = state_of(ctx)
    status = state.client.get(f"/drains/nodes/{quote(name, safe='')}")
    if not state.out.data(status):
        _show_status(state.out, status, _status_title(status))


# --- drains ----------------------------------------------------------------------------------


def _label(status: dict[str, Any]) -> str:
    return f"{'Link' if status['kind'] == 'link' else 'Node'} {status['element']}"


def _waiting_for(status: dict[str, Any]) -> str:
    """Why an element still counts as carrying traffic, in one line."""
    if status["in_service"]:
        if status["admin_state"] == "up":
            return "path computation has not planned the drain yet (it still sees it up)"
        return f"still in service in plan {status['plan_revision']}"
    routes = status["routes_through"]
    if routes["total"]:
        return (
            f"{routes['total']} routes still cross it (red {routes['red']}, blue {routes['blue']})"
        )
    pending: list[str] = status["agents_pending"]
    if pending:
        names = ", ".join(pending[:5]) + (f" (+{len(pending) - 5})" if len(pending) > 5 else "")
        return f"{len(pending)} agent(s) still applying the new paths: {names}"
    return "no traffic"


def _status_title(status: dict[str, Any]) -> str:
    if not status["carries_traffic"]:
        return f"{_label(status)} carries no traffic (plan {status['plan_revision']})"
    if status["in_service"] and status["admin_state"] == "up":
        return f"{_label(status)} is in service (not drained): it carries traffic"
    return f"{_label(status)} carries traffic: {_waiting_for(status)}"


def _show_status(out: Out, status: dict[str, Any], title: str) -> None:
    routes = status["routes_through"]
    out.fields(
        [
            ("admin_state", status["admin_state"]),
            ("in_service", status["in_service"]),
            ("carries_traffic", status["carries_traffic"]),
            ("routes_through", f"{routes['total']} (red {routes['red']}, blue {routes['blue']})"),
            ("plan_revision", status["plan_revision"]),
            ("out_of_service_since", status.get("since") or "-"),
            ("agents_pending", status["agents_pending"] or "-"),
            ("agents_silent", status["agents_silent"] or "-"),
            ("hosts_cut_off", status["hosts_cut_off"] or "-"),
        ],
        title=title,
    )
    if status["agents_silent"]:
        out.warn(
            f"{len(status['agents_silent'])} agent(s) written for did not report in the last "
            "minute and were not waited for: check them before touching the cable"
        )
    if status["hosts_cut_off"]:
        out.warn("hosts left without any usable link: " + ", ".join(status["hosts_cut_off"]))


def _drain_and_wait(
    state: State,
    kind: str,
    element: str,
    drained: dict[str, Any],
    timeout: float,
    interval: float,
) -> None:
    """Poll the drain status until the element carries no traffic, or give up (exit 75)."""
    out = state.out
    path = f"/drains/{kind}s/{quote(element, safe='')}"
    start = time.monotonic()
    shown = ""
    while True:
        status: dict[str, Any] = state.client.get(path)
        elapsed = time.monotonic() - start
        if not status["carries_traffic"]:
            break
        reason = _waiting_for(status)
        if reason != shown:
            out.note(f"[{elapsed:5.1f} s] {_label(status)}: {reason}")
            shown = reason
        if elapsed >= timeout:
            raise CliError(
                f"{_label(status).lower()} still carries traffic after {timeout:g} s: {reason} "
                "(the drain stays in place; check again with "
                f"thornctl {kind}s status {element})",
                ExitCode.TEMPFAIL,
            )
        time.sleep(min(interval, max(timeout - elapsed, 0.0)))
    if out.data({kind: drained, "drain": status}):
        return
    _show_status(out, status, f"{_label(status)} drained and carries no traffic ({elapsed:.1f} s)")


@commands.command()
def drains(ctx: typer.Context) -> None:
    """Every drained link and node, and whether each still carries traffic."""
    state = state_of(ctx)
    page = state.client.pages("/drains", limit=None, offset=None, everything=True)
    if state.out.data(page):
        return
    state.out.table(
        ["KIND", "ELEMENT", "CARRIES TRAFFIC", "ROUTES", "AGENTS PENDING", "SINCE"],
        (
            [
                s["kind"],
                s["element"],
                "yes" if s["carries_traffic"] else "no",
                s["routes_through"]["total"],
                len(s["agents_pending"]),
                s.get("since") or "-",
            ]
            for s in page["items"]
        ),
        caption=page_caption(page, "drained elements"),
        no_wrap=2,
    )


# --- links -----------------------------------------------------------------------------------


def _end(ref: dict[str, Any]) -> str:
    return f"{ref['node']}:{ref['port']}"


@links_app.command("list")
def links_list(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Option("--node", help="With an end on this node.")] = None,
    admin_state: Annotated[AdminState | None, typer.Option("--state", case_sensitive=False)] = None,
    srlg: Annotated[str | None, typer.Option("--srlg", help="In this SRLG.")] = None,
    limit: Limit = None,
    offset: Offset = None,
    everything: All = False,
) -> None:
    """List links, sorted by id."""
    state = state_of(ctx)
    page = fetch_page(
        state,
        "/links",
        limit,
        offset,
        everything,
        node=node,
        admin_state=admin_state.value if admin_state else None,
        srlg=srlg,
    )
    if state.out.data(page):
        return
    state.out.table(
        ["ID", "A", "B", "STATE", "SRLGS"],
        (
            [lk["id"], _end(lk["a"]), _end(lk["b"]), lk["admin_state"], lk["srlgs"]]
            for lk in page["items"]
        ),
        caption=page_caption(page, "links"),
        no_wrap=3,
    )


LinkId = Annotated[int, typer.Argument(metavar="ID", help="Link id.", show_default=False)]


def _show_link(out: Out, link: dict[str, Any], title: str | None = None) -> None:
    if out.data(link):
        return
    out.fields(
        [
            ("id", link["id"]),
            ("a", _end(link["a"])),
            ("b", _end(link["b"])),
            ("admin_state", link["admin_state"]),
            ("srlgs", link["srlgs"]),
        ],
        title=title,
    )


@links_app.command("show")
def links_show(ctx: typer.Context, link_id: LinkId) -> None:
    """One link."""
    state = state_of(ctx)
    _show_link(state.out, state.client.get(f"/links/{link_id}"))


@links_app.command("drain")
def links_drain(
    ctx: typer.Context,
    link_id: LinkId,
    wait: Wait = False,
    timeout: WaitTimeout = 120.0,
    interval: Interval = 0.5,
) -> None:
    """Drain a link: path computation moves traffic off it (operator role)."""
    state = state_of(ctx)
    link = state.client.post(f"/links/{link_id}/drain")
    if wait:
        _drain_and_wait(state, "link", str(link_id), link, timeout, interval)
    else:
        _show_link(state.out, link, title=f"Link {link_id} drained")


@links_app.command("undrain")
def links_undrain(ctx: typer.Context, link_id: LinkId) -> None:
    """Return a drained link to service (operator role)."""
    state = state_of(ctx)
    link = state.client.post(f"/links/{link_id}/undrain")
    _show_link(state.out, link, title=f"Link {link_id} back in service")


@links_app.command("status")
def links_status(ctx: typer.Context, link_id: LinkId) -> None:
    """Whether a link still carries traffic (from path computation)."""
    state = state_of(ctx)
    status = state.client.get(f"/drains/links/{link_id}")
    if not state.out.data(status):
        _show_status(state.out, status, _status_title(status))
