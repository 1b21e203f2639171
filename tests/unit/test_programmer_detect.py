"""Which BFD sessions a node runs, what it reports, and when it fails over on its own.

The manager here is a recording stand-in (the real one runs over UDP in the fabric lane:
tests/fabric/test_bfd_*.py and the end-to-end detection tests); these tests pin the policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from thorn.events import BfdReport
from thorn.model import Colour
from thorn_programmer import detect
from thorn_programmer.bfd import BfdEvent, Diag, SessionConfig, SessionStatus, State
from thorn_programmer.detect import (
    BfdSessions,
    Discriminators,
    WantedSession,
    peers_to_watch,
    wanted_sessions,
)
from thorn_programmer.intent import HostIntent, NextHop, Peer, SwitchIntent, UnderlayRoute

TEPS: dict[Colour, str] = {"red": "10.224.0.1", "blue": "10.240.0.1"}


def peer(host: str, n: int, colour: Colour = "red") -> Peer:
    teps: dict[Colour, str] = {"red": f"10.224.0.{n}", "blue": f"10.240.0.{n}"}
    return Peer(f"{host}-vf0", 100, f"02:00:00:00:00:0{n}", f"100.64.0.{n}", host, teps, colour)


def host_intent(*peers: Peer) -> HostIntent:
    routes = (
        UnderlayRoute("10.224.0.0/16", "eth0", "10.0.0.0"),
        UnderlayRoute("10.240.0.0/16", "eth1", "10.0.1.0"),
        UnderlayRoute("10.250.0.0/16", "eth1", "10.0.1.0"),  # same neighbour: one session
    )
    return HostIntent("host1", 1, TEPS, routes, (), peers)


def test_a_switch_runs_one_single_hop_session_per_routed_neighbour() -> None:
    intent = SwitchIntent("leaf1", 1, (
        UnderlayRoute("10.224.0.0/28", "swp1", "10.0.0.1"),
        UnderlayRoute("10.224.0.16/28", "swp1", "10.0.0.1"),
        UnderlayRoute("10.224.0.32/28", "swp2", "10.0.0.3"),
        UnderlayRoute("10.9.0.0/24", "swp3", None),  # connected: no neighbour to watch
    ))  # fmt: skip
    assert wanted_sessions(intent, "all") == {
        WantedSession("10.0.0.1", None, "swp1", False),
        WantedSession("10.0.0.3", None, "swp2", False),
    }


def test_a_host_watches_each_peer_host_on_both_colours_from_its_own_teps() -> None:
    intent = host_intent(peer("host2", 2), peer("host2", 2), peer("host3", 3, "blue"))
    multihop = {s for s in wanted_sessions(intent, "peers")}
    assert multihop == {
        WantedSession("10.224.0.2", "10.224.0.1", None, True, "host2", "red"),
        WantedSession("10.240.0.2", "10.240.0.1", None, True, "host2", "blue"),
        WantedSession("10.224.0.3", "10.224.0.1", None, True, "host3", "red"),
        WantedSession("10.240.0.3", "10.240.0.1", None, True, "host3", "blue"),
    }
    assert len(wanted_sessions(intent, "all")) == 4 + 2  # and its two uplinks
    assert len(wanted_sessions(intent, "links")) == 2
    assert wanted_sessions(intent, "off") == frozenset()
    assert wanted_sessions(None, "all") == frozenset()


class FakeManager:
    def __init__(self, refuse: set[str] | None = None) -> None:
        self.configs: dict[int, SessionConfig] = {}
        self.statuses: list[SessionStatus] = []  # what sessions() reads back
        self.removed: list[int] = []
        self.refuse = refuse or set()
        self.armed: dict[int, tuple[bytes, ...]] = {}
        self.arms = 0

    def add(self, config: SessionConfig, *, ifname: str | None = None,
            netns: str | None = None) -> None:  # fmt: skip
        if ifname in self.refuse:
            raise OSError(19, f"no such device {ifname}")
        self.configs[config.local_discriminator] = config

    def remove(self, disc: int, *, admin_down: bool = True) -> None:
        self.removed.append(disc)
        del self.configs[disc]
        self.armed.pop(disc, None)

    def arm(self, disc: int, messages: Any) -> None:
        if disc not in self.configs:
            raise KeyError(disc)
        self.armed[disc] = tuple(messages)
        self.arms += 1

    def sessions(self) -> list[SessionStatus]:
        return self.statuses


class Node:
    """The agent side: reports and flips are recorded; the peers' colours are ours to set."""

    def __init__(self) -> None:
        self.reports: list[BfdReport] = []
        self.flips: list[tuple[str, str, str]] = []
        self.paths: list[tuple[str, str, bool]] = []
        self.colours: dict[str, Colour] = {"host2": "red", "host3": "red"}

    def sessions(self, manager: FakeManager, mode: Any = "all") -> BfdSessions:
        return BfdSessions(
            "host1", "ns-host1", manager, Discriminators(), mode=mode, interval_ms=10,  # type: ignore[arg-type]
            multiplier=3, report=self.reports.append, colour_of=self.colours.get,
            flip=lambda p, c, why: self.flips.append((p, c, why)),
            path=lambda p, c, up: self.paths.append((p, c, up)),
        )  # fmt: skip


