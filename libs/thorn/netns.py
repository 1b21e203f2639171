"""Named network namespaces, made and entered with the system calls themselves (ctypes).

Compatible with iproute2: a namespace ``X`` is a bind mount of an nsfs inode at
``/run/netns/X``, so ``ip netns exec X ...`` and ``ip -n X ...`` work on them. The agents
use them to serve nodes in namespaces; the lab uses them to build its fabric.

Network namespaces are per thread: `entered` moves only the calling thread and always
moves it back; a socket (netlink or UDP) made inside stays in that namespace for its life,
whichever thread uses it later. `create` unshares in a short-lived thread, so the caller's
thread never changes namespace. No process is forked (pyroute2's own netns helpers fork a
child per socket, which is slower and unsafe in a threaded program).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ParamSpec, TypeVar

__all__ = [
    "NETNS_DIR",
    "create",
    "entered",
    "exists",
    "listed",
    "netlink_socket",
    "remove",
    "run_in_netns",
]

NETNS_DIR = Path("/run/netns")  # where iproute2 (`ip netns`) keeps named namespaces

CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2
_THREAD_NS = b"/proc/thread-self/ns/net"

_libc = ctypes.CDLL(None, use_errno=True)
_rundir_ready = threading.Lock()
_rundir_done = False

P = ParamSpec("P")
T = TypeVar("T")


def _check(result: int, what: str, name: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what} for namespace '{name}': {os.strerror(code)}")


def path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).is_file()


def listed() -> list[str]:
    """Every named namespace (what `ip netns list` shows)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _prepare_rundir() -> None:
    """Make /run/netns a shared mount point, as iproute2 does, once per process.

    Shared, so namespaces mounted later are visible to programs that entered their own
    mount namespace (`ip netns exec` does).
    """
    global _rundir_done
    with _rundir_ready:
        if _rundir_done:
            return
        NETNS_DIR.mkdir(parents=True, exist_ok=True)
        target = bytes(NETNS_DIR)
        if _libc.mount(b"", target, b"none", MS_SHARED | MS_REC, None) != 0:
            _check(_libc.mount(target, target, b"none", MS_BIND | MS_REC, None), "bind", "*")
            _check(_libc.mount(b"", target, b"none", MS_SHARED | MS_REC, None), "share", "*")
        _rundir_done = True


def _setns(fd: int, name: str) -> None:
    _check(_libc.setns(fd, CLONE_NEWNET), "setns", name)


def create(name: str) -> None:
    """Create the named namespace ``name``; FileExistsError if the name is taken."""
    _prepare_rundir()
    target = path(name)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    failure: list[BaseException] = []

    def unshare_and_mount() -> None:
        own = os.open(_THREAD_NS, os.O_RDONLY)
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare", name)
            _check(_libc.mount(_THREAD_NS, bytes(target), b"none", MS_BIND, None), "mount", name)
            _setns(own, name)
        except BaseException as exc:
            failure.append(exc)
        finally:
            os.close(own)

    worker = threading.Thread(target=unshare_and_mount, name=f"netns-create-{name}")
    worker.start()
    worker.join()
    if failure:
        target.unlink(missing_ok=True)
        raise failure[0]


def remove(name: str) -> bool:
    """Unmount and delete the name (as `ip netns del`); False if it did not exist.

    The kernel frees the namespace, and with it its devices (veth peers included), once
    no process and no open descriptor holds it any more.
    """
    target = path(name)
    if _libc.umount2(bytes(target), MNT_DETACH) != 0 and ctypes.get_errno() not in (
        errno.EINVAL,  # not a mount point: a name left half-made
        errno.ENOENT,
    ):
        _check(-1, "umount", name)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    return True


@contextmanager
def entered(name: str) -> Iterator[None]:
    """The calling thread inside namespace ``name`` for the block, then back where it was."""
    own = os.open(_THREAD_NS, os.O_RDONLY)
    try:
        try:
            fd = os.open(path(name), os.O_RDONLY)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"no network namespace '{name}'") from None
        try:
            _setns(fd, name)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            _setns(own, "(the caller's own)")
    finally:
        os.close(own)


def run_in_netns(name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn(*args, **kwargs)`` in a new thread inside namespace ``name``; return its
    result or raise its exception. The caller's thread never leaves its namespace."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            with entered(name):
                result.append(fn(*args, **kwargs))
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=body, name=f"netns-{name}")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


NETLINK_ROUTE = 0


def netlink_socket(
    name: str | None, proto: int = NETLINK_ROUTE, *, sndbuf: int = 1 << 20, rcvbuf: int = 1 << 20
) -> socket.socket:
    """A netlink socket made inside namespace `name` (None: this one) by a short-lived thread
    that entered it: no fork. Hand it to pyroute2 as `use_socket`: its own `netns=` forks a
    child per socket, which can hang a multithreaded process (a lock held at fork)."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        return sock

    return make() if name is None else run_in_netns(name, make)


def open_fd(name: str) -> int:
    """An O_RDONLY descriptor of the namespace (for IFLA_NET_NS_FD); the caller closes it."""
    return os.open(path(name), os.O_RDONLY)
