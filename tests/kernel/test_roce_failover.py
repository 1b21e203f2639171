"""RDMA survives a silent path failure when the source flips its tunnel to the other colour.

Soft-RoCE (rxe) on Debian's kernel, through the flower/tunnel_key VXLAN tunnel between two
emulated hosts (roce.py, netlab.py). `ib_write_bw` writes 300 x 64 KiB from workload A to
workload B, a reliable-connected QP with the QP timeout NCCL_IB_TIMEOUT=14 gives
(~67 ms per retry, 7 retries).

The failure is silent: a blackhole route on the red router for B's red TEP. The red link
stays up, nothing tells anyone, every packet from A to B on red is lost. B's replies to A
(on B's own red action) are untouched, so one flip at A is the whole repair.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest
from netlab import Host, NetnsFactory, Prestarted, prestarted, tx_packets
from roce import (
    RoceLab,
    Running,
    Transfer,
    client_result,
    prepared_flip,
    roce_lab,
    running_transfer,
)

TRANSFER = Transfer(size=65536, iterations=300, qp_timeout=14)
PACKETS = TRANSFER.iterations * TRANSFER.size // 1024  # rxe's path MTU on a 1500 netdev: 1 KiB
CUT_AFTER_PACKETS = PACKETS // 6  # well inside the transfer, whatever the guest's speed
FLIP_AFTER_S = 0.05  # less than one QP timeout: costs at most one retransmission
COMPLETES_WITHIN_S = 90.0  # 2-5 s here (rxe makes 4-15 MB/s under TCG); generous for load
STALL_BOUND_S = 20.0  # ~40x the RC retry budget (7 x 67 ms): an alive transfer ends long before


@pytest.fixture
def lab(netns: NetnsFactory) -> Iterator[RoceLab]:
    with roce_lab(netns) as built:
        yield built


def red_path_cut_toward(lab: RoceLab, host: Host) -> AbstractContextManager[Prestarted]:
    """A silent drop, ready to fire: a blackhole route on the red router for `host`'s TEP."""
    return prestarted("ip", lab.fabric.routers["red"], f"route add blackhole {host.tep['red']}/32")


def wait_until_mid_transfer(lab: RoceLab, run: Running, baseline: int) -> None:
    """Until A has sent CUT_AFTER_PACKETS RoCE packets, so the cut lands mid-transfer."""
    vf = lab.fabric.a.workload.dev
    deadline = time.monotonic() + COMPLETES_WITHIN_S
    while tx_packets(None, vf) - baseline < CUT_AFTER_PACKETS:
        assert run.client.poll() is None, f"client ended early:\n{run.output()[1]}"
        assert time.monotonic() < deadline, "the transfer did not start"
        time.sleep(0.005)


def first_packet_at(ns: str, dev: str, before: int, timeout_s: float = 10.0) -> float:
    """When `dev`'s transmit counter first moved past `before`."""
    deadline = time.monotonic() + timeout_s
    while tx_packets(ns, dev) == before:
        assert time.monotonic() < deadline, f"nothing left on {dev}"
        time.sleep(0.001)
    return time.monotonic()


def test_a_transfer_through_the_red_tunnel_completes(lab: RoceLab) -> None:
    a = lab.fabric.a
    red_before, blue_before = tx_packets(a.ns, "red"), tx_packets(a.ns, "blue")
    with running_transfer(lab, TRANSFER) as run:
        assert run.wait(COMPLETES_WITHIN_S), "ib_write_bw did not finish"
        server_out, client_out = run.output()
    assert (run.server.returncode, run.client.returncode) == (0, 0), client_out + server_out
    result = client_result(client_out)
    assert result and result.iterations == TRANSFER.iterations, client_out
    print(f"ib_write_bw: {result.average_mb_s} MB/s")
    # Every RoCE packet of A left in VXLAN on the red path; none on blue.
    assert tx_packets(a.ns, "red") - red_before >= PACKETS
    assert tx_packets(a.ns, "blue") - blue_before < 10


def test_a_silent_red_drop_then_one_flip_to_blue_loses_no_iteration(lab: RoceLab) -> None:
    a, b = lab.fabric.a, lab.fabric.b
    baseline = tx_packets(None, a.workload.dev)
    with (
        running_transfer(lab, TRANSFER) as run,
        red_path_cut_toward(lab, b) as cut,
        prepared_flip(lab.fabric, a, "blue") as flip,
    ):
        wait_until_mid_transfer(lab, run, baseline)
        cut()
        cut_at = time.monotonic()
        time.sleep(FLIP_AFTER_S)
        blue_before = tx_packets(a.ns, "blue")
        flip_at = time.monotonic()
        flip.send()
        blue_at = first_packet_at(a.ns, "blue", blue_before)
        flip.wait()
        assert run.wait(COMPLETES_WITHIN_S), "ib_write_bw did not finish after the flip"
        done_at = time.monotonic()
        server_out, client_out = run.output()
    assert (run.server.returncode, run.client.returncode) == (0, 0), client_out + server_out
    result = client_result(client_out)
    assert result and result.iterations == TRANSFER.iterations, client_out
    # The rest of the transfer, retransmissions included, went over blue.
    assert tx_packets(a.ns, "blue") - blue_before >= (PACKETS - CUT_AFTER_PACKETS) // 2
    print(
        f"cut, then the flip sent at +{1000 * (flip_at - cut_at):.0f} ms, the first packet "
        f"on blue at +{1000 * (blue_at - cut_at):.0f} ms; all {result.iterations} iterations "
        f"done at +{done_at - cut_at:.1f} s ({result.average_mb_s} MB/s)"
    )


def test_without_the_flip_the_same_drop_stalls_the_transfer(lab: RoceLab) -> None:
    a, b = lab.fabric.a, lab.fabric.b
    baseline = tx_packets(None, a.workload.dev)
    with running_transfer(lab, TRANSFER) as run, red_path_cut_toward(lab, b) as cut:
        wait_until_mid_transfer(lab, run, baseline)
        cut()
        finished = run.wait(STALL_BOUND_S)
        client_out = run.output()[1]
    # Still stuck at the bound (what rxe on 6.1 does) or ended in an error: never complete.
    if finished:
        assert run.client.returncode != 0 and not client_result(client_out), client_out
    print(f"ended in error, exit {run.client.returncode}" if finished else "stalled")
