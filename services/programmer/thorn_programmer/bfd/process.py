"""`BfdManager` in a child process of its own: the same API, no GIL shared with the caller.

Why: a BFD thread inside a busy Python process waits for the GIL. Measured (docs/bfd.md), an
event loop that runs short callbacks and polls its selector keeps re-taking the GIL before a
waiting thread wakes, and 10 ms timers on that thread were then hundreds of ms late at p99:
enough for false detections at 10 ms x 3. A child process has its own interpreter and GIL;
the kernel schedules it like any other process. CLOCK_MONOTONIC is system-wide, so the events'
`monotonic` timestamps mean the same in both processes.

The child is a fresh interpreter (`python -c ...` calling `_child_main`; forking a
threaded parent is unsafe, and multiprocessing's "spawn" would re-run the parent's main
module) talking over a socketpair with multiprocessing's pickled-message framing. It stops
when the pipe closes, so it dies with its parent.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import suppress
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

import structlog

from thorn.telemetry import configure_logging
from thorn.watchdog import GcPauses, StallWatchdog, settle_heap
from thorn_programmer.bfd.auth import BfdAuth
from thorn_programmer.bfd.events import BfdEvent, Counters, SessionStatus
from thorn_programmer.bfd.manager import BfdManager
from thorn_programmer.bfd.metrics import COLLECTOR
from thorn_programmer.bfd.session import SessionConfig

log = structlog.get_logger("thorn.bfd")

_REQUEST_TIMEOUT_S = 15.0
_CHILD = (
    "import sys; from multiprocessing.connection import Connection; "
    "from thorn_programmer.bfd.process import _child_main; "
    "_child_main(Connection(int(sys.argv[1])), sys.argv[2])"
)
START_TIMEOUT_S = 30.0  # the child's Python start and imports (minutes under emulation)


# The child's scheduling: BFD needs little CPU but needs it on time. As root it runs
# SCHED_FIFO at a low real-time priority, so a busy agent or a lab's traffic never delays a
# 10 ms timer (the kernel still keeps 5 % of each second for other tasks); otherwise nice -10
# if allowed; otherwise as it is.
RT_PRIORITY = 20
STALL_THRESHOLD_S = 0.010  # a third of the lab's 10 ms x 3 detection time
_LEVELS = ("debug", "info", "warning", "error")


def _prompt_scheduling() -> str:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"SCHED_FIFO {RT_PRIORITY}"
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "normal"


def _child_main(conn: Connection, name: str) -> None:
    """The child: a manager, and this thread answering the parent's requests in order."""
    # Its logs go where the agent's go (the inherited stderr), as the agent's settings say.
    level, fmt = os.environ.get("THORN_LOG_LEVEL", "info"), os.environ.get("THORN_LOG_FORMAT")
    configure_logging(level if level in _LEVELS else "info",
                      "console" if fmt == "console" else "json")  # fmt: skip
    lock = threading.Lock()
    scheduling = _prompt_scheduling()  # before the manager's thread: threads inherit it

    def send(message: tuple[Any, ...]) -> None:
        with lock:  # the manager's thread (events) and this one (replies) share the pipe
            conn.send(message)

    # A runtime that misses its own timers by a detection time fails every session it holds
    # at once: the watchdog logs what held it (`bfd_runtime_stalled`, with its stack).
    watchdog = StallWatchdog("bfd_runtime", threshold_s=STALL_THRESHOLD_S, check_s=0.005)
    manager = BfdManager(lambda event: send(("event", event)), name=name, watchdog=watchdog)
    GcPauses(warn_s=STALL_THRESHOLD_S / 2).install()
    settle_heap()  # a full collection of the start-up heap would outlast a detection time
    manager.start()
    send(("ready", scheduling))
    try:
        while True:
            try:
                ident, op, args, kwargs = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone: stop
            try:
                result = getattr(manager, op)(*args, **kwargs)
            except BaseException as exc:
                send(("error", ident, exc))
            else:
                send(("reply", ident, result))
            if op == "close":
                return
    finally:
        manager.close(admin_down=False)
        conn.close()


