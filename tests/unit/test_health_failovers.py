"""Failover timelines (thorn_health.failovers, pure): the store record of an event, and one
trace's events merged into hops with latencies only where one clock read both ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from thorn.events import FailoverEvent, Trace
from thorn_health.failovers import (
    MalformedFailover,
    link_of,
    merge_hops,
    record_of,
    timeline,
    untraced_id,
)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


# What health and pathcomp put in the trace before any agent sees it.
CENTRAL = (
    Trace(id="a1b2c3d4e5f60718")
    .then("detected", "spine1", at=ms(0))
    .then("health_received", "health", at=ms(1.2))
    .then("health_decided", "health", at=ms(1.5))
    .then("pathcomp_received", "pathcomp", at=ms(1.9))
    .then("pathcomp_decided", "pathcomp", at=ms(2.2))
)


def flip(
    node: str, peers: list[str], received: float, applied: float, **kw: object
) -> FailoverEvent:
    trace = CENTRAL.then("agent_received", node, at=ms(received)).then(
        "agent_applied", node, at=ms(applied)
    )
    fields: dict[str, object] = {
        "node": node, "peers": peers, "from_colour": "red", "to_colour": "blue",
        "at": ms(applied + 0.1), "reason": "central: link 17", "tier": "central",
        "kernel_ms": 0.3, "trace": trace, **kw,
    }  # fmt: skip
    return FailoverEvent.model_validate(fields)


def test_two_agents_of_one_trace_merge_into_shared_hops_then_each_agents_own() -> None:
    records = [
        record_of(flip("host1", ["host3", "host4"], 2.6, 3.1), stream_seq=7),
        record_of(flip("host2", ["host3"], 2.7, 3.5), stream_seq=8),
    ]
    hops = merge_hops(records)
    assert [(h.step, h.clock) for h in hops] == [
        ("detected", "spine1"), ("health_received", "health"), ("health_decided", "health"),
        ("pathcomp_received", "pathcomp"), ("pathcomp_decided", "pathcomp"),
        ("agent_received", "host1"), ("agent_applied", "host1"),
        ("agent_received", "host2"), ("agent_applied", "host2"),
    ]  # fmt: skip
    # host2's branch follows pathcomp's decision, not host1's last hop
    assert [h.after for h in hops] == [None, 0, 1, 2, 3, 4, 5, 4, 7]
    # a latency only where one clock read both ends; across clocks: none, and said so
    assert [h.ms for h in hops] == [None, None, 0.3, None, 0.3, None, 0.5, None, 0.8]
    assert [h.clocks_differ for h in hops] == [
        False, True, False, True, False, True, False, True, False
    ]  # fmt: skip


def test_the_timeline_of_a_central_failover_refuses_a_gap_across_clocks() -> None:
    records = [
        record_of(flip("host1", ["host3", "host4"], 2.6, 3.1), stream_seq=7),
        record_of(flip("host2", ["host3"], 2.7, 3.5), stream_seq=8),
    ]
    t = timeline(records)
    assert (t.id, t.traced, t.tier, t.link_id) == ("a1b2c3d4e5f60718", True, "central", 17)
    assert (t.started, t.started_clock) == (T0, "spine1")
    assert t.sources == ["host1", "host2"] and t.pairs_moved == 3
    # detection on spine1's clock, the flips on host1's and host2's: not subtracted
    assert t.gap_ms_upper_bound is None and t.gap_clocks_differ
    assert t.gap_clocks == ["spine1", "host1", "host2"]
    assert [(m.node, m.peers) for m in t.moved] == [("host1", ["host3", "host4"]),
                                                    ("host2", ["host3"])]  # fmt: skip


def test_a_gap_on_one_clock_is_the_slowest_sources_detection_to_applied() -> None:
    own = Trace(id="00ff00ff00ff00ff").then("detected", "host1", at=ms(0))
    event = FailoverEvent(
        node="host1", peers=["host3"], from_colour="red", to_colour="blue", at=ms(1.5),
        reason="bfd red to host3 down (control_detection_time_expired)", tier="source",
        trace=own.then("agent_applied", "host1", at=ms(1.25)),
    )  # fmt: skip
    t = timeline([record_of(event, stream_seq=1)])
    assert t.gap_ms_upper_bound == 1.25 and not t.gap_clocks_differ
    assert t.gap_clocks == ["host1"] and t.link_id is None
    [_, applied] = t.hops
    assert (applied.ms, applied.clocks_differ, applied.after) == (1.25, False, 0)


def test_an_event_without_a_trace_is_a_failover_of_its_own_with_no_hops_and_no_gap() -> None:
    event = FailoverEvent(
        node="host3", peers=["host1"], from_colour="blue", to_colour="red", at=ms(40),
        reason="bfd blue to host1 down (neighbor_signaled_session_down)", tier="source",
    )  # fmt: skip
    record = record_of(event, stream_seq=9)
    assert record.trace_id == untraced_id("host3", ms(40)) == "host3-20261201T100000.040000Z"
    assert not record.traced and record.started_at == ms(40)
    t = timeline([record])
    assert t.hops == [] and t.gap_ms_upper_bound is None and not t.gap_clocks_differ
    assert (t.started, t.started_clock, t.tier) == (ms(40), "host3", "source")


def test_the_same_hop_in_two_events_is_kept_once_even_if_stored_twice() -> None:
    one = record_of(flip("host1", ["host3"], 2.6, 3.1), stream_seq=7)
    assert len(merge_hops([one, one])) == 7


def test_what_the_store_cannot_hold_is_refused_naming_the_field_and_text_is_cleaned() -> None:
    with pytest.raises(MalformedFailover, match=r"^node:"):
        record_of(flip("h" * 64, ["host3"], 2.6, 3.1), stream_seq=1)
    with pytest.raises(MalformedFailover, match=r"^to_colour:"):
        record_of(flip("host1", ["host3"], 2.6, 3.1, to_colour="ultraviolet-infrared"), 1)
    dirty = record_of(flip("host1", ["host3"], 2.6, 3.1, reason="bad\x00" + "x" * 600), 1)
    assert "\x00" not in dirty.reason and len(dirty.reason) == 500


@pytest.mark.parametrize(
    ("reason", "link"),
    [("central: link 17", 17), ("central: link 3 down", 3), ("bfd red to host3 down", None),
     ("central: re-protection", None), ("linked 4", None)],
)  # fmt: skip
def test_the_link_is_read_from_a_central_flips_reason(reason: str, link: int | None) -> None:
    assert link_of(reason) == link


def reprotection(done: float) -> FailoverEvent:
    trace = CENTRAL.then("reprotected", "pathcomp", at=ms(done))
    return FailoverEvent(node="pathcomp", peers=["leaf1", "spine2"], to_colour="planned",
                         at=ms(done), reason="re-protection: link 17 down",
                         tier="reprotection", trace=trace)  # fmt: skip


def test_the_end_of_re_protection_is_the_traces_last_hop_and_moves_nothing() -> None:
    t = timeline([
        record_of(flip("host1", ["host3", "host4"], 2.6, 3.1), stream_seq=7),
        record_of(reprotection(180.4), stream_seq=9),
    ])  # fmt: skip
    assert t.hops[-1].step == "reprotected" and t.hops[-1].clock == "pathcomp"
    assert t.reprotected_ms == pytest.approx(178.5)  # pathcomp_received 1.9 -> 180.4
    assert t.reprotected_nodes == 2
    # what moved traffic is what the timeline reports as moved
    assert (t.tier, t.sources, t.pairs_moved) == ("central", ["host1"], 2)
    assert [m.node for m in t.moved] == ["host1"]


def test_a_failure_only_re_planned_is_a_timeline_of_pathcomp_with_no_gap() -> None:
    t = timeline([record_of(reprotection(50.0), stream_seq=3)])
    assert (t.tier, t.sources, t.gap_ms_upper_bound) == ("reprotection", ["pathcomp"], None)
    assert (t.pairs_moved, t.reprotected_nodes) == (0, 2)  # it rewrote nodes, moved no pair
    assert t.reprotected_ms == pytest.approx(48.1)
