"""thornctl: THORN's command line over the REST API: one URL, the entry point, serves every
service's routes. This module holds the root command, the fabric, node, link, token and audit
commands; the other groups have their own modules (paths, health, failovers, tenants, lab,
rdma) and share `context` (options, the client) and `render` (tables, JSON, YAML).

Global options (before the command)
    --url URL          the API (env THORN_URL; default http://127.0.0.1:8080)
    --token TOKEN      a bearer token (env THORN_TOKEN)
    -o, --output FMT   table (default; rich tables for people), json (exactly the API's
                       JSON, for scripts) or yaml (env THORN_OUTPUT)
    --timeout SECONDS  per request (env THORN_TIMEOUT; default 60)

Commands
    import FILE|-          replace the fabric with a THORN document (JSON or YAML) or a
                           containerlab file (.clab.yml, or any YAML with `topology:`)
    export                 print or --file the whole fabric document
    generate NAME          replace the fabric with a generated one (--set key=value)
    generate --list        generators and their parameters (also: `generators`)
    summary, whoami
    nodes list|show|drain|undrain|status, links list|show|drain|undrain|status
                           (drain --wait: until it carries no more traffic)
    drains                 every drained link and node, and whether it still carries traffic
    paths SRC DST          the red and blue routes of a host pair, what they share
    plan show|recompute|what-if   the plan's protection; a full recompute; a simulated
                           failure of links and nodes (on a copy of the plan)
    health links|link|events|sessions   links' health, failures over time, BFD sessions
    failovers list|show    failover timelines: each hop, its latency, whose clock, and the
                           verdict against each touched tenant's RC budget (health)
    failovers budget       each tenant's RC budget against its recent failovers (p50, p99)
    tenants list|show|budget   tenants and the NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT of their jobs
    tokens list|create|revoke, audit
    lab up|down|status|fail|restore|traffic   the fabric lab in namespaces (docs/lab.md)
    rdma probe|serve       an RC queue pair between two workloads, with NCCL's QP settings

Exit codes (BSD sysexits where one fits)
    0   success
    1   the server refused the request (4xx): its `detail` line is printed
    2   usage error: unknown command or option, bad option value, bad --set syntax
    65  EX_DATAERR: an input file cannot be parsed (bad JSON/YAML, not UTF-8, empty)
    66  EX_NOINPUT: an input file does not exist or cannot be read
    69  EX_UNAVAILABLE: cannot reach THORN (refused, DNS, timeout) or it failed (5xx)
    73  EX_CANTCREAT: the --file of `export` cannot be written
    75  EX_TEMPFAIL: `drain --wait` timed out with traffic still on the element
    76  EX_PROTOCOL: the answer is not THORN's JSON (is --url right?)
    77  EX_NOPERM: 401 (missing, wrong or revoked token) or 403 (role too weak)

Results go to stdout; errors ("Error: ...", one line, never a traceback) and warnings go
to stderr.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TransferSpeedColumn,
)
from typer.core import TyperGroup

from thorn.model import AdminState, Role, TokenRole
from thornctl.client import API
from thornctl.context import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    All,
    Limit,
    Offset,
    State,
    fetch_page,
    state_of,
)
from thornctl.errors import CliError, ExitCode
from thornctl.failovers import failovers_app
from thornctl.files import Document, InputFormat, load_document, write_text
from thornctl.health import health_app
from thornctl.lab import lab_app
from thornctl.paths import paths, plan_app
from thornctl.rdma import rdma_app
from thornctl.render import Out, OutputFormat, page_caption, spinner, to_json, to_yaml
from thornctl.tenants import tenants_app

UPLOAD_CHUNK = 256 * 1024

EPILOG = """\
\b
Exit codes:
  0   success
  1   the server refused the request (4xx); its detail line is printed
  2   usage error (unknown command or option, bad option value)
  65  an input file cannot be parsed (bad JSON/YAML, not UTF-8, empty)
  66  an input file does not exist or cannot be read
  69  cannot reach THORN (refused, DNS, timeout) or it failed (5xx)
  73  the output file cannot be written
  75  drain --wait timed out: the element still carries traffic
  76  the answer is not THORN's JSON (is --url right?)
  77  token missing, wrong or revoked (401) or its role is too weak (403)
