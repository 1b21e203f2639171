"""An RC transfer survives a cut of its path when THORN carries it (without THORN, the same
cut fails it: test_rdma_static.py).

THORN here is the product as `make run` starts it, inside the guest (thorn_rdma.py): real
agents with the flower driver on the hosts and routes on the switches, real BFD, health and
pathcomp over a real nats-server. Nothing plays the detector.

The traffic is `thornctl rdma probe` between the two hosts' rxe devices at NCCL-like QP
settings (timeout 14, retry 7: the QP fails after ~537 ms without an acknowledgement). The
stall is the cut's: from the last completion before it to the first after the move.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from netlab import sh
from thorn_rdma import (
    DST,
    FABRIC,
    SRC,
    THORNCTL,
    TRANSFER,
    Cut,
    RdmaEnds,
    cut_mid_transfer,
    describe,
    rdma_ends,
    report,
)
from thorn_system import RunningThorn, logs_tail, thorn_run

from thorn.rdma.probe import ProbeResult
from thorn_lab import faults

THORN_PREFIX = "lanethorn"
# The guest is emulated (TCG): 10 ms timers would flap there. 30 ms x 3 still finds a
# silent drop in 90 ms, well inside the QP's 537 ms. BFD toward the peer TEPs only (what
# drives the repair at the source NIC): with the link sessions too, 16 sessions at 30 ms
# took the BFD process (real-time priority, by design) 56 % of the guest's two emulated
# CPUs, and the starved transfer itself retried and crawled at 0.05 MB/s. Carrier loss is
# still seen on every node by netlink.
THORN_ENV = {
    "THORN_BFD_INTERVAL_MS": "30",
    "THORN_BFD_MULTIPLIER": "3",
    "THORN_BFD_SESSIONS": "peers",
    "THORN_START_TIMEOUT_S": "400",  # each service imports its stack for a minute or more
}
SETTLE_S = 180.0


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """thorn-run's data directory on a tmpfs as large as JetStream's reservations: THORN's
    streams reserve ~2 GiB (their max_bytes), more than the guest's /tmp has. A tmpfs only
    limits, it reserves nothing: the store uses a few MB."""
    data = Path(tempfile.mkdtemp(prefix="thorn-lane-"))
    sh("mount", "-t", "tmpfs", "-o", "size=8g", "thorn-lane", str(data))
    try:
        yield data
    finally:
        sh("umount", "-l", str(data), check=False)


@pytest.fixture(scope="module")
async def thorn(data_dir: Path) -> AsyncIterator[RunningThorn]:
    data = data_dir
    async with thorn_run(FABRIC, THORN_PREFIX, data, THORN_ENV, start_timeout_s=900) as running:
        assert await running.settle(within=SETTLE_S), logs_tail(data)
        yield running


@pytest.fixture(scope="module")
def thorn_ends(thorn: RunningThorn) -> Iterator[RdmaEnds]:
    with rdma_ends(thorn.lab) as ends:
        yield ends


async def _with_thorn(
    thorn: RunningThorn, ends: RdmaEnds, fault: str, say: Callable[[str], None]
) -> Cut:
    inject = {"carrier": lambda end: faults.carrier_loss(thorn.lab, end),
              "drop": lambda end: faults.silent_drop(thorn.lab, end)}[fault]  # fmt: skip
    api = (thorn.services["topology"], thorn.token)
    try:
        cut = await asyncio.to_thread(cut_mid_transfer, thorn.lab, ends, inject, api)
    finally:
        await asyncio.to_thread(faults.restore, thorn.lab)
    report("THORN", fault, cut, say)
    assert await thorn.settle(within=SETTLE_S), "THORN did not settle after the restore"
    return cut


@pytest.mark.parametrize("fault", ["carrier", "drop"])
async def test_with_thorn_an_rc_transfer_survives_a_cut_of_its_path(
    thorn: RunningThorn, thorn_ends: RdmaEnds, fault: str, lane_log: Callable[[str], None]
) -> None:
    cut = await _with_thorn(thorn, thorn_ends, fault, lane_log)
    result = cut.result
    assert result.ok, describe(cut)
    assert "IBV_WC_RETRY_EXC_ERR" not in result.errors
    # The cut landed mid-transfer, and the transfer flowed again sooner than the QP's retry
    # budget: from the last completion before the cut to the first after the move.
    assert 0 < cut.at_ms < result.duration_ms
    assert result.cut_wait(cut.at_ms, cut.until_ms)[0] < TRANSFER.retry_budget_ms, describe(cut)


async def test_thornctl_rdma_probe_ping_pongs_between_two_workloads_by_name(
    thorn: RunningThorn, thorn_ends: RdmaEnds
) -> None:
    args = [THORNCTL, "-o", "json", "--url", thorn.services["topology"], "--token", thorn.token,
            "rdma", "probe", SRC, DST, "--mode", "pingpong", "--count", "50", "--size", "4096",
            "--deadline", "60"]  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True,
                                   timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = ProbeResult.model_validate(json.loads(done.stdout))
    assert result.ok and result.completed == 50 and len(result.rtt_us) == 50
    assert result.device == thorn_ends.rxe["A"]
    print(f"ping-pong {SRC} -> {DST}: p50 {result.rtt_percentile(0.5)} us")
