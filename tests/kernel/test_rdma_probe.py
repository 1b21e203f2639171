"""`thornctl rdma probe` (pyverbs) between two rxe devices, through THORN's flower tunnel.

The two-host harness of roce.py: workloads A and B in the guest's root namespace with an rxe
device each, their traffic encapsulated by the production flower driver on the red path.
What a path cut does to such a transfer, with THORN running and without, is
test_rdma_thorn.py's; this file checks the probe itself.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from netlab import NetnsFactory, tx_packets
from roce import RoceLab, roce_lab
from thorn_rdma import THORNCTL

from thorn.rdma.probe import ProbeResult

COUNT, SIZE = 100, 65536


@pytest.fixture
def lab(netns: NetnsFactory) -> Iterator[RoceLab]:
    with roce_lab(netns) as built:
        yield built


def probe(lab: RoceLab, *options: str) -> tuple[subprocess.CompletedProcess[str], ProbeResult]:
    a, b = lab.fabric.a.workload, lab.fabric.b.workload
    done = subprocess.run([THORNCTL, "-o", "json", "rdma", "probe", a.ip, b.ip, *options],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.stdout.strip(), done.stderr
    return done, ProbeResult.model_validate(json.loads(done.stdout))


def test_a_stream_of_rdma_writes_completes_through_the_red_tunnel(lab: RoceLab) -> None:
    a = lab.fabric.a
    red_before, blue_before = tx_packets(a.ns, "red"), tx_packets(a.ns, "blue")
    done, result = probe(lab, "--count", str(COUNT), "--size", str(SIZE))
    assert done.returncode == 0, done.stderr
    assert result.ok and result.completed == COUNT and not result.errors
    assert result.device == lab.rxe["A"] and result.gid_index == lab.gid_index["A"]
    assert (result.settings.timeout, result.settings.retry) == (14, 7)
    assert len(result.completions_ms) == COUNT and result.mb_s > 0
    # Every RoCE packet of A left in VXLAN on the red uplink (1 KiB path MTU), none on blue.
    assert tx_packets(a.ns, "red") - red_before >= COUNT * SIZE // 1024
    assert tx_packets(a.ns, "blue") - blue_before < 10
    print(f"stream: {result.mb_s} MB/s, longest stall {result.stall_ms} ms")


def test_ping_pong_measures_every_round_trip(lab: RoceLab) -> None:
    done, result = probe(lab, "--mode", "pingpong", "--count", "20", "--size", "64")
    assert done.returncode == 0, done.stderr
    assert result.ok and len(result.rtt_us) == 20 and all(rtt > 0 for rtt in result.rtt_us)
    print(f"ping-pong: p50 {result.rtt_percentile(0.5)} us")


def test_a_cut_path_ends_the_probe_in_retry_exhaustion_or_at_its_deadline(lab: RoceLab) -> None:
    # Nothing carries B's red TEP any more (a blackhole on the red router, set before the
    # probe starts): the very first write is never acknowledged.
    b = lab.fabric.b
    subprocess.run(["ip", "-n", lab.fabric.routers["red"], "route", "add", "blackhole",
                    f"{b.tep['red']}/32"], check=True)  # fmt: skip
    done, result = probe(lab, "--count", "10", "--deadline", "20")
    assert done.returncode == 1
    assert not result.ok and result.completed == 0
    assert result.retries_exhausted or result.timed_out, result
    print(f"cut: {result.first_error or 'stalled'} after {result.duration_ms:.0f} ms")
