"""thornctl: THORN's command line over the REST API: one URL, the entry point, serves every
service's routes. This module is the root: global options, summary, whoami, and where every
command comes from. The commands live with their kind: `fabric` (import, export, generate),
`elements` (nodes, links, drains), `registrations` (cabling, mismatches), `tokens` (and
audit), `paths` (paths, plan), `health`, `failovers`, `tenants`, `lab`, `rdma`; they share
`context` (options, the client, paging) and `render` (tables, JSON, YAML).

Global options (before the command)
    --url URL          the API (env THORN_URL; default http://127.0.0.1:8080)
    --token TOKEN      a bearer token (env THORN_TOKEN)
    --ca FILE          the CA certificate (PEM) an https:// URL's certificate is verified
                       with (env THORN_CA; make run's THORN_TLS=local writes
                       <data dir>/tls/ca.pem); default: the system's CAs
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
    bus creds NODE         NATS credentials for a node's agent (admin), to a file (0600)
    bus init|revoke|rotate DIR   a deployment's NATS trust material, on this machine
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

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from typer.core import TyperGroup

from thornctl import elements, fabric, registrations, tokens
from thornctl.bus import bus_app
from thornctl.context import DEFAULT_TIMEOUT, DEFAULT_URL, State, state_of, verify_with
from thornctl.elements import links_app, nodes_app
from thornctl.errors import CliError
from thornctl.failovers import failovers_app
from thornctl.health import health_app
from thornctl.lab import lab_app
from thornctl.paths import paths, plan_app
from thornctl.rdma import rdma_app
from thornctl.render import Out, OutputFormat
from thornctl.tenants import tenants_app
from thornctl.tokens import tokens_app

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
# Top-level commands defined beside their groups, in the order `thornctl --help` lists them.
for _module in (fabric, registrations, elements, tokens):
    app.registered_commands += _module.commands.registered_commands
app.command("paths")(paths)  # defined with the plan commands (paths.py)
app.add_typer(nodes_app, name="nodes")
app.add_typer(links_app, name="links")
app.add_typer(nodes_app, name="node", hidden=True)  # `thornctl node drain NAME` reads well too
app.add_typer(links_app, name="link", hidden=True)
app.add_typer(tokens_app, name="tokens")
app.add_typer(bus_app, name="bus")
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
    ca: Annotated[
        Path | None,
        typer.Option(
            "--ca",
            envvar="THORN_CA",
            help="CA certificate (PEM) to verify an https:// URL with (default: the system's).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Command line for THORN, the SDN controller for RDMA training fabrics."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise typer.BadParameter(f"'{url}' is not an http:// or https:// URL", param_hint="--url")
    state = State(url=url, token=token or None, timeout=timeout, out=Out(output),
                  verify=verify_with(ca))  # fmt: skip
    ctx.obj = state
    ctx.call_on_close(state.close)


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
