"""A THORN service's real entry point (`thorn-topology`, `thorn-health`, ...) as a
subprocess, configured only by THORN_* variables, as production starts it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from thorn.natsd import free_port

START_S = 60.0
STOP_S = 15.0


@dataclass
class ServiceProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the process's /metrics (0 when absent)."""
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}")
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == wanted or (not labels and sample == name):
                return float(value)
        return 0.0


def entry_point(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def run_once(
    name: str, env: Mapping[str, str], within_s: float = START_S
) -> subprocess.CompletedProcess[str]:
    """Start `name` and wait for it to exit on its own (a start that must be refused)."""
    return subprocess.run([entry_point(name)], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=within_s)  # fmt: skip


@contextmanager
def service_process(name: str, env: Mapping[str, str], data_dir: Path) -> Iterator[ServiceProcess]:
    """`name` listening on a free port until /healthz answers 200; stopped with SIGTERM (as
    an orchestrator does) at the end. Its output goes to `data_dir`/`name`.log."""
    port = free_port()
    log = data_dir / f"{name}.log"
    full = {**os.environ, "THORN_DATA_DIR": str(data_dir), "THORN_LISTEN": f"127.0.0.1:{port}",
            **env}  # fmt: skip
    with log.open("ab") as out:
        process = subprocess.Popen([entry_point(name)], env=full, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    running = ServiceProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}):\n{running.log_tail()}")
            try:
                if httpx.get(f"{running.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer /healthz:\n{running.log_tail()}")
            time.sleep(0.1)
        yield running
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
