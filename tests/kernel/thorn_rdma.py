"""RoCE across a lab fabric in the guest, carried by THORN itself or by a static path.

The fabric is `leaf_spine(2, 2, 1)`: host1 on leaf1, host2 on leaf2, two spines, so red and
blue cross distinct switches. With THORN, `thorn-run` (what `make run` starts: nats-server,
topology, health, pathcomp and the programmer for every lab node, with real BFD) runs in
the guest on this fabric; the programmer finds flower and tunnel_key in Debian's kernel and
programs the hosts with the flower driver, the switches with routes. Without THORN the same
lab carries the same overlay over one static path per destination (`baselines.Static`).

Soft-RoCE on Debian's 6.1 only works on root-namespace netdevs, so once the lab is up the two
workloads' VFs move from their namespaces into the guest's root namespace, as `vfA` and
`vfB` (MAC and IP kept; their representors stay on the hosts), with the policy routing of
`roce.root_namespace_endpoints` and an rxe device each.

The RC traffic is `thornctl rdma probe` (pyverbs): 6,000 RDMA WRITEs of 1 KiB, 16 in flight,
with NCCL-like QP settings (timeout 14: 67 ms per retry, retry 7). A failure is injected with
the lab's own faults (`thorn_lab.faults`) on the leaf1 uplink that carries the transfer,
found from the uplinks' counters mid-transfer.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from netlab import Batch, Workload, ip, tx_packets, wait_oper_up
from roce import root_namespace_endpoints

from thorn.generators import leaf_spine
from thorn.model import FabricDocument
from thorn.rdma.probe import ProbeResult, ProbeSettings
from thorn_lab.handle import Lab

FABRIC: FabricDocument = leaf_spine(2, 2, 1)
SRC, DST = "host1-vf0", "host2-vf0"  # host1 (leaf1) -> host2 (leaf2)
ROOT_NAME = {SRC: "A", DST: "B"}
SOURCE_LEAF = "leaf1"
# What NCCL_IB_TIMEOUT=14, NCCL_IB_RETRY_CNT=7 give a job's QPs: 67 ms per retry, and the QP
# fails once 8 timeouts pass without an acknowledgement (537 ms). One packet per write (rxe's
# path MTU here is 1 KiB): with 64 KiB writes, rxe on 6.1 once ended a transfer THORN had
# already moved with IBV_WC_REM_INV_REQ_ERR (its responder's opcode-sequence check), not
# retry exhaustion, while a plain 150 ms loss burst on one path is survived at either size.
TRANSFER = ProbeSettings(size=1024, count=6000, window=16, timeout=14, retry=7, deadline_s=60)
PACKETS = TRANSFER.count * TRANSFER.size // 1024  # rxe's path MTU on a 1500 netdev: 1 KiB
CUT_AFTER_PACKETS = PACKETS // 5  # well inside the transfer, whatever the guest's speed
THORNCTL = str(Path(sys.executable).with_name("thornctl"))
# From the probe's start to a fifth of the transfer sent: two Pythons loading pyverbs, the
# API's answer and the QP set-up, under emulation beside a running THORN (its stage lines on
# stderr say where the time went when it runs out).
START_BOUND_S = 300.0
MARKER = "@@bench-roce "  # one line per cut in the lane's log, read by tests/bench/bench_roce.py


def root_workloads(lab: Lab) -> tuple[Workload, Workload]:
    """Move SRC's and DST's VFs into the guest's root namespace as vfA and vfB."""
    moved: list[Workload] = []
    for plan in (w for name in (SRC, DST) for w in lab.plan.workloads if w.name == name):
        short = ROOT_NAME[plan.name]
        dev = f"vf{short}"
        batch = Batch()
        batch.ip(plan.namespace, f"link set dev {plan.vf} down")
        batch.ip(plan.namespace, f"link set dev {plan.vf} name {dev}")
        batch.ip(plan.namespace, f"link set dev {dev} netns 1")  # pid 1: the root namespace
        batch.run()
        address = plan.ip.split("/")[0]
        ip(None, f"address add {address}/32 dev {dev}")
        ip(None, f"link set dev {dev} up")
        moved.append(Workload(short, None, dev, address, plan.mac))
    wait_oper_up(None, [w.dev for w in moved])
    return moved[0], moved[1]


@dataclass(frozen=True)
class RdmaEnds:
    a: Workload
    b: Workload
    rxe: dict[str, str]