class BfdProcess:
    """The `BfdManager` API with the manager in a child process.

    `on_event` runs on this process's reader thread, in order; it must not block. Use
    `EventQueue.put` to hand events to an asyncio loop.
    """

    def __init__(
        self,
        on_event: Callable[[BfdEvent], None] | None = None,
        *,
        name: str = "bfd",
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.start_timeout_s = start_timeout_s
        self._on_event = on_event
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.scheduling = "not started"  # the child's CPU scheduling, once it runs
        self._gone = False
        COLLECTOR.managers.add(self)

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("BfdProcess already started")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fd = theirs.fileno()
            self._process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(fd), self.name],
                pass_fds=[fd],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._reader = threading.Thread(target=self._read, name=f"bfd-{self.name}-rx", daemon=True)
        self._reader.start()
        if not self._ready.wait(self.start_timeout_s) or self._gone:
            self.close(admin_down=False)
            raise RuntimeError(
                f"the BFD child process did not start within {self.start_timeout_s:g} s"
            )

    @property
    def alive(self) -> bool:
        """The child runs and answers (False once it exited or its pipe closed)."""
        return self._process is not None and not self._gone

    def add(
        self, config: SessionConfig, *, ifname: str | None = None, netns: str | None = None
    ) -> None:
        """As `BfdManager.add`; the sockets are made in the child (inside `netns`)."""
        self._request("add", config, ifname=ifname, netns=netns)

    def remove(self, local_discriminator: int, *, admin_down: bool = True) -> None:
        self._request("remove", local_discriminator, admin_down=admin_down)

    def set_auth(self, local_discriminator: int, auth: BfdAuth | None) -> None:
        self._request("set_auth", local_discriminator, auth)

    def arm(self, local_discriminator: int, messages: Iterable[bytes]) -> None:
        """As `BfdManager.arm`: the child sends them itself, at SCHED_FIFO."""
        self._request("arm", local_discriminator, list(messages))

    def sessions(self) -> list[SessionStatus]:
        result: list[SessionStatus] = self._request("sessions")
        return result

    def counters(self) -> Counters:
        result: Counters = self._request("counters")
        return result

    def close(self, *, admin_down: bool = True, timeout: float = 2.0) -> None:
        process = self._process
        if process is None:
            return
        if not self._gone:
            # Already gone, or stuck: terminated below.
            with suppress(RuntimeError, TimeoutError):
                self._request("close", admin_down=admin_down, timeout=timeout)
        try:
            process.wait(timeout + 2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(2.0)
        if self._conn is not None:
            self._conn.close()
        if self._reader is not None:
            self._reader.join(2.0)

    def __enter__(self) -> BfdProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, op: str, *args: Any, **kwargs: Any) -> Any:
        conn = self._conn
        if conn is None or self._gone:
            raise RuntimeError("the BFD process is not running")
        future: Future[Any] = Future()
        with self._lock:
            ident = next(self._ids)
            self._pending[ident] = future
            try:
                conn.send((ident, op, args, kwargs))
            except OSError as exc:  # the child died before the reader thread noticed
                self._pending.pop(ident, None)
                raise RuntimeError("the BFD process is gone") from exc
        return future.result(_REQUEST_TIMEOUT_S)

    def _read(self) -> None:
        assert self._conn is not None
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "event":
                    self._deliver(message[1])
                elif kind == "ready":
                    self.scheduling = str(message[1])
                    log.info("bfd_process_ready", manager=self.name, scheduling=self.scheduling)
                    self._ready.set()
                else:
                    future = self._pending.pop(message[1], None)
                    if future is None:
                        continue
                    if kind == "reply":
                        future.set_result(message[2])
                    else:
                        future.set_exception(message[2])
        except (EOFError, OSError):
            pass  # the child exited or the pipe was closed
        finally:
            self._gone = True
            self._ready.set()
            with self._lock:
                pending, self._pending = self._pending, {}
            for future in pending.values():
                future.set_exception(RuntimeError("the BFD process is gone"))

    def _deliver(self, event: BfdEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            log.exception("bfd event callback failed", manager=self.name)
