"""The RC probe over verbs: one reliable-connected QP per end, connected out of band over TCP.

    server (DST)                                   client (SRC)
    listen on TCP                     <-  {"settings": ..., "qp": client's QpInfo}
    QP, MR; post receives (pingpong)
    {"qp": server's QpInfo}           ->  both QPs INIT -> RTR -> RTS
                                          stream: RDMA WRITE x count, `window` in flight
                                          pingpong: SEND, wait for the echo, x count
    (pingpong: echo every SEND)
    exit                              <-  {"done": true}

The client's QP carries the settings' timeout and retry count (NCCL_IB_TIMEOUT,
NCCL_IB_RETRY_CNT); its completions are stamped on the monotonic clock as they are polled.
Polling sleeps 0.5 ms when the CQ is empty, so a probe never takes a whole CPU from the
agents and BFD sharing the machine (the stall it measures is tens of ms and more).

`python -m thorn.rdma.rc serve --address IP --port N` runs a server end (thornctl starts
one for a probe between two local workloads).
"""

from __future__ import annotations

import argparse
import json
import random
import select
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from thorn.rdma.probe import ProbeMode, ProbeResult, ProbeSettings, QpInfo, wc_status_name
from thorn.rdma.verbs import RdmaUnavailable, RoceEndpoint, load, roce_endpoint

__all__ = ["ProbeError", "run_client", "serve"]

POLL_IDLE_S = 0.0005
CONNECT_TIMEOUT_S = 30.0
HOP_LIMIT = 64
RNR_RETRY = 7  # "infinite": a receiver short of buffers is not what the probe measures
MIN_RNR_TIMER = 12  # 0.64 ms
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}  # enum ibv_mtu
Progress = Callable[[int, int], None]  # (completed, count)
Stage = Callable[[str], None]  # a step of the set-up done, for the person waiting


class ProbeError(RuntimeError):
    """The probe could not run (as opposed to a run whose completions failed)."""


class _Qp:
    """One end's verbs objects: context, PD, CQ, an RC QP and a registered buffer."""

    def __init__(self, endpoint: RoceEndpoint, settings: ProbeSettings) -> None:
        v = load()
        e = v.enums
        self.v, self.endpoint, self.settings = v, endpoint, settings
        depth = settings.window + 2
        self.context = v.device.Context(name=endpoint.device)
        self.pd = v.pd.PD(self.context)
        self.cq = v.cq.CQ(self.context, 2 * depth)
        cap = v.qp.QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = v.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                               sq_sig_all=1)  # fmt: skip
        self.qp = v.qp.QP(self.pd, init)
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.mr = v.mr.MR(self.pd, settings.size, access)
        self.psn = random.randrange(1 << 24)

    def info(self) -> QpInfo:
        return QpInfo(qpn=self.qp.qp_num, psn=self.psn, gid=self.endpoint.gid,
                      addr=self.mr.buf, rkey=self.mr.rkey)  # fmt: skip

    def connect(self, remote: QpInfo) -> None:
        """RESET -> INIT -> RTR -> RTS toward `remote`."""
        v, e, s = self.v, self.v.enums, self.settings
        attr = v.qp.QPAttr()
        attr.port_num = self.endpoint.port
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        attr.path_mtu = MTU_ENUM[s.mtu]
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = MIN_RNR_TIMER
        route = v.addr.GlobalRoute(dgid=v.addr.GID(remote.gid), sgid_index=self.endpoint.gid_index)
        route.hop_limit = HOP_LIMIT
        attr.ah_attr = v.addr.AHAttr(gr=route, is_global=1, port_num=self.endpoint.port)
        attr.sq_psn = self.psn
        attr.timeout = s.timeout
        attr.retry_cnt = s.retry
        attr.rnr_retry = RNR_RETRY
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def sge(self) -> Any:
        return self.v.wr.SGE(self.mr.buf, self.settings.size, self.mr.lkey)

    def post_recv(self, wr_id: int) -> None:
        self.qp.post_recv(self.v.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[self.sge()]))

    def post_send(self, wr_id: int, remote: QpInfo | None = None) -> None:
        """A SEND, or an RDMA WRITE into `remote`'s buffer."""
        e = self.v.enums
        opcode = e.IBV_WR_RDMA_WRITE if remote is not None else e.IBV_WR_SEND
        wr = self.v.wr.SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[self.sge()],
                              send_flags=e.IBV_SEND_SIGNALED)  # fmt: skip
        if remote is not None:
            wr.set_wr_rdma(remote.rkey, remote.addr)
        self.qp.post_send(wr)

    def poll(self, most: int) -> list[Any]:
        _, completions = self.cq.poll(most)
        return list(completions)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.context):
            obj.close()


