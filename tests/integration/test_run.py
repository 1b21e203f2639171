"""`thorn-run` (what `make run` starts): the whole controller comes up, serves, and stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from thorn.natsd import free_port

START = 90.0
STOP = 30.0


def wait_for(url: str, token: str, deadline: float) -> httpx.Response:
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=2)
            if response.status_code == 200 and response.json()["nodes"] > 0:
                return response
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not serve a loaded fabric in time")


def netns_names() -> list[str]:
    run = Path("/run/netns")
    return [p.name for p in run.iterdir()] if run.exists() else []


def children_of(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
    return found


def test_thorn_run_serves_a_generated_fabric_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    lab = f"tr{uuid.uuid4().hex[:8]}"  # this test's own emulated fabric (as root)
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_LAB": lab}  # fmt: skip
    env.pop("THORN_ADMIN_TOKEN", None)
    script = Path(sys.executable).parent / "thorn-run"
    run = subprocess.Popen([str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        token_file = tmp_path / "admin-token"
        deadline = time.monotonic() + START
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        token = token_file.read_text().strip()
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        summary = wait_for(
            f"http://127.0.0.1:{port}/api/v1/fabric/summary", token, time.monotonic() + START
        ).json()
        assert (summary["switches"], summary["hosts"]) == (6, 16)
        # nats-server, topology, health, pathcomp; as root also the programmer, which starts
        # once the emulated fabric (a lab of namespaces) is built.
        expected = 5 if os.geteuid() == 0 else 4
        while len(services := children_of(run.pid)) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(services) >= expected
        if os.geteuid() == 0:
            assert any(name.startswith(f"{lab}-") for name in netns_names())
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=STOP)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = output.decode(errors="replace")
    assert run.returncode == 0, text
    assert token in text  # the generated admin token is printed on the run that made it
    assert "THORN stopped cleanly." in text
    assert not any(Path(f"/proc/{pid}").exists() for pid in services)
    assert not any(name.startswith(f"{lab}-") for name in netns_names()), "the lab is down"
    # A second run reuses the saved token, loads nothing new, and does not print the secret.
    again = subprocess.Popen(
        [str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/api/v1/fabric/summary", token, time.monotonic() + START)
        services = children_of(again.pid)
        again.send_signal(signal.SIGHUP)  # the terminal went away: stop cleanly all the same
        output, _ = again.communicate(timeout=STOP)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
    assert again.returncode == 0
    assert token not in output.decode(errors="replace")
    assert not any(Path(f"/proc/{pid}").exists() for pid in services)


def test_services_do_not_outlive_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL leaves the launcher no time to stop anything: its services stop themselves."""
    port = free_port()
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_EMULATED_FABRIC": "0"}  # fmt: skip
    env.pop("THORN_ADMIN_TOKEN", None)
    script = Path(sys.executable).parent / "thorn-run"
    run = subprocess.Popen([str(script)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + START
    while len(services := children_of(run.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(services) >= 4
    run.kill()
    run.wait()
    deadline = time.monotonic() + STOP
    while any(Path(f"/proc/{pid}").exists() for pid in services) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in services)
