"""A lease's timing rules, without I/O (the clock is injectable), its key's record and its
KV bucket: when a holder may act as leader, when it must renew, when it must stop."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from thorn.events import KeyValueSpec

DEFAULT_TTL = 3.0
"""Default lease duration, seconds: also the lease bucket's max_age."""

STEP_DOWN_AT = 0.8
"""A holder acts as leader until this fraction of `ttl` after sending its last renewal."""

LEASES_KV = KeyValueSpec(
    bucket="thorn-leases",
    description="leader-election leases, one key per election; entries expire after the lease "
    "duration (the bucket's max_age)",
    history=1,
    max_value_size=1024,
    max_bytes=1 << 20,
    storage="file",  # a lease must survive a server restart, or a rival could acquire early
)

Clock = Callable[[], float]
TransitionKind = Literal["became_leader", "lost_leadership"]


class LeaseConfigError(Exception):
    """The lease bucket exists but cannot hold leases (it has no max_age)."""


def make_candidate_id(prefix: str | None = None) -> str:
    """A unique candidate id: `<host>-<pid>-<random>` (or `<prefix>-<pid>-<random>`)."""
    return f"{prefix or socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Transition:
    """This candidate became leader or lost leadership; `term` is the KV revision of the term."""

    kind: TransitionKind
    election: str
    candidate: str
    term: int
    reason: str
    at: float  # the election's clock (time.monotonic by default)

    @property
    def became_leader(self) -> bool:
        return self.kind == "became_leader"


@dataclass(frozen=True, slots=True)
class _Record:
    """The value of a lease key."""

    candidate: str
    token: str  # per LeaderElection object: only this object may reclaim a lease it wrote

    def encode(self) -> bytes:
        return json.dumps({"candidate": self.candidate, "token": self.token}).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> _Record | None:
        try:
            raw = json.loads(data or b"")
            return cls(candidate=str(raw["candidate"]), token=str(raw["token"]))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass
class Lease:
    """When a holder may act as leader and when it must renew; the clock is injectable.

    A write (create or renewal) *sent* at `sent_at` and acknowledged makes the holder leader
    until `sent_at + step_down_at * ttl`; it renews from `sent_at + renew_every` on.
    """

    ttl: float
    clock: Clock = time.monotonic
    step_down_at: float = STEP_DOWN_AT
    renew_every: float | None = None  # default ttl / 3
    revision: int | None = field(default=None, init=False)
    term: int | None = field(default=None, init=False)
    sent_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if self.ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {self.ttl}")
        if not 0 < self.step_down_at < 1:
            raise ValueError(f"step_down_at must be within (0, 1), got {self.step_down_at}")
        if self.renew_every is None:
            self.renew_every = self.ttl / 3
        if not 0 < self.renew_every < self.step_down_at * self.ttl:
            raise ValueError("renew_every must be positive and below step_down_at * ttl")

    @property
    def deadline(self) -> float:
        """Clock time from which the holder must no longer act as leader."""
        return self.sent_at + self.step_down_at * self.ttl

    @property
    def renew_at(self) -> float:
        assert self.renew_every is not None
        return self.sent_at + self.renew_every

    @property
    def held(self) -> bool:
        """A lease was granted and not dropped (it may have lapsed: see `valid`)."""
        return self.revision is not None

    @property
    def valid(self) -> bool:
        return self.revision is not None and self.clock() < self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock()) if self.revision is not None else 0.0

    def grant(self, revision: int, sent_at: float, *, new_term: bool) -> bool:
        """Record a successful write sent at `sent_at`. False (nothing recorded) if too late."""
        if self.clock() >= sent_at + self.step_down_at * self.ttl:
            return False
        if new_term or self.term is None:
            self.term = revision
        self.revision = revision
        self.sent_at = sent_at
        return True

    def drop(self) -> int | None:
        """Forget the lease; returns the term that ended (None if there was none)."""
        term, self.revision, self.term = self.term, None, None
        return term
