"""`thornctl` against a real topology service: uvicorn in a thread, SQLite, real NATS.

The CLI talks HTTP to the server exactly as it would in production; nothing is mocked.
Most tests drive it in-process with Typer's CliRunner (stdout and stderr kept apart), and
`test_the_installed_thornctl_exits_with_conventional_codes` runs `.venv/bin/thornctl` as
a subprocess to check real exit codes. Every test starts from the same small fabric.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import yaml
from fixed_tokens import fixed_token
from rc_tenants import fabric_of_two_tenants
from serving import SHUTDOWN, STARTUP, serving
from standin_agents import StandInAgents
from typer.testing import CliRunner, Result

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import (
    STREAM_FAILOVER,
    AgentRegistration,
    Event,
    FailoverEvent,
    RegistrationReply,
    Trace,
    new_trace_id,
    utcnow,
)
from thorn.natsauth import permissions
from thorn.natsauth.files import AuthDir
from thorn.natsauth.jwt import decode, read_creds
from thorn.natsd import free_port
from thorn.observed import HeardNeighbour, NodeObservation, ObservedPort
from thorn_gateway.app import create_app as gateway_app
from thorn_health.app import create_app as health_app
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_topology.app import create_app
from thornctl.context import since_value
from thornctl.main import app

ADMIN = fixed_token("thornctl-test-admin")
THORNCTL = Path(sys.executable).with_name("thornctl")

# The fabric every test starts from: two switches, one host, two links.
SMALL: dict[str, Any] = {
    "format": "thorn.fabric/v1",
    "nodes": [
        {
            "name": "spine1",
            "role": "switch",
            "labels": {"tier": "spine"},
            "ports": [{"name": "swp1"}],
        },
        {
            "name": "leaf1",
            "role": "switch",
            "labels": {"tier": "leaf"},
            "ports": [{"name": "swp1"}, {"name": "swp2"}],
        },
        {"name": "gpu1", "role": "host", "labels": {"tier": "host"}, "ports": [{"name": "eth1"}]},
    ],
    "links": [
        {"a": "leaf1:swp2", "b": "spine1:swp1", "srlgs": ["duct-7"]},
        {"a": "gpu1:eth1", "b": "leaf1:swp1"},
    ],
}

NATIVE_YAML = """\
format: thorn.fabric/v1
nodes:
  - name: sw-a
    role: switch
    ports: [{name: swp1}, {name: swp2}]
  - name: sw-b
    role: switch
    ports: [{name: swp1}]
  - name: host-a
    role: host
    ports: [{name: eth1}]
links:
  - {a: "sw-a:swp1", b: "sw-b:swp1"}
  - {a: "host-a:eth1", b: "sw-a:swp2"}
"""

CLAB = (Path(__file__).parents[1] / "data" / "clab" / "tiny.clab.yml").read_text()
# A bridge is a shared L2 segment, not a fabric node: it and its links are skipped.
CLAB_WITH_BRIDGE = (
    CLAB.replace("  links:\n", "    br0: {kind: bridge}\n  links:\n")
    + '    - endpoints: ["gpu1:eth2", "br0:eth1"]\n'
)


# --- the server ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def server_logs_to_stderr() -> Iterator[None]:
    """The in-process servers log while a command runs (a stalled loop, say): to the real
    stderr, never into the CliRunner's captured stdout, which a test parses as JSON."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.__stderr__))
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("thornctl")


@pytest.fixture(scope="module")
def thorn_url(data_dir: Path, nats_url: str) -> Iterator[str]:
    """The real topology app (issuing agents' NATS credentials with a signing key of its own
    trust material; its connection stays the test server's, without auth)."""
    auth = AuthDir.open(data_dir / "nats-auth")
    own = auth.write_creds(permissions.topology(), now=time.time(), lifetime=3600, name="topo")
    settings = Settings(admin_token=ADMIN, data_dir=data_dir, nats_issuer_seed=auth.issuer_seeds,
                        nats_creds=own)  # fmt: skip
    with serving(
        "topology", lambda store, bus: create_app(settings, store=store, bus=bus),
        data_dir / "thorn.db", nats_url,
    ) as url:  # fmt: skip
        yield url


def api(thorn_url: str, method: str, path: str, **kwargs: Any) -> Any:
    """Ask the API directly (as admin): the reference the CLI's output is checked against."""
    response = httpx.request(
        method,
        f"{thorn_url}/api/v1{path}",
        headers=AS_ADMIN,
        timeout=30.0,
        **kwargs,
    )
    assert response.is_success, response.text
    return response.json()


@pytest.fixture(autouse=True)
def small_fabric(thorn_url: str) -> None:
    """Each test starts from SMALL (tokens, which imports do not touch, are per test)."""
    api(thorn_url, "POST", "/fabric/import", json=SMALL)


# --- driving the CLI -------------------------------------------------------------------------


@dataclass
class Thornctl:
    url: str
    runner: CliRunner

    def __call__(
        self, *args: str, token: str | None = ADMIN, url: str | None = None, stdin: str = ""
    ) -> Result:
        argv = ["--url", url or self.url]
        if token is not None:
            argv += ["--token", token]
        result = self.runner.invoke(app, [*argv, *args], input=stdin)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a traceback is a bug, whatever the input
        return result


@pytest.fixture
def thornctl(thorn_url: str) -> Thornctl:
    # None unsets: the developer's own THORN_* settings must not leak into the tests.
    env: dict[str, str | None] = {
        k: None
        for k in ("THORN_URL", "THORN_TOKEN", "THORN_OUTPUT", "THORN_TIMEOUT", "COLUMNS")
    }  # fmt: skip
    return Thornctl(thorn_url, CliRunner(env=env))


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return result


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- generate, summary, nodes ----------------------------------------------------------------


def test_generate_replaces_the_fabric_and_summary_counts_it(thornctl: Thornctl) -> None:
    result = ok(
        thornctl(
            "generate", "leaf-spine",
            "--set", "spines=2",
            "-s", "leaves=2",
            "--set", "hosts-per-leaf=2",
            "--set", "workloads=false",
        )
    )  # fmt: skip
    assert "Imported generated leaf-spine" in result.stdout
    summary = as_json(thornctl("-o", "json", "summary"))
    assert (summary["switches"], summary["hosts"], summary["links"]) == (4, 4, 8)
    assert summary["workloads"] == 0  # workloads=false arrived as a boolean
    table = ok(thornctl("summary")).stdout
    assert re.search(r"switches\s+4", table)
    assert re.search(rf"revision\s+{summary['revision']}", table)


def test_a_generate_dry_run_validates_but_changes_nothing(
    thornctl: Thornctl, thorn_url: str
) -> None:
    before = api(thorn_url, "GET", "/fabric/summary")
    result = as_json(thornctl("-o", "json", "generate", "fat-tree", "--set", "k=4", "--dry-run"))
    assert result["dry_run"] is True
    assert result["summary"]["nodes"] == 36  # 20 switches and 16 hosts
    assert api(thorn_url, "GET", "/fabric/summary") == before


