"""An agent's report queue: what a node tells health, in what order, and what it keeps."""

from __future__ import annotations

from datetime import UTC, datetime

from thorn.events import BfdReport, CarrierReport, CountersReport
from thorn_programmer.monitor import LinkCounters, LinkEvent, OperState
from thorn_programmer.reports import MAX_ITEMS, ReportQueue, is_fabric_port

AT = datetime(2026, 11, 30, tzinfo=UTC)


def link(name: str, carrier: bool, at_ns: int = 1, *, deleted: bool = False) -> LinkEvent:
    oper = OperState.UP if carrier else OperState.LOWERLAYERDOWN
    return LinkEvent(name, 5, True, carrier, oper, deleted, at_ns, None)


def carriers(queue: ReportQueue) -> list[tuple[str, bool]]:
    report = queue.next_report()
    assert report is not None
    return [(i.port, i.carrier) for i in report.items if isinstance(i, CarrierReport)]


def test_loopback_and_thorns_own_tunnels_are_not_fabric_ports() -> None:
    assert not is_fabric_port("lo")
    assert not is_fabric_port("thorn-vx")
    assert not is_fabric_port("thv100")
    assert is_fabric_port("swp1") and is_fabric_port("eth0")


def test_every_change_is_reported_in_order_so_dampening_sees_each_flap() -> None:
    q = ReportQueue("leaf1")
    for n, carrier in enumerate([False, True, False, True]):
        assert q.link(link("swp1", carrier, at_ns=n + 1))
    assert carriers(q) == [("swp1", False), ("swp1", True), ("swp1", False), ("swp1", True)]


def test_a_repeated_state_is_not_news() -> None:
    q = ReportQueue("leaf1")
    assert q.link(link("swp1", False, 1))
    assert not q.link(link("swp1", False, 2))  # e.g. an MTU change re-announces the link
    assert len(q) == 1


def test_a_deleted_port_is_reported_without_carrier() -> None:
    q = ReportQueue("leaf1")
    q.link(link("swp1", True, 1))
    q.link(link("swp1", True, 2, deleted=True))
    report = q.next_report()
    assert report is not None
    gone = report.items[-1]
    assert isinstance(gone, CarrierReport)
    assert (gone.carrier, gone.admin_up, gone.oper_state) == (False, False, "notpresent")


def test_a_snapshot_carries_every_port_with_its_counters() -> None:
    q = ReportQueue("leaf1")
    counters = {"swp1": LinkCounters(10, 20, 1, 0, 2, 0)}
    q.snapshot([link("lo", True, 5), link("swp1", True, 5), link("swp2", False, 5)], counters, AT)
    report = q.next_report()
    assert report is not None
    kinds = [(type(i).__name__, i.port) for i in report.items if not isinstance(i, BfdReport)]
    assert kinds == [
        ("CarrierReport", "swp1"),
        ("CountersReport", "swp1"),
        ("CarrierReport", "swp2"),
    ]
    counted = report.items[1]
    assert isinstance(counted, CountersReport) and counted.rx_errors == 1


def test_a_change_read_after_the_dump_began_wins_over_the_dump() -> None:
    q = ReportQueue("leaf1")
    q.link(link("swp1", False, at_ns=200))  # carrier lost while the dump was running
    q.snapshot([link("swp1", True, at_ns=100)], {}, AT)  # the dump read the port before
    assert carriers(q) == [("swp1", False)]


def test_items_stay_queued_until_health_answers_and_seq_rises_per_report() -> None:
    q = ReportQueue("leaf1")
    q.link(link("swp1", False))
    first = q.next_report()
    assert first is not None and first.seq == 0
    again = q.next_report()  # unanswered: the same items go again, with the same seq
    assert again is not None and again.seq == 0 and again.items == first.items
    q.sent(first)
    assert q.next_report() is None
    q.link(link("swp1", True, 2))
    later = q.next_report()
    assert later is not None and later.seq == 1


def test_a_report_holds_at_most_the_schemas_limit() -> None:
    q = ReportQueue("leaf1")
    for n in range(MAX_ITEMS + 10):
        q.link(link(f"p{n}", n % 2 == 0, n + 1))
    first = q.next_report()
    assert first is not None and len(first.items) == MAX_ITEMS
    q.sent(first)
    rest = q.next_report()
    assert rest is not None and len(rest.items) == 10


def test_while_health_is_away_the_oldest_changes_go_first_and_are_counted() -> None:
    q = ReportQueue("leaf1", backlog=3)
    for n in range(5):
        q.link(link("swp1", n % 2 == 0, n + 1))
    assert len(q) == 3 and q.dropped == 2
    assert carriers(q) == [("swp1", True), ("swp1", False), ("swp1", True)]


def test_items_pushed_out_while_a_report_is_in_flight_are_never_lost_uncounted() -> None:
    """The backlog may push out the in-flight report's own items; when health answers, only
    what is left of that report goes, and the newer items stay queued for the next one."""
    q = ReportQueue("leaf1", backlog=3)
    for n in range(3):
        q.link(link(f"p{n}", True, n + 1))
    in_flight = q.next_report()
    assert in_flight is not None and len(in_flight.items) == 3 and in_flight.run == q.run
    for n in range(3, 5):  # two more arrive: the two oldest (in flight) are pushed out
        q.link(link(f"p{n}", True, n + 1))
    assert q.dropped == 0  # they are in the report on its way, not lost
    q.sent(in_flight)
    assert [i.port for i in q.next_report().items] == ["p3", "p4"]  # type: ignore[union-attr]
