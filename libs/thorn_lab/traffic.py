"""Traffic generator and meter: one UDP (or RoCEv2-shaped) stream between two lab endpoints.

Each end's socket is made inside the endpoint's namespace (`netns.entered`, which moves
only the calling thread, and back) and stays in that namespace for its life. The two loops
then run as threads of one forked child process (`multiprocessing`, fork context): no
interpreter start-up as with `ip netns exec python -m ...` (~0.3 s), the sockets and the
parameters are simply inherited, and the child has its own GIL, so a caller that injects a
fault mid-stream cannot stall the sender. The sender runs in a process of its own, forked
from that child (`_ForkedSender`), so the receiver's per-packet Python never holds a GIL the
sender waits for. The sender asks for SCHED_FIFO and 1 us timer slack; arrivals are stamped
by the kernel (SO_TIMESTAMPNS), so the receiver may drain late without moving them. Measured
on a loaded 2-core machine: the longest gap of a clean 1000 pps stream was 1.1-1.7 ms with
this, up to 22 ms with in-process threads.

Every loop is bounded: the sender stops after `count` packets or `duration_s`, whichever
comes first; the receiver stops `linger_s` after the sender (or once all arrived), and in
any case at a hard deadline.

Endpoints: a workload name (its namespace and IP), a node name (its red TEP, else its
first port address), or ``NAME@ADDRESS`` for any address in that namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import math
import multiprocessing
import os
import pickle
import random
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from thorn import netns
from thorn.model import Colour
from thorn_lab.handle import Lab, UnknownName
from thorn_lab.meter import Meter, MeterResult
from thorn_lab.packets import ROCE_PORT, Kind, decode, encode_into, min_size

__all__ = [
    "Endpoint", "Stream", "StreamGroup", "StreamSpec", "TrafficReport", "resolve", "run",
    "start", "start_group",
]  # fmt: skip

SO_TIMESTAMPNS = 35  # asm-generic; SCM_TIMESTAMPNS has the same value
SO_RCVBUFFORCE = 33
PR_SET_TIMERSLACK = 29
PR_SET_PDEATHSIG = 1
SENDER_RT_PRIORITY = 10
RCVBUF = 8 << 20  # ~10 s of 1000 pps probes even if the receiver thread stalls
RECV_POLL_S = 0.05
# A group's receiver sleeps this long after each drain, so one wake-up reads ~2 ms of every
# flow (48 packets at 24 x 1 kHz) instead of one or two: measured at 24 flows, waking per
# arrival cost the meter ~40 % of a core in wake-ups alone, taken from the system under test.
RECV_BATCH_S = 0.002
RECEIVER_NICE = 10  # the receiver only counts (kernel stamps): it yields to what is measured
DEADLINE_MARGIN_S = 5.0
_TIMESPEC = struct.Struct("@qq")


class StreamSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    src: str = Field(description="workload, node, or NAME@ADDRESS")
    dst: str = Field(description="workload, node, or NAME@ADDRESS")
    kind: Kind = Kind.udp
    rate_pps: int = Field(default=1000, ge=1, le=200_000)
    count: int = Field(default=1000, ge=1, le=10_000_000)
    duration_s: float = Field(default=10.0, gt=0, le=3600)
    size: int = Field(default=64, le=1472, description="UDP payload bytes")
    port: int = Field(default=5000, ge=1, le=65535, description="UDP destination (udp kind)")
    src_port: int = Field(default=0, ge=0, le=65535, description="0: the kernel picks")
    qp: int = Field(default=0x11, ge=0, lt=1 << 24, description="RoCE destination QP")
    linger_s: float = Field(default=0.5, ge=0, le=30, description="wait after the last send")

    @model_validator(mode="after")
    def _check(self) -> StreamSpec:
        if self.size < min_size(self.kind):
            raise ValueError(f"size must be at least {min_size(self.kind)} for {self.kind}")
        return self

    @property
    def dst_port(self) -> int:
        return ROCE_PORT if self.kind == Kind.roce else self.port

    @property
    def packets(self) -> int:
        """What the sender will send: the count, unless the duration ends it first."""
        return min(self.count, max(1, math.floor(self.duration_s * self.rate_pps)))


class TrafficReport(BaseModel):
    """The meter's JSON: counts, and the longest silence between two arrivals."""

    spec: StreamSpec
    src_namespace: str
    dst_namespace: str
    src_ip: str
    dst_ip: str
    dst_port: int
    started_at: str
    start_psn: int | None
    sent: int
    send_errors: int
    received: int
    lost: int
    loss_pct: float
    reordered: int
    duplicates: int
    strays: int
    max_gap_ms: float
    max_gap_at: str | None = Field(description="arrival before the longest gap (UTC)")
    max_gap_offset_ms: float | None = Field(description="... in ms after the first send")
    max_gap_after_seq: int | None
    max_gap_before_seq: int | None
    max_loss_ms: float | None = Field(
        description="the longest loss period: from the send stamp of the packet before a run "
        "of lost packets to that of the packet after it (none if no run has both)"
    )
    max_loss_at: str | None = Field(description="send time of the packet before it (UTC)")
    max_loss_range: tuple[int, int] | None = Field(description="its lost numbers [first, last]")
    lost_ranges: list[tuple[int, int]] = Field(description="first 20 runs [first, last] lost")
    lost_ranges_total: int
    send_seconds: float
    send_rate_pps: float
    sender_realtime: bool = Field(description="the sender thread ran at SCHED_FIFO priority")


