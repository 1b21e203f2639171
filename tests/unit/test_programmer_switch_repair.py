"""A switch's routes with their loop-free backups, and its local repair (pure parts).

What is installed: per route its primary at metric 10 and, where pathcomp found one, the
backup at metric 20, and the U-turn rule of each protected primary's port (its table holds
the backups); a withdrawn port's primaries are left to their backups. What changes:
the diff touches only the route that differs. The route messages are checked against
pyroute2's own decoder; the kernel's side is tests/fabric/test_switch_repair.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

import pytest
from pyroute2.netlink.rtnl.fibmsg import fibmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from thorn.desired import Backup, HostState, Route, SwitchState
from thorn.events import FailoverEvent
from thorn_programmer.drivers.netlink import ApplyReport
from thorn_programmer.drivers.routes import (
    RTM_DELROUTE,
    RTM_DELRULE,
    RTM_NEWROUTE,
    RTM_NEWRULE,
    parse_thorn_route,
    parse_thorn_rule,
    route_message,
    rule_message,
)
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.intent import NextHop, SwitchIntent, UnderlayRoute, host_intent, switch_intent
from thorn_programmer.kernel import (
    BACKUP_METRIC,
    PRIMARY_METRIC,
    RTPROT_THORN,
    UTURN_RULE_PRIORITY,
    Change,
    PortRule,
    diff,
    uturn_table,
)
from thorn_programmer.kernel import Route as KernelRoute
from thorn_programmer.monitor import LinkEvent, OperState
from thorn_programmer.netlink.constants import NlmFlag
from thorn_programmer.reconcile import reconcile
from thorn_programmer.render import flower_objects, switch_objects
from thorn_programmer.repair import LocalRepair

SPINE2 = Backup(port="swp2", neighbour="spine2", via="10.0.0.35")


def state(*routes: Route) -> SwitchState:
    return SwitchState(node="leaf1", plan_revision=3, topology_revision=7, routes=list(routes))


def route(prefix: str = "10.224.0.16/32", backup: Backup | None = SPINE2,
          port: str = "swp1") -> Route:  # fmt: skip
    return Route(prefix=prefix, colour="red", port=port, neighbour="spine1", via="10.0.0.33",
                 stage=2, backup=backup)  # fmt: skip


def rows(objects: Sequence[Any]) -> list[tuple[str, str, str | None, int]]:
    return [(o.prefix, o.dev, o.via, o.metric) for o in objects]


def test_a_route_with_a_backup_is_its_primary_at_metric_10_and_its_backup_at_metric_20() -> None:
    assert (PRIMARY_METRIC, BACKUP_METRIC) == (10, 20)
    assert rows(switch_objects(switch_intent(state(route())))) == [
        ("10.224.0.16/32", "swp1", "10.0.0.33", 10),
        ("10.224.0.16/32", "swp2", "10.0.0.35", 20),
    ]


def test_a_route_without_a_backup_is_one_route_at_metric_10() -> None:
    assert rows(switch_objects(switch_intent(state(route(backup=None))))) == [
        ("10.224.0.16/32", "swp1", "10.0.0.33", 10),
    ]


def test_a_hosts_uplink_route_is_one_route_at_metric_10_whatever_its_document_says() -> None:
    host = HostState(node="h1", plan_revision=1, topology_revision=1,
                     teps={"red": "10.224.0.1"}, routes=[route("10.224.0.0/16")], local=[],
                     vnis=[], blue_peers=[])  # fmt: skip
    objects = [o for o in flower_objects(host_intent(host, [])) if isinstance(o, KernelRoute)]
    assert rows(objects) == [("10.224.0.0/16", "swp1", "10.0.0.33", 10)]


def test_a_withdrawn_port_leaves_its_routes_to_their_backups() -> None:
    doc = state(
        route("10.224.0.16/32"),
        route("10.224.0.17/32", backup=None),  # no backup: the primary stays
        route("10.224.0.18/32", backup=Backup(port="swp1", neighbour="spine1", via="10.0.0.33"),
              port="swp2"),  # its backup is on the withdrawn port: nothing changes
    )  # fmt: skip
    assert rows(switch_objects(switch_intent(doc, withdrawn={"swp1"}))) == [
        ("10.224.0.16/32", "swp2", "10.0.0.35", 20),
        ("10.224.0.17/32", "swp1", "10.0.0.33", 10),
        ("10.224.0.18/32", "swp2", "10.0.0.33", 10),
        ("10.224.0.18/32", "swp1", "10.0.0.33", 20),
    ]
    # Both ports withdrawn: taking a primary out would gain nothing, so it stays.
    both = switch_objects(switch_intent(state(route()), withdrawn={"swp1", "swp2"}))
    assert rows(both) == [("10.224.0.16/32", "swp1", "10.0.0.33", 10),
                          ("10.224.0.16/32", "swp2", "10.0.0.35", 20)]  # fmt: skip


def ops(changes: list[Change]) -> list[tuple[str, int, str]]:
    return [(c.op, c.obj.metric, c.obj.dev) for c in changes if isinstance(c.obj, KernelRoute)]


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, SPINE2, [("add", 20, "swp2")]),
        (SPINE2, Backup(port="swp3", neighbour="spine3", via="10.0.0.37"),
         [("replace", 20, "swp3")]),
        (SPINE2, None, [("delete", 20, "swp2")]),
        (SPINE2, SPINE2, []),
    ],
    ids=["a backup appears", "the backup changes", "the backup goes", "nothing changes"],
)  # fmt: skip
def test_a_change_of_backup_touches_the_backup_route_only(
    before: Backup | None, after: Backup | None, expected: list[tuple[str, int, str]]
) -> None:
    old = switch_objects(switch_intent(state(route(backup=before))))
    new = switch_objects(switch_intent(state(route(backup=after))))
    assert ops(diff(new, old)) == expected


def test_a_route_of_an_older_version_without_a_metric_is_replaced_make_before_break() -> None:
    older = [KernelRoute("10.224.0.16/32", "swp1", "10.0.0.33", metric=0)]
    changes = diff(switch_objects(switch_intent(state(route()))), older)
    assert ops(changes) == [("add", 10, "swp1"), ("add", 20, "swp2"), ("delete", 0, "swp1")]


def test_each_protected_primary_port_gets_one_u_turn_rule_whose_table_holds_the_backups() -> None:
    tables = {"swp1": uturn_table(11), "swp2": uturn_table(12), "swp3": uturn_table(13)}
    intent = switch_intent(state(
        route("10.224.0.16/32"),
        route("10.224.0.17/32"),
        route("fd00:224::/64", backup=Backup(port="swp2", neighbour="spine2", via="fe80::2")),
        route("10.224.0.18/32", backup=None, port="swp3"),  # unprotected: no U-turn
    ))  # fmt: skip
    objects = switch_objects(intent, tables)
    assert [o for o in objects if isinstance(o, PortRule)] == [
        PortRule(family=4, iif="swp1", table=0x70000000 + 11, priority=UTURN_RULE_PRIORITY),
        PortRule(family=6, iif="swp1", table=0x70000000 + 11, priority=UTURN_RULE_PRIORITY),
    ]
    uturns = [(o.prefix, o.dev, o.metric) for o in objects
              if isinstance(o, KernelRoute) and o.table == 0x70000000 + 11]  # fmt: skip
    assert uturns == [("10.224.0.16/32", "swp2", 20), ("10.224.0.17/32", "swp2", 20),
                      ("fd00:224::/64", "swp2", 20)]  # fmt: skip
    # Without the ports' tables (no kernel known yet): the routes alone.
    assert not [o for o in switch_objects(intent) if isinstance(o, PortRule)]
    # A withdraw leaves the U-turn where it was: it only moves the primaries.
    moved = diff(
        switch_objects(switch_intent(state(route()), withdrawn={"swp1"}), tables),
        switch_objects(switch_intent(state(route())), tables),
    )
    assert [(c.op, c.obj.key) for c in moved] == [
        ("delete", ("route", "10.224.0.16/32", 10, 254))]  # fmt: skip


def test_tables_beyond_the_band_are_not_thorns() -> None:
    assert uturn_table(0) is None and uturn_table(0x10000000) is None
    assert uturn_table(1) == 0x70000001
    assert uturn_table(100_020) is not None  # a lab's veth peers are numbered from 100000


def test_a_u_turn_rule_is_added_exclusively_and_deleted_by_all_it_matches_on() -> None:
    rule = PortRule(family=4, iif="swp1", table=uturn_table(7) or 0)
    for op, kind, flags in (
        ("add", RTM_NEWRULE, NlmFlag.REQUEST | NlmFlag.ACK | NlmFlag.CREATE | NlmFlag.EXCL),
        ("delete", RTM_DELRULE, NlmFlag.REQUEST | NlmFlag.ACK),
    ):
        msg = fibmsg(rule_message(op, rule))
        msg.decode()
        assert (msg["header"]["type"], msg["header"]["flags"]) == (kind, flags)
        assert (msg["family"], msg["action"], msg["table"]) == (socket.AF_INET, 1, 0)
        assert (msg.get("FRA_IIFNAME"), msg.get("FRA_TABLE"), msg.get("FRA_PRIORITY"),
                msg.get("FRA_PROTOCOL")) == ("swp1", 0x70000007, UTURN_RULE_PRIORITY,
                                             RTPROT_THORN)  # fmt: skip
    # What the reader makes of the same bytes (a dump's answers have this form).
    assert parse_thorn_rule(rule_message("add", rule)) == rule
    six = PortRule(family=6, iif="eth12", table=uturn_table(300) or 0, priority=20001)
    assert parse_thorn_rule(rule_message("add", six)) == six


def test_a_u_turn_table_route_names_its_table_and_reads_back_so() -> None:
    table = uturn_table(7) or 0
    route_ = KernelRoute("10.224.0.16/32", "swp2", "10.0.0.35", 20, table)
    _, _, msg = decode(route_message("add", route_, 9))
    assert (msg["table"], msg.get("RTA_TABLE")) == (0, table)
    assert parse_thorn_route(route_message("add", route_, 9), {9: "swp2"}) == route_
    # Another table that is not THORN's is not read as THORN's.
    other = KernelRoute("10.224.0.16/32", "swp2", "10.0.0.35", 20, 100)
    assert parse_thorn_route(route_message("add", other, 9), {9: "swp2"}) is None


def decode(message: bytes) -> tuple[int, int, Any]:
    msg = rtmsg(message)
    msg.decode()
    return msg["header"]["type"], msg["header"]["flags"], msg


def test_a_route_is_replaced_by_its_prefix_and_metric_with_protocol_thorn() -> None:
    kind, flags, msg = decode(route_message("add", KernelRoute("10.224.0.16/32", "swp1",
                                                               "10.0.0.33", 10), 7))  # fmt: skip
    assert kind == RTM_NEWROUTE
    assert flags == NlmFlag.REQUEST | NlmFlag.ACK | NlmFlag.CREATE | NlmFlag.REPLACE
    assert (msg["family"], msg["dst_len"], msg["proto"], msg["table"]) == (
        socket.AF_INET, 32, RTPROT_THORN, 254)  # fmt: skip
    assert (msg["scope"], msg["type"]) == (0, 1)  # universe, unicast
    assert (msg.get("RTA_DST"), msg.get("RTA_OIF"), msg.get("RTA_GATEWAY"),
            msg.get("RTA_PRIORITY")) == ("10.224.0.16", 7, "10.0.0.33", 10)  # fmt: skip


def test_a_connected_route_has_link_scope_and_an_ipv6_one_its_family() -> None:
    _, _, v4 = decode(route_message("add", KernelRoute("10.9.0.0/24", "swp3", None, 10), 3))
    assert (v4["scope"], v4.get("RTA_GATEWAY")) == (253, None)
    _, _, v6 = decode(route_message("replace", KernelRoute("fd00:224::/64", "swp1",
                                                           "fe80::1", 20), 4))  # fmt: skip
    assert (v6["family"], v6["dst_len"], v6.get("RTA_DST")) == (socket.AF_INET6, 64, "fd00:224::")
    assert (v6.get("RTA_GATEWAY"), v6.get("RTA_PRIORITY")) == ("fe80::1", 20)


def test_a_delete_names_the_metric_device_and_gateway_so_only_that_route_goes() -> None:
    kind, flags, msg = decode(route_message("delete", KernelRoute("10.224.0.16/32", "swp1",
                                                                  "10.0.0.33", 10), 7))  # fmt: skip
    assert (kind, flags) == (RTM_DELROUTE, NlmFlag.REQUEST | NlmFlag.ACK)
    assert (msg["proto"], msg["scope"], msg["type"]) == (RTPROT_THORN, 255, 0)  # any scope, type
    assert (msg.get("RTA_OIF"), msg.get("RTA_GATEWAY"), msg.get("RTA_PRIORITY")) == (
        7, "10.0.0.33", 10)  # fmt: skip
    # Read back from an older version (no metric), its device gone: neither is matched on.
    _, _, loose = decode(route_message("delete", KernelRoute("10.224.0.16/32", "?",
                                                             "10.0.0.33", 0), None))  # fmt: skip
    assert (loose.get("RTA_OIF"), loose.get("RTA_PRIORITY")) == (None, None)


class Recording(SwitchRouteDriver):
    """The switch driver with its kernel side replaced by a record of the changes."""

    def __init__(self) -> None:
        super().__init__(None, None, None)
        self.changes: list[list[Change]] = []

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        self.changes.append(list(changes))
        await asyncio.sleep(0)  # a real apply yields to the loop
        return ApplyReport(applied=list(changes), sendmsgs=1 if changes else 0)


def protected() -> SwitchIntent:
    backup = NextHop("swp2", "10.0.0.35")
    return SwitchIntent("leaf1", 3, (
        UnderlayRoute("10.224.0.16/32", "swp1", "10.0.0.33", backup),
        UnderlayRoute("10.224.0.17/32", "swp1", "10.0.0.33", backup),
        UnderlayRoute("10.224.0.18/32", "swp1", "10.0.0.33"),
        UnderlayRoute("10.240.0.16/32", "swp2", "10.0.0.35", NextHop("swp1", "10.0.0.33")),
    ))  # fmt: skip


async def test_a_withdrawn_port_loses_its_protected_primaries_until_it_is_restored() -> None:
    driver = Recording()
    driver.render(protected())  # what reconcile last applied
    report = await driver.withdraw_port("swp1")
    assert [(c.op, c.obj.key) for c in driver.changes[-1]] == [
        ("delete", ("route", "10.224.0.16/32", 10, 254)),
        ("delete", ("route", "10.224.0.17/32", 10, 254)),
    ]
    assert len(report.applied) == 2
    rendered = driver.render(protected())  # the controller's intent, unchanged
    assert ("route", "10.224.0.16/32", 10, 254) not in {o.key for o in rendered}
    await driver.restore_port("swp1")
    assert [(c.op, c.obj.key) for c in driver.changes[-1]] == [
        ("add", ("route", "10.224.0.16/32", 10, 254)),
        ("add", ("route", "10.224.0.17/32", 10, 254)),
        # and whatever else goes through the port, in case it was admin down meanwhile
        # (which deleted its routes); an add of a route still there changes nothing
        ("add", ("route", "10.224.0.18/32", 10, 254)),
        ("add", ("route", "10.240.0.16/32", 20, 254)),
    ]
    assert driver.render(protected()) == switch_objects(protected())


def link(ifname: str, admin_up: bool) -> LinkEvent:
    return LinkEvent(ifname, 7, admin_up, admin_up, OperState.UP if admin_up else
                     OperState.DOWN, False, 0, None)  # fmt: skip


async def test_a_port_back_from_admin_down_gets_all_its_routes_again_at_once() -> None:
    """The kernel deleted them when the port went down; they must be back before the
    neighbour's BFD session comes Up and sends traffic this way."""
    driver, repair = Recording(), LocalRepair("spine1")
    repair.attach(driver)
    driver.render(protected())
    repair.link(link("swp1", True))  # what the monitor's first dump says: nothing to do
    repair.link(link("swp1", False))
    await repair.idle()
    assert driver.changes == []
    repair.link(link("swp1", True))
    await repair.idle()
    assert [(c.op, c.obj.key) for c in driver.changes[-1]] == [
        ("add", ("route", "10.224.0.16/32", 10, 254)),
        ("add", ("route", "10.224.0.17/32", 10, 254)),
        ("add", ("route", "10.224.0.18/32", 10, 254)),
        ("add", ("route", "10.240.0.16/32", 20, 254)),
    ]
    assert repair.last is not None and (repair.last.op, repair.last.routes) == ("reassert", 4)


