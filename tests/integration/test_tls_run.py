"""`THORN_TLS=local make run`: the whole controller with its API over HTTPS and NATS over TLS,
checked from outside as a user would (the generated CA, a wrong CA, plain HTTP, thornctl);
and processes given unusable certificate files refuse to start, naming the setting."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from thorn import local_ca
from thorn.auth import new_token
from thorn.bus import Bus, BusConnectError
from thorn.natsd import free_port
from thorn.tls import client_context

START = 120.0
STOP = 30.0
BIN = Path(sys.executable).parent


def exited(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run a THORN command to its end: its exit code and everything it printed."""
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def nats_info(url: str) -> dict[str, object]:
    host, _, port = url.removeprefix("nats://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        line = sock.makefile("rb").readline()
    info: dict[str, object] = json.loads(line.removeprefix(b"INFO "))
    return info


def test_make_run_with_a_local_ca_serves_https_and_nats_over_tls_only(tmp_path: Path) -> None:
    port, token = free_port(), new_token()
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path), "THORN_LISTEN": f"127.0.0.1:{port}",
           "THORN_TLS": "local", "THORN_EMULATED_FABRIC": "0",
           "THORN_ADMIN_TOKEN": token}  # fmt: skip
    run = subprocess.Popen([str(BIN / "thorn-run")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)  # fmt: skip
    try:
        run_file = tmp_path / "run.json"
        deadline = time.monotonic() + START
        while not run_file.exists():
            assert run.poll() is None, "thorn-run exited while starting"
            assert time.monotonic() < deadline, "thorn-run did not come up"
            time.sleep(0.2)
        running = json.loads(run_file.read_text())
        api, ca = running["api"], Path(running["ca"])
        assert api == f"https://127.0.0.1:{port}"
        assert ca == tmp_path / "tls" / "ca.pem"
        trusting = client_context(ca, ca_variable="CA")
        headers = {"Authorization": f"Bearer {token}"}

        # With the CA: the whole API, one URL. The seeded fabric and the plan mean topology
        # and pathcomp spoke to each other over the TLS-only NATS.
        with httpx.Client(base_url=api, verify=trusting, headers=headers, timeout=30) as client:
            summary = client.get("/api/v1/fabric/summary").json()
            assert (summary["switches"], summary["hosts"]) == (6, 16)
            deadline = time.monotonic() + START
            while (plan := client.get("/api/v1/plan")).status_code != 200:
                assert time.monotonic() < deadline, plan.text
                time.sleep(0.5)
            assert client.get("/healthz").json()["status"] == "ok"

        # Plain HTTP on the same port gets no answer: the TLS handshake fails.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        # Another CA, or none (the system's), refuses the certificate.
        other = local_ca.ensure(tmp_path / "other-ca")
        for verify in (client_context(other.ca, ca_variable="CA"), True):
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(f"{api}/healthz", verify=verify, timeout=10)

        # thornctl with the CA, by option or environment; without it, one line saying so.
        ctl = [str(BIN / "thornctl"), "--url", api, "--token", token, "-o", "json"]
        code, output = exited([*ctl, "--ca", str(ca), "summary"], env)
        assert code == 0 and json.loads(output)["hosts"] == 16, output
        code, output = exited([*ctl, "whoami"], {**env, "THORN_CA": str(ca)})
        assert code == 0, output
        code, output = exited([*ctl, "summary"], {k: v for k, v in env.items() if k != "THORN_CA"})
        assert code == 69 and "--ca FILE (THORN_CA)" in output, output

        # NATS: TLS only; a client that does not trust the CA gets nowhere.
        nats_url = running["nats"]
        assert nats_info(nats_url)["tls_required"] is True
        for context in (None, client_context(other.ca, ca_variable="CA")):
            with pytest.raises(BusConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                asyncio.run(Bus.connect(nats_url, tls=context, connect_timeout=2))
        run.send_signal(signal.SIGINT)
        output_bytes, _ = run.communicate(timeout=STOP)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = output_bytes.decode(errors="replace")
    assert run.returncode == 0, text
    assert f"https://127.0.0.1:{port}" in text and str(ca) in text  # the start-up table
    assert oct((tmp_path / "tls" / "server-key.pem").stat().st_mode & 0o777) == "0o600"


# --- bad certificate files: a clear refusal at start ------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> local_ca.LocalCA:
    return local_ca.ensure(tmp_path_factory.mktemp("ca"))


def test_the_entry_point_refuses_to_start_with_a_missing_certificate_naming_it(
    ca: local_ca.LocalCA, tmp_path: Path
) -> None:
    env = {**os.environ, "THORN_LISTEN": f"127.0.0.1:{free_port()}",
           "THORN_TLS_CERT": str(tmp_path / "missing.pem"), "THORN_TLS_KEY": str(ca.key),
           "THORN_UPSTREAMS": "topology=http://127.0.0.1:9"}  # fmt: skip
    code, output = exited([str(BIN / "thorn-gateway")], env)
    assert code == os.EX_CONFIG, output
    (line,) = [json.loads(x) for x in output.splitlines() if '"tls_unusable"' in x]
    assert line["variable"] == "THORN_TLS_CERT"
    assert line["path"] == str(tmp_path / "missing.pem")
    assert line["problem"] == "no such file"


def test_a_service_refuses_to_start_with_a_key_that_is_not_its_certificates(
    ca: local_ca.LocalCA, tmp_path: Path
) -> None:
    other = local_ca.ensure(tmp_path / "other")
    env = {**os.environ, "THORN_LISTEN": f"127.0.0.1:{free_port()}",
           "THORN_DATA_DIR": str(tmp_path), "THORN_TLS_CERT": str(ca.cert),
           "THORN_TLS_KEY": str(other.key)}  # fmt: skip
    code, output = exited([str(BIN / "thorn-health")], env)
    assert code == os.EX_CONFIG, output
    assert '"variable": "THORN_TLS_KEY"' in output
    assert "is not the private key of the certificate in THORN_TLS_CERT" in output
    body = "".join(other.key.read_text().splitlines()[1:-1])
    assert body[:24] not in output


def test_a_service_refuses_to_start_with_an_unreadable_nats_ca_naming_it(tmp_path: Path) -> None:
    env = {**os.environ, "THORN_LISTEN": f"127.0.0.1:{free_port()}",
           "THORN_DATA_DIR": str(tmp_path), "THORN_NATS_CA": str(tmp_path),
           "THORN_NATS_URL": "nats://127.0.0.1:9"}  # fmt: skip
    code, output = exited([str(BIN / "thorn-pathcomp")], env)
    assert code == os.EX_CONFIG, output
    (line,) = [json.loads(x) for x in output.splitlines() if '"tls_unusable"' in x]
    assert (line["variable"], line["problem"]) == (
        "THORN_NATS_CA",
        "is a directory, not a PEM file",
    )


def test_thorn_run_refuses_a_missing_certificate_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "THORN_DATA_DIR": str(tmp_path),
           "THORN_LISTEN": f"127.0.0.1:{free_port()}",
           "THORN_EMULATED_FABRIC": "0", "THORN_TLS_CERT": str(tmp_path / "nope.pem"),
           "THORN_TLS_KEY": str(tmp_path / "nope-key.pem")}  # fmt: skip
    code, output = exited([str(BIN / "thorn-run")], env)
    assert code == 1, output
    said = "".join(output.split())  # the console may wrap a long path
    assert "".join(f"THORN_TLS_CERT={tmp_path / 'nope.pem'}: no such file".split()) in said
    assert "Traceback" not in output


# --- the hops behind the entry point, when a deployment wants them over TLS too ---------------


def wait_ok(url: str, verify: ssl.SSLContext, within: float = 60) -> httpx.Response:
    deadline = time.monotonic() + within
    while True:
        try:
            answer = httpx.get(url, verify=verify, timeout=5)
            if answer.status_code == 200:
                return answer
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer 200"
        time.sleep(0.2)


def test_the_entry_point_reaches_an_https_service_verified_with_thorn_tls_ca(
    ca: local_ca.LocalCA, tmp_path: Path, nats_url: str
) -> None:
    health_port = free_port()
    trusting = client_context(ca.ca, ca_variable="CA")
    service_env = {**os.environ, "THORN_LISTEN": f"127.0.0.1:{health_port}",
                   "THORN_DATA_DIR": str(tmp_path), "THORN_NATS_URL": nats_url,
                   "THORN_TLS_CERT": str(ca.cert), "THORN_TLS_KEY": str(ca.key)}  # fmt: skip
    upstream = f"https://127.0.0.1:{health_port}"
    other = local_ca.ensure(tmp_path / "other")
    health = subprocess.Popen([str(BIN / "thorn-health")], env=service_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    gateways: list[subprocess.Popen[bytes]] = []
    try:
        wait_ok(f"{upstream}/healthz", trusting)
        seen = {}
        for name, gateway_ca in (("right CA", ca.ca), ("another CA", other.ca)):
            port = free_port()
            gateway_env = {**os.environ, "THORN_LISTEN": f"127.0.0.1:{port}",
                           "THORN_UPSTREAMS": f"health={upstream}",
                           "THORN_TLS_CA": str(gateway_ca)}  # fmt: skip
            gateways.append(subprocess.Popen([str(BIN / "thorn-gateway")], env=gateway_env,
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))  # fmt: skip
            entry = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    report = httpx.get(f"{entry}/healthz", timeout=5).json()
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the entry point did not start"
                    time.sleep(0.2)
            routed = httpx.get(f"{entry}/api/v1/health/links", timeout=10)
            seen[name] = (report["services"]["health"]["status"], routed.status_code)
    finally:
        for process in (*gateways, health):
            process.send_signal(signal.SIGINT)
        for process in (*gateways, health):
            process.wait(timeout=STOP)
    # with the CA that signed it: routed to health, which wants a token (401, its own answer)
    # with another: the replica is unreachable, and the request is answered 503 by the gateway
    assert seen == {"right CA": ("ok", 401), "another CA": ("unreachable", 503)}