"""


class ThornGroup(TyperGroup):
    """Turns a `CliError` from any command into one line on stderr and its exit code."""

    # `ctx` is Typer's Click context; Any keeps this override independent of where Typer
    # keeps its Click (0.29 vendors it as a private module).
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as exc:
            typer.echo(f"Error: {exc.message}", err=True)
            raise typer.Exit(int(exc.code)) from None


app = typer.Typer(
    cls=ThornGroup,
    name="thornctl",
    help="Command line for THORN, the SDN controller for RDMA training fabrics.",
    epilog=EPILOG,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)
nodes_app = typer.Typer(help="Fabric nodes (hosts and switches).", no_args_is_help=True)
links_app = typer.Typer(help="Links between ports; drain and undrain.", no_args_is_help=True)
tokens_app = typer.Typer(help="API tokens (admin role).", no_args_is_help=True)
app.add_typer(nodes_app, name="nodes")
app.add_typer(links_app, name="links")
app.add_typer(nodes_app, name="node", hidden=True)  # `thornctl node drain NAME` reads well too
app.add_typer(links_app, name="link", hidden=True)
app.add_typer(tokens_app, name="tokens")
app.add_typer(tenants_app, name="tenants")
app.add_typer(tenants_app, name="tenant", hidden=True)
app.add_typer(failovers_app, name="failovers")
app.add_typer(plan_app, name="plan")
app.add_typer(health_app, name="health")
app.add_typer(failovers_app, name="failover", hidden=True)
app.add_typer(lab_app, name="lab")
app.add_typer(rdma_app, name="rdma")


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str, typer.Option("--url", envvar="THORN_URL", help="THORN's REST API base URL.")
    ] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="THORN_TOKEN", help="Bearer token.", show_default=False),
    ] = None,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--output",
            "-o",
            envvar="THORN_OUTPUT",
            case_sensitive=False,
            help="table for people; json (the API's own JSON) or yaml for scripts.",
        ),
    ] = OutputFormat.table,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", envvar="THORN_TIMEOUT", min=0.1, help="Seconds to wait per request."
        ),
    ] = DEFAULT_TIMEOUT,
) -> None:
    """Command line for THORN, the SDN controller for RDMA training fabrics."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise typer.BadParameter(f"'{url}' is not an http:// or https:// URL", param_hint="--url")
    state = State(url=url, token=token or None, timeout=timeout, out=Out(output))
    ctx.obj = state
    ctx.call_on_close(state.close)


# --- import, export, generate ----------------------------------------------------------------


def _upload(state: State, doc: Document, path: str, dry_run: bool) -> dict[str, Any]:
    """POST the document; on a terminal, show upload progress and then a spinner on stderr."""
    params = {"dry_run": "true"} if dry_run else {}
    headers = {"Content-Type": doc.content_type}
    if not state.out.stderr_is_terminal:
        result: dict[str, Any] = state.client.request(
            "POST", f"{API}{path}", params=params, content=doc.body, headers=headers
        )
        return result
    size = len(doc.body)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=state.out.err, transient=True) as progress:
        task = progress.add_task(f"uploading {doc.name}", total=size)

        def chunks() -> Iterator[bytes]:
            for start in range(0, size, UPLOAD_CHUNK):
                chunk = doc.body[start : start + UPLOAD_CHUNK]
                yield chunk
                progress.advance(task, len(chunk))
            what = "validating" if dry_run else "validating and storing"
            progress.update(task, description=f"{what} (server side)")

        result = state.client.request(
            "POST",
            f"{API}{path}",
            params=params,
            content=chunks(),
            headers={**headers, "Content-Length": str(size)},
        )
    return result


def _show_import(out: Out, result: dict[str, Any], what: str) -> None:
    if out.data(result):
        return
    summary = result["summary"]
    if result.get("dry_run"):
        title = f"Dry run of {what}: valid; nothing changed (revision {summary['revision']})"
    else:
        title = f"Imported {what}: the fabric is now revision {summary['revision']}"
    out.fields([(k, v) for k, v in summary.items() if k != "revision"], title=title)
    warnings: list[str] = result.get("warnings") or []
    for warning in warnings:
        out.warn(warning)
    if warnings:
        out.note(f"{len(warnings)} warning(s): the items above were skipped")