@dataclass(frozen=True)
class Endpoint:
    name: str
    namespace: str
    ip: str


def resolve(lab: Lab, text: str) -> Endpoint:
    """A workload, a node (red TEP, else first port address) or ``NAME@ADDRESS``."""
    name, _, address = text.partition("@")
    namespace = lab.namespace(name)  # UnknownName for anything else
    if address:
        return Endpoint(name, namespace, address)
    if name in {w.name for w in lab.plan.workloads}:
        return Endpoint(name, namespace, lab.workload(name).ip.split("/")[0])
    teps = {t.colour: t for t in lab.fabric.teps if t.node == name}
    if teps:
        tep = teps.get(Colour.red) or next(iter(teps.values()))
        return Endpoint(name, namespace, str(tep.address))
    for node in lab.fabric.nodes:
        if node.name == name:
            for port in node.ports:
                if port.address is not None:
                    return Endpoint(name, namespace, str(port.address.ip))
    raise UnknownName(f"'{name}' has no address to send from; use {name}@ADDRESS")


def _socket_in(endpoint: Endpoint) -> socket.socket:
    family = socket.AF_INET6 if ":" in endpoint.ip else socket.AF_INET
    with netns.entered(endpoint.namespace):
        return socket.socket(family, socket.SOCK_DGRAM)


