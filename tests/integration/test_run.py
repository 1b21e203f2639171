"""`thorn-run` (what `make run` starts): the whole controller comes up, serves, and stops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import nats
import nats.errors
from fixed_tokens import fixed_token
from launched import children_of, cmdline, listen_port

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


async def anonymous_refused(url: str) -> bool:
    try:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    except nats.errors.Error as exc:
        return "Authorization Violation" in str(exc)
    await nc.close()
    return False


def agents_applied(programmer: str, nodes: int, deadline: float) -> None:
    """Wait until each of the lab's `nodes` agents has reconciled its node without error."""
    status: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            status = httpx.get(f"{programmer}/status", timeout=5).json()
            done = [a for a in status if a["reconciles"] and not a["last_errors"]]
            if len(done) == nodes:
                return
        time.sleep(0.5)
    raise AssertionError(f"not every agent applied its desired state: {status}")


def netns_names() -> list[str]:
    run = Path("/run/netns")
    return [p.name for p in run.iterdir()] if run.exists() else []


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
        # nats-server, topology, health, pathcomp, the entry point; as root also the
        # programmer, which starts once the emulated fabric (a lab of namespaces) is built.
        expected = 6 if os.geteuid() == 0 else 5
        while len(services := children_of(run.pid)) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(services) >= expected
        if os.geteuid() == 0:
            assert any(name.startswith(f"{lab}-") for name in netns_names())
        run_file = tmp_path / "run.json"  # what scripts read, once everything is up
        while not run_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        running = json.loads(run_file.read_text())
        assert running["api"] == f"http://127.0.0.1:{port}"
        assert running["nats"].startswith("nats://127.0.0.1:")
        # NATS in operator mode: no anonymous client; the admin's creds printed and in run.json
        admin_creds = tmp_path / "nats-auth" / "creds" / "admin.creds"
        assert running["nats_creds"] == str(admin_creds)
        assert oct(admin_creds.stat().st_mode & 0o777) == "0o600"
        assert asyncio.run(anonymous_refused(running["nats"]))
        assert asyncio.run(topology_stream(running["nats"], admin_creds))[1] >= 1
        assert {"topology", "health", "pathcomp", "gateway"} <= running["services"].keys()
        # One URL: every service's API answers on the well-known port.
        for path in ("/api/v1/plan", "/api/v1/health/links", "/api/v1/nodes"):
            answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10,
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            assert answer.status_code == 200, (path, answer.text)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()
        assert {"topology", "health", "pathcomp"} <= health["services"].keys()
        assert running["lab"] == (lab if os.geteuid() == 0 else None)
        if os.geteuid() == 0:  # every lab node's agent programmed its node as itself
            agents_applied(running["services"]["programmer"]["url"], 22, deadline)
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
    assert f"--creds {tmp_path / 'nats-auth' / 'creds' / 'admin.creds'} stream ls" in text
    # Normal work under least privilege: the server refused nothing any THORN process asked
    # (it logs a refusal as "Publish Violation" or "Subscription Violation").
    nats_log = (tmp_path / "logs" / "nats-server.log").read_text(errors="replace")
    refused = [line for line in nats_log.splitlines() if "Violation - " in line]
    assert refused == [], refused[:5]
    assert "Authenticated JWT" in nats_log  # the log is the one of an operator-mode server
    assert not (tmp_path / "run.json").exists()
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


# --- supervision: a dead child comes back, the rest is left alone ----------------------------

RESTART = 30.0  # bound on a child's way back (the first restart waits 0.2 s)


def child_roles(launcher_pid: int) -> dict[str, int]:
    """The launcher's children by role: nats-server and thorn-<service> -> pid."""
    roles = {}
    for pid in children_of(launcher_pid):
        args = cmdline(pid)
        if args and Path(args[0]).name == "nats-server":
            roles["nats-server"] = pid
        for arg in args[:2]:  # `python .venv/bin/thorn-health`
            if Path(arg).name.startswith("thorn-"):
                roles[Path(arg).name.removeprefix("thorn-")] = pid
    return roles


def nats_port(pid: int) -> int:
    args = cmdline(pid)
    return int(args[args.index("-p") + 1])


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def healthz_on(port: int) -> Callable[[int], bool]:
    """A readiness check for `back_again`: the service's port answers, whatever its pid."""
    return lambda _pid: healthy(port)


def nats_greets(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(1)
            return sock.recv(5) == b"INFO "
    except OSError:
        return False


def back_again(launcher_pid: int, role: str, old_pid: int, ready: Callable[[int], bool]) -> int:
    """Wait for a new `role` child that is ready (its port answers); return its pid."""
    deadline = time.monotonic() + RESTART
    while time.monotonic() < deadline:
        pid = child_roles(launcher_pid).get(role)
        if pid is not None and pid != old_pid and ready(pid):
            return pid
        time.sleep(0.05)
    raise AssertionError(f"{role} did not come back within {RESTART:.0f} s")


async def topology_stream(url: str, creds: Path) -> tuple[int, int, dict[str, object]]:
    """THORN_TOPOLOGY's first sequence, message count and last topology.changed event."""
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0,
                            user_credentials=str(creds))  # fmt: skip
    try:
        js = nc.jetstream()
        info = await js.stream_info("THORN_TOPOLOGY")
        last = await js.get_last_msg("THORN_TOPOLOGY", "topology.changed")
        return info.state.first_seq, info.state.messages, json.loads(last.data or b"{}")
    finally:
        await nc.close()