@app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="THORN document (.json/.yaml) or containerlab file (.clab.yml); '-' is stdin.",
            show_default=False,
        ),
    ],
    fmt: Annotated[
        InputFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="auto: containerlab for *.clab.yml/yaml or a top-level 'topology:' key.",
        ),
    ] = InputFormat.auto,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate on the server; change nothing.")
    ] = False,
) -> None:
    """Replace the whole fabric with FILE (all or nothing; admin role)."""
    state = state_of(ctx)
    doc = load_document(file, fmt)
    path = "/fabric/import/containerlab" if doc.kind is InputFormat.clab else "/fabric/import"
    result = _upload(state, doc, path, dry_run)
    _show_import(state.out, result, doc.name)


@app.command()
def export(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Write here (atomically) instead of stdout."),
    ] = None,
    as_yaml: Annotated[
        bool,
        typer.Option("--yaml", help="YAML instead of JSON (default for a .yaml/.yml --file)."),
    ] = False,
) -> None:
    """Print (or write) the whole fabric as a document `import` accepts."""
    state = state_of(ctx)
    document: dict[str, Any] = state.client.get("/fabric")
    yaml_wanted = (
        as_yaml
        or state.out.fmt is OutputFormat.yaml
        or (file is not None and file.suffix.lower() in (".yaml", ".yml"))
    )
    text = to_yaml(document) if yaml_wanted else to_json(document) + "\n"
    if file is None:
        typer.echo(text, nl=False)
        return
    write_text(file, text)
    nodes, links = len(document.get("nodes", [])), len(document.get("links", []))
    state.out.line(
        f"Exported revision {document.get('revision')} ({nodes} nodes, {links} links) to {file}"
    )


_INT = re.compile(r"[+-]?\d+")


def parse_value(raw: str) -> bool | int | str:
    """A --set value: true/false are booleans, whole numbers integers, the rest strings."""
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    return raw


def parse_sets(items: list[str]) -> dict[str, bool | int | str]:
    params: dict[str, bool | int | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise typer.BadParameter(f"'{item}' is not KEY=VALUE", param_hint="--set")
        if key in params:
            raise typer.BadParameter(f"'{key}' is given twice", param_hint="--set")
        params[key] = parse_value(raw)
    return params


def _generator_list(state: State) -> list[dict[str, Any]]:
    """Generators and their parameters, from the server's OpenAPI document.

    A server that does not publish /openapi.json (404) gets this client's own registry.
    """
    try:
        spec: dict[str, Any] = state.client.request("GET", "/openapi.json")
    except CliError as exc:
        if exc.status != 404:
            raise
        return _local_generators()
    schemas: dict[str, Any] = spec.get("components", {}).get("schemas", {})
    prefix = f"{API}/fabric/generate/"
    found = []
    for path, item in sorted(spec.get("paths", {}).items()):
        if not path.startswith(prefix):
            continue
        body = item.get("post", {}).get("requestBody", {}).get("content", {})
        schema = body.get("application/json", {}).get("schema", {})
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            schema = schemas.get(ref.rsplit("/", 1)[1], {})
        found.append(_generator_info(path[len(prefix) :], schema))
    return found


def _local_generators() -> list[dict[str, Any]]:
    from thorn.generators import GENERATORS

    return [
        _generator_info(name.replace("_", "-"), entry.params.model_json_schema())
        for name, entry in sorted(GENERATORS.items())
    ]


def _generator_info(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    wanted = ("type", "default", "minimum", "maximum", "description")
    parameters = {
        param: {k: _whole(prop[k]) for k in wanted if k in prop}
        for param, prop in schema.get("properties", {}).items()
    }
    return {"name": name, "description": schema.get("description", ""), "parameters": parameters}


def _whole(value: Any) -> Any:
    # OpenAPI renders integer bounds as 256.0.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _show_generators(state: State, only: str | None) -> None:
    generators = _generator_list(state)
    if only is not None:
        wanted = only.replace("_", "-")
        generators = [g for g in generators if g["name"] == wanted]
        if not generators:
            raise CliError(_unknown_generator(only, _generator_list(state)), ExitCode.USAGE)
    if state.out.data(generators):
        return
    rows = []
    for g in generators:
        for i, (param, p) in enumerate(g["parameters"].items()):
            low, high = p.get("minimum"), p.get("maximum")
            bounds = f"{low}..{high}" if low is not None or high is not None else ""
            default = p.get("default")
            rows.append(
                [
                    g["name"] if i == 0 else "",
                    param,
                    p.get("type", ""),
                    str(default).lower() if isinstance(default, bool) else default,
                    bounds.replace("None", ""),
                    p.get("description", ""),
                ]
            )
    state.out.table(
        ["GENERATOR", "PARAMETER", "TYPE", "DEFAULT", "RANGE", "DESCRIPTION"],
        rows,
        caption="thornctl generate NAME --set PARAMETER=VALUE ...",
        no_wrap=2,
    )


def _unknown_generator(name: str, known: list[dict[str, Any]]) -> str:
    names = ", ".join(g["name"] for g in known)
    return f"unknown generator '{name}'; known: {names} (see thornctl generate --list)"


@app.command()
def generate(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="NAME", help="Generator, e.g. leaf-spine or fat-tree.", show_default=False
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help="A parameter (repeat); true/false and integers are typed.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate on the server; change nothing.")
    ] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="List the generators and their parameters.")
    ] = False,
) -> None:
    """Replace the whole fabric with a generated topology (admin role)."""
    state = state_of(ctx)
    if list_:
        _show_generators(state, name)
        return
    if name is None:
        raise CliError(
            "missing generator NAME (thornctl generate --list shows them)", ExitCode.USAGE
        )
    params = parse_sets(sets or [])
    route = name.replace("_", "-")
    try:
        with spinner(state.out, f"generating {route}"):
            result: dict[str, Any] = state.client.post(
                f"/fabric/generate/{quote(route, safe='')}",
                json_body=params,
                dry_run="true" if dry_run else None,
            )
    except CliError as exc:
        if exc.status != 404:
            raise
        raise CliError(_unknown_generator(name, _generator_list(state)), ExitCode.USAGE) from exc
    _show_import(state.out, result, f"generated {route}")


