"""What a running `thorn-run` started, read from /proc: its children, their command lines,
the port each service listens on (its THORN_LISTEN)."""

from __future__ import annotations

from pathlib import Path


def children_of(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def listen_port(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    listen = next(v for v in environ if v.startswith(b"THORN_LISTEN="))
    return int(listen.rsplit(b":", 1)[1])


def child_on_port(launcher_pid: int, port: int) -> int | None:
    """The launcher's child that listens on `port` (a service), if it is running."""
    for pid in children_of(launcher_pid):
        try:
            if listen_port(pid) == port:
                return pid
        except (OSError, StopIteration):
            continue  # gone meanwhile, or nats-server (no THORN_LISTEN)
    return None