async def test_a_withdrawn_port_back_from_admin_down_keeps_its_protected_primaries_out() -> None:
    driver, repair = Recording(), LocalRepair("leaf1")
    repair.attach(driver)
    driver.render(protected())
    repair.link(link("swp1", False))
    repair.withdraw("swp1", "bfd down")
    repair.link(link("swp1", True))  # carrier is back, BFD not Up yet
    await repair.idle()
    readded = {c.obj.key for c in driver.changes[-1]}
    assert ("route", "10.224.0.16/32", 10, 254) not in readded  # left to its backup until BFD Up
    assert ("route", "10.224.0.18/32", 10, 254) in readded  # no backup: it stays in any case


async def test_a_quick_down_then_up_ends_with_the_port_restored() -> None:
    driver, repair = Recording(), LocalRepair("leaf1")
    repair.attach(driver)
    driver.render(protected())
    repair.withdraw("swp1", "bfd down")
    repair.restore("swp1", "bfd up")  # before the withdraw has run
    repair.restore("swp1", "bfd up")  # once more: nothing left to do
    await repair.idle()
    assert [[c.op for c in changes] for changes in driver.changes] == [
        ["delete", "delete"], ["add"] * 4]  # fmt: skip
    assert repair.withdrawn == set()
    assert repair.last is not None and (repair.last.op, repair.last.routes) == ("restore", 4)


