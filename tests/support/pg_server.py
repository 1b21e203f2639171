"""A PostgreSQL server of a test's own, from Debian's binaries, that the test may restart,
stop and kill -9 (the machine's shared server on 5432 serves other tests: never touched).

Its data directory is a fresh one under /tmp, owned by the `postgres` user when the tests
run as root (initdb and the server refuse root). fsync is off: only the operating system
could lose what the server wrote, and the tests crash the server, not the machine. Commits
stay synchronous, so a commit the server acknowledged survives a kill -9.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from thorn.natsd import free_port

STEP_S = 60.0  # longest a start, stop or restart may take


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


class PgServer:
    """`with PgServer() as pg:` a running server on a free port; `pg.url(db)` for THORN."""

    def __init__(self) -> None:
        found = pg_bin()
        if found is None:
            raise RuntimeError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
        self.bin = found
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="thorn-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user = "postgres" if os.geteuid() == 0 else None

    def __enter__(self) -> PgServer:
        try:
            self._init()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    # --- what a test does to it -----------------------------------------------------------

    def start(self) -> None:
        self._ctl("start", "-w", "-t", str(int(STEP_S)), "-l", str(self.log))

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-w", "-t", str(int(STEP_S)), "-m", mode)

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: backends are told to end, the server comes back."""
        self._ctl("restart", "-w", "-t", str(int(STEP_S)), "-m", "fast", "-l", str(self.log))

    def kill_postmaster(self) -> None:
        """kill -9 of the postmaster alone, as a crash of it; its children notice it gone and
        exit (waited for: a new postmaster will not start beside them)."""
        pid = self.postmaster_pid()
        children = self._children(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STEP_S
        while any(_alive(p) for p in [pid, *children]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres children {children} outlived their postmaster")
            time.sleep(0.02)

    def accepting(self) -> bool:
        try:
            with psycopg.connect(self.conninfo(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, RuntimeError):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # --- inside ------------------------------------------------------------------------

    def _init(self) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-sync")  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "fsync = off\n"
                "full_page_writes = off\n"
                "max_connections = 200\n"
            )

    def _ctl(self, *args: str) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), *args)

    def _run(self, *argv: str) -> None:
        command = ["runuser", "-u", self._user, "--", *argv] if self._user else list(argv)
        done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_S + 30,
                              cwd=self.root)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr or done.stdout}"
                f"\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-10:])
        except OSError:
            return ""

    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # the field after the parenthesised name: state, then the parent's pid
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(stat.parent.name))
        return out


def _alive(pid: int) -> bool:
    """Until reaped: a new postmaster takes even a zombie's pid in its lock file as alive."""
    return Path(f"/proc/{pid}").exists()