def _sharpen_sleep() -> bool:
    """Make this thread wake on time: 1 us timer slack (default 50 us) and, where allowed,
    real-time priority (SCHED_FIFO), so a busy machine delays probes less. The loop it
    runs sleeps between sends and is bounded, and the kernel's RT throttling still leaves
    5 % of each CPU to others. Returns whether the thread got real-time priority."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(SENDER_RT_PRIORITY))
    except OSError:
        return False
    return True


@dataclass
class _Sent:
    """What a sender reports about one flow, from its own process."""

    sent: int = 0
    send_errors: int = 0
    started_ns: int = 0
    send_seconds: float = 0.0
    realtime: bool = False


class _ForkedSender:
    """`send` in a process of its own (os.fork: the stream's process is a daemon, which
    multiprocessing does not let have children). Two processes, two GILs: as threads of one
    process the sender waited for the receiver's GIL at every packet (measured at 24 flows:
    ~6 % of the machine in GIL hand-offs and task switches). Dies with its parent."""

    def __init__(self, send: Callable[[], list[_Sent]]) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the sender: report, then leave without running the parent's exit code
            status = 1
            try:
                os.close(read_end)
                gc.freeze()  # the heap forked from the caller: no collection walks it
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL
                data = pickle.dumps(send())
                with os.fdopen(write_end, "wb") as out:
                    out.write(data)
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid = pid
        self._read_end = read_end
        self.result: list[_Sent] | None = None

    def finished(self) -> bool:
        """Whether the sender is done (its report is then in `result`); never blocks."""
        if self.result is None and select.select([self._read_end], [], [], 0)[0]:
            self._collect()
        return self.result is not None

    def join(self) -> list[_Sent]:
        if self.result is None:
            self._collect()
        assert self.result is not None
        return self.result

    def _collect(self) -> None:
        chunks = []
        while chunk := os.read(self._read_end, 1 << 16):  # the sender wrote, then exited
            chunks.append(chunk)
        os.close(self._read_end)
        _, status = os.waitpid(self.pid, 0)
        if not chunks:
            raise RuntimeError(f"the traffic sender died (wait status {status})")
        self.result = pickle.loads(b"".join(chunks))


@dataclass
class _Outcome(_Sent):
    """What the stream's process reports back to the caller's `Stream.wait()`: the
    sender's account and the receiver's."""

    meter: MeterResult | None = None


class _Probe:
    """The sender and receiver loops; runs in the stream's own process (see `Stream`)."""

    def __init__(
        self,
        spec: StreamSpec,
        rx: socket.socket,
        tx: socket.socket,
        target: tuple[str, int],
        stream_id: int,
        start_psn: int | None,
        stop: threading.Event,
    ) -> None:
        self.spec = spec
        self.rx = rx
        self.tx = tx
        self.target = target
        self.stream_id = stream_id
        self.start_psn = start_psn
        self.stop = stop
        self.meter = Meter(spec.packets, start_psn=start_psn)

    def run(self) -> _Outcome:
        sender = _ForkedSender(self._send)
        self._receive(sender)
        return _outcome(sender.join()[0], self.meter)

    def _send(self) -> list[_Sent]:
        out = _Sent(realtime=_sharpen_sleep())
        spec = self.spec
        payload = bytearray(spec.size)
        interval = 1.0 / spec.rate_pps
        first = self.start_psn or 0
        begin = time.monotonic()
        stop_at = begin + spec.duration_s
        out.started_ns = time.time_ns()
        for k in range(spec.packets):
            due = begin + k * interval
            now = time.monotonic()
            if self.stop.is_set() or now > stop_at:
                break
            if due > now:
                time.sleep(due - now)
            encode_into(payload, spec.kind, self.stream_id, first + k, time.time_ns(), spec.qp)
            out.sent += 1
            try:
                self.tx.sendto(payload, self.target)
            except OSError:
                out.send_errors += 1  # no route, no neighbour: counted, then lost
        out.send_seconds = time.monotonic() - begin
        return [out]

    def _receive(self, sender: _ForkedSender) -> None:
        spec = self.spec
        hard_stop = time.monotonic() + spec.duration_s + spec.linger_s + DEADLINE_MARGIN_S
        linger_until: float | None = None
        space = socket.CMSG_SPACE(_TIMESPEC.size)
        while time.monotonic() < hard_stop:
            if sender.finished():
                assert sender.result is not None
                if linger_until is None:
                    linger_until = time.monotonic() + spec.linger_s
                if self.meter.received >= sender.result[0].sent:
                    break
                if time.monotonic() > linger_until:
                    break
            try:
                data, ancillary, _, _ = self.rx.recvmsg(2048, space)
            except TimeoutError:
                continue
            probe = decode(data, spec.kind)
            if probe is not None and probe.stream == self.stream_id:
                self.meter.observe(probe.seq, _arrival(ancillary), probe.sent_ns)
        self.rx.setblocking(False)  # what arrived while this process waited for the CPU
        _drain(self.rx, spec.kind, self.stream_id, self.meter)


def _drain(rx: socket.socket, kind: Kind, stream_id: int, meter: Meter) -> None:
    """Count every probe waiting on non-blocking `rx` (the kernel stamped each already)."""
    space = socket.CMSG_SPACE(_TIMESPEC.size)
    while True:
        try:
            data, ancillary, _, _ = rx.recvmsg(2048, space)
        except (BlockingIOError, InterruptedError):
            return
        probe = decode(data, kind)
        if probe is not None and probe.stream == stream_id:
            meter.observe(probe.seq, _arrival(ancillary), probe.sent_ns)