async def test_a_port_whose_session_is_up_again_gets_its_primaries_back_after_the_hold() -> None:
    driver, repair = Recording(), LocalRepair("leaf1", up_hold=0.05)
    repair.attach(driver)
    driver.render(protected())
    repair.withdraw("swp1", "bfd down")
    await repair.idle()
    repair.restore_after_hold("swp1", "bfd up")
    repair.restore_after_hold("swp1", "bfd up")  # Up again: the hold already runs
    await asyncio.sleep(0.03)
    assert repair.holding() == ["swp1"] and repair.withdrawn == {"swp1"}
    await asyncio.sleep(0.04)
    await repair.idle()
    assert repair.holding() == [] and repair.withdrawn == set()
    assert [[c.op for c in changes] for changes in driver.changes] == [
        ["delete", "delete"], ["add"] * 4]  # fmt: skip
    assert repair.last is not None and repair.last.reason == "bfd up, held 0.05 s"


async def test_a_session_down_again_during_the_hold_keeps_the_port_withdrawn() -> None:
    """A gray link's session comes Up for a few tens of ms at a time: its traffic stays on
    the backups."""
    driver, repair = Recording(), LocalRepair("leaf1", up_hold=0.05)
    repair.attach(driver)
    driver.render(protected())
    repair.withdraw("swp1", "bfd down")
    for _ in range(3):
        repair.restore_after_hold("swp1", "bfd up")
        await asyncio.sleep(0.03)
        repair.withdrawn_by_runtime("swp1", "bfd down", 2, 0.2, ())
    await asyncio.sleep(0.08)
    await repair.idle()
    assert repair.holding() == [] and repair.withdrawn == {"swp1"}
    assert [c.op for changes in driver.changes for c in changes] == ["delete", "delete"]