def test_nodes_list_is_a_table_for_people_and_the_api_json_for_scripts(
    thornctl: Thornctl, thorn_url: str
) -> None:
    table = ok(thornctl("nodes", "list")).stdout
    assert table.split()[:5] == ["NAME", "ROLE", "STATE", "MGMT", "ADDRESS"]
    assert re.search(r"gpu1\s+host\s+up\s+-\s+tier=host", table)
    assert "3 nodes" in table
    assert as_json(thornctl("-o", "json", "nodes", "list")) == api(thorn_url, "GET", "/nodes")
    listed = yaml.safe_load(ok(thornctl("-o", "yaml", "nodes", "list")).stdout)
    assert [n["name"] for n in listed["items"]] == ["gpu1", "leaf1", "spine1"]


def test_nodes_list_filters_by_role_and_label_and_pages(thornctl: Thornctl) -> None:
    switches = as_json(thornctl("-o", "json", "nodes", "list", "--role", "switch"))
    assert [n["name"] for n in switches["items"]] == ["leaf1", "spine1"]
    spines = as_json(thornctl("-o", "json", "nodes", "list", "-l", "tier=spine"))
    assert [n["name"] for n in spines["items"]] == ["spine1"]

    page = ok(thornctl("nodes", "list", "--limit", "2", "--offset", "1")).stdout
    assert "showing 2-3 of 3 nodes" in page
    assert "gpu1" not in page
    everything = as_json(thornctl("-o", "json", "nodes", "list", "--all"))
    assert everything["total"] == len(everything["items"]) == 3


def test_nodes_show_gives_the_ports_and_the_links(thornctl: Thornctl) -> None:
    shown = ok(thornctl("nodes", "show", "leaf1")).stdout
    assert re.search(r"role\s+switch", shown)
    assert re.search(r"\d+\s+swp2\s+spine1:swp1\s+up\s+duct-7", shown)
    assert re.search(r"\d+\s+swp1\s+gpu1:eth1\s+up", shown)
    node = as_json(thornctl("-o", "json", "nodes", "show", "leaf1"))
    assert [p["name"] for p in node["ports"]] == ["swp1", "swp2"]


def test_generators_are_listed_from_the_servers_openapi(thornctl: Thornctl) -> None:
    table = ok(thornctl("generate", "--list")).stdout
    for name in ("leaf-spine", "fat-tree", "rail-optimized", "dual-plane"):
        assert name in table
    assert re.search(r"spines\s+integer\s+2\s+1\.\.256", table)
    listed = as_json(thornctl("-o", "json", "generators", "fat-tree"))
    assert listed[0]["name"] == "fat-tree"
    assert listed[0]["parameters"]["k"]["maximum"] == 40


def test_whoami_names_the_token_and_its_role(thornctl: Thornctl) -> None:
    assert as_json(thornctl("-o", "json", "whoami")) == {"name": "bootstrap-admin", "role": "admin"}


# --- import and export -----------------------------------------------------------------------


def test_a_native_yaml_file_is_imported(thornctl: Thornctl, tmp_path: Path) -> None:
    result = ok(thornctl("import", write(tmp_path / "fabric.yaml", NATIVE_YAML)))
    assert "Imported" in result.stdout
    assert re.search(r"nodes\s+3", result.stdout)
    names = as_json(thornctl("-o", "json", "nodes", "list"))["items"]
    assert [n["name"] for n in names] == ["host-a", "sw-a", "sw-b"]


def test_a_native_json_file_is_imported(thornctl: Thornctl, tmp_path: Path) -> None:
    document = yaml.safe_load(NATIVE_YAML)
    result = as_json(
        thornctl("-o", "json", "import", write(tmp_path / "f.json", json.dumps(document)))
    )
    assert result["dry_run"] is False
    assert result["summary"]["links"] == 2


def test_a_document_on_stdin_is_imported(thornctl: Thornctl) -> None:
    result = as_json(thornctl("-o", "json", "import", "-", stdin=NATIVE_YAML))
    assert result["summary"]["nodes"] == 3


def test_a_containerlab_file_is_imported(thornctl: Thornctl, tmp_path: Path) -> None:
    result = ok(thornctl("import", write(tmp_path / "lab.clab.yml", CLAB)))
    assert "Imported" in result.stdout
    assert re.search(r"links\s+2", result.stdout)
    gpu = as_json(thornctl("-o", "json", "nodes", "show", "gpu1"))
    assert gpu["role"] == "host"
    assert gpu["labels"]["clab.kind"] == "linux"


def test_a_containerlab_file_is_recognised_by_its_topology_key(
    thornctl: Thornctl, tmp_path: Path
) -> None:
    result = as_json(thornctl("-o", "json", "import", write(tmp_path / "lab.yaml", CLAB)))
    assert result["summary"]["switches"] == 2


def test_containerlab_warnings_go_to_stderr_and_the_import_succeeds(
    thornctl: Thornctl, tmp_path: Path
) -> None:
    result = thornctl("import", write(tmp_path / "lab.clab.yml", CLAB_WITH_BRIDGE))
    assert result.exit_code == 0, result.stderr
    assert re.search(r"links\s+2", result.stdout)
    assert re.search(r"^warning: topology\.nodes\.br0: .*bridge", result.stderr, re.MULTILINE)
    piped = thornctl("-o", "json", "import", "--format", "clab", "-", stdin=CLAB_WITH_BRIDGE)
    assert len(as_json(piped)["warnings"]) == 2


def test_an_import_dry_run_validates_but_changes_nothing(
    thornctl: Thornctl, thorn_url: str, tmp_path: Path
) -> None:
    before = api(thorn_url, "GET", "/fabric/summary")
    result = ok(thornctl("import", "--dry-run", write(tmp_path / "f.yaml", NATIVE_YAML)))
    assert "Dry run" in result.stdout and "nothing changed" in result.stdout
    assert api(thorn_url, "GET", "/fabric/summary") == before


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_an_export_re_imports_to_the_same_fabric(
    thornctl: Thornctl, thorn_url: str, tmp_path: Path, suffix: str
) -> None:
    ok(thornctl("generate", "dual-plane", "--set", "leaves_per_plane=2"))
    exported = tmp_path / f"fabric{suffix}"
    result = ok(thornctl("export", "--file", str(exported)))
    assert f"to {exported}" in result.stdout
    document = api(thorn_url, "GET", "/fabric")
    on_disk = json.loads(exported.read_text()) if suffix == ".json" else None
    if on_disk is None:
        on_disk = yaml.safe_load(exported.read_text())
    assert on_disk == document

    ok(thornctl("import", str(exported)))
    again = api(thorn_url, "GET", "/fabric")
    assert again["revision"] > document["revision"]
    assert _without_ids(again) == _without_ids(document)  # imports renumber links


def _without_ids(document: dict[str, Any]) -> dict[str, Any]:
    links = [{k: v for k, v in lk.items() if k != "id"} for lk in document["links"]]
    return {**document, "revision": None, "links": links}


