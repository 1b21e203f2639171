"""A live `thorn-run` stack (what `make run` starts) for tests and benchmarks that drive it
from outside: the browser lane, the dashboard benchmark, the replicas test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from thorn.natsd import free_port

DASHBOARD = Path(__file__).parents[2] / "services" / "gateway" / "dashboard" / "dist"
START_S = 120.0
STOP_S = 30.0


@dataclass
class Stack:
    url: str
    admin: str
    lab: str | None
    env: dict[str, str]
    pid: int = 0  # thorn-run's
    run: dict[str, Any] = field(default_factory=dict)  # its run.json: what runs where

    def api(self, method: str, path: str, token: str | None = None, **kw: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60, **kw)  # type: ignore[arg-type]

    @property
    def nats_creds(self) -> Path | None:
        """The admin's NATS identity thorn-run issued (every client needs one)."""
        given = self.run.get("nats_creds")
        return Path(given) if given else None

    def token(self, role: str) -> str:
        name = f"{role}-{uuid.uuid4().hex[:6]}"
        made = self.api("POST", "/api/v1/tokens", json={"name": name, "role": role})
        assert made.status_code == 201, made.text
        return str(made.json()["token"])

    def thornctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        script = Path(sys.executable).parent / "thornctl"
        return subprocess.run([str(script), *args], env=self.env, capture_output=True, text=True,
                              timeout=60, check=True)  # fmt: skip

    def wait_planned(self, hosts: int, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            plan = self.api("GET", "/api/v1/plan")
            summary = self.api("GET", "/api/v1/fabric/summary").json()
            if plan.status_code == 200 and plan.json()["hosts"] == hosts and \
                    plan.json()["topology_revision"] == summary["revision"]:  # fmt: skip
                return
            time.sleep(0.3)
        raise AssertionError("pathcomp did not plan the fabric in time")


@contextmanager
def run_stack(
    tmp: Path, emulated: bool, settings: Mapping[str, str] | None = None
) -> Iterator[Stack]:
    """thorn-run in `tmp` on a free port; `emulated`: with its lab of namespaces (root);
    `settings`: more THORN_* variables."""
    if not (DASHBOARD / "index.html").is_file():
        raise RuntimeError("the dashboard is not built: `make dashboard` (make test builds it)")
    port = free_port()
    lab = f"br{uuid.uuid4().hex[:6]}" if emulated else None
    env = {**os.environ, "THORN_DATA_DIR": str(tmp), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_EMULATED_FABRIC": "1" if emulated else "0", "THORN_LAB": lab or "thorn",
           "THORN_URL": f"http://127.0.0.1:{port}", "THORN_LAB_PREFIX": lab or "thorn",
           **(settings or {})}  # fmt: skip
    env.pop("THORN_ADMIN_TOKEN", None)
    log = (tmp / "thorn-run.out").open("wb")
    run = subprocess.Popen([str(Path(sys.executable).parent / "thorn-run")], env=env,
                           stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        run_file = tmp / "run.json"
        deadline = time.monotonic() + START_S
        while not run_file.exists():
            assert run.poll() is None, (tmp / "thorn-run.out").read_text()
            assert time.monotonic() < deadline, "thorn-run did not start in time"
            time.sleep(0.2)
        running = json.loads(run_file.read_text())
        admin = (tmp / "admin-token").read_text().strip()
        env["THORN_TOKEN"] = admin
        yield Stack(running["api"], admin, lab, env, run.pid, running)
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
        log.close()
