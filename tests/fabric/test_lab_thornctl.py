"""`thornctl lab` end to end as root: up from a generator, status, fail, restore, down."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from thorn import netns
from thorn_lab import build
from thornctl.main import app


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"tf{uuid.uuid4().hex[:8]}"
    yield name
    build.down(name)


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, ["-o", "json", "lab", *args])


def test_up_status_fail_restore_down(prefix: str) -> None:
    generated = ["--generate", "leaf-spine", "--set", "spines=1", "--set", "leaves=2"]
    result = _run("up", "--prefix", prefix, *generated, "--set", "hosts_per_leaf=1")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["created_veths"] == 4 + 2  # 4 links, 2 workloads

    again = _run("up", "--prefix", prefix)  # no source: repair from the lab's own fabric
    assert json.loads(again.stdout)["created_veths"] == 0

    failed = _run("fail", "carrier", "leaf1:swp2", "--prefix", prefix)
    assert failed.exit_code == 0, failed.stderr
    fault = json.loads(failed.stdout)
    assert fault["kind"] == "carrier"

    status = json.loads(_run("status", "--prefix", prefix).stdout)
    (link,) = [lk for lk in status["links"] if lk["faults"]]
    assert link["name"] == "leaf1:swp2--spine1:swp1"
    assert (link["a"]["admin_up"], link["a"]["carrier"]) == (True, False)
    assert (link["b"]["admin_up"], link["b"]["carrier"]) == (False, False)

    unknown = _run("fail", "link", "leaf1:swp7", "--prefix", prefix)
    assert unknown.exit_code == 1
    assert "leaf1:swp7" in unknown.stderr

    restored = _run("restore", fault["id"], "--prefix", prefix)
    assert [f["id"] for f in json.loads(restored.stdout)] == [fault["id"]]
    assert json.loads(_run("status", "--prefix", prefix).stdout)["healthy"]

    down = _run("down", "--prefix", prefix)
    assert json.loads(down.stdout)["namespaces"] == 2 + 1 + 2 + 2  # hosts, spine, leaves, wls
    assert not [n for n in netns.listed() if n.startswith(f"{prefix}-")]


def test_traffic_reports_json(prefix: str) -> None:
    _run("up", "--prefix", prefix, "--generate", "leaf-spine", "--set", "hosts_per_leaf=1")
    # A directly connected pair needs no routes: host1's port and its leaf's.
    result = _run(
        "traffic",
        "host1@10.0.0.0",
        "leaf1@10.0.0.1",
        "--count",
        "200",
        "--rate",
        "2000",
        "--roce",
        "--prefix",
        prefix,
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["sent"], report["received"], report["lost"]) == (200, 200, 0)
    assert report["dst_port"] == 4791
