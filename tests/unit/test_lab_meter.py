"""Traffic probes, the meter's accounting and the fault programs' bytes (pure, no root)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thorn_lab import bpf
from thorn_lab.meter import Meter, unwrap_psn
from thorn_lab.packets import PSN_MODULUS, Kind, decode, encode_into, min_size
from thorn_lab.traffic import StreamSpec

MS = 1_000_000


def _feed(meter: Meter, arrivals: list[tuple[int, int]]) -> None:
    for seq, at_ms in arrivals:
        meter.observe(seq, at_ms * MS)


# --- probes -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Kind.udp, Kind.roce])
def test_a_probe_decodes_to_what_was_encoded(kind: Kind) -> None:
    buf = bytearray(128)
    encode_into(buf, kind, stream=7, seq=PSN_MODULUS + 5, sent_ns=123, qp=0x11)
    probe = decode(bytes(buf), kind)
    assert probe is not None
    expected_seq = 5 if kind is Kind.roce else PSN_MODULUS + 5  # the PSN is 24 bits
    assert (probe.stream, probe.seq, probe.sent_ns) == (7, expected_seq, 123)


def test_a_roce_probe_starts_with_a_base_transport_header() -> None:
    buf = bytearray(min_size(Kind.roce))
    encode_into(buf, Kind.roce, stream=1, seq=0xABCDEF, sent_ns=0, qp=0x123456)
    opcode, flags, pkey, qp_word, psn_word = struct.unpack_from("!BBHII", buf)
    assert (opcode, flags, pkey) == (0x04, 0, 0xFFFF)  # RC SEND Only, default P_Key
    assert qp_word & 0xFFFFFF == 0x123456
    assert psn_word & 0xFFFFFF == 0xABCDEF
    assert buf[-4:] == b"\0\0\0\0"  # the ICRC placeholder


def test_foreign_datagrams_are_not_probes() -> None:
    assert decode(b"hello", Kind.udp) is None
    assert decode(bytes(64), Kind.udp) is None
    assert decode(bytes(64), Kind.roce) is None


def test_a_stream_ends_at_its_count_or_its_duration_whichever_is_first() -> None:
    assert StreamSpec(src="a", dst="b", rate_pps=1000, count=500, duration_s=10).packets == 500
    assert StreamSpec(src="a", dst="b", rate_pps=1000, count=10**6, duration_s=2).packets == 2000
    assert StreamSpec(src="a", dst="b", kind=Kind.roce).dst_port == 4791
    with pytest.raises(ValueError, match="at least 32"):
        StreamSpec(src="a", dst="b", kind=Kind.roce, size=28)


# --- the meter ---------------------------------------------------------------------------


def test_a_clean_stream_has_no_loss_and_a_gap_of_one_interval() -> None:
    meter = Meter(100)
    _feed(meter, [(i, i) for i in range(100)])
    result = meter.result()
    assert (result.received, result.duplicates, result.reordered) == (100, 0, 0)
    assert result.max_gap_ns == 1 * MS


def test_a_cut_shows_as_the_longest_gap_with_its_place_in_the_stream() -> None:
    # 1 ms probes; packets 300-329 vanish: the receiver is silent for 31 ms.
    meter = Meter(1000)
    _feed(meter, [(i, i) for i in range(1000) if not 300 <= i < 330])
    result = meter.result()
    assert result.received == 970
    assert result.max_gap_ns == 31 * MS
    assert (result.max_gap_before_seq, result.max_gap_after_seq) == (299, 330)
    assert result.max_gap_start_ns == 299 * MS
    assert (result.lost_ranges, result.lost_ranges_total) == ([(300, 329)], 1)


def test_duplicates_and_late_packets_are_counted_apart() -> None:
    meter = Meter(10)
    _feed(meter, [(0, 0), (2, 1), (1, 2), (2, 3), (3, 4)])
    result = meter.result()
    assert result.received == 4
    assert result.duplicates == 1  # 2 twice
    assert result.reordered == 1  # 1 after 2
    assert meter.result(sent=6).lost_ranges == [(4, 5)]  # only what was sent can be lost


def test_sequence_numbers_outside_the_stream_are_strays() -> None:
    meter = Meter(5)
    _feed(meter, [(0, 0), (7, 1)])
    assert (meter.result().received, meter.result().strays) == (1, 1)


def test_psns_wrap_at_24_bits_without_breaking_the_count() -> None:
    start = PSN_MODULUS - 3
    meter = Meter(6, start_psn=start)
    _feed(meter, [((start + i) % PSN_MODULUS, i) for i in range(6)])
    assert meter.result().received == 6
    assert meter.result().strays == 0


@given(st.integers(0, 2**40), st.integers(-(2**22), 2**22))
def test_unwrap_finds_the_psn_nearest_the_reference(reference: int, step: int) -> None:
    value = max(0, reference + step)
    assert unwrap_psn(value % PSN_MODULUS, reference) == value


# --- fault programs ----------------------------------------------------------------------


def test_the_black_hole_program_returns_shot() -> None:
    code, _, _, imm = struct.unpack("<BBhI", bpf.drop_all()[:8])
    assert (code, imm) == (0xB7, bpf.TC_ACT_SHOT)  # r0 = 2
    assert bpf.drop_all()[8] == 0x95  # exit


@pytest.mark.parametrize(("percent", "expected"), [(50, 2**31), (25, 2**30), (1e-9, 0)])
def test_the_loss_threshold_is_that_fraction_of_the_u32_range(
    percent: float, expected: int
) -> None:
    assert bpf.threshold(percent) == expected


@pytest.mark.parametrize("percent", [0, 100, -1, 150])
def test_loss_outside_the_open_range_is_refused(percent: float) -> None:
    with pytest.raises(ValueError, match="above 0 and below 100"):
        bpf.drop_fraction(percent)


def test_the_loss_program_compares_a_random_u32_with_the_threshold() -> None:
    program = bpf.drop_fraction(30)
    assert len(program) == 6 * 8
    call, jlt = struct.unpack_from("<BBhI", program, 0), struct.unpack_from("<BBhI", program, 8)
    assert call[0] == 0x85 and call[3] == bpf.FUNC_GET_PRANDOM_U32
    assert jlt[0] == 0xA6 and jlt[3] == bpf.threshold(30)  # jmp32 unsigned <


def _feed_sent(meter: Meter, arrivals: list[tuple[int, int, int]]) -> None:
    for seq, at_ms, sent_ms in arrivals:
        meter.observe(seq, at_ms * MS, sent_ms * MS)


def test_a_loss_period_runs_between_the_send_stamps_around_the_lost_run() -> None:
    # 1 ms probes, each arriving 2 ms after it was sent; packets 300-329 vanish.
    meter = Meter(1000)
    _feed_sent(meter, [(i, i + 2, i) for i in range(1000) if not 300 <= i < 330])
    result = meter.result()
    assert result.max_loss_ns == 31 * MS  # sent 299 at 299 ms, 330 at 330 ms
    assert result.max_loss_start_ns == 299 * MS
    assert result.max_loss_range == (300, 329)


def test_a_pause_with_nothing_lost_is_a_gap_but_no_loss_period() -> None:
    # The sender (or the receiver) stalls 15 ms; every packet still arrives.
    meter = Meter(100)
    _feed_sent(meter, [(i, i + (15 if i >= 50 else 0), i + (15 if i >= 50 else 0))
                       for i in range(100)])  # fmt: skip
    result = meter.result()
    assert result.max_gap_ns == 16 * MS
    assert result.max_loss_ns is None and result.lost_ranges == []


def test_the_longest_of_several_loss_periods_is_kept_and_an_open_run_has_none() -> None:
    meter = Meter(100)
    kept = [i for i in range(100) if not (10 <= i < 13 or 40 <= i < 48 or i >= 90)]
    _feed_sent(meter, [(i, i, i) for i in kept])
    result = meter.result()
    assert result.max_loss_ns == 9 * MS and result.max_loss_range == (40, 47)
    assert result.lost_ranges == [(10, 12), (40, 47), (90, 99)]  # 90-99: no arrival after it
