"""The traffic meter's accounting (pure): loss, reordering, duplicates, the longest gap.

Definitions, for a stream of `count` packets numbered 0..count-1:
    received    distinct sequence numbers that arrived;
    lost        sent - received (a packet the sender's kernel refused counts as sent);
    duplicates  arrivals of a sequence number already received;
    reordered   arrivals (not duplicates) below the highest number received so far;
    gap         the time between two consecutive arrivals, from the kernel's receive
                timestamps (SO_TIMESTAMPNS), so Python's scheduling does not blur it;
    loss        a run of consecutive lost numbers: its period is the time between the send
                stamps of the packets that arrived on either side of it (RFC 6412's packet
                loss period, on the sender's clock). Unlike the gap, a pause of the sender
                or the receiver with nothing lost is not one; a run at either end of the
                stream, with no arrival on one side, has no period.
RoCE PSNs are 24 bits: each is unwrapped to the value nearest the highest one seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from thorn_lab.packets import PSN_MODULUS

__all__ = ["MAX_RANGES", "Meter", "MeterResult", "unwrap_psn"]

MAX_RANGES = 20
MAX_BOUNDARIES = 100_000  # send stamps kept around discontinuities (bounds the memory)


def unwrap_psn(psn: int, reference: int) -> int:
    """The integer congruent to `psn` mod 2^24 nearest `reference` (an unwrapped PSN)."""
    candidate = reference - (reference % PSN_MODULUS) + psn
    if candidate - reference > PSN_MODULUS // 2:
        candidate -= PSN_MODULUS
    elif reference - candidate > PSN_MODULUS // 2:
        candidate += PSN_MODULUS
    return candidate


@dataclass(frozen=True)
class MeterResult:
    received: int
    duplicates: int
    reordered: int
    strays: int  # ours by stream id, but a sequence number outside the stream
    first_rx_ns: int | None
    last_rx_ns: int | None
    max_gap_ns: int
    max_gap_start_ns: int | None  # arrival time of the packet before the longest gap
    max_gap_before_seq: int | None
    max_gap_after_seq: int | None
    lost_ranges: list[tuple[int, int]]  # the first MAX_RANGES runs of missing numbers
    lost_ranges_total: int  # how many runs in all
    max_loss_ns: int | None = None  # the longest loss period (see the module's definitions)
    max_loss_start_ns: int | None = None  # send stamp of the arrival before it
    max_loss_range: tuple[int, int] | None = None  # its lost numbers [first, last]


class Meter:
    def __init__(self, count: int, *, start_psn: int | None = None) -> None:
        """`start_psn`: the stream is RoCE and its first packet carries this PSN."""
        self.count = count
        self.start_psn = start_psn
        self._highest_psn = start_psn
        self._seen = bytearray((count + 7) // 8)
        self.received = 0
        self.duplicates = 0
        self.reordered = 0
        self.strays = 0
        self._highest = -1
        self._first: int | None = None
        self._last: int | None = None
        self._last_seq: int | None = None
        self._gap = 0
        self._gap_start: int | None = None
        self._gap_before: int | None = None
        self._gap_after: int | None = None
        self._last_sent: int | None = None
        self._sent_at: dict[int, int] = {}  # send stamps on both sides of a discontinuity

    def _sequence(self, raw: int) -> int:
        if self.start_psn is None or self._highest_psn is None:
            return raw
        unwrapped = unwrap_psn(raw, self._highest_psn)
        self._highest_psn = max(self._highest_psn, unwrapped)
        return unwrapped - self.start_psn

    def observe(self, raw_seq: int, rx_ns: int, sent_ns: int | None = None) -> None:
        """One arrival: its sequence number (or PSN), kernel receive time and, to time
        loss periods, the send stamp it carries."""
        seq = self._sequence(raw_seq)
        if not 0 <= seq < self.count:
            self.strays += 1
            return
        if sent_ns is not None:
            jumped = self._last_seq is None or seq != self._last_seq + 1
            if jumped and len(self._sent_at) < MAX_BOUNDARIES:
                if self._last_seq is not None and self._last_sent is not None:
                    self._sent_at[self._last_seq] = self._last_sent
                self._sent_at[seq] = sent_ns
            self._last_sent = sent_ns
        if self._last is not None:
            gap = rx_ns - self._last
            if gap > self._gap:
                self._gap = gap
                self._gap_start = self._last
                self._gap_before = self._last_seq
                self._gap_after = seq
        if self._first is None:
            self._first = rx_ns
        self._last = rx_ns
        self._last_seq = seq
        byte, bit = divmod(seq, 8)
        if self._seen[byte] & (1 << bit):
            self.duplicates += 1
            return
        self._seen[byte] |= 1 << bit
        self.received += 1
        if seq < self._highest:
            self.reordered += 1
        else:
            self._highest = seq

    def _runs(self, sent: int) -> Iterator[tuple[int, int]]:
        """Runs [first, last] of sequence numbers below `sent` that never arrived."""
        seen, sent = self._seen, min(sent, self.count)
        seq = 0
        while seq < sent:
            if seen[seq >> 3] & (1 << (seq & 7)):
                seq += 1
                continue
            first = seq
            while seq < sent and not seen[seq >> 3] & (1 << (seq & 7)):
                seq += 1
            yield first, seq - 1

    def _longest_loss(
        self, runs: list[tuple[int, int]], sent: int
    ) -> tuple[int, int, tuple[int, int]] | None:
        """(period ns, send stamp before it, [first, last]) of the longest loss period among
        `runs`; None if no run has arrivals on both sides."""
        best: tuple[int, int, tuple[int, int]] | None = None
        for first, last in runs:
            before, after = self._sent_at.get(first - 1, -1), self._sent_at.get(last + 1, -1)
            if last + 1 >= min(sent, self.count) or before < 0 or after < 0:
                continue  # an arrival is missing on one side: no period to time
            if best is None or after - before > best[0]:
                best = (after - before, before, (first, last))
        return best

    def result(self, sent: int | None = None) -> MeterResult:
        """The accounting so far; `sent` (default: the whole stream) bounds the lost runs."""
        sent = self.count if sent is None else sent
        runs = list(self._runs(sent))  # one walk of the bitmap for both accounts
        ranges, total = runs[:MAX_RANGES], len(runs)
        loss = self._longest_loss(runs, sent)
        return MeterResult(
            received=self.received,
            duplicates=self.duplicates,
            reordered=self.reordered,
            strays=self.strays,
            first_rx_ns=self._first,
            last_rx_ns=self._last,
            max_gap_ns=self._gap,
            max_gap_start_ns=self._gap_start,
            max_gap_before_seq=self._gap_before,
            max_gap_after_seq=self._gap_after,
            lost_ranges=ranges,
            lost_ranges_total=total,
            max_loss_ns=loss[0] if loss else None,
            max_loss_start_ns=loss[1] if loss else None,
            max_loss_range=loss[2] if loss else None,
        )