def test_export_prints_the_document_on_stdout(thornctl: Thornctl, thorn_url: str) -> None:
    assert as_json(thornctl("export")) == api(thorn_url, "GET", "/fabric")
    assert yaml.safe_load(ok(thornctl("export", "--yaml")).stdout) == api(
        thorn_url, "GET", "/fabric"
    )


# --- links, tokens, audit --------------------------------------------------------------------


def _spine_link(thornctl: Thornctl) -> int:
    links = as_json(thornctl("-o", "json", "links", "list", "--srlg", "duct-7"))["items"]
    assert len(links) == 1
    link_id: int = links[0]["id"]
    return link_id


def test_a_link_is_drained_and_undrained(thornctl: Thornctl) -> None:
    link = _spine_link(thornctl)
    drained = ok(thornctl("links", "drain", str(link))).stdout
    assert f"Link {link} drained" in drained and "leaf1:swp2" in drained
    listed = as_json(thornctl("-o", "json", "links", "list", "--state", "drained"))
    assert [lk["id"] for lk in listed["items"]] == [link]

    assert as_json(thornctl("-o", "json", "links", "undrain", str(link)))["admin_state"] == "up"
    assert re.search(r"admin_state\s+up", ok(thornctl("links", "show", str(link))).stdout)
    actions = as_json(thornctl("-o", "json", "audit", "--action", "link."))["items"]
    assert [a["action"] for a in actions[:2]] == ["link.undrain", "link.drain"]
    assert re.search(rf"link\.undrain\s+{link}\b", ok(thornctl("audit", "--limit", "5")).stdout)


def test_links_list_filters_by_node(thornctl: Thornctl) -> None:
    table = ok(thornctl("links", "list", "--node", "gpu1")).stdout
    assert re.search(r"gpu1:eth1\s+leaf1:swp1\s+up", table)
    assert "spine1" not in table


def test_a_token_is_created_listed_and_revoked_after_which_it_is_refused(
    thornctl: Thornctl,
) -> None:
    created = ok(thornctl("tokens", "create", "ci-bot", "--role", "operator")).stdout
    assert "shown only this once" in created
    secret = re.search(r"thn_\S+", created)
    assert secret is not None
    token = secret.group(0)

    assert as_json(thornctl("-o", "json", "whoami", token=token)) == {
        "name": "ci-bot",
        "role": "operator",
    }
    assert re.search(r"ci-bot\s+operator", ok(thornctl("tokens", "list")).stdout)
    assert token not in ok(thornctl("tokens", "list")).stdout

    assert "Revoked token 'ci-bot'" in ok(thornctl("tokens", "revoke", "ci-bot")).stdout
    refused = thornctl("whoami", token=token)
    assert refused.exit_code == 77
    assert refused.stderr.strip() == "Error: invalid or revoked token"
    assert refused.stdout == ""


def test_a_viewer_token_cannot_import_and_gets_77(thornctl: Thornctl, tmp_path: Path) -> None:
    created = as_json(thornctl("-o", "json", "tokens", "create", "dash", "--role", "viewer"))
    try:
        refused = thornctl(
            "import", write(tmp_path / "f.yaml", NATIVE_YAML), token=created["token"]
        )
        assert refused.exit_code == 77
        assert "has role viewer; this needs admin" in refused.stderr
    finally:
        ok(thornctl("tokens", "revoke", "dash"))


def secret_in(output: str) -> str:
    found = re.search(r"thn_[A-Za-z0-9_-]{43}", output)
    assert found is not None, output
    return found.group(0)


def tokens_by_name(thornctl: Thornctl) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in as_json(thornctl("-o", "json", "tokens", "list"))["items"]}


def test_a_token_made_with_a_ttl_lists_its_expiry_and_its_last_use(
    thornctl: Thornctl,
) -> None:
    made = ok(thornctl("tokens", "create", "ci-ttl", "--role", "viewer", "--ttl", "2d")).stdout
    assert "Created token 'ci-ttl' with role viewer, expiring " in made
    token = secret_in(made)
    try:
        ok(thornctl("whoami", token=token))
        table = ok(thornctl("tokens", "list")).stdout
        assert table.split()[:9] == ["NAME", "ROLE", "CREATED", "CREATED", "BY", "EXPIRES",
                                     "LAST", "USED", "OLD"]  # fmt: skip
        listed = tokens_by_name(thornctl)
        expires = datetime.fromisoformat(listed["ci-ttl"]["expires_at"])
        assert timedelta(days=2) - timedelta(minutes=1) < expires - datetime.now(UTC) <= \
            timedelta(days=2)  # fmt: skip
        # The service writes last uses in the background, every few seconds.
        deadline = time.monotonic() + 15
        while (used := listed["ci-ttl"]["last_used_at"]) is None:
            assert time.monotonic() < deadline, "the token's last use was never written"
            time.sleep(0.2)
            listed = tokens_by_name(thornctl)
        assert datetime.fromisoformat(used) <= datetime.now(UTC)
    finally:
        ok(thornctl("tokens", "revoke", "ci-ttl"))


def test_rotate_prints_a_new_secret_and_the_old_one_works_for_the_overlap(
    thornctl: Thornctl,
) -> None:
    old = secret_in(ok(thornctl("tokens", "create", "ci-rot", "--role", "operator")).stdout)
    try:
        rotated = ok(thornctl("tokens", "rotate", "ci-rot", "--overlap", "10m")).stdout
        assert "Rotated token 'ci-rot': its old secret works until " in rotated
        new = secret_in(rotated)
        for secret in (old, new):
            assert as_json(thornctl("-o", "json", "whoami", token=secret))["name"] == "ci-rot"
        again = ok(thornctl("tokens", "rotate", "ci-rot", "--overlap", "0", token=new)).stdout
        assert "its old secret stopped working now" in again
        refused = thornctl("whoami", token=new)
        assert refused.exit_code == 77
        assert refused.stderr.strip() == "Error: invalid or revoked token"
        assert ok(thornctl("whoami", token=secret_in(again))).stdout
    finally:
        ok(thornctl("tokens", "revoke", "ci-rot"))


def test_token_options_given_wrong_exit_2_naming_the_option(thornctl: Thornctl) -> None:
    for args, option in (
        (["tokens", "create", "x", "--role", "viewer", "--ttl", "soon"], "--ttl"),
        (["tokens", "create", "x", "--role", "viewer", "--ttl", "1d", "--expires-at",
          "2030-01-01T00:00:00Z"], "--ttl"),
        (["tokens", "rotate", "bootstrap-admin", "--overlap", "a while"], "--overlap"),
    ):  # fmt: skip
        result = thornctl(*args)
        assert result.exit_code == 2 and option in result.stderr, result.stderr
    too_short = thornctl("tokens", "create", "x", "--role", "viewer", "--ttl", "30s")
    assert too_short.exit_code == 1
    assert "ttl_seconds" in too_short.stderr and "60" in too_short.stderr


