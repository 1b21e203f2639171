"""Draining nodes: an operator takes a switch out of every path before maintenance.

A host cannot be drained: it carries no transit traffic, so there is nothing to move off it,
and its own workloads' traffic cannot avoid it. Refusing says so, instead of quietly cutting
its workloads off (that is an admin's `down`).
"""

from __future__ import annotations

import copy

import pytest

from thorn.fabric import Fabric, FabricError, NotFound
from thorn.generators import leaf_spine
from thorn.model import AdminState, NodeUpdate


@pytest.fixture
def fabric() -> Fabric:
    return Fabric.from_document(leaf_spine(2, 2, 2))


def test_draining_a_switch_marks_it_drained_as_one_change(fabric: Fabric) -> None:
    changes = fabric.drain_node("spine1")
    assert [(c.kind, c.op, c.key) for c in changes] == [("node", "update", "spine1")]
    assert fabric.node("spine1").admin_state is AdminState.drained


def test_draining_twice_changes_nothing_the_second_time(fabric: Fabric) -> None:
    fabric.drain_node("spine1")
    assert fabric.drain_node("spine1") == []


def test_undrain_returns_a_drained_switch_to_service(fabric: Fabric) -> None:
    fabric.drain_node("leaf1")
    assert [c.key for c in fabric.undrain_node("leaf1")] == ["leaf1"]
    assert fabric.node("leaf1").admin_state is AdminState.up
    assert fabric.undrain_node("leaf1") == []  # already up: a no-op


def test_undrain_of_a_down_node_is_refused_naming_admin_state(fabric: Fabric) -> None:
    fabric.update_node("spine2", NodeUpdate(admin_state=AdminState.down))
    before = copy.deepcopy(fabric.__dict__)
    with pytest.raises(FabricError) as err:
        fabric.undrain_node("spine2")
    (issue,) = err.value.issues
    assert issue.loc == ("admin_state",) and issue.kind == "conflict"
    assert "down, not drained" in issue.msg and "PATCH" in issue.msg
    assert fabric.__dict__ == before


def test_a_down_switch_may_be_drained_then_undrained_like_a_link(fabric: Fabric) -> None:
    fabric.update_node("spine2", NodeUpdate(admin_state=AdminState.down))
    fabric.drain_node("spine2")
    fabric.undrain_node("spine2")
    assert fabric.node("spine2").admin_state is AdminState.up


def test_draining_a_host_is_refused_with_the_reason(fabric: Fabric) -> None:
    before = copy.deepcopy(fabric.__dict__)
    with pytest.raises(FabricError) as err:
        fabric.drain_node("host1")
    (issue,) = err.value.issues
    assert issue.loc == ("role",) and issue.kind == "conflict"
    assert "is a host" in issue.msg and "drain that link" in issue.msg
    assert fabric.__dict__ == before


def test_unknown_nodes_are_not_found(fabric: Fabric) -> None:
    with pytest.raises(NotFound):
        fabric.drain_node("nosuch")
    with pytest.raises(NotFound):
        fabric.undrain_node("nosuch")
