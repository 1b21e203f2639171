"""The BFD child process, kept running: when it dies, a new one is started and every
node's sessions are added to it again.

Without this, a dead child left the agent with no BFD at all (no local failover, no link
reports) while its `/healthz` said ok. Now the programmer's `/healthz` answers 503 while the
child is down (`problem`), and the watchdog brings it back within about a second: peers see
the sessions go Down for that long, as for any restart of a BFD speaker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import structlog
from prometheus_client import Counter

from thorn_programmer.bfd.auth import BfdAuth
from thorn_programmer.bfd.events import BfdEvent, Counters, SessionStatus
from thorn_programmer.bfd.process import START_TIMEOUT_S, BfdProcess
from thorn_programmer.bfd.session import SessionConfig

log = structlog.get_logger("thorn.programmer.bfd")

CHILD_RESTARTS = Counter(
    "thorn_programmer_bfd_child_restarts_total", "BFD child processes started again after dying"
)
WATCH_SECONDS = 0.25
MAX_BACKOFF_SECONDS = 10.0


class SupervisedBfd:
    """A `BfdProcess` that is replaced when it dies (the `SessionRunner` BfdSessions use)."""

    def __init__(
        self,
        on_event: Callable[[BfdEvent], None],
        *,
        name: str,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self._on_event, self.name = on_event, name
        self.start_timeout_s = start_timeout_s
        self.process = BfdProcess(on_event=on_event, name=name, start_timeout_s=start_timeout_s)
        self.restarts = 0
        self.on_restart: list[Callable[[], Awaitable[None]]] = []

    @property
    def scheduling(self) -> str:
        return self.process.scheduling

    def problem(self) -> str | None:
        """Why this node's BFD is not working right now (None: it is)."""
        return None if self.process.alive else "the BFD child process is not running"

    def start(self) -> None:
        self.process.start()

    def add(
        self, config: SessionConfig, *, ifname: str | None = None, netns: str | None = None
    ) -> None:
        self.process.add(config, ifname=ifname, netns=netns)

    def remove(self, local_discriminator: int, *, admin_down: bool = True) -> None:
        self.process.remove(local_discriminator, admin_down=admin_down)

    def arm(self, local_discriminator: int, messages: Iterable[bytes]) -> None:
        self.process.arm(local_discriminator, messages)

    def set_auth(self, local_discriminator: int, auth: BfdAuth | None) -> None:
        self.process.set_auth(local_discriminator, auth)

    def sessions(self) -> list[SessionStatus]:
        return self.process.sessions()

    def counters(self) -> Counters:
        return self.process.counters()

    def close(self) -> None:
        self.process.close()

    async def watch(self) -> None:
        """Until cancelled: notice a dead child, start a new one, re-add the sessions."""
        backoff = WATCH_SECONDS
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if self.process.alive:
                backoff = WATCH_SECONDS
                continue
            log.error("bfd_child_died", manager=self.name, restarts=self.restarts)
            fresh = BfdProcess(on_event=self._on_event, name=self.name,
                               start_timeout_s=self.start_timeout_s)  # fmt: skip
            try:
                await asyncio.to_thread(fresh.start)
            except (RuntimeError, OSError) as exc:
                log.error("bfd_child_not_restarted", manager=self.name, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                continue
            await asyncio.to_thread(self.process.close, admin_down=False)
            self.process = fresh
            self.restarts += 1
            CHILD_RESTARTS.inc()
            for readd in self.on_restart:
                await readd()
            log.info("bfd_child_restarted", manager=self.name, restarts=self.restarts)