@contextlib.contextmanager
def rdma_ends(lab: Lab) -> Iterator[RdmaEnds]:
    """SRC and DST as root-namespace RDMA endpoints of `lab`; deleted after."""
    a, b = root_workloads(lab)
    with root_namespace_endpoints(a, b) as (rxe, _):
        yield RdmaEnds(a, b, rxe)


def uplink_counters(lab: Lab, leaf: str) -> dict[str, int]:
    """Packets sent so far on each of `leaf`'s ports toward a spine (port -> count)."""
    ns = lab.namespaces()[leaf]
    spines = {n.name for n in FABRIC.nodes if n.name.startswith("spine")}
    out: dict[str, int] = {}
    for link in FABRIC.links:
        for near, far in ((link.a, link.b), (link.b, link.a)):
            if near.node == leaf and far.node in spines:
                out[near.port] = tx_packets(ns, lab.plan.ports[leaf][near.port])
    return out


@dataclass
class Probe:
    """`thornctl rdma probe` running (it starts the DST end itself)."""

    proc: subprocess.Popen[str]

    stderr: str = ""

    def result(self, timeout_s: float) -> ProbeResult:
        out, err = self.proc.communicate(timeout=timeout_s)
        self.stderr = err
        if not out.strip():
            raise AssertionError(f"thornctl rdma probe printed no result (exit "
                                 f"{self.proc.returncode}): {err}")  # fmt: skip
        return ProbeResult.model_validate(json.loads(out))