def test_audit_shows_refused_authentications_with_their_client_and_outcome(
    thornctl: Thornctl,
) -> None:
    assert thornctl("whoami", token=fixed_token("never-made")).exit_code == 77
    deadline = time.monotonic() + 10  # written just after the answer, in the background
    while not (denied := as_json(thornctl("-o", "json", "audit", "--action", "auth.",
                                          "--outcome", "denied"))["items"]):  # fmt: skip
        assert time.monotonic() < deadline, "no auth.failure entry"
        time.sleep(0.2)
    newest = denied[0]
    assert (newest["action"], newest["actor"], newest["client"], newest["outcome"]) == (
        "auth.failure", "anonymous", "127.0.0.1", "denied",
    )  # fmt: skip
    table = ok(thornctl("audit", "--action", "auth.", "--limit", "1")).stdout
    assert table.split()[:9] == ["ID", "AT", "ACTOR", "CLIENT", "ACTION", "TARGET", "OUTCOME",
                                 "REVISION", "DETAIL"]  # fmt: skip
    assert re.search(r"anonymous\s+127\.0\.0\.1\s+auth\.failure", table)


def test_too_many_failed_authentications_exit_75_with_the_wait(
    thornctl: Thornctl, thorn_url: str, data_dir: Path, nats_url: str
) -> None:
    strict = Settings(upstreams=f"topology={thorn_url}", auth_failure_limit=2)
    with serving("gateway", lambda _s, _b: gateway_app(strict), data_dir / "unused.db",
                 nats_url, ready=lambda _status: True) as url:  # fmt: skip
        for _ in range(2):
            assert thornctl("whoami", url=url, token=fixed_token("guess")).exit_code == 77
        held = thornctl("whoami", url=url)
        assert held.exit_code == 75
        expected = r"Error: too many failed authentications from 127\.0\.0\.1 \(2 within 60 s\)"
        assert re.fullmatch(rf"{expected}: retry in \d+ s\n", held.stderr), held.stderr


# --- errors: one line on stderr, a conventional exit code, never a traceback -----------------


