"""RDMA through a path cut, with THORN and without: the kernel lane's RoCE proof, reported.

Runs `tests/kernel/test_rdma_static.py` and `test_rdma_thorn.py` in the kernel lane
(Debian's kernel under qemu, where flower, tunnel_key and Soft-RoCE exist): `thorn-run` in
the guest carries an RC transfer
(`thornctl rdma probe`, 6,000 RDMA WRITEs of 1 KiB, QP timeout 14 and retry 7 as NCCL's
NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT would set them) between two hosts' rxe devices, and the
leaf uplink carrying it is cut mid-transfer by carrier loss, then by a silent drop; the same
cuts hit the same lab with one static path. Each cut's throughput before, during (the
stall) and after comes from the completions' time stamps, and goes to docs/benchmarks.md.

    .venv/bin/python tests/bench/bench_roce.py --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from sections import markdown_table, print_results, write_section

REPO = Path(__file__).resolve().parents[2]
LANE_LOG = REPO / ".cache" / "kernel-lane" / "pytest.log"
MARKER = "@@bench-roce "  # as tests/kernel/thorn_rdma.py prints it
MARK_BEGIN = "<!-- bench:roce:begin -->"
MARK_END = "<!-- bench:roce:end -->"
COMMAND = ".venv/bin/python tests/bench/bench_roce.py --write docs/benchmarks.md"
LANE_TIMEOUT_S = 1800

console = Console(stderr=True)


def read_cuts(log: Path) -> list[dict[str, Any]]:
    """The marked measurement lines of a lane log."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [json.loads(line[len(MARKER) :]) for line in lines if line.startswith(MARKER)]


def run_lane() -> tuple[list[dict[str, Any]], bool]:
    cmd = [sys.executable, str(REPO / "tests/kernel/lane.py"), "--lane-timeout",
           str(LANE_TIMEOUT_S), "-s", "-v", "tests/kernel/test_rdma_static.py",
           "tests/kernel/test_rdma_thorn.py"]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, check=False)
    cuts = read_cuts(LANE_LOG)
    if run.returncode != 0:
        console.print(f"[red]the kernel lane failed ({run.returncode}); see {LANE_LOG}[/red]")
    return cuts, run.returncode == 0


def _outcome(cut: dict[str, Any]) -> str:
    if cut["ok"]:
        return "completed"
    if cut["first_error"]:
        return f"failed: {cut['first_error']} at {cut['first_error_ms']:.0f} ms"
    return "stalled until the deadline"


def rows(cuts: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [c["system"], c["fault"], c["port"], _outcome(c), f"{c['completed']}/{c['count']}",
         f"{c['cut_wait_ms']:.1f}", f"{c['stall_ms']:.1f}", f"{c['before_mb_s']:.2f}",
         f"{c['during_mb_s']:.2f} ({c['during_ms']:.0f} ms)", f"{c['after_mb_s']:.2f}"]
        for c in cuts
    ]  # fmt: skip


COLUMNS = ["system", "cut", "leaf uplink", "transfer", "messages", "cut's stall ms",
           "longest stall ms",
           "MB/s before", "MB/s during", "MB/s after"]  # fmt: skip


def markdown(cuts: list[dict[str, Any]], seconds: float | None) -> str:
    budget = cuts[0]["retry_budget_ms"] if cuts else 0
    lines = [
        MARK_BEGIN,
        "## RDMA through a path cut (kernel lane, Soft-RoCE)",
        "",
        f"`{COMMAND}` ({time.strftime('%Y-%m-%d')}, "
        + (f"{seconds:.0f} s). " if seconds is not None else "from a `make test` lane log). ")
        + "Debian's 6.1 kernel "
        "under qemu (TCG, 2 vCPUs), so absolute rates are the emulator's, not a NIC's. "
        "`thorn-run` runs in the guest on `leaf_spine(2, 2, 1)` (BFD 30 ms x 3 toward the peer "
        "TEPs; flower on the hosts); `thornctl rdma probe` streams 6,000 RDMA WRITEs of 1 KiB, "
        "16 in flight, over one "
        f"RC QP with timeout 14 and retry 7 (the QP fails after {budget:.0f} ms without an "
        "acknowledgement) from host1 to host2. Mid-transfer the leaf1 uplink carrying it is "
        "cut; the static path is the same lab with one route per destination and nothing "
        "reacting. Cut's stall: from the last completion before the cut to the first after "
        "it (the transfer moved or the retries ran out); longest stall: the longest wait "
        "between two completions in the whole run. During: from the cut to the end of its "
        "stall. rxe on 6.1 retransmits without end instead of failing the QP after its 7 "
        "retries, so the static path shows a transfer stuck until the probe's deadline (20 s "
        "for the static path since 2026-12-03, 60 s before) where "
        "a NIC would report IBV_WC_RETRY_EXC_ERR after 537 ms.",
        "",
        *markdown_table(COLUMNS, rows(cuts)),
        MARK_END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="update this markdown file's section")
    parser.add_argument(
        "--from-log",
        type=Path,
        help="read the cuts of a lane run's log "
        "(a default `make test` run prints them) instead of running the lane",
    )
    args = parser.parse_args()
    started = time.monotonic()
    if args.from_log:
        cuts, passed = read_cuts(args.from_log), True
    else:
        cuts, passed = run_lane()
    seconds = None if args.from_log else time.monotonic() - started
    print_results(console, [("RDMA through a path cut", COLUMNS, rows(cuts))], [])
    if not cuts:
        sys.exit(1)
    if args.write:
        write_section(args.write, markdown(cuts, seconds), MARK_BEGIN, MARK_END)
        console.print(f"written to {args.write}")
    if not passed:  # what was measured is written, but the run says it failed
        sys.exit(1)


if __name__ == "__main__":
    main()