def event(disc: int, old: State, new: State, diag: Diag = Diag.NONE,
          remote: State = State.UP) -> BfdEvent:  # fmt: skip
    return BfdEvent(disc, "x", None, None, None, True, old, new, diag, 1.0,
                    datetime(2026, 11, 30, tzinfo=UTC), remote_state=remote)  # fmt: skip


def disc_of(s: BfdSessions, host: str, colour: str) -> int:
    return next(d for k, d in s.sessions.items() if k.peer_host == host and k.colour == colour)


async def test_sessions_follow_each_applied_intent_with_the_configured_timers() -> None:
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    assert len(manager.configs) == 4
    config = manager.configs[disc_of(s, "host2", "red")]
    assert (config.desired_min_tx_us, config.required_min_rx_us, config.detect_mult) == (
        10_000, 10_000, 3)  # fmt: skip
    assert config.multihop and config.local_address == "10.224.0.1"
    await s.update(host_intent(peer("host3", 3)))  # host2 left the VNI
    assert {k.peer_host for k in s.sessions if k.multihop} == {"host3"}
    assert len(manager.removed) == 2
    await s.close()
    assert manager.configs == {}


async def test_a_session_that_cannot_start_is_tried_again_with_the_next_intent() -> None:
    manager, node = FakeManager(refuse={"eth0"}), Node()
    s = node.sessions(manager, "links")
    await s.update(host_intent())
    assert [k.ifname for k in s.sessions] == ["eth1"]
    manager.refuse.clear()
    await s.update(host_intent())
    assert {k.ifname for k in s.sessions} == {"eth0", "eth1"}


