"""The replicas behind each service, and which one takes the next request. Pure: the caller
passes the time, and does the I/O.

- **Spreading**: the replica with the fewest requests outstanding (a server-sent event
  stream counts while it is open) among those that are up; ties go round robin, so idle
  replicas take turns.
- **Passive health**: a request that could not connect, or whose connection broke, marks its
  replica down for `DOWN_S`; the request moves on to another replica when that is safe
  (`replayable`).
- **Active health**: the gateway asks every replica's /healthz every few seconds; the answer
  sets the replica up or down (an answer of 200 also lifts a passive mark).
- When every replica is marked down, they are all tried anyway: a mark may be out of date,
  and trying costs one refused connection each, never a hang.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DOWN_S", "REPLAYABLE", "Replica", "Replicas", "pools", "replayable"]

DOWN_S = 5.0  # how long a replica that failed a request is left out (unless /healthz says up)
# Methods a request of which may be sent again to another replica after its connection broke
# once the request was (perhaps) sent: they change nothing (RFC 9110 9.2.1). PUT and DELETE
# are idempotent too, but a DELETE replayed after it succeeded answers 404 for a success: the
# client decides, with the 502 in hand.
REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})


def replayable(method: str, sent: bool) -> bool:
    """Whether a request whose attempt failed may go to another replica: always when nothing
    was sent (the connection was never made), else only a method that changes nothing."""
    return not sent or method.upper() in REPLAYABLE


@dataclass(eq=False)
class Replica:
    """One upstream URL of a service and what the gateway knows of it."""

    service: str
    url: str
    outstanding: int = 0
    healthy: bool = True  # the latest /healthz answer (up until one says otherwise)
    down_until: float = 0.0  # a passive mark: left out until then

    def up(self, now: float) -> bool:
        return self.healthy and now >= self.down_until


class Replicas:
    """The replicas of one service."""

    def __init__(self, service: str, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError(f"service {service} has no replica")
        self.service = service
        self.replicas = [Replica(service, url) for url in urls]
        self._turn = 0

    def __len__(self) -> int:
        return len(self.replicas)

    def pick(self, now: float, tried: Collection[Replica] = ()) -> Replica | None:
        """The replica for the next attempt of a request that already `tried` some; None
        when every replica was tried."""
        left = [r for r in self.replicas if r not in tried]
        if not left:
            return None
        up = [r for r in left if r.up(now)] or left
        start = self._turn % len(up)
        self._turn += 1
        # min() keeps the first of equals: rotating the start is the round robin.
        return min(up[start:] + up[:start], key=lambda r: r.outstanding)

    @staticmethod
    def failed(replica: Replica, now: float) -> None:
        """A request could not reach `replica` (refused, reset, broken): leave it out a while."""
        replica.down_until = now + DOWN_S

    @staticmethod
    def checked(replica: Replica, ok: bool) -> None:
        """The answer of `replica`'s /healthz."""
        replica.healthy = ok
        if ok:
            replica.down_until = 0.0

    def status(self, now: float) -> str:
        """`ok` (every replica up), `degraded` (some) or `down` (none)."""
        up = sum(r.up(now) for r in self.replicas)
        return "ok" if up == len(self.replicas) else "degraded" if up else "down"


def pools(upstreams: Mapping[str, Sequence[str]]) -> dict[str, Replicas]:
    """A `Replicas` per service of THORN_UPSTREAMS (name -> its URLs)."""
    return {name: Replicas(name, urls) for name, urls in upstreams.items()}
