"""The RC probe's settings and results, and what its completions say (pure; no verbs here).

A probe is one reliable-connected queue pair per end (`thorn.rdma.rc` runs them). It either
streams RDMA WRITEs with a window of work requests in flight, or ping-pongs SENDs. Every
completion is time-stamped on the monotonic clock (the same clock for every process on a
machine, so a test can place a failure it injected among them). From the stamps:

- the stall: the longest time between two successful completions (or from the start to
  the first), which is what a path failure costs a transfer that survives it;
- throughput in bins, and before / during / after a given instant;
- errors by verbs status: `IBV_WC_RETRY_EXC_ERR` means the RC retries ran out, which is
  what an NCCL job sees as a fatal transport error.

The QP's `timeout` and `retry` are NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT: one RC timeout is
4.096 us x 2^timeout, and the QP fails after retry + 1 of them without an acknowledgement.
"""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, computed_field

__all__ = [
    "WC_STATUS",
    "Phase",
    "ProbeMode",
    "ProbeResult",
    "ProbeSettings",
    "QpInfo",
    "rc_timeout_ms",
]

# enum ibv_wc_status (verbs.h): its values are the verbs ABI.
WC_STATUS = (
    "IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR", "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR", "IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR", "IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR", "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
)  # fmt: skip


def wc_status_name(status: int) -> str:
    return WC_STATUS[status] if 0 <= status < len(WC_STATUS) else f"IBV_WC_STATUS_{status}"


def rc_timeout_ms(timeout: int) -> float:
    """One RC (local ACK) timeout: 4.096 us x 2^timeout."""
    return float(4.096e-3 * 2**timeout)


class ProbeMode(StrEnum):
    stream = "stream"  # RDMA WRITE, `window` in flight: throughput and the stall
    pingpong = "pingpong"  # SEND, one at a time, echoed: round-trip times


class ProbeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: ProbeMode = ProbeMode.stream
    size: Annotated[int, Field(ge=1, le=16 << 20, description="bytes per message")] = 65536
    count: Annotated[int, Field(ge=1, le=1_000_000, description="messages")] = 300
    window: Annotated[int, Field(ge=1, le=128, description="stream: writes in flight")] = 8
    timeout: Annotated[
        int, Field(ge=1, le=31, description="QP local ACK timeout exponent (NCCL_IB_TIMEOUT)")
    ] = 14
    retry: Annotated[int, Field(ge=0, le=7, description="QP retry count (NCCL_IB_RETRY_CNT)")] = 7
    mtu: Annotated[int, Field(description="path MTU: 256, 512, 1024, 2048 or 4096")] = 1024
    deadline_s: Annotated[
        float, Field(gt=0, le=3600, description="give up (and say so) after this long")
    ] = 120.0

    def model_post_init(self, _context: object) -> None:
        if self.mtu not in (256, 512, 1024, 2048, 4096):
            raise ValueError(f"mtu: {self.mtu} is not one of 256, 512, 1024, 2048, 4096")

    @property
    def retry_budget_ms(self) -> float:
        """How long the QP keeps retrying one unacknowledged packet before it errors."""
        return rc_timeout_ms(self.timeout) * (self.retry + 1)


class QpInfo(BaseModel):
    """What one end tells the other out of band to connect an RC QP (and be written to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    qpn: int
    psn: int
    gid: str
    addr: int
    rkey: int


class Phase(BaseModel):
    """Throughput over one stretch of a stream."""

    start_ms: float
    end_ms: float
    completions: int
    mb_s: float


class ProbeResult(BaseModel):
    """One probe run, as the client end saw it. Times in ms from the first post."""

    src: str
    dst: str
    device: str
    gid_index: int
    settings: ProbeSettings
    started_monotonic: float  # time.monotonic() at the first post
    posted: int
    completions_ms: list[float]  # every successful completion
    errors: dict[str, int] = Field(default_factory=dict)  # verbs status name -> count
    first_error: str | None = None
    first_error_ms: float | None = None
    rtt_us: list[float] = Field(default_factory=list)  # pingpong: each round trip
    timed_out: bool = False
    duration_ms: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def completed(self) -> int:
        return len(self.completions_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        """Every message completed, no completion in error, within the deadline."""
        return not self.errors and not self.timed_out and self.completed == self.settings.count

    @computed_field  # type: ignore[prop-decorator]
    @property
    def retries_exhausted(self) -> bool:
        return "IBV_WC_RETRY_EXC_ERR" in self.errors

    def _waits(self) -> list[tuple[float, float]]:
        """(length, start) of every wait for a completion: from the first post to the first
        completion, between two, and from the last to the end of a run that did not finish."""
        marks = [0.0, *self.completions_ms]
        if not self.ok:
            marks.append(self.duration_ms)
        return [(b - a, a) for a, b in itertools.pairwise(marks)]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stall_ms(self) -> float:
        """The longest wait for a completion."""
        return round(max(self._waits(), default=(0.0, 0.0))[0], 3)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stall_at_ms(self) -> float:
        """When the longest wait began."""
        return max(self._waits(), default=(0.0, 0.0))[1]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mb_s(self) -> float:
        """Mean throughput of what completed, over the whole run."""
        return self.phase(0.0, self.duration_ms).mb_s

    def phase(self, start_ms: float, end_ms: float) -> Phase:
        """Throughput of the completions in [start_ms, end_ms)."""
        done = sum(1 for t in self.completions_ms if start_ms <= t < end_ms)
        seconds = max(end_ms - start_ms, 1e-6) / 1000
        return Phase(start_ms=round(start_ms, 3), end_ms=round(end_ms, 3), completions=done,
                     mb_s=round(done * self.settings.size / seconds / 1e6, 3))  # fmt: skip

    def cut_wait(self, at_ms: float, until_ms: float | None = None) -> tuple[float, float]:
        """The wait a failure injected from `at_ms` to `until_ms` (default: at once) caused:
        (its length in ms, when the transfer flowed again). The longest wait that covers
        `at_ms` or begins after it, but before the QP could have given up on what the cut
        lost: a longer wait that begins later is something else (the emulator, a
        collector)."""
        after = [t for t in self.completions_ms if t >= at_ms]
        before = [t for t in self.completions_ms if t < at_ms]
        marks = [before[-1] if before else 0.0, *after, *([] if self.ok else [self.duration_ms])]
        horizon = max(at_ms, until_ms or at_ms) + self.settings.retry_budget_ms
        length, recovered = max(
            ((b - a, b) for a, b in itertools.pairwise(marks) if a <= horizon),
            default=(0.0, self.duration_ms),
        )
        return round(length, 3), max(recovered, at_ms)

    def around(self, at_ms: float, until_ms: float | None = None) -> tuple[Phase, Phase, Phase]:
        """Before `at_ms`; from `at_ms` until the transfer flowed again (`cut_wait`); and
        after that: the picture of a transfer a failure at `at_ms` cut."""
        _, recovered = self.cut_wait(at_ms, until_ms)
        return (self.phase(0.0, at_ms), self.phase(at_ms, recovered),
                self.phase(recovered, self.duration_ms + 1e-3))  # fmt: skip

    def rtt_percentile(self, q: float) -> float | None:
        if not self.rtt_us:
            return None
        ranked = sorted(self.rtt_us)
        return ranked[min(len(ranked) - 1, int(q * len(ranked)))]