async def test_every_change_is_reported_with_its_detection_time() -> None:
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red = disc_of(s, "host2", "red")
    s.event(event(red, State.DOWN, State.UP))
    report = node.reports[-1]
    assert (report.state, report.peer, report.multihop) == ("up", "10.224.0.2", True)
    assert report.local == "10.224.0.1" and report.detected_at.year == 2026
    link = next(d for k, d in s.sessions.items() if k.ifname == "eth0")
    s.event(event(link, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    assert (node.reports[-1].state, node.reports[-1].port, node.reports[-1].diag) == (
        "down", "eth0", 1)  # fmt: skip


async def test_the_timers_a_session_settles_on_after_up_are_restated_to_health(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At Up both ends still send at slow start's 1 s (RFC 5880 6.8.3); once the Poll
    sequences are done the negotiated timers are reported, with the same Up."""
    monkeypatch.setattr(detect, "TIMERS_SETTLE_S", 0.01)
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red = disc_of(s, "host2", "red")
    up = dataclasses.replace(event(red, State.DOWN, State.UP), tx_interval_us=1_000_000,
                             detection_time_us=3_000_000)  # fmt: skip
    manager.statuses = [SessionStatus(red, 77, "10.224.0.2", "10.224.0.1", None, None, True,
                                      State.UP, State.UP, Diag.NONE, 10_000, 10_000, 3,
                                      10_000, 30_000)]  # fmt: skip
    s.event(up)
    assert (node.reports[-1].tx_interval_ms, node.reports[-1].detect_time_ms) == (1000, 3000)
    await asyncio.sleep(0.1)
    restated = node.reports[-1]
    assert (restated.state, restated.tx_interval_ms, restated.detect_time_ms) == ("up", 10, 30)
    assert restated.detected_at == up.wall and len(node.reports) == 2
    # Down again before the timers settle: nothing is restated.
    s.event(dataclasses.replace(up, new=State.DOWN, old=State.UP))
    s.event(up)
    s.event(dataclasses.replace(up, new=State.DOWN, old=State.UP))
    await asyncio.sleep(0.1)
    assert [r.state for r in node.reports[2:]] == ["down", "up", "down"]


async def test_the_active_colour_going_down_flips_the_peer_when_the_other_is_up() -> None:
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red, blue = disc_of(s, "host2", "red"), disc_of(s, "host2", "blue")
    s.event(event(red, State.DOWN, State.UP))
    s.event(event(blue, State.DOWN, State.UP))
    s.event(event(red, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    assert node.flips == [
        ("host2", "blue", "bfd red to host2 down (control_detection_time_expired)")
    ]


async def test_each_path_session_coming_up_or_failing_is_told_for_reverts() -> None:
    """What lets an agent undo a flip only it knows of: the preferred colour's session
    toward that peer is Up again (and its failing again stops the clock)."""
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red = disc_of(s, "host2", "red")
    s.event(event(red, State.DOWN, State.UP))
    s.event(event(red, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    s.event(event(red, State.DOWN, State.INIT))  # not Up yet: nothing to tell
    s.event(event(red, State.INIT, State.UP))
    assert node.paths == [("host2", "red", True), ("host2", "red", False), ("host2", "red", True)]
    assert s.path_state("host2", "red") is State.UP
    assert s.path_state("host9", "red") is None


@pytest.mark.parametrize(
    ("why", "colour_now", "blue_state", "remote"),
    [
        ("the peer already uses blue", "blue", State.UP, State.UP),
        ("blue is down too: flipping would not help", "red", State.DOWN, State.UP),
        ("the peer said AdminDown: a stop, not a failure", "red", State.UP, State.ADMIN_DOWN),
    ],
)
async def test_no_flip_when(why: str, colour_now: Colour, blue_state: State,
                            remote: State) -> None:  # fmt: skip
    manager, node = FakeManager(), Node()
    node.colours["host2"] = colour_now
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red, blue = disc_of(s, "host2", "red"), disc_of(s, "host2", "blue")
    s.event(event(red, State.DOWN, State.UP))
    if blue_state is State.UP:
        s.event(event(blue, State.DOWN, State.UP))
    s.event(event(red, State.UP, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN, remote))
    assert node.flips == [], why


async def test_a_withdrawn_session_is_reported_as_admin_down_not_as_a_failure() -> None:
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent())
    link = next(iter(s.sessions.values()))
    s.event(event(link, State.UP, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN,
                  State.ADMIN_DOWN))  # fmt: skip
    s.event(event(link, State.UP, State.ADMIN_DOWN, Diag.ADMINISTRATIVELY_DOWN))
    assert [r.state for r in node.reports] == ["admin_down", "admin_down"]


async def test_events_of_other_nodes_sessions_are_not_ours() -> None:
    manager, node = FakeManager(), Node()
    s = node.sessions(manager)
    await s.update(host_intent())
    assert not s.owns(999)
    s.event(event(999, State.UP, State.DOWN))
    assert node.reports == []


async def test_a_link_session_outlives_the_routes_that_started_it() -> None:
    """Pathcomp moves traffic off a failed (or drained) link: its session must stay to see
    the link recover, or health would hold the link down for ever."""
    manager, node = FakeManager(), Node()
    s = node.sessions(manager, "links")
    await s.update(host_intent())
    eth0 = next(d for k, d in s.sessions.items() if k.ifname == "eth0")
    only_eth1 = HostIntent("host1", 2, TEPS, (UnderlayRoute("10.0.0.0/8", "eth1", "10.0.1.0"),),
                           (), ())  # fmt: skip
    await s.update(only_eth1)
    assert eth0 in manager.configs and manager.removed == []
    renumbered = HostIntent("host1", 3, TEPS, (UnderlayRoute("10.0.0.0/8", "eth0", "10.0.9.0"),),
                            (), ())  # fmt: skip
    await s.update(renumbered)  # eth0 now faces another neighbour: the old session goes
    assert manager.removed == [eth0]
    assert {(k.ifname, k.peer) for k in s.sessions} == {("eth0", "10.0.9.0"), ("eth1", "10.0.1.0")}


async def test_a_session_that_comes_up_while_it_is_being_added_stays_up() -> None:
    """The manager may report Up before `add` returns (the event is handled meanwhile on
    the loop); that state must not be overwritten with Down, or the other colour looks
    down and no flip is made (found in the end-to-end lab test)."""
    node = Node()

    class Eager(FakeManager):
        def add(self, config: SessionConfig, *, ifname: str | None = None,
                netns: str | None = None) -> None:  # fmt: skip
            super().add(config, ifname=ifname, netns=netns)
            s.event(event(config.local_discriminator, State.DOWN, State.UP))

    manager = Eager()
    s = node.sessions(manager)
    await s.update(host_intent(peer("host2", 2)))
    red, blue = disc_of(s, "host2", "red"), disc_of(s, "host2", "blue")
    assert s.states[red] is State.UP and s.states[blue] is State.UP
    s.event(event(red, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    assert [f[:2] for f in node.flips] == [("host2", "blue")]


def switch_routes() -> SwitchIntent:
    backup = NextHop("swp3", "10.0.0.5")
    return SwitchIntent("leaf1", 1, (
        UnderlayRoute("10.224.0.16/32", "swp1", "10.0.0.1", backup),
        UnderlayRoute("10.240.0.16/32", "swp2", "10.0.0.3"),
    ))  # fmt: skip


class Repairs:
    """The switch side: withdraws and restores are recorded as (op, port)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def sessions(self, manager: FakeManager) -> BfdSessions:
        return BfdSessions(
            "leaf1", "ns-leaf1", manager, Discriminators(), mode="links", interval_ms=10,
            multiplier=3, report=lambda _: None, colour_of=lambda _: None,
            flip=lambda *_: None,
            withdraw=lambda port, why: self.calls.append(("withdraw", port)),
            restore=lambda port, why: self.calls.append(("restore", port)),
            restore_after_hold=lambda port, why: self.calls.append(("restore after hold", port)),
            withdrawn=lambda port, why, routes, ms, errors: self.calls.append(
                ("withdrawn by the runtime", port)),
        )  # fmt: skip


def link_of(s: BfdSessions, port: str) -> int:
    return next(d for k, d in s.sessions.items() if k.ifname == port)


def test_a_switch_watches_the_link_of_each_backup_too() -> None:
    assert wanted_sessions(switch_routes(), "links") == {
        WantedSession("10.0.0.1", None, "swp1", False),
        WantedSession("10.0.0.3", None, "swp2", False),
        WantedSession("10.0.0.5", None, "swp3", False),  # carries no primary
    }


async def test_a_link_session_down_withdraws_its_port_and_up_restores_it_after_the_hold() -> None:
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    await s.update(switch_routes())
    swp1 = link_of(s, "swp1")
    s.event(event(swp1, State.DOWN, State.UP))
    s.event(event(swp1, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    s.event(event(swp1, State.DOWN, State.INIT))
    s.event(event(swp1, State.INIT, State.UP))
    # Up is passed on every time (a restore of a port that is not withdrawn does nothing).
    assert repairs.calls == [
        ("restore after hold", "swp1"),
        ("withdraw", "swp1"),
        ("restore after hold", "swp1"),
    ]


@pytest.mark.parametrize(
    ("why", "old", "remote"),
    [
        ("the peer said AdminDown: a stop, not a failure", State.UP, State.ADMIN_DOWN),
        ("it never was Up: nothing is known to have failed", State.INIT, State.UP),
    ],
)
async def test_no_withdraw_when(why: str, old: State, remote: State) -> None:
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    await s.update(switch_routes())
    s.event(event(link_of(s, "swp1"), old, State.DOWN, Diag.NEIGHBOR_SIGNALED_SESSION_DOWN,
                  remote))  # fmt: skip
    assert repairs.calls == [], why


async def test_a_multihop_session_going_down_withdraws_no_port() -> None:
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    s.mode = "all"
    await s.update(host_intent(peer("host2", 2)))
    red = disc_of(s, "host2", "red")
    s.event(event(red, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED))
    assert repairs.calls == []


async def test_a_removed_link_session_ends_its_ports_withdrawal() -> None:
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    await s.update(switch_routes())
    renumbered = SwitchIntent("leaf1", 2, (UnderlayRoute("10.224.0.16/32", "swp1", "10.0.9.1"),))
    await s.update(renumbered)  # swp1 faces another neighbour: its old session goes
    assert repairs.calls == [("restore", "swp1")]


def test_a_host_watches_a_bounded_stable_subset_of_its_peers_that_watch_it_back() -> None:
    """Multihop BFD needs the session at both ends: whatever the bound, B is among the
    hosts A watches exactly when A is among B's (the member lists are the VNI's, which
    every member sees whole)."""
    hosts = {f"host{i}" for i in range(1, 40)}
    vni = {100: hosts}
    picked = peers_to_watch("host1", vni, 4)
    assert len(picked) == 4 and set(picked) <= hosts - {"host1"}
    assert peers_to_watch("host1", vni, 4) == picked  # stable across calls
    assert peers_to_watch("host2", vni, 4) != picked  # each host its own subset
    for limit in (1, 2, 3, 4):
        watches = {h: set(peers_to_watch(h, vni, limit)) for h in hosts}
        assert all(a in watches[b] for a in hosts for b in watches[a]), limit
        assert all(len(w) == 2 * ((limit + 1) // 2) for w in watches.values())
    # Two VNIs: the union of each ring's neighbours, still both ways.
    two = {100: hosts, 200: {"host1", "host50", "host51"}}
    both = {h: set(peers_to_watch(h, {v: m for v, m in two.items() if h in m}, 2))
            for h in hosts | two[200]}  # fmt: skip
    assert {"host50", "host51"} <= both["host1"]
    assert all(a in both[b] for a in both for b in both[a])
    # A VNI smaller than the bound: everyone; no bound: the full mesh.
    assert peers_to_watch("host1", {7: {"host1", "host2", "host3"}}, 8) == ["host2", "host3"]
    assert set(peers_to_watch("host1", vni, None)) == hosts - {"host1"}


async def test_each_link_session_is_armed_with_its_ports_batch_and_rearmed_only_on_change() -> None:
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    await s.update(switch_routes())
    await s.arm({"swp1": (b"delete a", b"delete b")})
    assert manager.armed == {link_of(s, "swp1"): (b"delete a", b"delete b")}
    await s.arm({"swp1": (b"delete a", b"delete b")})
    await s.update(switch_routes())
    assert manager.arms == 1  # nothing changed: nothing sent to the runtime
    await s.arm({"swp2": (b"delete c",)})  # swp1's routes moved to swp2
    assert manager.armed == {link_of(s, "swp1"): (), link_of(s, "swp2"): (b"delete c",)}
    # A session started later is armed as it starts.
    extra = UnderlayRoute("10.224.0.32/32", "swp4", "10.0.0.7")
    wider = SwitchIntent("leaf1", 3, (*switch_routes().routes, extra))
    await s.arm({"swp2": (b"delete c",), "swp4": (b"delete d",)})
    await s.update(wider)
    assert manager.armed[link_of(s, "swp4")] == (b"delete d",)


async def test_a_link_session_the_runtime_already_repaired_is_recorded_not_withdrawn_again() -> (
    None
):
    manager, repairs = FakeManager(), Repairs()
    s = repairs.sessions(manager)
    await s.update(switch_routes())
    swp1 = link_of(s, "swp1")
    down = dataclasses.replace(
        event(swp1, State.UP, State.DOWN, Diag.CONTROL_DETECTION_TIME_EXPIRED),
        withdrawn=1, withdrawn_ms=0.4,
    )  # fmt: skip
    s.event(down)
    assert repairs.calls == [("withdrawn by the runtime", "swp1")]
