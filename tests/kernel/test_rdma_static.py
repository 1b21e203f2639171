"""Without THORN, the cut that THORN repairs (test_rdma_thorn.py) fails an RC transfer.

The same lab as test_rdma_thorn.py's (`leaf_spine(2, 2, 1)`, the VFs in the guest's root
namespace with rxe devices), carrying the same overlay over one static path per
destination (`baselines.Static`), nothing reacting. The same probe, timeout 14 / retry 7,
and the same cuts of the leaf1 uplink carrying it mid-transfer.

Its own module: the THORN lab's module fixtures are gone before this lab is built (their
moved VFs keep ifindexes this lab's would take).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from baselines import Static
from thorn_rdma import (
    FABRIC,
    TRANSFER,
    Cut,
    RdmaEnds,
    cut_mid_transfer,
    describe,
    rdma_ends,
    report,
)

from thorn_lab import build, faults
from thorn_lab.handle import Lab

STATIC_PREFIX = "lanestatic"
# A static path never recovers: stuck this long is ~40x the QP's retry budget (537 ms), and
# each cut costs the lane this much rather than THORN's transfers' 60 s allowance.
STATIC_DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def static_lab() -> Iterator[tuple[Lab, RdmaEnds]]:
    build.up(FABRIC, STATIC_PREFIX, replace=True)
    try:
        lab = Lab.open(STATIC_PREFIX)
        Static(lab).start()
        with rdma_ends(lab) as ends:
            yield lab, ends
    finally:
        build.down(STATIC_PREFIX)


def _without_thorn(lab: Lab, ends: RdmaEnds, fault: str, say: Callable[[str], None]) -> Cut:
    inject = {"carrier": lambda end: faults.carrier_loss(lab, end),
              "drop": lambda end: faults.silent_drop(lab, end)}[fault]  # fmt: skip
    try:
        cut = cut_mid_transfer(lab, ends, inject, names=(ends.a.ip, ends.b.ip),
                               deadline_s=STATIC_DEADLINE_S)  # fmt: skip
    finally:
        faults.restore(lab)
    report("static path", fault, cut, say)
    return cut


@pytest.mark.parametrize("fault", ["carrier", "drop"])
def test_without_thorn_the_same_cut_on_a_static_path_fails_the_transfer(
    static_lab: tuple[Lab, RdmaEnds], fault: str, lane_log: Callable[[str], None]
) -> None:
    cut = _without_thorn(*static_lab, fault, lane_log)
    result = cut.result
    assert not result.ok, describe(cut)
    # Either the retries ran out (what an NCCL job sees as a fatal error), or the transfer
    # was still stuck at the deadline, far past the QP's retry budget.
    assert result.retries_exhausted or result.timed_out, describe(cut)
    assert result.completed < TRANSFER.count
