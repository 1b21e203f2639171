"""One link's health, as a pure state machine: reports in, state transitions out.

Time is an argument (Faucet style): every method takes `now` (seconds, monotonic) and
returns the transitions it caused, so tests drive a fake clock and the service only
publishes what comes back.

States: `up`, `down`, `degraded` (up, but losing more than `degraded_loss` of its packets),
`flapping` (suppressed by dampening) and `drained` (an operator took it out of service).

Signals: each source that watches the link (the carrier at either end, BFD) says up or
down; the link is down while any source says down, and up once every source that has
spoken says up. A source that has not spoken yet does not hold the link down.

Dampening, in the manner of RFC 2439: every up -> down adds `penalty` to a figure of
merit that halves every `half_life` seconds; reaching `suppress_at` makes the link
`flapping` (out of service, whatever it does), and it comes back only once the figure has
decayed below `reuse_at` (then it is up or down, as its sources say). While suppressed,
further flaps add penalty (up to `max_penalty`) but publish nothing: a flapping link never
causes a storm of events downstream.

Up hold (Junos' BFD `holddown-interval`): a link that went `down` comes back `up` only once
every source has said up for `up_hold` seconds without a break. A gray link (carrier up,
most packets lost) brings its BFD session Up now and then for a few tens of milliseconds;
without the hold each of those put traffic back on it for that long.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class LinkState(StrEnum):
    up = "up"
    down = "down"
    degraded = "degraded"
    flapping = "flapping"
    drained = "drained"


# States in which pathcomp routes around the link (pathcomp.service.OUT_OF_SERVICE).
OUT_OF_SERVICE = frozenset({LinkState.down, LinkState.flapping, LinkState.drained})


@dataclass(frozen=True, slots=True)
class Dampening:
    penalty: float = 1000.0
    half_life: float = 15.0  # seconds
    suppress_at: float = 2000.0
    reuse_at: float = 750.0
    max_penalty: float = 6000.0

    def __post_init__(self) -> None:
        if not 0 < self.reuse_at < self.suppress_at <= self.max_penalty:
            raise ValueError("dampening needs 0 < reuse_at < suppress_at <= max_penalty")
        if self.half_life <= 0 or self.penalty <= 0:
            raise ValueError("dampening needs a positive penalty and half-life")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    dampening: Dampening = field(default_factory=Dampening)
    degraded_loss: float = 0.01  # fraction of packets lost or errored
    up_hold: float = 1.0  # seconds a link that was down must stay up before it is up again

    def __post_init__(self) -> None:
        if self.up_hold < 0:
            raise ValueError("the up hold is 0 seconds or more")


@dataclass(frozen=True, slots=True)
class Transition:
    link_id: int
    previous: LinkState | None  # None: the first state published for the link
    state: LinkState
    at: float
    source: str  # what caused it: "carrier:leaf1:swp3", "bfd:...", "dampening", "drain"


@dataclass(frozen=True, slots=True)
class LinkSnapshot:
    """What a link's machine must keep across a restart of health (see `LinkHealth.restore`).
    `penalty_at` is on the same clock as the `now` arguments (the service uses wall-clock
    seconds, so the figure of merit keeps decaying while health is away)."""

    state: LinkState | None
    sources: Mapping[str, bool]
    loss: float
    drained: bool
    suppressed: bool
    penalty: float
    penalty_at: float


class LinkHealth:
    def __init__(self, link_id: int, config: HealthConfig | None = None) -> None:
        self.link_id = link_id
        self.config = config or HealthConfig()
        self.sources: dict[str, bool] = {}  # source -> up
        self.loss = 0.0
        self.drained = False
        self.penalty = 0.0
        self._penalty_at = 0.0
        self.suppressed = False
        self.state: LinkState | None = None
        self._up_since: float | None = None  # every source up since (None: not all up)
        self._up_by = ""  # the source whose up ended the last down

    def snapshot(self) -> LinkSnapshot:
        return LinkSnapshot(
            self.state, dict(self.sources), self.loss, self.drained, self.suppressed,
            self.penalty, self._penalty_at,
        )  # fmt: skip

    @classmethod
    def restore(
        cls, link_id: int, snapshot: LinkSnapshot, now: float, config: HealthConfig | None = None
    ) -> LinkHealth:
        """A link's machine as it was: reports that agree with it publish nothing. A link
        that was held down (sources up, hold not over) is held from `now` again."""
        link = cls(link_id, config)
        link.state = snapshot.state
        link.sources = dict(snapshot.sources)
        link.loss = snapshot.loss
        link.drained = snapshot.drained
        link.suppressed = snapshot.suppressed
        link.penalty = snapshot.penalty
        link._penalty_at = snapshot.penalty_at
        link._up_since = now if link._raw_up() else None
        return link

    # --- inputs ------------------------------------------------------------------------------

    def observe(self, source: str, up: bool, now: float) -> list[Transition]:
        """A source (carrier at one end, a BFD session) says the link is up or down."""
        was_up = self._raw_up()
        self.sources[source] = up
        if was_up and not self._raw_up():
            self._add_penalty(now)
        return self._settle(now, source)

    def forget(self, source: str, now: float) -> list[Transition]:
        """A source stops watching the link (a BFD session set admin-down): it no longer
        holds the link down, and its going away is not a flap."""
        if self.sources.pop(source, None) is None:
            return []
        return self._settle(now, source)

    def observe_loss(self, fraction: float, now: float, source: str) -> list[Transition]:
        """Counters say this fraction of the link's packets were lost or errored lately."""
        if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
            raise ValueError(f"a loss fraction is between 0 and 1, not {fraction}")
        self.loss = fraction
        return self._settle(now, source)

    def set_drained(self, drained: bool, now: float) -> list[Transition]:
        self.drained = drained
        return self._settle(now, "drain")

    def tick(self, now: float) -> list[Transition]:
        """Time passes: a suppressed link may be reused, a held one come up."""
        return self._settle(now, "dampening" if self.suppressed else self._up_by or "hold")

    # --- the machine -------------------------------------------------------------------------

    def penalty_at(self, now: float) -> float:
        elapsed = max(0.0, now - self._penalty_at)
        return self.penalty * math.pow(0.5, elapsed / self.config.dampening.half_life)

    def _add_penalty(self, now: float) -> None:
        d = self.config.dampening
        self.penalty = min(d.max_penalty, self.penalty_at(now) + d.penalty)
        self._penalty_at = now

    def _raw_up(self) -> bool:
        return all(self.sources.values())

    def held(self, now: float) -> bool:
        """Down, its sources all up again, not yet for `up_hold` seconds."""
        left = self._hold_left(now)
        return left is not None and left > 0

    def wake_in(self, now: float) -> float | None:
        """Seconds until time alone may change the state (a reuse, the end of a hold), when
        the service should call `tick` again; None: nothing waits on time."""
        waits = [w for w in (self.reuse_in(now), self._hold_left(now)) if w is not None]
        return min(waits) if waits else None

    def _hold_left(self, now: float) -> float | None:
        """Seconds left of the hold (0: over, a tick brings the link up); None: no hold."""
        if self.state is not LinkState.down or not self._raw_up() or self._up_since is None:
            return None
        return max(0.0, self._up_since + self.config.up_hold - now)

    def reuse_in(self, now: float) -> float | None:
        """Seconds until a suppressed link's figure of merit falls below reuse (None: not
        suppressed): when the service should call `tick` again."""
        if not self.suppressed:
            return None
        d = self.config.dampening
        current = self.penalty_at(now)
        if current <= d.reuse_at:
            return 0.0
        return d.half_life * math.log2(current / d.reuse_at)

    def _settle(self, now: float, source: str) -> list[Transition]:
        d = self.config.dampening
        merit = self.penalty_at(now)
        if not self.suppressed and merit >= d.suppress_at:
            self.suppressed = True
        elif self.suppressed and merit < d.reuse_at:
            self.suppressed = False  # then up or down as the sources say (RFC 2439 reuse)
        if not self._raw_up():
            self._up_since = None
        elif self._up_since is None:
            self._up_since, self._up_by = now, source
        new = self._state(now)
        if new == self.state:
            return []
        previous, self.state = self.state, new
        return [Transition(self.link_id, previous, new, now, source)]

    def _state(self, now: float) -> LinkState:
        if self.drained:
            return LinkState.drained
        if self.suppressed:
            return LinkState.flapping
        if not self._raw_up() or self.held(now):
            return LinkState.down
        if self.loss > self.config.degraded_loss:
            return LinkState.degraded
        return LinkState.up