# --- out of band: one JSON object per line over TCP -----------------------------------------


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _receive(stream: Any) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise ProbeError("the other end closed the out-of-band connection")
    message: dict[str, Any] = json.loads(line)
    if "error" in message:
        raise ProbeError(f"the server end: {message['error']}")
    return message


# --- server ---------------------------------------------------------------------------------


def serve(address: str, listener: socket.socket, ready: Callable[[], None] | None = None) -> None:
    """Serve one probe on `listener` as the end that owns `address`; returns when done."""
    if ready is not None:
        ready()
    listener.settimeout(CONNECT_TIMEOUT_S)
    conn, _ = listener.accept()
    with conn, conn.makefile("r") as stream:
        conn.settimeout(None)
        hello = _receive(stream)
        settings = ProbeSettings.model_validate(hello["settings"])
        try:
            end = _Qp(roce_endpoint(address), settings)
        except Exception as exc:  # told to the client, which reports it; then raised
            _send(conn, {"error": f"{type(exc).__name__}: {exc}"})
            raise
        try:
            try:
                end.connect(QpInfo.model_validate(hello["qp"]))
                if settings.mode is ProbeMode.pingpong:  # a QP takes receives from INIT on
                    for wr_id in range(settings.window):
                        end.post_recv(wr_id)
            except Exception as exc:
                _send(conn, {"error": f"connecting the QP: {type(exc).__name__}: {exc}"})
                raise
            _send(conn, {"qp": end.info().model_dump()})
            deadline = time.monotonic() + settings.deadline_s + CONNECT_TIMEOUT_S
            _echo_until_done(end, conn, settings, deadline)
        finally:
            end.close()


def _echo_until_done(end: _Qp, conn: socket.socket, s: ProbeSettings, deadline: float) -> None:
    """Pingpong: answer every SEND with one; either mode: until the client says done."""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([conn], [], [], 0 if s.mode is ProbeMode.pingpong else 0.2)
        if readable:
            return  # {"done": true}, or the client went away: either way, the end
        if s.mode is not ProbeMode.pingpong:
            continue
        got = end.poll(s.window)
        if not got:
            time.sleep(POLL_IDLE_S)
        for wc in got:
            if wc.status != 0:
                return  # the QP is in error: the client sees its own completions fail
            if wc.opcode == end.v.enums.IBV_WC_RECV:
                end.post_recv(wc.wr_id)
                end.post_send(wc.wr_id)


# --- client ---------------------------------------------------------------------------------


def run_client(
    src: str,
    dst: str,
    server: tuple[str, int],
    settings: ProbeSettings,
    progress: Progress | None = None,
    stage: Stage | None = None,
) -> ProbeResult:
    """Probe from the local end that owns address `src` to the server end of `dst`."""
    said = stage or (lambda _: None)
    endpoint = roce_endpoint(src)
    said(f"{src} sends from {endpoint.device} port {endpoint.port}, GID index "
         f"{endpoint.gid_index}")  # fmt: skip
    try:
        end = _Qp(endpoint, settings)
    except load().error as exc:
        raise ProbeError(f"verbs: {exc}") from None
    try:
        with (
            socket.create_connection(server, timeout=CONNECT_TIMEOUT_S) as conn,
            conn.makefile("r") as stream,
        ):
            _send(conn, {"settings": settings.model_dump(mode="json"),
                         "qp": end.info().model_dump()})  # fmt: skip
            remote = QpInfo.model_validate(_receive(stream)["qp"])
            end.connect(remote)
            said(f"QP {end.qp.qp_num} connected to {dst}'s QP {remote.qpn}")
            if settings.mode is ProbeMode.pingpong:  # before the first SEND: its echo lands here
                end.post_recv(0)
            result = ProbeResult(src=src, dst=dst, device=endpoint.device,
                                 gid_index=endpoint.gid_index, settings=settings,
                                 started_monotonic=time.monotonic(), posted=0,
                                 completions_ms=[])  # fmt: skip
            if settings.mode is ProbeMode.stream:
                _stream(end, remote, result, progress)
            else:
                _pingpong(end, result, progress)
            _send(conn, {"done": True})
    except OSError as exc:
        raise ProbeError(f"out-of-band connection to {server[0]}:{server[1]}: {exc}") from None
    except load().error as exc:  # a verbs call refused: the device, the QP or a WR
        raise ProbeError(f"verbs: {exc}") from None
    finally:
        end.close()
    return result


