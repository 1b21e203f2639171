"""thorn-run's restart policy on a fake clock, and the launcher's thin shell around it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from thorn.config import Settings
from thorn.supervisor import RestartPolicy, Supervisor
from thorn_run import launcher
from thorn_run.launcher import StopFlag, Supervised, bfd_note, describe_exit, restart_summary

POLICY = RestartPolicy(first_delay=0.2, max_delay=10.0, stable_after=30.0, crash_loop_after=5)


def crash_right_away(supervisor: Supervisor, name: str, times: int, t: float) -> list[float]:
    """Let `name` die `times` times, each the moment it was started again; return the waits."""
    delays = []
    for _ in range(times):
        restart = supervisor.exited(name, t, 1)
        delays.append(restart.delay)
        assert supervisor.due(restart.at - 0.001) == []
        assert supervisor.due(restart.at) == [name]
        t = restart.at
        supervisor.started(name, t)
    return delays


def test_the_wait_doubles_from_the_first_delay_up_to_the_cap() -> None:
    supervisor = Supervisor(POLICY)
    supervisor.add("health", 0.0)
    delays = crash_right_away(supervisor, "health", 10, 0.0)
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0, 10.0])
    assert supervisor.restarts == {"health": 10}


def test_the_cap_holds_for_a_child_that_never_stops_crashing() -> None:
    assert POLICY.delay(10_000) == 10.0  # no overflow, still retried
    with pytest.raises(ValueError):
        POLICY.delay(0)


def test_a_stable_run_resets_the_back_off() -> None:
    supervisor = Supervisor(POLICY)
    supervisor.add("pathcomp", 0.0)
    crash_right_away(supervisor, "pathcomp", 4, 0.0)  # waits 0.2 .. 1.6; started at 3.0
    t = 3.0
    just_short = supervisor.exited("pathcomp", t + 29.9, -9)
    assert just_short.streak == 5
    assert just_short.delay == pytest.approx(3.2)
    supervisor.started("pathcomp", 100.0)
    stable = supervisor.exited("pathcomp", 130.0, -9)  # up exactly stable_after
    assert (stable.streak, stable.delay, stable.uptime) == (1, 0.2, 30.0)
    assert stable.at == pytest.approx(130.2)


def test_a_crash_loop_is_announced_once_and_its_end_too() -> None:
    supervisor = Supervisor(POLICY)
    supervisor.add("topology", 0.0)
    t = 0.0
    loud = []
    for _ in range(8):
        restart = supervisor.exited("topology", t, 1)
        loud.append(restart.crash_loop)
        t = restart.at
        supervisor.started("topology", t)
    assert loud == [False, False, False, False, True, False, False, False]
    assert supervisor.settled(t + 29.0) == []
    assert supervisor.settled(t + 30.0) == ["topology"]
    assert supervisor.settled(t + 31.0) == []  # said once
    again = supervisor.exited("topology", t + 40.0, 1)  # healthy for 40 s: a fresh start
    assert (again.streak, again.delay, again.crash_loop) == (1, 0.2, False)


def test_children_are_independent_and_only_dead_ones_are_due() -> None:
    supervisor = Supervisor(POLICY)
    for name in ("nats-server", "topology", "health"):
        supervisor.add(name, 0.0)
    health = supervisor.exited("health", 5.0, -9)
    nats = supervisor.exited("nats-server", 5.05, -9)
    assert supervisor.running("topology")
    assert not supervisor.running("health")
    assert supervisor.due(5.1) == []
    assert supervisor.due(max(health.at, nats.at)) == ["nats-server", "health"]
    supervisor.started("health", 5.3)
    assert supervisor.due(5.3) == ["nats-server"]
    assert supervisor.restarts == {"nats-server": 0, "topology": 0, "health": 1}


def test_misuse_is_refused() -> None:
    supervisor = Supervisor(POLICY)
    supervisor.add("health", 0.0)
    with pytest.raises(ValueError):
        supervisor.add("health", 1.0)
    with pytest.raises(ValueError):
        supervisor.started("health", 1.0)  # nothing due: it is running
    supervisor.exited("health", 1.0, 0)
    with pytest.raises(ValueError):
        supervisor.exited("health", 2.0, 0)  # already down
    with pytest.raises(ValueError):
        RestartPolicy(first_delay=5, max_delay=1)


def test_exits_and_the_summary_read_well() -> None:
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(None) == "could not be started"
    assert restart_summary({"nats-server": 1, "topology": 0, "health": 2}) == (
        "Restarts: nats-server 1, health 2."
    )
    assert restart_summary({"topology": 0}) == "Restarts: none."


def test_the_lab_bfd_line_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("THORN_BFD_INTERVAL_MS", "THORN_BFD_MULTIPLIER", "THORN_BFD_SESSIONS"):
        monkeypatch.delenv(name, raising=False)
    interval = launcher.EMULATED_BFD_INTERVAL_MS
    multiplier = Settings().bfd_multiplier
    assert bfd_note(Settings()).startswith(
        f"{interval} ms x {multiplier}: a silent failure is detected in {interval * multiplier} ms"
    )
    monkeypatch.setenv("THORN_BFD_INTERVAL_MS", "20")  # the admin's setting wins
    monkeypatch.setenv("THORN_BFD_MULTIPLIER", "4")
    assert bfd_note(Settings()).startswith("20 ms x 4: a silent failure is detected in 80 ms")
    monkeypatch.setenv("THORN_BFD_SESSIONS", "off")
    assert bfd_note(Settings()).startswith("off")


@dataclass
class FakeChild:
    """Dies after `lives` polls per life; stops the loop once it was respawned `until` times."""

    name: str
    log: Path
    stop: StopFlag
    until: int
    fail_respawn: bool = False
    started_at: float = 0.0
    polls: int = 0
    respawns: int = 0
    events: list[str] = field(default_factory=list)

    def poll(self) -> int | None:
        self.polls += 1
        return -9 if self.polls % 2 == 0 else None

    def respawn(self) -> None:
        self.respawns += 1
        if self.respawns >= self.until:
            self.stop.requested = True
        if self.fail_respawn:
            raise OSError("no such file")


def test_the_shell_restarts_dead_children_and_stops_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = StopFlag()
    dies = FakeChild("health", tmp_path / "health.log", stop, until=99)
    cannot = FakeChild("pathcomp", tmp_path / "pathcomp.log", stop, until=3, fail_respawn=True)
    (tmp_path / "pathcomp.log").write_text("first\nbind: address already in use\n")
    policy = RestartPolicy(first_delay=0.001, max_delay=0.002, crash_loop_after=3)
    supervisor = Supervisor(policy)
    procs: list[Supervised] = [dies, cannot]
    for proc in procs:
        supervisor.add(proc.name, proc.started_at)
    launcher._supervise(procs, supervisor, stop)
    # A spawn that fails counts as a crash: retried with back-off, never fatal.
    assert cannot.respawns == 3
    assert dies.respawns >= 1
    assert supervisor.restarts == {"health": dies.respawns, "pathcomp": 3}
    out = capsys.readouterr().out
    assert "health was killed by SIGKILL after" in out
    assert "pathcomp could not be started (no such file); restart 2 in" in out
    assert out.count("pathcomp keeps failing soon after it starts (3 times in a row)") == 1
    assert "  bind: address already in use" in out  # the log's tail, shown with the warning
