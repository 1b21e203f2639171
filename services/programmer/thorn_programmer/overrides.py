"""A host agent's failover overrides: peers it sends on another colour than its desired
state says, because a flip (its own BFD, or pathcomp's urgent message) moved them there.

Rules (time is an argument: tests drive a fake clock):

- A flip sets an override per peer, remembering why, when, and the plan revision it was
  decided on.
- The controller agreeing clears it: the desired state itself now puts the peer on that
  colour (`agree`).
- Re-protection clears it, for a revertive policy only: pathcomp says a plan newer than the
  flip makes the preferred colour safe again (`reprotected`), or the agent's own BFD session
  on the preferred colour toward that peer comes Up (`path_up`: a source's own flips are
  invisible to pathcomp); once that has held for the hold-down, the override goes (`due`)
  and traffic moves back. The preferred colour's session going Down meanwhile stops the
  clock (`path_down`). A non-revertive policy stays on the other colour until that one
  fails in turn.
- Overrides are kept in a small JSON file, so an agent restarted mid-failover does not
  move traffic back onto a path that is still broken.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import structlog

from thorn.model import Colour

log = structlog.get_logger("thorn.programmer")

__all__ = ["Override", "Overrides"]


@dataclass(frozen=True, slots=True)
class Override:
    colour: Colour
    reason: str
    tier: str  # "source" (the agent's own BFD) or "central" (pathcomp)
    plan_revision: int  # the plan the flip was decided on
    since: float  # wall-clock seconds
    revert_at: float | None = None  # revertive: when it may go (set by re-protection)


class Overrides:
    def __init__(self, path: Path | None, *, revertive: bool, hold_down: float) -> None:
        self.path = path
        self.revertive = revertive
        self.hold_down = hold_down
        self.by_peer: dict[str, Override] = self._load()
        # Saves are numbered; a write never replaces a newer state already on disk (a save
        # handed to a thread may finish after a later one made on the loop).
        self._snapshots = 0
        self._on_disk = 0
        self._file_lock = threading.Lock()

    def colours(self) -> dict[str, Colour]:
        return {peer: o.colour for peer, o in self.by_peer.items()}

    def put(self, peers: list[str], colour: Colour, reason: str, tier: str,
            plan_revision: int, now: float, *, save: bool = True) -> None:  # fmt: skip
        """Record a flip (`save=False`: the caller saves once the kernel is changed, so
        the file write is not on the critical path)."""
        for peer in peers:
            self.by_peer[peer] = Override(colour, reason, tier, plan_revision, now)
        if save:
            self.save()

    def agree(self, blue_peers: set[str]) -> None:
        """Drop the overrides the desired state now agrees with."""
        kept = {
            peer: o
            for peer, o in self.by_peer.items()
            if (o.colour == "blue") != (peer in blue_peers)
        }
        if len(kept) != len(self.by_peer):
            self.by_peer = kept
            self.save()

    def reprotected(self, peers: list[str], plan_revision: int, now: float) -> float | None:
        """Plan `plan_revision` makes `peers`' preferred colour safe again: revertive
        overrides decided on an older plan may go after the hold-down. Returns when the
        first may go (None: nothing to revert)."""
        if not self.revertive:
            return None
        at = now + self.hold_down
        for peer in peers:
            o = self.by_peer.get(peer)
            if o is not None and o.plan_revision < plan_revision:
                self.by_peer[peer] = replace(o, revert_at=at)
        self.save()
        due = [o.revert_at for o in self.by_peer.values() if o.revert_at is not None]
        return min(due) if due else None

    def path_up(self, peer: str, now: float) -> float | None:
        """The preferred colour's path toward `peer` works again (its BFD session is Up):
        a revertive override may go after the hold-down. Returns when (None: nothing)."""
        o = self.by_peer.get(peer)
        if not self.revertive or o is None:
            return None
        if o.revert_at is None:
            self.by_peer[peer] = o = replace(o, revert_at=now + self.hold_down)
            self.save()
        return o.revert_at

    def path_down(self, peer: str) -> None:
        """The preferred colour's path toward `peer` failed again: no revert is due."""
        o = self.by_peer.get(peer)
        if o is not None and o.revert_at is not None:
            self.by_peer[peer] = replace(o, revert_at=None)
            self.save()

    def due(self, now: float) -> list[str]:
        """Remove and return the overrides whose hold-down has passed."""
        gone = [p for p, o in self.by_peer.items() if o.revert_at and o.revert_at <= now]
        for peer in gone:
            del self.by_peer[peer]
        if gone:
            self.save()
        return gone

    # --- the file ----------------------------------------------------------------------------

    def _load(self) -> dict[str, Override]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
            return {peer: Override(**fields) for peer, fields in raw.items()}
        except (OSError, ValueError, TypeError) as exc:
            log.error("overrides_unreadable", path=str(self.path), error=str(exc))
            return {}

    def save(self) -> None:
        self._write(*self._snapshot())

    async def save_off_loop(self) -> None:
        """`save`, with the file written on a worker thread: on a busy machine a write and
        rename took 250-290 ms (the failover benchmark's watchdog caught it on the agents'
        loop, after a flip)."""
        await asyncio.to_thread(self._write, *self._snapshot())

    def _snapshot(self) -> tuple[int, str]:
        self._snapshots += 1
        return self._snapshots, json.dumps({p: asdict(o) for p, o in self.by_peer.items()})

    def _write(self, number: int, text: str) -> None:
        if self.path is None:
            return
        with self._file_lock:
            if number <= self._on_disk:
                return  # a newer state is on disk already
            tmp = self.path.with_suffix(".tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(text)
                os.replace(tmp, self.path)  # atomic: a crash leaves the old file or the new one
                self._on_disk = number
            except OSError as exc:
                log.error("overrides_not_saved", path=str(self.path), error=str(exc))
