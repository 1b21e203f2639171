"""thornctl bus: THORN's NATS identities (docs/operations.md, "Bus identities").

`creds NODE` asks topology for a node's agent credentials (admin role; audited). `init DIR`
writes a deployment's trust material on this machine, no API involved: the keys, the
servers' operator-mode configuration and a creds file for each service and the admin (what
`make run` does for itself in its data directory). `revoke` and `rotate` change the keys:
write the configuration again and reload the servers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from thorn.natsauth import permissions
from thorn.natsauth.files import AuthDir, write_secret
from thorn.natsauth.issue import ADMIN_LIFETIME, AGENT_LIFETIME, SERVICE_LIFETIME
from thorn.natsauth.jwt import JwtError
from thornctl.context import state_of
from thornctl.errors import CliError, ExitCode

bus_app = typer.Typer(
    help="NATS identities: a node's agent credentials, a deployment's trust material.",
    no_args_is_help=True,
)
Directory = Annotated[Path, typer.Argument(help="The trust material's directory.")]


def _open(directory: Path, *, create: bool) -> AuthDir:
    try:
        return AuthDir.open(directory, create=create)
    except JwtError as exc:
        raise CliError(str(exc), ExitCode.NOINPUT) from None
    except OSError as exc:
        raise CliError(f"{directory}: {exc.strerror}", ExitCode.CANTCREAT) from None


@bus_app.command("creds")
def bus_creds(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="The node whose agent the credentials are for.")],
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Where to write them (default NODE.creds).")
    ] = None,
) -> None:
    """New NATS credentials for a node's agent (admin role), written to a file (0600)."""
    state = state_of(ctx)
    made: dict[str, Any] = state.client.post(f"/nodes/{quote(node, safe='')}/credentials")
    path = file or Path(f"{node}.creds")
    try:
        write_secret(path, made["creds"])
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror}", ExitCode.CANTCREAT) from None
    out = state.out
    if out.data({k: v for k, v in made.items() if k != "creds"} | {"file": str(path)}):
        return
    out.line(f"Wrote {path} (0600): node {made['node']}'s agent, key {made['public_key']}")
    vnis = ", ".join(map(str, made["vnis"])) or "none"
    out.line(f"It may read its VNIs' documents ({vnis}); it expires {made['expires_at']},")
    out.line("and the agent renews it before then. Copy it to the node (e.g. /etc/thorn/")
    out.line("agent.creds, mode 0600) and set THORN_NATS_CREDS to that path.")


@bus_app.command("init")
def bus_init(
    ctx: typer.Context,
    directory: Directory,
    node: Annotated[
        list[str] | None,
        typer.Option("--node", "-n", help="Also a creds file for this node's agent (repeat)."),
    ] = None,
) -> None:
    """Write a deployment's trust material in DIR (keys kept if there): the operator-mode
    configuration for nats-server (nats-auth.conf), creds for topology, health, pathcomp and
    the admin, and for each --node (without VNIs: its agent renews them from topology)."""
    state = state_of(ctx)
    auth = _open(directory, create=True)
    now = time.time()
    auth.write_server_config(now=now)
    written = []
    for role in permissions.SERVICES:
        held = permissions.service(role)
        written.append(auth.write_creds(held, now=now, lifetime=SERVICE_LIFETIME, name=role))
    admin = permissions.admin()
    written.append(auth.write_creds(admin, now=now, lifetime=ADMIN_LIFETIME, name="admin"))
    for name in node or []:
        agent = permissions.agent(name)
        path = auth.write_creds(agent, now=now, lifetime=AGENT_LIFETIME, name=f"agents/{name}")
        written.append(path)
    if state.out.data({"server_config": str(auth.server_config),
                       "chart_values": str(auth.chart_values),
                       "creds": [str(p) for p in written]}):  # fmt: skip
        return
    state.out.line(f"Wrote {auth.server_config} (nats-server: include it, or -c),")
    state.out.line(f"{auth.chart_values} (the NATS Helm chart: --values) and:")
    for path in written:
        state.out.line(f"  {path}")
    state.out.line(f"Topology issues agents' credentials with {auth.issuer_seeds}")
    state.out.line("(THORN_NATS_ISSUER_SEED). Keep operator.seed offline: it signs accounts.")


@bus_app.command("revoke")
def bus_revoke(
    ctx: typer.Context,
    directory: Directory,
    public_key: Annotated[str, typer.Argument(help="The user public key (U...) to refuse.")],
) -> None:
    """Refuse a user key from now on: rewrites nats-auth.conf; reload every server."""
    auth = _open(directory, create=False)
    try:
        auth = auth.revoke(public_key, at=time.time())
    except JwtError as exc:
        raise CliError(f"{public_key[:12]}...: {exc}") from None
    auth.write_server_config(now=time.time())
    state_of(ctx).out.line(
        f"Revoked {public_key}; reload every nats-server (nats-server --signal reload, or "
        "SIGHUP) to refuse it."
    )


@bus_app.command("rotate")
def bus_rotate(
    ctx: typer.Context,
    directory: Directory,
    retire: Annotated[
        bool, typer.Option("--retire", help="Stop trusting the previous signing key.")
    ] = False,
) -> None:
    """Rotate the account's signing key without downtime: a new one signs from now on, the
    old one stays trusted until --retire (once every identity has been issued again)."""
    auth = _open(directory, create=False)
    auth = auth.retire_previous_signing_key() if retire else auth.rotate_signing_key()
    auth.write_server_config(now=time.time())
    out = state_of(ctx).out
    if retire:
        out.line("Only the current signing key is trusted now; reload every nats-server.")
        return
    out.line(f"New signing key; {auth.issuer_seeds} holds it and the old one. Reload every")
    out.line("nats-server, give topology the new issuer.seeds (THORN_NATS_ISSUER_SEED), issue")
    out.line("new creds to the services and admins (`thornctl bus init` again), let the agents")
    out.line("renew, then `thornctl bus rotate --retire` and reload the servers again.")
