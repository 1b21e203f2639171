"""When `thorn-run` starts a dead child again: restart decisions without processes or clocks.

The launcher's loop polls its processes and hands what it saw, with the time it read, to a
`Supervisor`; the supervisor says when each dead child is due to start again. Nothing here
reads a clock or touches a process, so the policy is tested with plain numbers.

Back-off: the first restart waits `first_delay`, each further short run in a row doubles the
wait up to `max_delay`. A run that lasted `stable_after` or longer was a healthy one: the
next exit starts over at `first_delay`.
"""

from __future__ import annotations

from dataclasses import dataclass

_MAX_DOUBLINGS = 64  # beyond this the cap has long been reached; keeps 2**n finite


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_delay: float = 0.2
    max_delay: float = 10.0
    stable_after: float = 30.0
    crash_loop_after: int = 5  # short runs in a row before the user is told it crash-loops

    def __post_init__(self) -> None:
        if not 0 < self.first_delay <= self.max_delay:
            raise ValueError("need 0 < first_delay <= max_delay")
        if self.stable_after <= 0 or self.crash_loop_after < 1:
            raise ValueError("need stable_after > 0 and crash_loop_after >= 1")

    def delay(self, streak: int) -> float:
        """The wait before the restart that follows the `streak`-th short run in a row."""
        if streak < 1:
            raise ValueError("streak counts from 1")
        return min(self.max_delay, self.first_delay * 2.0 ** min(streak - 1, _MAX_DOUBLINGS))


@dataclass(frozen=True, slots=True)
class Restart:
    """The supervisor's answer to one exit: start `name` again at `at`."""

    name: str
    code: int | None  # None: it could not even be started
    uptime: float
    streak: int  # short runs in a row, this one included
    delay: float
    at: float
    number: int  # this child's restart count once this restart is made
    crash_loop: bool  # the streak just reached the policy's crash_loop_after: tell the user


@dataclass(slots=True)
class _Child:
    started_at: float | None  # None while it is down
    due_at: float | None = None
    streak: int = 0
    restarts: int = 0
    warned: bool = False


class Supervisor:
    """Restart bookkeeping for named children; every method takes the caller's `now`."""

    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._children: dict[str, _Child] = {}

    def add(self, name: str, now: float) -> None:
        """`name` was started for the first time at `now`."""
        if name in self._children:
            raise ValueError(f"{name} is already supervised")
        self._children[name] = _Child(started_at=now)

    def running(self, name: str) -> bool:
        return self._children[name].started_at is not None

    def exited(self, name: str, now: float, code: int | None) -> Restart:
        """`name` was seen dead at `now` (with exit `code`): when it starts again."""
        child = self._children[name]
        if child.started_at is None:
            raise ValueError(f"{name} is not running")
        uptime = max(0.0, now - child.started_at)
        # A long healthy run forgives the earlier crashes (checked at exit: no timer needed).
        child.streak = 1 if uptime >= self.policy.stable_after else child.streak + 1
        if child.streak == 1:
            child.warned = False
        crash_loop = child.streak >= self.policy.crash_loop_after and not child.warned
        child.warned = child.warned or crash_loop
        delay = self.policy.delay(child.streak)
        child.started_at = None
        child.due_at = now + delay
        return Restart(
            name=name,
            code=code,
            uptime=uptime,
            streak=child.streak,
            delay=delay,
            at=child.due_at,
            number=child.restarts + 1,
            crash_loop=crash_loop,
        )

    def due(self, now: float) -> list[str]:
        """The dead children whose wait is over at `now`, in the order they were added."""
        return [
            name
            for name, child in self._children.items()
            if child.due_at is not None and child.due_at <= now
        ]

    def started(self, name: str, now: float) -> None:
        """`name` was started again at `now` (after `due` named it)."""
        child = self._children[name]
        if child.due_at is None:
            raise ValueError(f"{name} has no restart due")
        child.due_at = None
        child.started_at = now
        child.restarts += 1

    def settled(self, now: float) -> list[str]:
        """Children said to crash-loop that have now stayed up `stable_after`: each is named
        once, so the user hears it is healthy again."""
        names = []
        for name, child in self._children.items():
            if (
                child.warned
                and child.started_at is not None
                and now - child.started_at >= self.policy.stable_after
            ):
                child.warned = False
                child.streak = 0
                names.append(name)
        return names

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts made so far, per child, in the order they were added."""
        return {name: child.restarts for name, child in self._children.items()}