def _outcome(sent: _Sent, meter: Meter) -> _Outcome:
    return _Outcome(**dataclasses.asdict(sent), meter=meter.result(sent.sent))


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's arrival stamp (SO_TIMESTAMPNS), else now."""
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanos = _TIMESPEC.unpack_from(raw)
            return int(seconds * 1_000_000_000 + nanos)
    return time.time_ns()


def _stream_process(probe: _Probe | _GroupProbe, results: Connection) -> None:
    # The caller's heap came along with the fork: a full collection of it (tens of ms for
    # a benchmark's) would stop the receiver, and the sender forked from here.
    gc.freeze()
    try:
        results.send(probe.run())
    finally:
        results.close()


class Stream:
    """A running stream; `wait()` returns its report. Made by `start`.

    The sockets are made here, inside the endpoints' namespaces; the loops run in a forked
    child process with its own GIL, so the caller (a test injecting faults, say) cannot
    stall the sender by holding the GIL while the machine is busy.
    """

    def __init__(self, lab: Lab, spec: StreamSpec) -> None:
        self.spec = spec
        self.src = resolve(lab, spec.src)
        self.dst = resolve(lab, spec.dst)
        self.start_psn = random.randrange(1 << 24) if spec.kind == Kind.roce else None
        rx, tx = _socket_in(self.dst), _socket_in(self.src)
        with rx, tx:
            rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rx.bind((self.dst.ip, spec.dst_port))
            rx.settimeout(RECV_POLL_S)
            tx.bind((self.src.ip, spec.src_port))
            context = multiprocessing.get_context("fork")
            self._stop = context.Event()
            self._results, child_end = context.Pipe(duplex=False)
            probe = _Probe(
                spec,
                rx,
                tx,
                (self.dst.ip, spec.dst_port),
                random.getrandbits(32),
                self.start_psn,
                cast(threading.Event, self._stop),
            )
            self._process = context.Process(
                target=_stream_process, args=(probe, child_end), name="lab-traffic", daemon=True
            )
            self._process.start()
            child_end.close()
        # The child holds its own copies of the sockets; ours are closed by `with`.

    def stop(self) -> None:
        """End the stream early (the report covers what was sent until then)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> TrafficReport:
        spec = self.spec
        limit = spec.duration_s + spec.linger_s + 2 * DEADLINE_MARGIN_S
        got = _collect(self._results, self._process, self.stop,
                       limit if timeout is None else timeout)  # fmt: skip
        return self._report(got if isinstance(got, _Outcome) else _Outcome())

    def _report(self, o: _Outcome) -> TrafficReport:
        return _report(self.spec, self.src, self.dst, self.start_psn, o)


def _collect(
    results: Connection, process: BaseProcess, stop: Callable[[], None], timeout: float
) -> object:
    """What the stream process sends back (None if it died without a word), waiting at most
    `timeout`, then asking it to stop; the process is gone when this returns."""
    got: object = None
    try:
        if results.poll(timeout):
            got = results.recv()
        else:
            stop()
            if results.poll(DEADLINE_MARGIN_S):
                got = results.recv()
    except EOFError:
        pass  # the child died without a report: everything counts as lost
    finally:
        process.join(DEADLINE_MARGIN_S)
        if process.is_alive():
            process.kill()
            process.join()
        results.close()
    return got


def _report(
    spec: StreamSpec, src: Endpoint, dst: Endpoint, start_psn: int | None, o: _Outcome
) -> TrafficReport:
    m = o.meter or Meter(1).result(0)
    lost = max(0, o.sent - m.received)
    gap_at = gap_offset = None
    if m.max_gap_start_ns is not None:
        gap_at = _iso(m.max_gap_start_ns)
        gap_offset = round((m.max_gap_start_ns - o.started_ns) / 1e6, 3)
    return TrafficReport(
        spec=spec,
        src_namespace=src.namespace,
        dst_namespace=dst.namespace,
        src_ip=src.ip,
        dst_ip=dst.ip,
        dst_port=spec.dst_port,
        started_at=_iso(o.started_ns),
        start_psn=start_psn,
        sent=o.sent,
        send_errors=o.send_errors,
        received=m.received,
        lost=lost,
        loss_pct=round(100.0 * lost / o.sent, 3) if o.sent else 0.0,
        reordered=m.reordered,
        duplicates=m.duplicates,
        strays=m.strays,
        max_gap_ms=round(m.max_gap_ns / 1e6, 3),
        max_gap_at=gap_at,
        max_gap_offset_ms=gap_offset,
        max_gap_after_seq=m.max_gap_after_seq,
        max_gap_before_seq=m.max_gap_before_seq,
        max_loss_ms=None if m.max_loss_ns is None else round(m.max_loss_ns / 1e6, 3),
        max_loss_at=None if m.max_loss_start_ns is None else _iso(m.max_loss_start_ns),
        max_loss_range=m.max_loss_range,
        lost_ranges=m.lost_ranges,
        lost_ranges_total=m.lost_ranges_total,
        send_seconds=round(o.send_seconds, 3),
        send_rate_pps=round(o.sent / o.send_seconds, 1) if o.send_seconds else 0.0,
        sender_realtime=o.realtime,
    )


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="microseconds")


def start(lab: Lab, spec: StreamSpec) -> Stream:
    """Start a stream in the background; `Stream.wait()` returns the report."""
    return Stream(lab, spec)


def run(lab: Lab, spec: StreamSpec) -> TrafficReport:
    """Run a stream to its end and return the report."""
    return start(lab, spec).wait()


# --- many streams, one process ----------------------------------------------------------------


@dataclass
class _Flow:
    """One stream of a group, as its process sees it."""

    spec: StreamSpec
    rx: socket.socket
    tx: socket.socket
    target: tuple[str, int]
    stream_id: int
    start_psn: int | None
    meter: Meter


class _GroupProbe:
    """The loops of a `StreamGroup`: one sender sends every due packet of every flow per
    wake-up; one receiver drains every socket that has data, then sleeps `RECV_BATCH_S`.
    Arrival times are the kernel's stamps, so draining late does not move them."""

    def __init__(self, flows: list[_Flow], stop: threading.Event) -> None:
        self.flows = flows
        self.stop = stop

    def run(self) -> list[_Outcome]:
        sender = _ForkedSender(self._send)
        self._receive(sender)
        return [_outcome(sent, flow.meter) for sent, flow in zip(sender.join(), self.flows,
                                                                  strict=True)]  # fmt: skip

    def _send(self) -> list[_Sent]:
        realtime = _sharpen_sleep()
        begin = time.monotonic()
        started = time.time_ns()
        outs = [_Sent(realtime=realtime, started_ns=started) for _ in self.flows]
        payloads = [bytearray(f.spec.size) for f in self.flows]
        due = [begin] * len(self.flows)
        stop_at = [begin + f.spec.duration_s for f in self.flows]
        active = set(range(len(self.flows)))
        while active and not self.stop.is_set():
            now = time.monotonic()
            for i in sorted(active):
                flow, out = self.flows[i], outs[i]
                if out.sent >= flow.spec.packets or now > stop_at[i]:
                    active.discard(i)
                    out.send_seconds = now - begin
                    continue
                if due[i] > now:
                    continue
                seq = (flow.start_psn or 0) + out.sent
                encode_into(payloads[i], flow.spec.kind, flow.stream_id, seq, time.time_ns(),
                            flow.spec.qp)  # fmt: skip
                out.sent += 1
                due[i] = begin + out.sent / flow.spec.rate_pps
                try:
                    flow.tx.sendto(payloads[i], flow.target)
                except OSError:
                    out.send_errors += 1  # no route, no neighbour: then lost
            if active:
                wait = min(due[i] for i in active) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
        end = time.monotonic() - begin
        for out in outs:
            out.send_seconds = out.send_seconds or end
        return outs

    def _receive(self, sender: _ForkedSender) -> None:
        with contextlib.suppress(OSError):
            os.nice(RECEIVER_NICE)
        longest = max(f.spec.duration_s + f.spec.linger_s for f in self.flows)
        hard_stop = time.monotonic() + longest + DEADLINE_MARGIN_S
        linger = max(f.spec.linger_s for f in self.flows)
        linger_until: float | None = None
        with selectors.DefaultSelector() as selector:
            for flow in self.flows:
                flow.rx.setblocking(False)
                selector.register(flow.rx, selectors.EVENT_READ, flow)
            while time.monotonic() < hard_stop:
                if sender.finished():
                    assert sender.result is not None
                    if linger_until is None:
                        linger_until = time.monotonic() + linger
                    if all(f.meter.received >= s.sent
                           for f, s in zip(self.flows, sender.result, strict=True)):  # fmt: skip
                        break
                    if time.monotonic() > linger_until:
                        break
                ready = selector.select(RECV_POLL_S)
                for key, _ in ready:
                    flow = key.data
                    _drain(flow.rx, flow.spec.kind, flow.stream_id, flow.meter)
                if ready:
                    time.sleep(RECV_BATCH_S)
            for flow in self.flows:  # what arrived while this process waited for the CPU
                _drain(flow.rx, flow.spec.kind, flow.stream_id, flow.meter)


