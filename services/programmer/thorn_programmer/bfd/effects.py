"""The BFD runtime's effects, off its timers' thread: an armed session's route withdraw
(sent to the kernel the moment it goes Down), then each event to the agent, in order."""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue

import structlog

from thorn_programmer.bfd.events import BfdEvent
from thorn_programmer.netlink import TcBatchError, TcSocket

log = structlog.get_logger("thorn.bfd")


class Effects:
    """The runtime's effects, in the order the sessions made them, on a thread of their own:
    an armed session's withdraw (then its event says what the kernel did), then each event
    to `on_event`. The timers' thread only enqueues."""

    def __init__(self, on_event: Callable[[BfdEvent], None] | None, name: str) -> None:
        self._on_event = on_event
        self._name = name
        self._queue: SimpleQueue[tuple[str | None, tuple[bytes, ...], BfdEvent] | None] = (
            SimpleQueue()
        )
        self._rtnl: dict[str | None, TcSocket] = {}  # per namespace, for armed withdraws
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"bfd-{self._name}-effects",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def put(self, netns: str | None, armed: tuple[bytes, ...], event: BfdEvent) -> None:
        self._queue.put((netns, armed, event))

    def stop(self, timeout: float = 2.0) -> None:
        self._queue.put(None)
        if self._thread is not None and not self.is_current():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                netns, armed, event = item
                if armed:
                    accepted, ms, errors = self._withdraw(netns, armed, event.monotonic)
                    event = dataclasses.replace(event, withdrawn=accepted, withdrawn_ms=ms,
                                                withdraw_errors=errors)  # fmt: skip
                log.info("bfd state change", manager=self._name, peer=event.peer,
                         local=event.local_address, old=event.old.name, new=event.new.name,
                         diag=event.diag.name, timer_late_ms=event.timer_late_ms,
                         excused_ms=event.excused_ms)  # fmt: skip
                if self._on_event is not None:
                    try:
                        self._on_event(event)
                    except Exception:
                        log.exception("bfd event callback failed", manager=self._name)
        finally:
            for rtnl in self._rtnl.values():
                rtnl.close()
            self._rtnl.clear()

    def _withdraw(self, netns: str | None, armed: tuple[bytes, ...], since: float
                  ) -> tuple[int, float, tuple[str, ...]]:  # fmt: skip
        """Send the armed requests: (accepted, ms since `since`, errors). A route the kernel
        no longer has (ESRCH: its port went admin down) is no error."""
        errors: list[str] = []
        accepted = len(armed)
        try:
            sock = self._rtnl.get(netns)
            if sock is None:
                sock = self._rtnl[netns] = TcSocket(netns, rcvbuf=1 << 20, sndbuf=1 << 18,
                                                    timeout=1.0)  # fmt: skip
            sock.send_batch(armed)
        except TcBatchError as exc:
            accepted -= len(exc.errors)
            errors = [str(e) for e in exc.errors if e.errno != errno.ESRCH]
        except OSError as exc:  # no such namespace any more, a timeout: the agent follows
            accepted, errors = 0, [f"armed withdraw not sent: {exc}"]
        return accepted, (time.monotonic() - since) * 1000, tuple(errors)
