"""`thornctl lab` checks that need no root: usage errors, exit codes, finding a lab's names.

A lab is "described" in a temporary state directory (no namespace is made); commands that
would touch the kernel are only run up to the point where they must refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from thorn.generators import leaf_spine
from thorn_lab import names, state
from thorn_lab.blueprint import plan_lab
from thornctl.main import app


@pytest.fixture(autouse=True)
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(names, "STATE_ROOT", tmp_path)
    return tmp_path


@pytest.fixture
def described() -> str:
    doc = leaf_spine(2, 2, 2)
    state.save_description(
        state.LabDescription(
            prefix="unit", created_at=state.now(), fabric=doc, plan=plan_lab(doc, "unit")
        )
    )
    return "unit"


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _as_root(monkeypatch: pytest.MonkeyPatch, root: bool = True) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0 if root else 1000)


def test_the_lab_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root(monkeypatch, root=False)
    for args in (["up", "--generate", "leaf-spine"], ["down"], ["status"], ["fail", "node", "x"]):
        result = _run("lab", *args)
        assert result.exit_code == 77, args
        assert "needs root" in result.stderr


def test_one_fabric_source_at_a_time() -> None:
    result = _run("lab", "up", "--generate", "leaf-spine", "--from-store")
    assert result.exit_code == 2
    assert "one of --file, --generate and --from-store" in result.stderr


def test_set_without_generate_is_a_usage_error() -> None:
    assert _run("lab", "up", "--set", "spines=2").exit_code == 2


def test_an_unknown_generator_or_parameter_is_a_usage_error() -> None:
    assert "unknown generator" in _run("lab", "up", "--generate", "ring").stderr
    result = _run("lab", "up", "--generate", "leaf-spine", "--set", "spines=0")
    assert result.exit_code == 2
    assert "spines" in result.stderr


def test_a_file_that_does_not_exist_is_noinput(tmp_path: Path) -> None:
    assert _run("lab", "up", "--file", str(tmp_path / "none.json")).exit_code == 66


def test_where_prints_a_node_s_namespace_and_a_port_s_interface(described: str) -> None:
    result = _run("lab", "where", "leaf1", "swp3", "--prefix", described)
    assert result.exit_code == 0
    assert result.stdout.split() == ["unit-leaf1", "swp3"]
    result = _run("-o", "json", "lab", "where", "host1-vf0", "--prefix", described)
    assert json.loads(result.stdout) == {"namespace": "unit-w-host1-vf0"}


def test_an_unknown_node_or_lab_is_exit_1_with_the_name(described: str) -> None:
    result = _run("lab", "where", "leaf9", "--prefix", described)
    assert result.exit_code == 1
    assert "leaf9" in result.stderr
    result = _run("lab", "where", "leaf1", "--prefix", "nolab")
    assert result.exit_code == 1
    assert "no lab 'nolab'" in result.stderr


def test_failing_an_unknown_link_is_exit_1_with_its_name(
    described: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_root(monkeypatch)
    result = _run("lab", "fail", "link", "leaf1:swp99", "--prefix", described)
    assert result.exit_code == 1
    assert "no link 'leaf1:swp99'" in result.stderr
    result = _run("lab", "fail", "drop", "leaf1--leaf2", "--prefix", described)
    assert result.exit_code == 1
    assert "leaf1--leaf2" in result.stderr


def test_carrier_loss_names_the_end_that_loses_carrier(
    described: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_root(monkeypatch)
    result = _run("lab", "fail", "carrier", "leaf1--spine1", "--prefix", described)
    assert result.exit_code == 1
    assert "node:port" in result.stderr


def test_restore_wants_a_fault_or_all() -> None:
    assert _run("lab", "restore").exit_code == 2
    assert _run("lab", "restore", "f1", "--all").exit_code == 2


def test_list_shows_described_labs(described: str) -> None:
    result = _run("-o", "json", "lab", "list")
    assert result.exit_code == 0
    (row,) = json.loads(result.stdout)
    assert row["prefix"] == described
    assert (row["namespaces"], row["links"], row["workloads"], row["faults"]) == (12, 8, 4, 0)
