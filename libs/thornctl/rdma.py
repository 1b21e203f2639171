"""`thornctl rdma`: an RC queue pair between two workloads' RDMA devices, measured.

Commands
    probe SRC DST   stream RDMA WRITEs (or ping-pong SENDs) from SRC to DST over one RC QP
                    with NCCL's QP settings (--timeout = NCCL_IB_TIMEOUT, --retry =
                    NCCL_IB_RETRY_CNT) and report throughput, the longest stall and every
                    completion error (IBV_WC_RETRY_EXC_ERR: the retries ran out)
    serve DST       the DST end for a probe started on another machine (--server there)

SRC and DST are workload names (their IPs come from the topology API) or IP addresses. The
end of each is the local RDMA device port whose RoCE v2 GID is that IP, found through
pyverbs. Without --server, `probe` starts DST's end itself, on this machine (a lab, or two
VFs of one host). Exit codes: 0 the probe completed cleanly, 1 it did not (an error
completion, or the deadline) or the API refused a name, 69 RDMA is unavailable here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Protocol, cast
from urllib.parse import quote

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from thorn.rdma.probe import ProbeResult, ProbeSettings, rc_timeout_ms
from thorn.rdma.rc import ProbeError
from thornctl.errors import CliError, ExitCode
from thornctl.render import Out, OutputFormat

if TYPE_CHECKING:
    from thornctl.client import Client

__all__ = ["rdma_app"]

rdma_app = typer.Typer(
    help="RDMA between workloads: an RC probe with NCCL's QP settings.", no_args_is_help=True
)
SERVER_START_S = 120.0  # a fresh Python loading pyverbs; minutes under emulation


class _Session(Protocol):
    out: Out

    @property
    def client(self) -> Client: ...


def _session(ctx: typer.Context) -> _Session | None:
    return cast("_Session | None", ctx.obj)


def _address(ctx: typer.Context, name: str, what: str) -> str:
    """An IP as given, or the workload's IP from the topology API."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(name))
    session = _session(ctx)
    if session is None:
        raise CliError(f"{what} '{name}' is not an IP address and there is no API session")
    workload = session.client.get(f"/workloads/{quote(name, safe='')}")
    return str(workload["ip"])


def _settings(**values: object) -> ProbeSettings:
    try:
        return ProbeSettings.model_validate(values)
    except (ValidationError, ValueError) as exc:
        raise CliError(f"bad probe setting: {_first_error(exc)}", ExitCode.USAGE) from None


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"--{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return str(exc)