def _record(result: ProbeResult, wc: Any, now: float) -> bool:
    """Note one completion; False if it is an error (the QP is then in the error state)."""
    at = round((now - result.started_monotonic) * 1000, 3)
    if wc.status == 0:
        result.completions_ms.append(at)
        return True
    name = wc_status_name(wc.status)
    result.errors[name] = result.errors.get(name, 0) + 1
    if result.first_error is None:
        result.first_error, result.first_error_ms = name, at
    return False


def _stream(end: _Qp, remote: QpInfo, result: ProbeResult, progress: Progress | None) -> None:
    s = result.settings
    deadline = result.started_monotonic + s.deadline_s
    finished = 0  # completions, successful or not
    failed = False
    while finished < s.count:
        while not failed and result.posted < s.count and result.posted - finished < s.window:
            end.post_send(result.posted, remote)
            result.posted += 1
        got = end.poll(s.window)
        now = time.monotonic()
        for wc in got:
            failed = not _record(result, wc, now) or failed
        finished += len(got)
        if progress is not None and got:
            progress(result.completed, s.count)
        if failed and finished >= result.posted:
            break  # every posted write has come back (the rest flushed); nothing more goes
        if not got:
            if now > deadline:
                result.timed_out = True
                break
            time.sleep(POLL_IDLE_S)
    result.duration_ms = round((time.monotonic() - result.started_monotonic) * 1000, 3)


def _pingpong(end: _Qp, result: ProbeResult, progress: Progress | None) -> None:
    s = result.settings
    deadline = result.started_monotonic + s.deadline_s
    e = end.v.enums
    for i in range(s.count):
        sent_at = time.monotonic()
        end.post_send(i)
        result.posted += 1
        waiting = {e.IBV_WC_SEND, e.IBV_WC_RECV}
        while waiting:
            got = end.poll(2)
            now = time.monotonic()
            for wc in got:
                if wc.status != 0:
                    _record(result, wc, now)
                    result.duration_ms = round((now - result.started_monotonic) * 1000, 3)
                    return
                waiting.discard(wc.opcode)
                if wc.opcode == e.IBV_WC_RECV:
                    _record(result, wc, now)
                    result.rtt_us.append(round((now - sent_at) * 1e6, 1))
                    end.post_recv(0)
            if not got:
                if now > deadline:
                    result.timed_out = True
                    result.duration_ms = round((now - result.started_monotonic) * 1000, 3)
                    return
                time.sleep(POLL_IDLE_S)
        if progress is not None:
            progress(result.completed, s.count)
    result.duration_ms = round((time.monotonic() - result.started_monotonic) * 1000, 3)


# --- the server as a process ----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thorn.rdma.rc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve one probe as the end that owns --address")
    srv.add_argument("--address", required=True, help="the IP whose RoCE GID this end uses")
    srv.add_argument("--listen", default="127.0.0.1", help="TCP address for the exchange")
    srv.add_argument("--port", type=int, default=0, help="TCP port (0: any; printed)")
    args = parser.parse_args(argv)
    try:
        roce_endpoint(args.address)  # refuse before listening: the client hears it at once
    except RdmaUnavailable as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    with socket.create_server((args.listen, args.port)) as listener:
        port = listener.getsockname()[1]
        try:
            serve(args.address, listener,
                  lambda: print(json.dumps({"listening": port}), flush=True))  # fmt: skip
        except (ProbeError, RdmaUnavailable, OSError) as exc:
            print(json.dumps({"error": str(exc)}), file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
