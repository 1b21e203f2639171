"""Health's core: what agent reports do to links, and what it asks the store to remember
(fake clock, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from thorn.events import AgentReport, BfdReport, CarrierReport, CountersReport
from thorn.health_records import (
    FailureClosed,
    FailureOpened,
    FailureWorsened,
    LinkForgotten,
    LinkStateRecord,
)
from thorn_health.core import SAMPLES, HealthCore, LinkEnds, loss_fraction
from thorn_health.linkstate import HealthConfig, LinkState

T0 = 1_800_000_000.0  # wall-clock seconds: the core's `now`
LINKS = {
    1: LinkEnds(1, "leaf1", "swp1", "spine1", "swp1"),
    2: LinkEnds(2, "leaf1", "swp2", "spine2", "swp1"),
}


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def carrier(port: str, up: bool, now: float) -> CarrierReport:
    return CarrierReport(
        port=port, admin_up=True, carrier=up, oper_state="up" if up else "down",
        detected_at=at(now),
    )  # fmt: skip


def counters(port: str, packets: int, lost: int, now: float) -> CountersReport:
    return CountersReport(
        port=port, rx_packets=packets, tx_packets=0, rx_errors=lost, tx_errors=0,
        rx_dropped=0, tx_dropped=0, at=at(now),
    )  # fmt: skip


def report(node: str, seq: int, *items: Any, now: float = T0) -> AgentReport:
    return AgentReport(node=node, seq=seq, sent_at=at(now), items=list(items))


def core_with_links(**kwargs: Any) -> HealthCore:
    core = HealthCore(**kwargs)
    core.set_topology(LINKS, T0)
    return core


def test_a_carrier_report_speaks_for_the_link_with_that_end() -> None:
    core = core_with_links()
    out = core.apply(report("spine2", 0, carrier("swp1", True, T0)), T0)
    assert [(t.link_id, t.previous, t.state) for t in out.transitions] == [(2, None, "up")]
    assert out.applied == 1 and out.unknown == []
    out = core.apply(report("leaf1", 0, carrier("swp2", False, T0 + 1)), T0 + 1.002)
    [down] = out.transitions
    assert (down.link_id, down.previous, down.state) == (2, "up", "down")
    assert down.source == "carrier:leaf1:swp2"


def test_a_failure_is_recorded_with_its_detection_times_and_closed_when_the_up_hold_ends() -> None:
    core = core_with_links()
    core.apply(report("leaf1", 0, carrier("swp1", True, T0)), T0)
    out = core.apply(report("leaf1", 1, carrier("swp1", False, T0 + 10)), T0 + 10.004)
    [opened] = [r for r in out.records if isinstance(r, FailureOpened)]
    assert (opened.link_id, opened.state, opened.source) == (1, "down", "carrier:leaf1:swp1")
    assert (opened.a_node, opened.a_port, opened.b_node, opened.b_port) == (
        "leaf1", "swp1", "spine1", "swp1",
    )  # fmt: skip
    assert opened.started_at == opened.detected_at == at(T0 + 10)
    assert opened.received_at == at(T0 + 10.004)
    assert opened.detection_latency_ms is not None and abs(opened.detection_latency_ms - 4) < 0.01
    out = core.apply(report("leaf1", 2, carrier("swp1", True, T0 + 20)), T0 + 20)
    assert out.transitions == []  # up again: held for THORN_LINK_UP_HOLD_MS first
    assert core.next_tick(T0 + 20) == pytest.approx(1.0)
    out = core.tick(T0 + 21)
    [closed] = [r for r in out.records if isinstance(r, FailureClosed)]
    assert (closed.link_id, closed.ended_at, closed.source) == (
        1, at(T0 + 21), "carrier:leaf1:swp1",
    )  # fmt: skip


def test_unknown_ports_and_nodes_are_counted_not_refused() -> None:
    core = core_with_links()
    out = core.apply(report("leaf1", 0, carrier("swp1", True, T0), carrier("swp9", True, T0)), T0)
    assert out.applied == 1 and out.unknown == ["carrier leaf1:swp9"]
    out = core.apply(report("leaf7", 0, carrier("swp1", False, T0)), T0)
    assert out.applied == 0 and out.transitions == []


def test_single_hop_bfd_is_a_source_of_the_link_and_multihop_only_a_session() -> None:
    core = core_with_links()
    single = BfdReport(local="10.0.0.0", peer="10.0.0.1", port="swp1", state="down", diag=1,
                       detected_at=at(T0))  # fmt: skip
    multi = BfdReport(local="10.224.0.1", peer="10.224.0.2", multihop=True, state="down",
                      diag=1, detected_at=at(T0))  # fmt: skip
    out = core.apply(report("leaf1", 0, single, multi), T0)
    assert [(t.link_id, t.state, t.source) for t in out.transitions] == [
        (1, "down", "bfd:leaf1:swp1")
    ]
    assert out.applied == 2
    sessions = {(s.multihop, s.link_id, s.state) for s in core.sessions.values()}
    assert sessions == {(False, 1, "down"), (True, None, "down")}


def test_bfd_admin_down_releases_the_link_and_init_changes_nothing() -> None:
    core = core_with_links(config=HealthConfig(up_hold=0))

    def bfd(state: Literal["admin_down", "down", "init", "up"]) -> BfdReport:
        return BfdReport(local="a", peer="b", port="swp1", state=state, diag=0,
                         detected_at=at(T0))  # fmt: skip

    core.apply(report("leaf1", 0, carrier("swp1", True, T0), bfd("up")), T0)
    assert [t.state for t in core.apply(report("leaf1", 1, bfd("down")), T0 + 1).transitions] == [
        "down"
    ]
    assert core.apply(report("leaf1", 2, bfd("init")), T0 + 2).transitions == []
    [back] = core.apply(report("leaf1", 3, bfd("admin_down")), T0 + 3).transitions
    assert back.state == "up"  # admin-down is a peer's decision, not a failure
    assert "bfd:leaf1:swp1" not in core.links[1].sources


def test_counters_give_loss_from_successive_reports_and_degrade_the_link() -> None:
    core = core_with_links(min_packets=100)
    core.apply(report("leaf1", 0, carrier("swp1", True, T0), counters("swp1", 1000, 0, T0)), T0)
    out = core.apply(report("leaf1", 1, counters("swp1", 1990, 10, T0 + 5)), T0 + 5)
    assert out.transitions == []  # 10 of 1,000: 1 %, not above the threshold
    out = core.apply(report("leaf1", 2, counters("swp1", 2940, 60, T0 + 10)), T0 + 10)
    [degraded] = out.transitions
    assert (degraded.state, degraded.source) == ("degraded", "counters:leaf1:swp1")
    assert [r.state for r in out.records if isinstance(r, FailureOpened)] == ["degraded"]
    # the other end's counters are clean, but a link is as lossy as its worse end
    core.apply(report("spine1", 0, counters("swp1", 0, 0, T0)), T0 + 10)
    assert core.apply(report("spine1", 1, counters("swp1", 5000, 0, T0)), T0 + 11).transitions == []
    # the loss clears, and the degradation ends
    assert [
        t.state for t in core.apply(report("leaf1", 3, counters("swp1", 4000, 60, T0)), T0 + 15)
        .transitions
    ] == ["up"]  # fmt: skip


def test_each_ends_drops_and_errors_are_kept_over_time_and_forgotten_with_the_link() -> None:
    core = core_with_links()
    core.apply(report("leaf1", 0, counters("swp1", 1000, 0, T0)), T0)
    core.apply(report("leaf1", 1, counters("swp1", 1990, 10, T0 + 10)), T0 + 10)
    core.apply(report("spine1", 0, counters("swp1", 50, 0, T0 + 10)), T0 + 10)
    core.apply(report("spine1", 1, counters("swp1", 90, 2, T0 + 20)), T0 + 20)
    core.apply(report("leaf1", 2, counters("swp1", 5, 0, T0 + 20)), T0 + 20)  # a reset
    core.apply(report("leaf1", 3, counters("swp1", 505, 1, T0 + 30)), T0 + 30)
    samples = list(core.samples[1])
    assert [(c.port, c.seconds, c.rx_packets, c.rx_errors) for c in samples] == [
        ("leaf1:swp1", 10.0, 990, 10), ("spine1:swp1", 10.0, 40, 2),
        ("leaf1:swp1", 10.0, 500, 1),  # no interval across the reset
    ]  # fmt: skip
    for i in range(SAMPLES + 5):  # bounded
        core.apply(report("leaf1", 4 + i, counters("swp1", 600 + i, 1, T0 + 40 + i)), T0 + 40 + i)
    assert len(core.samples[1]) == SAMPLES
    core.set_topology({2: LINKS[2]}, T0 + 500)
    assert 1 not in core.samples


def test_loss_needs_enough_packets_and_a_counter_reset_only_restarts_the_baseline() -> None:
    base = counters("swp1", 1000, 0, T0)
    assert loss_fraction(base, counters("swp1", 1010, 5, T0), 100) == (None, False)
    assert loss_fraction(base, counters("swp1", 10, 0, T0), 100) == (None, True)
    loss, rebase = loss_fraction(base, counters("swp1", 1900, 100, T0), 100)
    assert rebase and loss == 0.1


def test_a_flap_storm_is_one_open_failure_once_the_link_is_suppressed() -> None:
    core = core_with_links(config=HealthConfig(up_hold=0))
    core.apply(report("leaf1", 0, carrier("swp1", True, T0)), T0)
    records = []
    now = T0
    for _ in range(50):
        now += 0.05
        records += core.apply(report("leaf1", 0, carrier("swp1", False, now)), now).records
        now += 0.05
        records += core.apply(report("leaf1", 0, carrier("swp1", True, now)), now).records
    history = [(type(r).__name__, getattr(r, "state", None)) for r in records
               if not isinstance(r, LinkStateRecord)]  # fmt: skip
    # two flaps each open and close a failure; the third suppresses the link: one failure,
    # flapping, open until dampening lets the link back
    assert history == [("FailureOpened", "down"), ("FailureClosed", None)] * 2 + [
        ("FailureOpened", "flapping")
    ]
    assert core.links[1].state is LinkState.flapping and core.open_failures == {1: "flapping"}


def test_a_degraded_link_that_goes_down_is_one_failure_that_got_worse() -> None:
    core = core_with_links(min_packets=10)
    core.apply(report("leaf1", 0, carrier("swp1", True, T0), counters("swp1", 0, 0, T0)), T0)
    out = core.apply(report("leaf1", 1, counters("swp1", 50, 50, T0)), T0 + 1)
    assert [r.state for r in out.records if isinstance(r, FailureOpened)] == ["degraded"]
    out = core.apply(report("leaf1", 2, carrier("swp1", False, T0 + 2)), T0 + 2)
    assert [r for r in out.records if not isinstance(r, LinkStateRecord)] == [
        FailureWorsened(1, "down")
    ]


def test_dampening_reuse_is_a_tick_at_the_time_the_core_asks_for() -> None:
    core = core_with_links()
    now = T0
    core.apply(report("leaf1", 0, carrier("swp1", True, now)), now)
    for _ in range(5):
        now += 0.05
        core.apply(report("leaf1", 0, carrier("swp1", False, now)), now)
        now += 0.05
        core.apply(report("leaf1", 0, carrier("swp1", True, now)), now)
    wait = core.next_tick(now)
    assert wait is not None and wait > 10
    assert core.tick(now + wait - 1).transitions == []
    out = core.tick(now + wait + 0.01)
    assert [(t.state, t.source) for t in out.transitions] == [("up", "dampening")]
    assert [type(r).__name__ for r in out.records if not isinstance(r, LinkStateRecord)] == [
        "FailureClosed"
    ]
    assert core.next_tick(now + wait + 0.01) is None


def test_a_link_suppressed_before_a_restart_is_reused_on_time_by_the_restarted_core() -> None:
    first = core_with_links()
    stored: dict[int, LinkStateRecord] = {}
    now = T0
    first.apply(report("leaf1", 0, carrier("swp1", True, now)), now)
    for _ in range(5):
        for up in (False, True):
            now += 0.05
            for r in first.apply(report("leaf1", 0, carrier("swp1", up, now)), now).records:
                if isinstance(r, LinkStateRecord):
                    stored[r.link_id] = r
    assert stored[1].state == "flapping"
    second = HealthCore()
    second.restore(stored.values(), {1: "flapping"})
    second.set_topology(LINKS, now)  # no report, no transition: only time can reuse it
    wait = second.next_tick(now)
    assert wait is not None and wait > 10
    out = second.tick(now + wait + 0.01)
    assert [(t.link_id, t.state, t.source) for t in out.transitions] == [(1, "up", "dampening")]
    assert second.next_tick(now + wait + 0.01) is None


def test_a_drained_link_or_node_follows_the_topology() -> None:
    core = core_with_links()
    core.apply(report("leaf1", 0, carrier("swp1", True, T0)), T0)
    drained = {**LINKS, 1: LinkEnds(1, "leaf1", "swp1", "spine1", "swp1", drained=True)}
    out = core.set_topology(drained, T0 + 1)
    assert [(t.link_id, t.state, t.source) for t in out.transitions] == [(1, "drained", "drain")]
    assert not any(isinstance(r, FailureOpened) for r in out.records)  # a decision, no failure
    assert [t.state for t in core.set_topology(LINKS, T0 + 2).transitions] == ["up"]


def test_a_link_that_leaves_the_topology_is_forgotten_and_its_failure_closed() -> None:
    core = core_with_links()
    core.apply(report("leaf1", 0, carrier("swp1", False, T0)), T0)
    assert core.counts()["down"] == 1 and core.counts()["unknown"] == 1
    out = core.set_topology({2: LINKS[2]}, T0 + 1)
    assert out.records == [FailureClosed(1, at(T0 + 1), "topology"), LinkForgotten(1)]
    assert core.counts()["down"] == 0 and core.counts()["unknown"] == 1
    assert core.apply(report("leaf1", 1, carrier("swp1", True, T0)), T0 + 2).unknown == [
        "carrier leaf1:swp1"
    ]


def test_sequence_gaps_and_restarts_are_noticed() -> None:
    core = core_with_links()
    assert core.apply(report("leaf1", 4, carrier("swp1", True, T0)), T0).seq_gap == 0
    assert core.apply(report("leaf1", 5, carrier("swp1", True, T0)), T0).seq_gap == 0
    assert core.apply(report("leaf1", 9, carrier("swp1", True, T0)), T0).seq_gap == 3
    assert core.apply(report("leaf1", 0, carrier("swp1", True, T0)), T0).seq_restart


def test_a_report_retried_after_a_lost_reply_is_applied_once() -> None:
    """The agent resends the same (run, seq) when health's reply timed out; it may carry
    items queued since. Only those are applied; a restarted agent (new run) is not a retry."""
    core = core_with_links()
    down = carrier("swp1", False, T0)
    first = AgentReport(node="leaf1", seq=3, run="aa", sent_at=at(T0), items=[down])
    assert core.apply(first, T0).applied == 1
    up = carrier("swp1", True, T0 + 1)
    retry = AgentReport(node="leaf1", seq=3, run="aa", sent_at=at(T0 + 1), items=[down, up])
    out = core.apply(retry, T0 + 1)
    assert out.duplicate and out.applied == 1  # only the new item
    again = AgentReport(node="leaf1", seq=3, run="bb", sent_at=at(T0 + 2), items=[down])
    out = core.apply(again, T0 + 2)
    assert not out.duplicate and out.applied == 1


def test_a_restarted_core_agrees_with_its_stored_states_and_publishes_nothing_new() -> None:
    first = core_with_links(config=HealthConfig(up_hold=0))
    stored: dict[int, LinkStateRecord] = {}  # what the store keeps: each link's last record
    open_failures: dict[int, str] = {}

    def run(r: AgentReport, now: float) -> None:
        for record in first.apply(r, now).records:
            if isinstance(record, LinkStateRecord):
                stored[record.link_id] = record
            elif isinstance(record, FailureOpened):
                open_failures[record.link_id] = record.state

    run(report("leaf1", 0, carrier("swp1", True, T0), carrier("swp2", True, T0)), T0)
    run(report("spine1", 0, carrier("swp1", False, T0 + 1)), T0 + 1)
    assert stored[1].state == "down" and dict(stored[1].sources) == {
        "carrier:leaf1:swp1": True, "carrier:spine1:swp1": False,
    }  # fmt: skip
    assert stored[2].state == "up" and open_failures == {1: "down"}

    second = HealthCore(HealthConfig(up_hold=0))
    second.restore(stored.values(), open_failures)
    assert second.set_topology(LINKS, T0 + 60).transitions == []
    # agents' periodic snapshots after the restart: nothing changed, nothing is published
    snapshot = report("leaf1", 7, carrier("swp1", True, T0 + 60), carrier("swp2", True, T0 + 60))
    assert second.apply(snapshot, T0 + 60).transitions == []
    still_down = report("spine1", 3, carrier("swp1", False, T0 + 61))
    assert second.apply(still_down, T0 + 61).transitions == []
    # the repair: published once, and it closes the failure the first run opened
    out = second.apply(report("spine1", 4, carrier("swp1", True, T0 + 62)), T0 + 62)
    assert [(t.previous, t.state) for t in out.transitions] == [("down", "up")]
    assert [r for r in out.records if isinstance(r, FailureClosed)] == [
        FailureClosed(1, at(T0 + 62), "carrier:spine1:swp1")
    ]


def test_only_machines_that_changed_are_saved() -> None:
    core = core_with_links()
    first = core.apply(report("leaf1", 0, carrier("swp1", True, T0)), T0)
    assert [r.link_id for r in first.records if isinstance(r, LinkStateRecord)] == [1]
    again = core.apply(report("leaf1", 1, carrier("swp1", True, T0 + 5)), T0 + 5)
    assert again.records == []  # a snapshot that agrees costs no write
    assert core.counts()["up"] == 1 and core.counts()["unknown"] == 1


def test_the_failure_of_a_link_down_at_first_sight_starts_at_its_detection() -> None:
    core = core_with_links()
    out = core.apply(report("leaf1", 0, carrier("swp1", False, T0 - 2)), T0)
    [opened] = [r for r in out.records if isinstance(r, FailureOpened)]
    assert opened.started_at == at(T0 - 2) and opened.received_at == at(T0)
    assert opened.detection_latency_ms == timedelta(seconds=2).total_seconds() * 1000
