"""A host agent's failover overrides: set by flips, cleared when the controller agrees or,
for a revertive policy, once re-protection has held for the hold-down; kept on disk so an
agent restarted mid-failover does not move traffic back onto a broken path."""

from __future__ import annotations

from pathlib import Path

from thorn_programmer.overrides import Overrides


def test_a_flip_overrides_the_peers_colour() -> None:
    o = Overrides(None, revertive=True, hold_down=2.0)
    o.put(["h2", "h3"], "blue", "central: link 7", "central", plan_revision=4, now=100.0)
    assert o.colours() == {"h2": "blue", "h3": "blue"}


def test_the_controller_agreeing_clears_the_override() -> None:
    o = Overrides(None, revertive=False, hold_down=2.0)
    o.put(["h2", "h3"], "blue", "bfd", "source", plan_revision=4, now=100.0)
    o.agree(blue_peers={"h2"})  # the plan now sends h2 on blue too
    assert o.colours() == {"h3": "blue"}


def test_revertive_moves_back_only_after_reprotection_and_the_hold_down() -> None:
    o = Overrides(None, revertive=True, hold_down=2.0)
    o.put(["h2"], "blue", "central", "central", plan_revision=4, now=100.0)
    assert o.due(now=500.0) == []  # no re-protection yet: time alone does not revert
    first = o.reprotected(["h2"], plan_revision=5, now=101.0)
    assert first == 103.0
    assert o.due(now=102.9) == []
    assert o.due(now=103.0) == ["h2"] and o.colours() == {}


def test_reprotection_by_an_older_plan_does_not_revert_a_newer_flip() -> None:
    o = Overrides(None, revertive=True, hold_down=0.0)
    o.put(["h2"], "blue", "central", "central", plan_revision=6, now=100.0)
    assert o.reprotected(["h2"], plan_revision=5, now=101.0) is None
    assert o.due(now=200.0) == [] and o.colours() == {"h2": "blue"}


def test_non_revertive_stays_on_the_other_colour() -> None:
    o = Overrides(None, revertive=False, hold_down=0.0)
    o.put(["h2"], "blue", "central", "central", plan_revision=4, now=100.0)
    assert o.reprotected(["h2"], plan_revision=5, now=101.0) is None
    assert o.due(now=1e9) == [] and o.colours() == {"h2": "blue"}


def test_overrides_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "overrides-host1.json"
    first = Overrides(path, revertive=True, hold_down=2.0)
    first.put(["h2"], "blue", "central: link 7", "central", plan_revision=4, now=100.0)
    again = Overrides(path, revertive=True, hold_down=2.0)
    assert again.colours() == {"h2": "blue"}
    assert again.by_peer["h2"].reason == "central: link 7"


def test_an_unreadable_file_starts_empty_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "overrides-host1.json"
    path.write_text("{not json")
    assert Overrides(path, revertive=True, hold_down=2.0).colours() == {}


def test_the_preferred_paths_own_bfd_up_reverts_a_flip_pathcomp_never_saw() -> None:
    overrides = Overrides(None, revertive=True, hold_down=2.0)
    overrides.put(["host2"], "blue", "bfd red to host2 down", "source", 6, now=100.0)
    assert overrides.path_up("host2", now=101.0) == 103.0
    assert overrides.path_up("host2", now=102.0) == 103.0  # the clock is not restarted
    assert overrides.due(102.9) == []
    assert overrides.due(103.0) == ["host2"]
    assert overrides.colours() == {}


def test_the_preferred_path_failing_again_stops_the_revert_clock() -> None:
    overrides = Overrides(None, revertive=True, hold_down=2.0)
    overrides.put(["host2"], "blue", "bfd red to host2 down", "source", 6, now=100.0)
    overrides.path_up("host2", now=101.0)
    overrides.path_down("host2")
    assert overrides.due(200.0) == []
    assert overrides.colours() == {"host2": "blue"}


def test_a_non_revertive_policy_ignores_the_preferred_path_coming_back() -> None:
    overrides = Overrides(None, revertive=False, hold_down=2.0)
    overrides.put(["host2"], "blue", "bfd red to host2 down", "source", 6, now=100.0)
    assert overrides.path_up("host2", now=101.0) is None
    assert overrides.due(200.0) == []


async def test_a_save_off_the_loop_persists_and_never_replaces_a_newer_state(
    tmp_path: Path,
) -> None:
    path = tmp_path / "overrides.json"
    overrides = Overrides(path, revertive=True, hold_down=1.0)
    overrides.put(["h2"], "blue", "bfd down", "source", 1, 0.0, save=False)
    older = overrides._snapshot()  # taken for a write still on its way to a thread
    overrides.put(["h3"], "blue", "bfd down", "source", 1, 0.0, save=False)
    await overrides.save_off_loop()
    overrides._write(*older)  # the older write lands last: it must not win
    assert set(Overrides(path, revertive=True, hold_down=1.0).colours()) == {"h2", "h3"}