def test_a_missing_file_exits_66_naming_it(thornctl: Thornctl, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = thornctl("import", str(missing))
    assert result.exit_code == 66
    assert result.stderr == f"Error: {missing}: no such file\n"


def test_broken_yaml_exits_65_naming_the_file_and_line(thornctl: Thornctl, tmp_path: Path) -> None:
    broken = write(tmp_path / "broken.yaml", "format: thorn.fabric/v1\nnodes:\n  - name: [a\n")
    result = thornctl("import", broken)
    assert result.exit_code == 65
    assert result.stderr.startswith(f"Error: {broken}:4:1: not valid YAML")


def test_broken_json_exits_65_naming_the_file_line_and_column(
    thornctl: Thornctl, tmp_path: Path
) -> None:
    broken = write(tmp_path / "broken.json", '{"nodes": [\n  {"name": "a",}\n]}')
    result = thornctl("import", broken)
    assert result.exit_code == 65
    assert result.stderr.startswith(f"Error: {broken}:2:16: not valid JSON")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.yaml", b"", "the file is empty"),
        ("latin1.yaml", b"nodes: []\n# caf\xe9\n", "not UTF-8 text"),
        ("list.json", b"[1, 2]", "a THORN fabric document is a mapping"),
    ],
)
def test_a_file_that_is_not_a_document_exits_65(
    thornctl: Thornctl, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    result = thornctl("import", str(tmp_path / name))
    assert result.exit_code == 65
    assert result.stderr.startswith(f"Error: {tmp_path / name}: {message}")


def test_a_directory_is_not_an_input_file_and_exits_66(thornctl: Thornctl, tmp_path: Path) -> None:
    result = thornctl("import", str(tmp_path))
    assert result.exit_code == 66
    assert "is a directory" in result.stderr


def test_an_export_to_an_unwritable_place_exits_73(thornctl: Thornctl, tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "fabric.json"
    result = thornctl("export", "--file", str(target))
    assert result.exit_code == 73
    assert result.stderr.startswith(f"Error: {target}: cannot write")


def test_a_duplicate_yaml_key_exits_65(thornctl: Thornctl, tmp_path: Path) -> None:
    duplicated = write(tmp_path / "dup.yaml", "nodes: []\nlinks: []\nnodes: []\n")
    result = thornctl("import", duplicated)
    assert result.exit_code == 65
    assert "found duplicate key 'nodes'" in result.stderr


def test_a_containerlab_link_to_a_missing_node_exits_1_naming_the_link(
    thornctl: Thornctl, thorn_url: str, tmp_path: Path
) -> None:
    before = api(thorn_url, "GET", "/fabric/summary")
    broken = CLAB.replace('"leaf1:e1-1", "gpu1:eth1"', '"leaf1:e1-1", "ghost:eth1"')
    result = thornctl("import", write(tmp_path / "broken.clab.yaml", broken))
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: body.topology.links[1].endpoints[1]: node 'ghost' is not defined in "
        "topology.nodes\n"
    )
    assert api(thorn_url, "GET", "/fabric/summary") == before


def test_a_document_the_fabric_rejects_exits_1_with_the_apis_detail(
    thornctl: Thornctl, tmp_path: Path
) -> None:
    bad = NATIVE_YAML.replace('b: "sw-b:swp1"', 'b: "sw-b:swp9"')
    result = thornctl("import", write(tmp_path / "f.yaml", bad))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: body.links.0")
    assert "swp9" in result.stderr


def test_a_wrong_token_exits_77(thornctl: Thornctl) -> None:
    result = thornctl("nodes", "list", token=fixed_token("not-a-real-token"))
    assert result.exit_code == 77
    assert result.stderr == "Error: invalid or revoked token\n"


def test_no_token_exits_77_and_says_how_to_give_one(thornctl: Thornctl) -> None:
    result = thornctl("summary", token=None)
    assert result.exit_code == 77
    assert "missing bearer token" in result.stderr and "THORN_TOKEN" in result.stderr


def test_an_unreachable_server_exits_69(thornctl: Thornctl) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = thornctl("summary", url=url)
    assert result.exit_code == 69
    assert result.stderr.startswith(f"Error: cannot reach THORN at {url}: ")


def test_a_bad_generator_value_exits_1_naming_the_field(thornctl: Thornctl, thorn_url: str) -> None:
    before = api(thorn_url, "GET", "/fabric/summary")
    result = thornctl("generate", "leaf-spine", "--set", "spines=0")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: body.spines: ")
    not_a_number = thornctl("generate", "fat-tree", "--set", "k=four")
    assert not_a_number.exit_code == 1
    assert "body.k: " in not_a_number.stderr
    unknown = thornctl("generate", "fat-tree", "--set", "radix=4")
    assert unknown.exit_code == 1
    assert "body.radix: " in unknown.stderr
    assert api(thorn_url, "GET", "/fabric/summary") == before


def test_a_set_without_a_value_is_a_usage_error(thornctl: Thornctl) -> None:
    result = thornctl("generate", "leaf-spine", "--set", "spines")
    assert result.exit_code == 2
    assert "'spines' is not KEY=VALUE" in result.stderr


def test_an_unknown_generator_is_a_usage_error_listing_the_known_ones(thornctl: Thornctl) -> None:
    result = thornctl("generate", "torus")
    assert result.exit_code == 2
    assert "unknown generator 'torus'" in result.stderr and "leaf-spine" in result.stderr


def test_generate_without_a_name_is_a_usage_error(thornctl: Thornctl) -> None:
    result = thornctl("generate")
    assert result.exit_code == 2
    assert "missing generator NAME" in result.stderr


def test_a_url_that_is_not_the_api_exits_1_saying_so(thornctl: Thornctl) -> None:
    result = thornctl("summary", url=f"{thornctl.url}/elsewhere")
    assert result.exit_code == 1
    assert "is --url THORN's API?" in result.stderr


def test_a_url_without_http_is_a_usage_error(thornctl: Thornctl) -> None:
    result = thornctl("summary", url="127.0.0.1:8080")
    assert result.exit_code == 2
    assert "is not an http:// or https:// URL" in result.stderr


def test_an_unknown_command_exits_2(thornctl: Thornctl) -> None:
    result = thornctl("frobnicate")
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_a_missing_node_or_link_exits_1_with_the_apis_detail(thornctl: Thornctl) -> None:
    node = thornctl("nodes", "show", "ghost")
    assert (node.exit_code, node.stderr) == (1, "Error: path: node 'ghost' not found\n")
    link = thornctl("links", "drain", "999999")
    assert link.exit_code == 1
    assert "999999" in link.stderr


def test_all_with_limit_is_a_usage_error(thornctl: Thornctl) -> None:
    result = thornctl("nodes", "list", "--all", "--limit", "5")
    assert result.exit_code == 2


def test_the_help_documents_the_exit_codes(thornctl: Thornctl) -> None:
    result = ok(thornctl("--help"))
    for code in ("65", "66", "69", "77"):
        assert re.search(rf"^\s+{code}\s", result.stdout, re.MULTILINE)


# --- the installed console script ------------------------------------------------------------


def test_the_installed_thornctl_exits_with_conventional_codes(
    thorn_url: str, tmp_path: Path
) -> None:
    assert THORNCTL.exists(), f"{THORNCTL} is not installed (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("THORN_")}
    env.update(THORN_URL=thorn_url, THORN_TOKEN=ADMIN)

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(THORNCTL), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    summary = run("-o", "json", "summary")
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["nodes"] == 3
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [\n")
    unreachable = f"http://127.0.0.1:{free_port()}"
    cases = {
        66: run("import", str(tmp_path / "missing.yaml")),
        65: run("import", str(broken)),
        77: run("whoami", THORN_TOKEN="thn_wrong"),
        69: run("summary", THORN_URL=unreachable),
        1: run("links", "show", "424242"),
        2: run("no-such-command"),
    }
    for code, process in cases.items():
        assert process.returncode == code, (code, process.args, process.stderr)
        assert "Traceback" not in process.stderr
        assert process.stdout == ""


# --- drains and --wait (with path computation and stand-in agents) ---------------------------


@dataclass
class Agents:
    """Stand-in agents for every node (standin_agents.py) in a thread of their own."""

    agents: StandInAgents
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event

    def say_hello(self, nodes: list[str]) -> None:
        asyncio.run_coroutine_threadsafe(self.agents.hello(nodes), self.loop).result(10)


@pytest.fixture(scope="module")
def agents(nats_url: str) -> Iterator[Agents]:
    ready: list[Agents] = []

    async def main() -> None:
        async with await Bus.connect(nats_url, name="thornctl-test-agents") as bus:
            stand_in = StandInAgents(bus, delay=0.05)
            follower = asyncio.create_task(stand_in.follow())
            stop = asyncio.Event()
            ready.append(Agents(stand_in, asyncio.get_running_loop(), stop))
            await stop.wait()
            await stand_in.stop(follower)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP
    while not ready:
        assert thread.is_alive() and time.monotonic() < deadline, "stand-in agents did not start"
        time.sleep(0.02)
    yield ready[0]
    ready[0].loop.call_soon_threadsafe(ready[0].stop.set)
    thread.join(SHUTDOWN)


@pytest.fixture(scope="module")
def pathcomp_url(
    thorn_url: str, data_dir: Path, nats_url: str, agents: Agents, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The real pathcomp app on the same store; stages wait 0.2 s at most for the agents.

    Its log lines (plan_adopted, ...) would land in the output CliRunner captures: only
    warnings are logged while it runs."""
    settings = Settings(data_dir=data_dir, stage_ack_seconds=0.2)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    request.addfinalizer(structlog.reset_defaults)
    with serving(
        "pathcomp",
        lambda store, bus: pathcomp_app(settings, store=store, bus=bus, lease_seconds=1.0),
        data_dir / "thorn.db", nats_url,
    ) as url:  # fmt: skip
        yield url


AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


def planned_fabric(thorn_url: str, pathcomp_url: str, **params: Any) -> dict[str, Any]:
    """Generate a leaf-spine and wait until pathcomp serves a plan of it."""
    body = {"spines": 2, "leaves": 2, "hosts_per_leaf": 1, **params}
    revision = api(thorn_url, "POST", "/fabric/generate/leaf-spine", json=body)["summary"][
        "revision"
    ]
    deadline = time.monotonic() + STARTUP
    while True:
        plan = httpx.get(f"{pathcomp_url}/api/v1/plan", headers=AS_ADMIN)
        if plan.status_code == 200 and plan.json()["topology_revision"] >= revision:
            return plan.json()  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, plan.text
        time.sleep(0.05)


def test_a_link_drain_waits_until_the_link_carries_no_traffic(
    thornctl: Thornctl, thorn_url: str, pathcomp_url: str, paths_url: str
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    paths = httpx.get(
        f"{pathcomp_url}/api/v1/paths", params={"src": "host1", "dst": "host2"},
        headers=AS_ADMIN,
    ).json()  # fmt: skip
    used = paths["red"]["links"][1]
    before = ok(thornctl("--url", paths_url, "links", "status", str(used))).stdout
    assert f"Link {used} is in service (not drained): it carries traffic" in before
    result = thornctl("--url", paths_url, "links", "drain", str(used), "--wait", "--timeout", "20")
    assert result.exit_code == 0, result.stderr
    assert f"Link {used} drained and carries no traffic" in result.stdout
    assert re.search(r"routes_through\s+0 \(red 0, blue 0\)", result.stdout)
    listed = as_json(thornctl("--url", paths_url, "-o", "json", "drains"))
    assert [(d["kind"], d["element"], d["carries_traffic"]) for d in listed["items"]] == [
        ("link", str(used), False)
    ]
    ok(thornctl("links", "undrain", str(used)))


def test_a_node_drain_with_json_output_prints_the_node_and_its_final_status(
    thornctl: Thornctl, thorn_url: str, pathcomp_url: str, paths_url: str
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    result = thornctl("--url", paths_url, "-o", "json", "node", "drain", "spine1", "--wait")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["node"]["admin_state"] == "drained"
    assert body["drain"]["carries_traffic"] is False and body["drain"]["agents_pending"] == []
    undrained = as_json(thornctl("-o", "json", "nodes", "undrain", "spine1"))
    assert undrained["admin_state"] == "up"


def test_a_drain_wait_that_runs_out_of_time_exits_75_naming_what_it_waits_for(
    thornctl: Thornctl,
    thorn_url: str,
    pathcomp_url: str,
    agents: Agents,
    paths_url: str,
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    agents.agents.silent.add("leaf1")  # alive, but it stops applying anything
    agents.say_hello(["leaf1"])
    try:
        result = thornctl(
            "--url", paths_url, "nodes", "drain", "spine2", "--wait",
            "--timeout", "3", "--interval", "0.1",
        )  # fmt: skip
        assert result.exit_code == 75, (result.stdout, result.stderr)
        assert "node spine2 still carries traffic after 3 s" in result.stderr
        assert "still applying the new paths: leaf1" in result.stderr
        assert "thornctl nodes status spine2" in result.stderr
        # Progress went to stderr as it changed; the drain itself stays in place.
        assert re.search(r"\[\s*\d+\.\d s\] Node spine2: ", result.stderr)
        shown = as_json(thornctl("-o", "json", "nodes", "show", "spine2"))
        assert shown["admin_state"] == "drained"
    finally:
        agents.agents.silent.discard("leaf1")
    ok(thornctl("nodes", "undrain", "spine2"))


def test_a_host_cannot_be_drained_and_an_unknown_node_is_not_found(thornctl: Thornctl) -> None:
    host = thornctl("nodes", "drain", "gpu1")
    assert host.exit_code == 1 and "node 'gpu1' is a host" in host.stderr
    missing = thornctl("nodes", "drain", "nosuch")
    assert missing.exit_code == 1 and "node 'nosuch' not found" in missing.stderr
    viewer = as_json(thornctl("-o", "json", "tokens", "create", "ro-drain", "--role", "viewer"))
    refused = thornctl("nodes", "drain", "spine1", token=viewer["token"])
    assert refused.exit_code == 77 and "needs operator" in refused.stderr


# --- failovers (with the health service) -----------------------------------------------------


def publish(nats_url: str, *events: Event, purge: bool = False) -> None:
    async def main() -> None:
        async with await Bus.connect(nats_url, name="thornctl-test-failovers") as bus:
            await bus.ensure_streams()
            if purge:
                await bus.js.purge_stream(STREAM_FAILOVER.name)
            for event in events:
                await bus.publish(event)

    asyncio.run(main())


@pytest.fixture(scope="module")
def health_url(
    thorn_url: str, data_dir: Path, nats_url: str, request: pytest.FixtureRequest
) -> Iterator[str]:
    """The real health app on the same store, from an empty failover history; only warnings
    are logged (CliRunner would capture its log lines)."""
    publish(nats_url, purge=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    request.addfinalizer(structlog.reset_defaults)
    settings = Settings(data_dir=data_dir)
    with serving(
        "health",
        lambda store, bus: health_app(settings, store=store, bus=bus, lease_seconds=1.0),
        data_dir / "thorn.db", nats_url,
    ) as url:  # fmt: skip
        yield url


def _entry_point(upstreams: str, data_dir: Path, nats_url: str) -> Iterator[str]:
    with serving("gateway", lambda _s, _b: gateway_app(Settings(upstreams=upstreams)),
                 data_dir / "unused.db", nats_url, ready=lambda _status: True) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def paths_url(thorn_url: str, pathcomp_url: str, data_dir: Path, nats_url: str) -> Iterator[str]:
    """The entry point in front of topology and pathcomp (health is not running yet)."""
    yield from _entry_point(f"topology={thorn_url},pathcomp={pathcomp_url}", data_dir, nats_url)


@pytest.fixture(scope="module")
def one_url(
    thorn_url: str, pathcomp_url: str, health_url: str, data_dir: Path, nats_url: str
) -> Iterator[str]:
    """The entry point in front of topology, pathcomp and health: thornctl needs only it."""
    upstreams = f"topology={thorn_url},pathcomp={pathcomp_url},health={health_url}"
    yield from _entry_point(upstreams, data_dir, nats_url)


def test_failovers_are_listed_and_shown_hop_by_hop_with_whose_clock_read_each(
    thornctl: Thornctl, health_url: str, one_url: str, nats_url: str
) -> None:
    t0 = utcnow().replace(microsecond=0) - timedelta(minutes=5)

    def at(ms: float) -> datetime:
        return t0 + timedelta(milliseconds=ms)

    trace = (
        Trace(id=new_trace_id()).then("detected", "leaf1", at=at(0))
        .then("health_received", "health", at=at(1.2)).then("health_decided", "health", at=at(1.5))
        .then("agent_received", "gpu1", at=at(2.5)).then("agent_applied", "gpu1", at=at(2.9))
    )  # fmt: skip
    central = FailoverEvent(
        node="gpu1", peers=["gpu2", "gpu3"], from_colour="red", to_colour="blue", at=at(3),
        reason="central: link 2", tier="central", kernel_ms=0.4, trace=trace,
    )  # fmt: skip
    local = FailoverEvent(
        node="gpu2", peers=["gpu1"], from_colour="blue", to_colour="red", at=at(90_000),
        reason="bfd blue to gpu1 down (control_detection_time_expired)", tier="source",
    )  # fmt: skip
    publish(nats_url, central, local)
    deadline = time.monotonic() + STARTUP
    while (page := api(health_url, "GET", "/failovers"))["total"] < 2:
        assert time.monotonic() < deadline, page
        time.sleep(0.05)
    local_id = f"gpu2-{local.at.strftime('%Y%m%dT%H%M%S.%fZ')}"
    health = ("--url", one_url)

    listed = ok(thornctl(*health, "failovers", "list")).stdout
    assert listed.split()[:7] == ["ID", "STARTED", "TIER", "SOURCES", "PAIRS", "LINK", "GAP"]
    assert re.search(rf"{trace.id}\s+\S+ \S+\s+central\s+gpu1\s+2\s+2\s+clocks differ: "
                     r"leaf1, gpu1", listed)  # fmt: skip
    assert re.search(rf"{local_id}\s+\S+ \S+\s+source\s+gpu2\s+1\s+-\s+-", listed)
    assert "2 failovers" in listed
    assert as_json(thornctl(*health, "-o", "json", "failovers", "list")) == api(
        health_url, "GET", "/failovers"
    )
    source = as_json(thornctl(*health, "-o", "json", "failovers", "list", "--tier", "source"))
    assert [f["id"] for f in source["items"]] == [local_id]
    recent = as_json(thornctl(*health, "-o", "json", "failovers", "list", "--since", "1m"))
    assert recent["total"] == 0
    hour = as_json(thornctl(*health, "-o", "json", "failovers", "list", "--since", "1h",
                            "--node", "gpu1", "--limit", "1"))  # fmt: skip
    assert [f["id"] for f in hour["items"]] == [trace.id]

    shown = ok(thornctl(*health, "failovers", "show", trace.id)).stdout
    assert re.search(r"gap\s+clocks differ: leaf1, gpu1", shown)
    assert re.search(rf"started\s+{t0.strftime('%Y-%m-%d %H:%M:%S')}\.000000Z \(leaf1's clock\)",
                     shown)  # fmt: skip
    assert re.search(r"0\s+detected\s+\S+\s+leaf1\s+-\s+-", shown)
    assert re.search(r"1\s+health_received\s+\S+\s+health\s+clocks differ\s+0 detected",
                     shown)  # fmt: skip
    assert re.search(r"2\s+health_decided\s+\S+\s+health\s+0\.300\s+1 health_received",
                     shown)  # fmt: skip
    assert re.search(r"4\s+agent_applied\s+\S+\s+gpu1\s+0\.400\s+3 agent_received", shown)
    assert re.search(r"gpu1\s+gpu2, gpu3\s+red\s+blue\s+central\s+0\.400", shown)
    assert as_json(thornctl(*health, "-o", "json", "failovers", "show", trace.id)) == api(
        health_url, "GET", f"/failovers/{trace.id}"
    )


def test_failovers_errors_name_the_id_or_the_field(thornctl: Thornctl, one_url: str) -> None:
    missing = thornctl("failovers", "show", "0123456789abcdef", url=one_url)
    assert missing.exit_code == 1
    assert "failover '0123456789abcdef' not found" in missing.stderr
    naive = thornctl("failovers", "list", "--since", "2026-12-01", url=one_url)
    assert naive.exit_code == 1 and "query.since" in naive.stderr
    assert thornctl("failovers", "list", "--tier", "psychic", url=one_url).exit_code == 2


def test_a_tenants_rc_budget_is_declared_and_its_failovers_judged_with_a_warning(
    thornctl: Thornctl, thorn_url: str, health_url: str, one_url: str, nats_url: str
) -> None:
    api(thorn_url, "POST", "/fabric/import",
        json=fabric_of_two_tenants().to_document().model_dump(mode="json"))  # fmt: skip
    declared = ok(thornctl("tenants", "budget", "b", "--timeout", "10", "--retry-cnt", "7")).stdout
    assert re.search(r"NCCL_IB_TIMEOUT\s+10\s", declared)
    assert re.search(r"one RC timeout\s+4\.194 ms", declared)
    listed = ok(thornctl("tenants", "list")).stdout
    assert re.search(r"a\s+14\s+7 \(default\)\s+67\.109\s+536\.871", listed)
    assert re.search(r"b\s+10\s+7\s+4\.194", listed)
    # health follows the topology: wait until it judges with tenant b's declared budget
    deadline = time.monotonic() + STARTUP
    while True:
        answer = httpx.get(f"{health_url}/api/v1/failovers/budget/b", headers=AS_ADMIN)
        if answer.is_success and answer.json()["budget"]["nccl_ib_timeout"] == 10:
            break
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)

    t0 = utcnow() - timedelta(minutes=5)
    repair = FailoverEvent(  # leaf2 repaired its port toward h3 (tenant b's pairs) in 9 ms
        node="leaf2", peers=["10.0.0.3/32"], from_colour=None, to_colour="backup",
        at=t0 + timedelta(milliseconds=9), reason="carrier lost on swp1", tier="switch",
        trace=Trace(id=new_trace_id()).then("detected", "leaf2", at=t0)
        .then("agent_applied", "leaf2", at=t0 + timedelta(milliseconds=9)),
    )  # fmt: skip
    assert repair.trace is not None
    publish(nats_url, repair)
    health = ("--url", one_url)
    while api(health_url, "GET", "/failovers", params={"node": "leaf2"})["total"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    shown = ok(thornctl(*health, "failovers", "show", repair.trace.id)).stdout
    assert re.search(r"RC budget\s+1 tenant\(s\), worst: retransmits", shown)
    assert re.search(r"b\s+10\s+7\s+retransmits\s+failover 9 ms = 215% of one RC timeout", shown)

    budget = thornctl(*health, "failovers", "budget", "b")
    assert budget.exit_code == 0, budget.stderr
    assert re.search(r"b\s+10\s+7\s+4\.194\s+1\s+1\s+9\.000\s+9\.000\s+retransmits",
                     budget.stdout)  # fmt: skip
    assert "b: p99 failover 9 ms = 215% of one RC timeout at NCCL_IB_TIMEOUT=10" in budget.stdout
    assert "warning: b: budget tighter than the measured p99" in budget.stderr
    every = as_json(thornctl(*health, "-o", "json", "failovers", "budget", "--since", "1h"))
    assert [(s["tenant"], s["failovers"]) for s in every["items"]] == [
        ("a", 0), ("b", 1), ("c", 0), ("d", 0),
    ]  # fmt: skip

    undeclared = as_json(thornctl("-o", "json", "tenants", "budget", "b", "--timeout", "default"))
    assert undeclared["nccl_ib_timeout"] is None
    assert undeclared["rc_budget"]["nccl_ib_timeout"] == 20
    out_of_range = thornctl("tenants", "budget", "b", "--timeout", "32")
    assert out_of_range.exit_code == 1 and "nccl_ib_timeout" in out_of_range.stderr
    assert api(thorn_url, "GET", "/tenants/b")["nccl_ib_timeout"] is None  # unchanged
    assert thornctl("tenants", "budget", "b", "--timeout", "soon").exit_code == 2
    assert thornctl("tenants", "budget", "b").exit_code == 2  # nothing to declare


def test_since_takes_a_time_ago_or_passes_a_timestamp_to_the_api() -> None:
    now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert since_value("15m", now) == "2026-12-01T09:45:00+00:00"
    assert since_value("2h", now) == "2026-12-01T08:00:00+00:00"
    assert since_value("7d", now) == "2026-11-24T10:00:00+00:00"
    assert since_value("2026-11-30T10:00:00Z", now) == "2026-11-30T10:00:00Z"
    assert since_value(None, now) is None


# --- rdma -----------------------------------------------------------------------------------


def test_rdma_probe_to_an_unknown_workload_names_it_and_exits_1(thornctl: Thornctl) -> None:
    result = thornctl("rdma", "probe", "10.0.0.1", "nosuch-vf0")
    assert result.exit_code == 1
    assert "nosuch-vf0" in result.stderr and "not found" in result.stderr


def test_rdma_probe_settings_out_of_range_are_a_usage_error_naming_the_option(
    thornctl: Thornctl,
) -> None:
    result = thornctl("rdma", "probe", "10.0.0.1", "10.0.0.2", "--timeout", "32")
    assert result.exit_code == 2
    assert "--timeout" in result.stderr


def test_rdma_probe_where_rdma_is_unavailable_says_why_and_exits_69(thornctl: Thornctl) -> None:
    # No RDMA device on this machine carries 10.0.0.1 (the kernel lane runs real probes).
    result = thornctl("rdma", "probe", "10.0.0.1", "10.0.0.2")
    assert result.exit_code == 69
    assert result.stderr.startswith("Error: RDMA unavailable: ")


# --- registrations: cabling and mismatches ----------------------------------------------------


def register_with_topology(nats_url: str, node: str, observed: NodeObservation) -> None:
    async def send() -> None:
        async with await Bus.connect(nats_url, name="test-thornctl-agent") as bus:
            event = AgentRegistration(node=node, run="t", seq=0, sent_at=utcnow(),
                                      observed=observed)  # fmt: skip
            reply = RegistrationReply.model_validate_json(await bus.request(event, reply_within=5))
            assert reply.ok, reply.error

    asyncio.run(send())


def test_cabling_and_mismatches_show_what_the_agents_registered(
    thornctl: Thornctl, nats_url: str
) -> None:
    register_with_topology(nats_url, "leaf1", NodeObservation(
        ports=[ObservedPort(name="swp1", admin_up=True, carrier=True),
               ObservedPort(name="swp2", admin_up=True, carrier=True)],
        neighbours=[HeardNeighbour(port="swp2", chassis="spine1", port_id="swp1")],
    ))  # fmt: skip
    register_with_topology(nats_url, "gpu1", NodeObservation())  # no eth1
    links = {lk["a"]: lk for lk in as_json(thornctl("-o", "json", "cabling"))["links"]}
    assert links["leaf1:swp2"]["state"] == "verified"
    assert links["gpu1:eth1"]["state"] == "unverified"
    table = ok(thornctl("cabling", "--state", "verified")).stdout
    assert "leaf1:swp2" in table and "gpu1:eth1" not in table
    assert "1 verified, 1 unverified, 0 miscabled" in table
    found = as_json(thornctl("-o", "json", "mismatches"))
    assert [(m["node"], m["kind"], m["subject"]) for m in found["mismatches"]] == [
        ("gpu1", "port_missing", "eth1")
    ]
    assert "port_missing" in ok(thornctl("mismatches")).stdout
    refused = thornctl("cabling", "--state", "bogus")
    assert refused.exit_code != 0 and "bogus" in refused.stderr


def test_paths_and_the_plan_are_shown_over_the_one_url(
    thornctl: Thornctl, thorn_url: str, pathcomp_url: str, one_url: str
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    shown = ok(thornctl("paths", "host1", "host2", url=one_url)).stdout
    assert "host1 -> host2: degraded" in shown
    assert re.search(r"red\s+4\s+eth1\s+host1 -> leaf1 -> spine\d -> leaf2 -> host2", shown)
    assert "shared: link" in shown
    assert (
        as_json(thornctl("-o", "json", "paths", "host1", "host2", url=one_url))
        == httpx.get(
            f"{pathcomp_url}/api/v1/paths",
            params={"src": "host1", "dst": "host2"},
            headers=AS_ADMIN,
        ).json()
    )
    unknown = thornctl("paths", "host1", "nohost", url=one_url)
    assert unknown.exit_code == 1 and "host 'nohost' not found" in unknown.stderr
    plan = ok(thornctl("plan", "show", url=one_url)).stdout
    assert re.search(r"pairs\s+2", plan) and re.search(r"shared risk\s+2", plan)
    recomputed = as_json(thornctl("-o", "json", "plan", "recompute", url=one_url))
    assert recomputed["kind"] == "full"


def test_a_what_if_is_simulated_and_an_unknown_element_named(
    thornctl: Thornctl, thorn_url: str, pathcomp_url: str, one_url: str
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    before = api(thorn_url, "GET", "/links", params={"limit": 1000})
    shown = ok(thornctl("plan", "what-if", "--node", "leaf1", url=one_url)).stdout
    assert re.search(r"cut\s+2 pairs", shown)  # host1 hangs off leaf1 alone
    assert re.search(r"host1\s+host2\s+cut\s+unreachable", shown)
    first = before["items"][0]["id"]
    data = as_json(thornctl("-o", "json", "plan", "what-if", "-n", "spine1", "-l", str(first),
                            url=one_url))  # fmt: skip
    assert data["nodes"] == ["spine1"] and first in data["links"]
    unknown = thornctl("plan", "what-if", "--node", "spine9", url=one_url)
    assert unknown.exit_code == 1 and "node 'spine9' not found" in unknown.stderr
    nothing = thornctl("plan", "what-if", url=one_url)
    assert nothing.exit_code == 2 and "--link" in nothing.stderr
    assert api(thorn_url, "GET", "/links", params={"limit": 1000}) == before  # nothing changed


def test_health_links_events_and_sessions_are_listed_over_the_one_url(
    thornctl: Thornctl, thorn_url: str, pathcomp_url: str, health_url: str, one_url: str
) -> None:
    planned_fabric(thorn_url, pathcomp_url)
    links = as_json(thornctl("-o", "json", "health", "links", "--all", url=one_url))
    assert (
        links["items"] == api(health_url, "GET", "/health/links", params={"limit": 1000})["items"]
    )
    table = ok(thornctl("health", "links", url=one_url)).stdout
    assert table.split()[:4] == ["LINK", "A", "B", "STATE"]
    events = as_json(thornctl("-o", "json", "health", "events", "--since", "1h", url=one_url))
    assert "items" in events and "total" in events
    sessions = as_json(thornctl("-o", "json", "health", "sessions", url=one_url))
    assert sessions == api(health_url, "GET", "/health/sessions")
    missing = thornctl("health", "link", "4242", url=one_url)
    assert missing.exit_code == 1 and "4242" in missing.stderr
    assert thornctl("health", "links", "--state", "sideways", url=one_url).exit_code == 2


# --- bus ---------------------------------------------------------------------------------------


def test_bus_creds_writes_a_node_s_agent_credentials_readable_by_the_owner_only(
    thornctl: Thornctl, tmp_path: Path
) -> None:
    node = SMALL["nodes"][0]["name"]
    path = tmp_path / "agent.creds"
    done = ok(thornctl("bus", "creds", node, "--file", str(path)))
    assert str(path) in done.stdout and "THORN_NATS_CREDS" in done.stdout
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    token, user = read_creds(path.read_text())
    claims = decode(token)
    assert claims.name == f"agent:{node}" and claims.subject == user.public
    assert user.seed not in done.stdout, "the seed goes to the file only"


def test_bus_creds_for_an_unknown_node_says_so(thornctl: Thornctl, tmp_path: Path) -> None:
    done = thornctl("bus", "creds", "nosuch", "--file", str(tmp_path / "x.creds"))
    assert done.exit_code == 1 and "nosuch" in done.stderr
    assert not (tmp_path / "x.creds").exists()
