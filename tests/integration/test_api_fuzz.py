"""The API fuzzed: schemathesis drives every operation of the merged OpenAPI document
(openapi/openapi.json) through the one URL of a live `thorn-run`, as an admin and without a
valid token. Pass: no 5xx, no timeout, every answer's status, headers, content type and body
as the document says, invalid data refused, valid data past field validation.

How to run it and what each check means: docs/api.md, "Fuzzing the API". The runs'
settings and THORN's own checks: tests/fuzz/."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from thorn_stack import Stack, run_stack

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "tests" / "fuzz"
DOCUMENT = ROOT / "openapi" / "openapi.json"
# A fixed seed: CI's run is reproducible. THORN_FUZZ_SEED picks another (docs/api.md).
SEED = int(os.environ.get("THORN_FUZZ_SEED", "14"))
ADMIN_CASES = 1000  # the floor for the admin run
# schemathesis bounds each request (request-timeout in tests/fuzz/*.toml); this bounds a run.
RUN_S = 900


def operations() -> int:
    paths = json.loads(DOCUMENT.read_text())["paths"]
    return sum(len(item) for item in paths.values())


# The entry point answers 429 to every request of a client past 10 failed authentications a
# minute; both runs fail authentication on purpose, hundreds of times, from one address. The
# limit is raised so that every request reaches the services' own checks (the limiter has
# its own tests: tests/integration/test_auth_limits.py).
SETTINGS = {"THORN_AUTH_FAILURE_LIMIT": "1000000"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with run_stack(tmp_path_factory.mktemp("fuzz"), emulated=False, settings=SETTINGS) as running:
        yield running


def fuzz(stack: Stack, config: str, out: Path, **env: str) -> tuple[dict[str, Any], str]:
    """One schemathesis run against the stack: its JSON report and its console output."""
    report = out / "report.json"
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(FUZZ / config),
        "run", str(DOCUMENT), "--url", stack.url, "--seed", str(SEED), "--no-color",
        "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    output = out / "schemathesis.out"  # written as the run goes: `tail -f` it
    with output.open("w") as sink:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=RUN_S, check=False)  # fmt: skip
    console = output.read_text()
    assert report.exists(), console[-20_000:]
    document: dict[str, Any] = json.loads(report.read_text())
    assert done.returncode == 0, console[-20_000:]
    return document, console


def assert_clean(report: dict[str, Any], console: str) -> None:
    """Every operation tested; no failure, no error (a timeout is one), no failed warning."""
    assert report["operations"]["total"] == operations(), report["operations"]
    assert report["operations"]["tested"] == report["operations"]["total"], report["operations"]
    assert report["failures"] == [], console[-20_000:]
    assert report["errors"] == [], console[-20_000:]
    assert report["test_cases"]["errored"] == 0, console[-20_000:]


def assert_stack_survived(stack: Stack) -> None:
    """The stack answers as before, no service exited (thorn-run restarts a child that exits
    and says so on one line), and none logged an error: a failure behind the answers (the
    lane found pathcomp's incremental update failing on topology.changed that way)."""
    assert stack.api("GET", "/api/v1/whoami").status_code == 200
    assert httpx.get(f"{stack.url}/healthz", timeout=10).status_code == 200
    data = Path(stack.env["THORN_DATA_DIR"])
    restarts = re.findall(r".*; restart \d+ in.*", (data / "thorn-run.out").read_text())
    assert restarts == []
    for log in sorted((data / "logs").glob("*.log")):
        if log.name.startswith("nats-server"):
            continue  # not structlog's; the fuzz does not reach NATS
        errors = [line for line in log.read_text().splitlines()
                  if '"level": "error"' in line or "Traceback" in line]  # fmt: skip
        assert errors == [], f"{log.name}: {errors[0][:2000]}"


def test_every_operation_as_an_admin_answers_as_the_document_says(
    stack: Stack, tmp_path: Path
) -> None:
    admin = {"THORN_FUZZ_TOKEN": stack.admin, "THORN_FUZZ_URL": stack.url}
    report, console = fuzz(stack, "schemathesis.toml", tmp_path, **admin)
    assert_clean(report, console)
    assert report["test_cases"]["generated"] >= ADMIN_CASES, report["test_cases"]
    assert_stack_survived(stack)


def test_every_operation_without_a_valid_token_is_refused_with_401(
    stack: Stack, tmp_path: Path
) -> None:
    revoked_name = "fuzz-revoked"
    made = stack.api("POST", "/api/v1/tokens", json={"name": revoked_name, "role": "admin"})
    assert made.status_code == 201, made.text
    revoked = made.json()["token"]
    assert stack.api("DELETE", f"/api/v1/tokens/{revoked_name}").status_code == 204
    wrong = {"THORN_FUZZ_RUN": "unauthenticated", "THORN_FUZZ_REVOKED_TOKEN": revoked}
    report, console = fuzz(stack, "unauthenticated.toml", tmp_path, **wrong)
    assert_clean(report, console)
    assert report["test_cases"]["generated"] >= 2 * operations(), report["test_cases"]
    assert_stack_survived(stack)