@app.command()
def generators(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Only this generator.")] = None,
) -> None:
    """List the generators the server offers and their parameters."""
    _show_generators(state_of(ctx), name)


# --- fabric-wide reads -----------------------------------------------------------------------


@app.command()
def summary(ctx: typer.Context) -> None:
    """Counts of nodes, ports, links, ... and the fabric's revision."""
    state = state_of(ctx)
    result: dict[str, Any] = state.client.get("/fabric/summary")
    if not state.out.data(result):
        state.out.fields(result.items(), title=f"THORN at {state.client.url}")


@app.command()
def whoami(ctx: typer.Context) -> None:
    """The token's name and role."""
    state = state_of(ctx)
    result: dict[str, Any] = state.client.get("/whoami")
    if not state.out.data(result):
        state.out.fields([*result.items(), ("url", state.client.url)])


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


@app.command()
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


# --- registrations: observed beside declared -------------------------------------------------


class CablingState(StrEnum):
    verified = "verified"
    unverified = "unverified"
    miscabled = "miscabled"


@app.command()
def cabling(
    ctx: typer.Context,
    only: Annotated[CablingState | None, typer.Option("--state", case_sensitive=False,
                                                      help="Only links in this state.")] = None,
) -> None:  # fmt: skip
    """Each link's cabling as the agents' LLDP probes hear it; a miscabled link is out of
    the paths until it is heard cabled as declared."""
    state = state_of(ctx)
    body = state.client.get("/cabling", state=only.value if only else None)
    if state.out.data(body):
        return
    state.out.table(
        ["LINK", "A", "B", "CABLING", "OUT OF PATHS", "HEARD", "REASON"],
        ([lk["link_id"], lk["a"], lk["b"], lk["state"], "yes" if lk["out_of_service"] else "no",
          "; ".join(lk["heard"]) or "-", lk["reason"] or "-"] for lk in body["links"]),
        caption=f"{body['verified']} verified, {body['unverified']} unverified, "
        f"{body['miscabled']} miscabled; {body['out_of_service']} out of the paths",
    )  # fmt: skip


@app.command()
def mismatches(ctx: typer.Context) -> None:
    """Where the nodes, as their agents registered them, differ from their declaration."""
    state = state_of(ctx)
    body = state.client.get("/mismatches")
    if state.out.data(body):
        return
    state.out.table(
        ["NODE", "KIND", "SUBJECT", "DECLARED", "OBSERVED", "MESSAGE"],
        ([m["node"], m["kind"], m["subject"], m["declared"] or "-", m["observed"] or "-",
          m["message"]] for m in body["mismatches"]),
        caption=f"{body['registered']} node(s) registered, {len(body['unregistered'])} not",
        no_wrap=2,
    )  # fmt: skip


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


@app.command()
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


app.command("paths")(paths)  # defined with the plan commands (cli/paths.py)