@contextlib.contextmanager
def probe(
    src: str, dst: str, api: tuple[str, str] | None = None, deadline_s: float = TRANSFER.deadline_s
) -> Iterator[Probe]:
    """Start the probe SRC -> DST (names through the API at `api` = (url, token), or IPs)."""
    s = TRANSFER
    args = [THORNCTL, "-o", "json"]
    if api is not None:
        args += ["--url", api[0], "--token", api[1]]
    args += ["rdma", "probe", src, dst, "--size", str(s.size), "--count", str(s.count),
             "--window", str(s.window), "--timeout", str(s.timeout), "--retry", str(s.retry),
             "--deadline", str(deadline_s)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield Probe(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@dataclass(frozen=True)
class Cut:
    result: ProbeResult
    port: str  # the leaf1 port whose link was cut
    at_ms: float  # when the injection began, on the probe's clock (ms from its first post)
    until_ms: float  # when it returned: the fault took hold in between
    load: str = ""  # the guest's CPU and rxeA's counters over the transfer, for the log
    probe_log: str = ""  # the probe's stage lines (stderr)


def _rxe_counters(device: str) -> dict[str, int]:
    """rxe's own counters (retries, sequence errors, duplicates...): why a transfer stalled."""
    folder = Path(f"/sys/class/infiniband/{device}/ports/1/hw_counters")
    out: dict[str, int] = {}
    for path in folder.glob("*") if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            out[path.name] = int(path.read_text())
    return out


CpuSample = tuple[int, int, dict[int, tuple[str, int]]]


def _cpu() -> CpuSample:
    """Busy and total jiffies of the guest, and each process's name and jiffies."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    per: dict[int, tuple[str, int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            rest = text[text.rindex(")") + 2 :].split()
            args = (stat.parent / "cmdline").read_bytes().split(b"\0")
            # A Python program by its script's name (thorn-health, thornctl...), else its own.
            script = args[1] if args[0].endswith(b"python3") and len(args) > 1 else args[0]
            name = Path(script.decode()).name or text[text.index("(") + 1 : text.rindex(")")]
            per[int(stat.parent.name)] = (name, int(rest[11]) + int(rest[12]))
    return sum(fields) - fields[3] - fields[4], sum(fields), per


def _load(cpu0: CpuSample, rxe0: dict[str, int], device: str) -> str:
    busy1, total1, per1 = _cpu()
    ticks = max(total1 - cpu0[1], 1)
    used: dict[str, int] = {}
    for pid, (name, jiffies) in per1.items():
        used[name] = used.get(name, 0) + jiffies - cpu0[2].get(pid, (name, 0))[1]
    top = sorted(((t, n) for n, t in used.items() if t > 0), reverse=True)[:6]
    cpus = ", ".join(f"{n} {100 * t / ticks:.0f}%" for t, n in top)
    rxe1 = _rxe_counters(device)
    moved = {k: rxe1[k] - rxe0.get(k, 0) for k in rxe1 if rxe1[k] != rxe0.get(k, 0)}
    return (f"guest CPU {100 * (busy1 - cpu0[0]) / ticks:.0f}% busy (of all CPUs: {cpus}); "
            f"{device} counters {moved}")  # fmt: skip


def cut_mid_transfer(
    lab: Lab,
    ends: RdmaEnds,
    inject: Callable[[str], object],
    api: tuple[str, str] | None = None,
    names: tuple[str, str] = (SRC, DST),
    deadline_s: float = TRANSFER.deadline_s,
) -> Cut:
    """Run the probe, and once a fifth of it has left vfA, `inject` a failure on the leaf1
    uplink that carries it (`inject("leaf1:PORT")`); the probe's result and the cut. The
    transfer gives up after `deadline_s`."""
    before = uplink_counters(lab, SOURCE_LEAF)
    sent = tx_packets(None, ends.a.dev)
    cpu0, rxe0 = _cpu(), _rxe_counters(ends.rxe["A"])
    with probe(*names, api=api, deadline_s=deadline_s) as running:
        deadline = time.monotonic() + START_BOUND_S
        while tx_packets(None, ends.a.dev) - sent < CUT_AFTER_PACKETS:
            if running.proc.poll() is not None:
                raise AssertionError(f"the probe ended early: {running.proc.communicate()}")
            if time.monotonic() > deadline:
                running.proc.kill()
                out, err = running.proc.communicate()
                raise AssertionError(f"the transfer did not start: {out[-500:]} {err[-2000:]}")
            time.sleep(0.005)
        now = uplink_counters(lab, SOURCE_LEAF)
        port = max(now, key=lambda p: now[p] - before[p])
        cut_at = time.monotonic()
        inject(f"{SOURCE_LEAF}:{port}")
        cut_done = time.monotonic()
        result = running.result(timeout_s=deadline_s + 60)
        load = _load(cpu0, rxe0, ends.rxe["A"])
    at_ms, until_ms = (round((t - result.started_monotonic) * 1000, 3) for t in (cut_at, cut_done))
    return Cut(result, port, at_ms, until_ms, load, running.stderr.strip())


def describe(cut: Cut) -> str:
    """One line for the log: what the transfer did around the cut."""
    r = cut.result
    before, during, after = r.around(cut.at_ms, cut.until_ms)
    verdict = "completed" if r.ok else f"FAILED ({r.first_error or 'deadline'})"
    return (
        f"cut {SOURCE_LEAF}:{cut.port} at {cut.at_ms:.0f}-{cut.until_ms:.0f} ms: {verdict}, "
        f"{r.completed}/{r.settings.count} in {r.duration_ms:.0f} ms; the cut's wait "
        f"{r.cut_wait(cut.at_ms, cut.until_ms)[0]:.1f} ms (longest of the run "
        f"{r.stall_ms:.1f} ms); "
        f"MB/s before {before.mb_s:g}, during {during.mb_s:g} "
        f"({during.end_ms - during.start_ms:.0f} ms), after {after.mb_s:g}; errors {r.errors}"
    )


def report(system: str, fault: str, cut: Cut, say: Callable[[str], None] = print) -> None:
    """The cut as one marked JSON line of output (`tests/bench/bench_roce.py` collects them
    into docs/benchmarks.md) and one line for people."""
    r = cut.result
    before, during, after = r.around(cut.at_ms, cut.until_ms)
    line = {
        "system": system, "fault": fault, "port": f"{SOURCE_LEAF}:{cut.port}",
        "cut_at_ms": cut.at_ms, "cut_until_ms": cut.until_ms, "ok": r.ok,
        "first_error": r.first_error,
        "first_error_ms": r.first_error_ms, "errors": r.errors, "timed_out": r.timed_out,
        "completed": r.completed, "count": r.settings.count, "size": r.settings.size,
        "timeout": r.settings.timeout, "retry": r.settings.retry,
        "retry_budget_ms": round(r.settings.retry_budget_ms, 1),
        "duration_ms": r.duration_ms, "stall_ms": r.stall_ms,
        "cut_wait_ms": r.cut_wait(cut.at_ms, cut.until_ms)[0],
        "before_mb_s": before.mb_s, "during_mb_s": during.mb_s,
        "during_ms": round(during.end_ms - during.start_ms, 1), "after_mb_s": after.mb_s,
    }  # fmt: skip
    say(MARKER + json.dumps(line))
    say(f"{system}, {fault}: {describe(cut)}")
    say(f"  {cut.load}")
    for stage in cut.probe_log.splitlines():
        say(f"  {stage}")