async def test_a_removed_session_restores_its_port_at_once() -> None:
    driver, repair = Recording(), LocalRepair("leaf1", up_hold=10)
    repair.attach(driver)
    driver.render(protected())
    repair.withdraw("swp1", "bfd down")
    repair.restore_after_hold("swp1", "bfd up")
    repair.restore("swp1", "bfd session removed")
    await repair.idle()
    assert repair.holding() == [] and repair.withdrawn == set()


class Paused(Recording):
    """A switch whose kernel read waits until the test lets it go: a reconcile caught
    between reading the kernel and applying what it planned."""

    def __init__(self, installed: list[Any]) -> None:
        super().__init__()
        self.installed = installed
        self.reading, self.go = asyncio.Event(), asyncio.Event()

    async def read(self) -> list[Any]:
        self.reading.set()
        await self.go.wait()
        return list(self.installed)


@pytest.mark.parametrize("op", ["withdraw", "restore"])
async def test_a_local_repair_waits_for_a_reconcile_that_has_read_the_kernel(op: str) -> None:
    """Otherwise the reconcile applies a plan rendered before the repair: one rendered
    before a withdraw puts the primaries back into the failed link, one rendered before a
    restore acts on a kernel the restore changed."""
    driver = Paused(switch_objects(protected()))
    repair = LocalRepair("leaf1")
    repair.attach(driver)
    driver.render(protected())
    if op == "restore":
        driver.withdrawn.add("swp1")
    reconciling = asyncio.create_task(reconcile(driver, protected()))
    await driver.reading.wait()
    (repair.withdraw if op == "withdraw" else repair.restore)("swp1", "bfd")
    await asyncio.sleep(0.02)
    assert driver.changes == []  # the repair waits for the reconcile's apply
    driver.go.set()
    await reconciling
    await repair.idle()
    ops = [c.op for changes in driver.changes for c in changes]
    if op == "withdraw":  # the reconcile found the kernel as planned; the withdraw came after
        assert ops == ["delete", "delete"] and repair.withdrawn == {"swp1"}
    else:  # the reconcile took the withdrawn primaries out; the restore put them back after
        assert ops == ["delete", "delete", *["add"] * 4] and repair.withdrawn == set()


