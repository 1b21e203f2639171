"""What an RC probe's completions say: the stall, throughput around a cut, the verdict."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from thorn.rdma.probe import ProbeResult, ProbeSettings, rc_timeout_ms, wc_status_name
from thorn.rdma.verbs import gid_of


def result(
    completions: list[float],
    duration: float,
    count: int | None = None,
    timed_out: bool = False,
    errors: dict[str, int] | None = None,
) -> ProbeResult:
    """A stream of 1 MB writes that completed at `completions` (ms from the first post)."""
    settings = ProbeSettings(count=count or len(completions), size=1_000_000)
    return ProbeResult(src="a", dst="b", device="rxeA", gid_index=1, settings=settings,
                       started_monotonic=0.0, posted=settings.count, completions_ms=completions,
                       duration_ms=duration, timed_out=timed_out, errors=errors or {})  # fmt: skip


def test_one_rc_timeout_at_nccl_ib_timeout_14_is_67_ms_and_the_qp_gives_up_after_8() -> None:
    assert rc_timeout_ms(14) == pytest.approx(67.1, abs=0.05)
    assert ProbeSettings(timeout=14, retry=7).retry_budget_ms == pytest.approx(536.9, abs=0.1)
    assert ProbeSettings(timeout=20, retry=7).retry_budget_ms / 1000 == pytest.approx(34.4, abs=0.1)


def test_the_stall_is_the_longest_wait_between_two_completions() -> None:
    r = result([10, 20, 30, 230, 240], duration=240)
    assert r.ok
    assert (r.stall_ms, r.stall_at_ms) == (200, 30)


def test_the_wait_for_the_first_completion_counts_as_a_stall_too() -> None:
    assert result([300, 310], duration=310).stall_ms == 300


def test_a_run_that_did_not_finish_stalls_until_its_end() -> None:
    r = result([10, 20], duration=5000, count=10, timed_out=True)
    assert not r.ok
    assert (r.stall_ms, r.stall_at_ms) == (4980, 20)


def test_an_error_completion_fails_the_run_and_retry_exhaustion_is_named() -> None:
    r = result([10, 20], duration=600, count=3, errors={"IBV_WC_RETRY_EXC_ERR": 1})
    assert not r.ok and r.retries_exhausted
    assert not result([10], duration=10, errors={"IBV_WC_WR_FLUSH_ERR": 3}).retries_exhausted


def test_throughput_before_during_and_after_a_cut() -> None:
    # 1 MB per completion: every 10 ms before the cut at 100 ms, nothing for 200 ms, then
    # every 10 ms again.
    before = [10.0 * i for i in range(1, 11)]  # 10 .. 100
    after = [300.0 + 10 * i for i in range(10)]  # 300 .. 390
    r = result(before + after, duration=390)
    b, during, a = r.around(100.5)
    assert (b.completions, b.mb_s) == (10, pytest.approx(99.5, abs=0.1))
    assert (during.start_ms, during.end_ms, during.completions) == (100.5, 300, 0)
    assert during.mb_s == 0
    assert (a.completions, a.mb_s) == (10, pytest.approx(111.1, abs=0.1))


def test_settings_out_of_range_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="timeout"):
        ProbeSettings(timeout=32)
    with pytest.raises(ValidationError, match="retry"):
        ProbeSettings(retry=8)
    with pytest.raises(ValidationError, match="mtu"):
        ProbeSettings(mtu=1500)


def test_a_roce_v2_gid_carries_the_ipv4_address_mapped_into_ipv6() -> None:
    assert gid_of("10.100.0.1") == "0000:0000:0000:0000:0000:ffff:0a64:0001"
    assert gid_of("fd00::1") == "fd00:0000:0000:0000:0000:0000:0000:0001"


def test_completion_status_names_follow_the_verbs_abi() -> None:
    assert wc_status_name(12) == "IBV_WC_RETRY_EXC_ERR"
    assert wc_status_name(5) == "IBV_WC_WR_FLUSH_ERR"
    assert wc_status_name(99) == "IBV_WC_STATUS_99"


def test_a_transfer_that_never_recovered_stalls_from_the_cut_to_its_end() -> None:
    r = result([10.0, 20.0, 30.0, 31.0], duration=60_000, count=100, timed_out=True)
    before, during, after = r.around(30.5)
    assert (before.completions, during.completions, after.completions) == (3, 1, 0)
    assert (during.start_ms, during.end_ms) == (30.5, 60_000)


def test_a_longer_wait_long_after_the_cut_is_not_the_cut_s() -> None:
    # 1 MB every 10 ms; the cut at 100.5 costs 200 ms; a 400 ms pause 5 s later is not it.
    done = [10.0 * i for i in range(1, 11)] + [300.0 + 10 * i for i in range(500)]
    done += [done[-1] + 400 + 10 * i for i in range(10)]
    _, during, _ = result(done, duration=done[-1]).around(100.5)
    assert (during.start_ms, during.end_ms) == (100.5, 300)


def test_the_cut_s_wait_runs_from_the_last_completion_before_it_to_the_next() -> None:
    # A slow first completion (600 ms: the QP's first packets) is not what the cut cost.
    done = [600.0, *[600.0 + 10 * i for i in range(1, 11)], 950.0, 960.0]
    r = result(done, duration=960)
    assert r.stall_ms == 600
    assert r.cut_wait(705.0) == (250.0, 950.0)


def test_a_fault_that_took_time_to_inject_is_looked_for_until_it_held() -> None:
    # Injected from 100 to 900 ms; completions ran on until 800, then nothing for 300 ms.
    done = [10.0 * i for i in range(1, 81)] + [1100.0 + 10 * i for i in range(10)]
    r = result(done, duration=done[-1])
    assert r.cut_wait(100.0)[0] == 10.0  # looked for from the start alone, it is missed
    assert r.cut_wait(100.0, 900.0) == (300.0, 1100.0)
