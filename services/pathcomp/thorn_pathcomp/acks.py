"""What each node's agent last applied, so that staged writes wait for the stage before.

Make-before-break needs more than writing stage n+1 after stage n: the switches of stage n
must have *installed* their routes before their upstream neighbours point at them. Agents
report every reconcile on `agent.applied.<node>` with the KV revision they applied; the
writer waits, after each stage, until every node written in it has reported that revision.

Only agents that are alive are waited for (one that reported within `live_for` seconds;
agents repeat their last report every `HEARTBEAT_SECONDS` while nothing changes, so a quiet
fabric's agents stay live):
a fabric whose agents are not running (a controller with no datapath, a node being
replaced) must not stall every plan for the full timeout. A stage that is not acknowledged
in time is reported and the next one goes ahead: a late agent is better than a frozen
fabric.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from thorn.events import DatapathApplied

LATE_STAGES = Counter(
    "thorn_pathcomp_stage_ack_timeouts_total", "Staged writes that went ahead without every ack"
)


class AgentAcks:
    """Each waiter waits on the nodes it still needs, by node: an acknowledgement wakes only
    the waiters of its node. (One condition woken by every report made each of a k=32
    stage's ~750 waiting writes re-check at each of ~750 reports: seconds of the loop.)"""

    def __init__(self, live_for: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.live_for = live_for
        self.clock = clock
        self.applied: dict[str, int] = {}  # node -> key revision its agent last applied
        self.seen: dict[str, float] = {}  # node -> when its agent last reported
        # node -> (revision wanted, the waiter's future), for the waiters still missing it
        self._waiting: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}

    async def on_applied(self, event: DatapathApplied) -> None:
        # A report with errors says the agent is alive but did not apply that revision: it
        # is no acknowledgement (the stage waits, and its lateness is reported).
        node = event.node
        if not event.errors:
            self.applied[node] = max(self.applied.get(node, 0), event.key_revision)
        self.seen[node] = self.clock()
        waiting = self._waiting.get(node)
        if not waiting:
            return
        applied = self.applied.get(node, 0)
        for revision, future in waiting:
            if applied >= revision and not future.done():
                future.set_result(None)
        waiting[:] = [(r, f) for r, f in waiting if not f.done()]

    def live(self, node: str) -> bool:
        seen = self.seen.get(node)
        return seen is not None and self.clock() - seen <= self.live_for

    def missing(self, written: Mapping[str, int]) -> list[str]:
        """Live nodes that have not yet applied the revision written for them."""
        return sorted(
            node
            for node, revision in written.items()
            if self.live(node) and self.applied.get(node, 0) < revision
        )

    async def wait(self, written: Mapping[str, int], within: float) -> list[str]:
        """Wait until every live node applied its revision; returns the late ones."""
        loop = asyncio.get_running_loop()
        mine: list[tuple[str, tuple[int, asyncio.Future[None]]]] = []
        for node in self.missing(written):
            entry = (written[node], loop.create_future())
            self._waiting.setdefault(node, []).append(entry)
            mine.append((node, entry))
        try:
            if mine:
                async with asyncio.timeout(within):
                    for _, (_, future) in mine:
                        await future
        except TimeoutError:
            LATE_STAGES.inc()
        finally:
            for node, entry in mine:
                waiting = self._waiting.get(node)
                if waiting is not None and entry in waiting:
                    waiting.remove(entry)
                if not waiting:
                    self._waiting.pop(node, None)
        return self.missing(written)