async def test_a_withdraw_with_no_driver_yet_is_kept_for_the_first_rendering() -> None:
    repair = LocalRepair("leaf1")
    repair.withdraw("swp1", "bfd down")
    await repair.idle()
    driver = Recording()
    repair.attach(driver)  # e.g. the agent restarted and opened a new driver
    rendered = driver.render(protected())
    assert ("route", "10.224.0.16/32", 10, 254) not in {o.key for o in rendered}


def carrier(ifname: str, up: bool) -> LinkEvent:
    return LinkEvent(ifname, 7, True, up, OperState.UP if up else OperState.LOWERLAYERDOWN,
                     False, 1_700_000_000_000_000_000, None)  # fmt: skip


async def test_each_switch_repair_is_a_switch_tier_failover_naming_what_it_moved() -> None:
    driver, repair = Recording(), LocalRepair("leaf1")
    repair.attach(driver)
    events: list[FailoverEvent] = []
    repair.on_failover = events.append
    driver.render(protected())
    repair.withdraw("swp1", "bfd to 10.0.0.33 on swp1 down")
    await repair.idle()
    [withdrawn] = events
    assert (withdrawn.tier, withdrawn.node, withdrawn.to_colour) == ("switch", "leaf1", "backup")
    assert withdrawn.peers == ["10.224.0.16/32", "10.224.0.17/32"]  # not .18: it has no backup
    assert withdrawn.reason == "bfd to 10.0.0.33 on swp1 down"
    assert withdrawn.trace is not None
    assert [h.step for h in withdrawn.trace.hops] == ["detected", "agent_applied"]
    assert {h.clock for h in withdrawn.trace.hops} == {"leaf1"}


async def test_carrier_loss_under_protected_primaries_is_recorded_as_the_kernels_repair() -> None:
    driver, repair = Recording(), LocalRepair("leaf1")
    repair.attach(driver)
    events: list[FailoverEvent] = []
    repair.on_failover = events.append
    driver.render(protected())
    for port in ("swp1", "swp2"):
        repair.link(carrier(port, True))
    repair.link(carrier("swp1", False))
    [moved] = events
    assert (moved.tier, moved.kernel_ms, moved.peers) == (
        "switch", 0.0, ["10.224.0.16/32", "10.224.0.17/32"])  # fmt: skip
    assert "carrier lost on swp1" in moved.reason
    repair.link(carrier("swp2", False))  # its primary's backup is on swp1, down too: no repair
    assert len(events) == 1
    repair.link(carrier("swp1", True))
    repair.link(carrier("swp2", True))
    repair.link(carrier("swp2", False))  # now its backup on swp1 takes over
    repair.link(carrier("swp2", False))  # and a repeated state is no new event
    assert len(events) == 2 and events[1].peers == ["10.240.0.16/32"]
