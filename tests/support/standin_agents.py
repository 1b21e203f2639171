"""Stand-in agents for pathcomp tests over real NATS: they watch the desired-state KV as the
programmer's agents do, and report each write applied (`agent.applied.<node>`) after a
delay, without touching a kernel. The real agent's side of this contract is tested in
tests/fabric."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from thorn.bus import Bus, CaughtUp
from thorn.events import DatapathApplied


class StandInAgents:
    """Plays every node's agent on the bus: reports a key revision as applied `delay` after
    it was written (the real agent's side of this contract is tested in tests/fabric)."""

    def __init__(
        self,
        bus: Bus,
        delay: float,
        silent: set[str] | None = None,
        delays: dict[str, float] | None = None,
        absent: set[str] | None = None,
    ) -> None:
        self.bus, self.delay, self.silent = bus, delay, silent or set()
        # `silent` agents run (they say hello) but never apply anything; `absent` ones do not
        # run at all: they never report.
        self.absent = absent or set()
        self.silent |= self.absent
        self.delays = delays or {}  # nodes slower (or faster) than `delay`
        self.writes: list[tuple[float, str, int]] = []  # (when, node, revision)
        self.acks: dict[tuple[str, int], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def hello(self, nodes: list[str]) -> None:
        """Each agent reports once what it last applied (0: nothing yet), as running agents
        do: pathcomp now counts them live and waits for them."""
        for node in (n for n in nodes if n not in self.absent):
            applied = [rev for (n, rev) in self.acks if n == node]
            await self.bus.publish(self._applied(node, max(applied, default=0)))

    def _applied(self, node: str, revision: int) -> DatapathApplied:
        return DatapathApplied(
            node=node, driver="stand-in", key_revision=revision, plan_revision=0, changes=0,
            seconds=0.0, at=datetime.now(UTC),
        )  # fmt: skip

    async def follow(self) -> None:
        kv = await self.bus.desired_state()
        async with kv.watch() as watch:
            async for item in watch:
                if isinstance(item, CaughtUp) or not item.node.startswith("node."):
                    continue
                node = item.node.removeprefix("node.")
                self.writes.append((time.monotonic(), node, item.revision))
                if node not in self.silent:
                    task = asyncio.create_task(self._ack(node, item.revision))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _ack(self, node: str, revision: int) -> None:
        await asyncio.sleep(self.delays.get(node, self.delay))
        self.acks[(node, revision)] = time.monotonic()
        await self.bus.publish(self._applied(node, revision))

    async def stop(self, follower: asyncio.Task[None]) -> None:
        """Stop following and drop the reports not sent yet (before the bus closes)."""
        for task in (follower, *self._tasks):
            task.cancel()
        await asyncio.gather(follower, *self._tasks, return_exceptions=True)