@contextlib.contextmanager
def _local_server(address: str) -> Iterator[tuple[str, int]]:
    """DST's end as a child process on this machine; its TCP port for the exchange."""
    child = subprocess.Popen(
        [sys.executable, "-m", "thorn.rdma.rc", "serve", "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        # Its first line: listening, or why not (bounded: a wedged child must not hang us).
        ready, _, _ = select.select([child.stdout], [], [], SERVER_START_S)
        line = child.stdout.readline() if ready else ""
        try:
            said = json.loads(line) if line else {}
        except json.JSONDecodeError:
            said = {}
        if "listening" not in said:
            child.kill()
            reason = said.get("error") or (child.stderr.read() if child.stderr else "").strip()
            raise _unavailable(
                str(reason or f"the server end did not start within {SERVER_START_S:g} s")
            )
        try:
            yield "127.0.0.1", int(said["listening"])
        except ProbeError as exc:
            child.kill()
            _, err = child.communicate()
            last = " | ".join(err.strip().splitlines()[-3:])
            raise ProbeError(f"{exc} (the server end: {last or 'no output'})") from None
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=SERVER_START_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _unavailable(reason: str) -> CliError:
    return CliError(f"RDMA unavailable: {reason}", ExitCode.UNAVAILABLE)


def _server(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"--server: expected HOST:PORT, got '{value}'", ExitCode.USAGE)
    return host, int(port)


@rdma_app.command()
def probe(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(help="Workload name or IP: the sending end (local).")],
    dst: Annotated[str, typer.Argument(help="Workload name or IP: the receiving end.")],
    mode: Annotated[str, typer.Option(help="stream (RDMA WRITE) or pingpong (SEND).")] = "stream",
    size: Annotated[int, typer.Option(help="Bytes per message.")] = 65536,
    count: Annotated[int, typer.Option("--count", "-n", help="Messages.")] = 300,
    window: Annotated[int, typer.Option(help="Stream: writes in flight.")] = 8,
    timeout: Annotated[int, typer.Option(help="QP timeout exponent (NCCL_IB_TIMEOUT).")] = 14,
    retry: Annotated[int, typer.Option(help="QP retry count (NCCL_IB_RETRY_CNT).")] = 7,
    deadline: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 120.0,
    server: Annotated[
        str | None, typer.Option(help="HOST:PORT of a `thornctl rdma serve` elsewhere.")
    ] = None,
) -> None:
    """Run an RC probe from SRC to DST and report throughput, the stall and errors."""
    from thorn.rdma.rc import run_client
    from thorn.rdma.verbs import RdmaUnavailable

    session = _session(ctx)
    out = session.out if session is not None else Out(OutputFormat.table)
    settings = _settings(mode=mode, size=size, count=count, window=window, timeout=timeout,
                         retry=retry, deadline_s=deadline)  # fmt: skip
    src_ip, dst_ip = _address(ctx, src, "SRC"), _address(ctx, dst, "DST")
    started = time.monotonic()

    def stage(what: str) -> None:  # on stderr: where a slow start spends its time
        out.note(f"[{time.monotonic() - started:6.1f} s] {what}")

    try:
        with (
            contextlib.nullcontext(_server(server)) if server else _local_server(dst_ip) as where,
            _progress(out, settings.count) as progress,
        ):
            stage(f"{dst}'s end listens on {where[0]}:{where[1]}")
            result = run_client(src_ip, dst_ip, where, settings, progress, stage)
    except RdmaUnavailable as exc:
        raise _unavailable(str(exc)) from None
    except ProbeError as exc:
        raise CliError(f"the probe could not run: {exc}", ExitCode.UNAVAILABLE) from None
    if not out.data(result.model_dump(mode="json")):
        _show(out, src, dst, result)
    if not result.ok:
        raise typer.Exit(1)


@contextlib.contextmanager
def _progress(out: Out, count: int) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar of completions on a terminal; nothing otherwise."""
    if not out.stderr_is_terminal:
        yield None
        return
    with Progress(TextColumn("completions"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out.err, transient=True) as bar:  # fmt: skip
        task = bar.add_task("probe", total=count)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _show(out: Out, src: str, dst: str, r: ProbeResult) -> None:
    s = r.settings
    rows: list[tuple[str, object]] = [
        ("device", f"{r.device} (GID index {r.gid_index})"),
        ("QP", f"RC, timeout {s.timeout} ({rc_timeout_ms(s.timeout):.1f} ms), retry {s.retry} "
               f"(gives up after {s.retry_budget_ms:.0f} ms unacknowledged)"),
        ("completed", f"{r.completed} of {s.count} x {s.size} B in {r.duration_ms:.0f} ms"),
        ("throughput", f"{r.mb_s:g} MB/s"),
        ("longest stall", f"{r.stall_ms:g} ms, from {r.stall_at_ms:g} ms"),
        ("errors", ", ".join(f"{k} x{v}" for k, v in r.errors.items()) or "none"),
    ]  # fmt: skip
    if r.rtt_us:
        rows.append(("round trip", f"p50 {r.rtt_percentile(0.5)} us, p99 "
                                   f"{r.rtt_percentile(0.99)} us"))  # fmt: skip
    if r.timed_out:
        rows.append(("deadline", f"reached after {s.deadline_s:g} s: the transfer stalled"))
    verdict = "completed" if r.ok else "FAILED"
    out.fields(rows, title=f"RC probe {src} -> {dst}: {verdict}")


@rdma_app.command()
def serve(
    ctx: typer.Context,
    dst: Annotated[str, typer.Argument(help="Workload name or IP: the local receiving end.")],
    listen: Annotated[str, typer.Option(help="TCP address for the exchange.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="TCP port for the exchange.")] = 18516,
) -> None:
    """Serve one probe as DST's end (for a `probe --server` from another machine)."""
    import socket

    from thorn.rdma.rc import serve as serve_probe
    from thorn.rdma.verbs import RdmaUnavailable, roce_endpoint

    session = _session(ctx)
    out = session.out if session is not None else Out(OutputFormat.table)
    address = _address(ctx, dst, "DST")
    try:
        endpoint = roce_endpoint(address)
        with socket.create_server((listen, port)) as listener:
            ready = f"serving {dst} on {endpoint.device} for one probe: --server HOST:{port}"
            serve_probe(address, listener, lambda: out.line(ready))
    except RdmaUnavailable as exc:
        raise _unavailable(str(exc)) from None
    except (ProbeError, OSError) as exc:
        raise CliError(f"serve: {exc}", ExitCode.UNAVAILABLE) from None