class StreamGroup:
    """Many streams sharing one child process, for benchmarks with dozens of flows on a
    small machine: 24 streams at 1 kHz cost one sender and one receiver wake-up per
    millisecond, not 24 of each (measured here: the per-stream processes of `Stream` took
    most of the machine at 24 flows and starved the controller under test). Each stream
    keeps its own sockets, meter and report; `wait()` returns the reports in spec order."""

    def __init__(self, lab: Lab, specs: list[StreamSpec]) -> None:
        if not specs:
            raise ValueError("a stream group needs at least one stream")
        self.specs = specs
        self.ends = [(resolve(lab, s.src), resolve(lab, s.dst)) for s in specs]
        flows: list[_Flow] = []
        sockets: list[socket.socket] = []
        try:
            for spec, (src, dst) in zip(specs, self.ends, strict=True):
                rx, tx = _socket_in(dst), _socket_in(src)
                sockets += [rx, tx]
                rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
                rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                rx.bind((dst.ip, spec.dst_port))
                tx.bind((src.ip, spec.src_port))
                psn = random.randrange(1 << 24) if spec.kind == Kind.roce else None
                flows.append(_Flow(spec, rx, tx, (dst.ip, spec.dst_port),
                                   random.getrandbits(32), psn,
                                   Meter(spec.packets, start_psn=psn)))  # fmt: skip
            self.start_psns = [f.start_psn for f in flows]
            context = multiprocessing.get_context("fork")
            self._stop = context.Event()
            self._results, child_end = context.Pipe(duplex=False)
            probe = _GroupProbe(flows, cast(threading.Event, self._stop))
            self._process = context.Process(target=_stream_process, args=(probe, child_end),
                                            name="lab-traffic-group", daemon=True)  # fmt: skip
            self._process.start()
            child_end.close()
        finally:
            for sock in sockets:  # the child holds its own copies
                sock.close()

    def stop(self) -> None:
        """End every stream now (the reports cover what was sent until then)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> list[TrafficReport]:
        limit = max(s.duration_s + s.linger_s for s in self.specs) + 2 * DEADLINE_MARGIN_S
        got = _collect(self._results, self._process, self.stop,
                       limit if timeout is None else timeout)  # fmt: skip
        outcomes = got if isinstance(got, list) else [_Outcome() for _ in self.specs]
        return [_report(spec, src, dst, psn, o) for spec, (src, dst), psn, o
                in zip(self.specs, self.ends, self.start_psns, outcomes, strict=True)]  # fmt: skip


def start_group(lab: Lab, specs: list[StreamSpec]) -> StreamGroup:
    """Start `specs` together in one process; `StreamGroup.wait()` returns their reports."""
    return StreamGroup(lab, specs)