def test_thorn_run_restarts_killed_services_and_nats_and_leaves_the_rest(tmp_path: Path) -> None:
    port = free_port()
    token = fixed_token("supervision_test")
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_EMULATED_FABRIC": "0", "THORN_ADMIN_TOKEN": token}  # fmt: skip
    script = Path(sys.executable).parent / "thorn-run"
    run = subprocess.Popen([str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    try:
        wait_for(f"http://127.0.0.1:{port}/api/v1/fabric/summary", token, time.monotonic() + START)
        assert healthy(port)
        deadline = time.monotonic() + START
        while len(roles := child_roles(run.pid)) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(roles) == {"nats-server", "topology", "health", "pathcomp", "gateway"}, roles
        seen |= set(roles.values())

        # health and pathcomp die hard: each comes back on its own port; topology is untouched.
        ports = {role: listen_port(roles[role]) for role in ("health", "pathcomp")}
        killed_at = time.monotonic()
        for role in ports:
            os.kill(roles[role], signal.SIGKILL)
        for role, role_port in ports.items():
            pid = back_again(run.pid, role, roles[role], healthz_on(role_port))
            print(f"{role} back (healthz) {time.monotonic() - killed_at:.2f} s after kill -9")
            assert listen_port(pid) == role_port
            seen.add(pid)
        assert child_roles(run.pid)["topology"] == roles["topology"]

        # nats-server dies hard: it comes back on the same port with its JetStream store.
        old_nats = roles["nats-server"]
        old_port = nats_port(old_nats)
        url = f"nats://127.0.0.1:{old_port}"
        admin = tmp_path / "nats-auth" / "creds" / "admin.creds"
        first_seq, messages, _ = asyncio.run(topology_stream(url, admin))
        assert messages >= 1  # the seeded fabric's topology.changed
        killed_at = time.monotonic()
        os.kill(old_nats, signal.SIGKILL)
        new_nats = back_again(
            run.pid, "nats-server", old_nats, lambda pid: nats_greets(nats_port(pid))
        )
        print(f"nats-server back (INFO) {time.monotonic() - killed_at:.2f} s after kill -9")
        assert nats_port(new_nats) == old_port
        seen.add(new_nats)

        # topology still serves a write, and its event reaches the restarted server's stream.
        headers = {"Authorization": f"Bearer {token}"}
        created = httpx.post(f"http://127.0.0.1:{port}/api/v1/tenants", json={"name": "after"},
                             headers=headers, timeout=10)  # fmt: skip
        assert created.status_code == 201, created.text
        revision = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/fabric/summary", headers=headers, timeout=10
        ).json()["revision"]
        deadline = time.monotonic() + RESTART
        while True:
            with contextlib.suppress(Exception):  # JetStream may still be recovering its store
                now_first, now_messages, last = asyncio.run(topology_stream(url, admin))
                if last.get("revision") == revision:
                    break
            assert time.monotonic() < deadline, "topology.changed never reached the new server"
            time.sleep(0.2)
        print(f"tenant event in the stream {time.monotonic() - killed_at:.2f} s after kill -9")
        assert (now_first, now_messages) == (first_seq, messages + 1)  # the old events survived
        roles = child_roles(run.pid)
        assert set(roles) == {"nats-server", "topology", "health", "pathcomp", "gateway"}

        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=STOP)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = output.decode(errors="replace")
    assert run.returncode == 0, text
    assert "THORN stopped cleanly." in text
    for role in ("health", "pathcomp", "nats-server"):
        assert f"{role} was killed by SIGKILL after" in text, text
    assert "Restarts: nats-server 1, health 1, pathcomp 1." in text, text
    assert not any(Path(f"/proc/{pid}").exists() for pid in seen)


def test_a_child_that_keeps_failing_at_start_is_retried_and_the_user_told(tmp_path: Path) -> None:
    """health's port is taken while it is down: each start fails at once; once freed, it is back."""
    port = free_port()
    token = fixed_token("crash_loop_test")
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_EMULATED_FABRIC": "0", "THORN_ADMIN_TOKEN": token}  # fmt: skip
    script = Path(sys.executable).parent / "thorn-run"
    run = subprocess.Popen([str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = tmp_path / "logs" / "health.log"
    try:
        wait_for(f"http://127.0.0.1:{port}/api/v1/fabric/summary", token, time.monotonic() + START)
        deadline = time.monotonic() + START
        while "health" not in (roles := child_roles(run.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        health_port = listen_port(roles["health"])
        with socket.socket() as squatter:
            os.kill(roles["health"], signal.SIGKILL)
            deadline = time.monotonic() + STOP
            while Path(f"/proc/{roles['health']}/cmdline").exists():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", health_port))
            squatter.listen()
            deadline = time.monotonic() + 4 * RESTART
            while log.read_text(errors="replace").count("address already in use") < 5:
                assert time.monotonic() < deadline, "health was not retried five times"
                time.sleep(0.2)
            topology = child_roles(run.pid)["topology"]
            assert topology == roles["topology"]  # the others were left alone
        freed = time.monotonic()
        back_again(run.pid, "health", roles["health"], healthz_on(health_port))
        # the wait is capped at 10 s; a start takes ~1 s
        assert time.monotonic() - freed < 10 + RESTART
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=STOP)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = output.decode(errors="replace")
    assert run.returncode == 0, text
    assert text.count("health keeps failing soon after it starts (5 times in a row)") == 1, text
    assert "health exited with code " in text, text  # a taken port: a clean error exit
    assert "THORN stopped cleanly." in text
