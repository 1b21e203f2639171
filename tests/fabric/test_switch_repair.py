"""Switch-local repair (tier 1) on this machine's kernel: the switch route driver installs
each route's loop-free backup beside its primary, and the kernel or one batch from the agent
moves traffic to it.

    b (primary neighbour, 10.0.1.2) --b1/a1-- s --a2/c1-- c (backup neighbour, 10.0.2.2)

Switch s routes 10.224.0.16/32 and 10.224.0.17/32 via b (metric 10) with c as their backup
(metric 20), and 10.224.0.18/32 via b with no backup. No agent runs in (a) and (b): only
the driver's setup and one reconcile. In (c) a real BFD runtime watches both links.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from thorn.desired import Backup, Route, SwitchState
from thorn.netns import run_in_netns
from thorn_programmer.bfd import BfdManager, EventQueue, SessionConfig, State
from thorn_programmer.detect import BfdSessions, Discriminators
from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.intent import SwitchIntent, switch_intent
from thorn_programmer.kernel import RT_TABLE_MAIN, UTURN_RULE_PRIORITY, PortRule, uturn_table
from thorn_programmer.kernel import Route as KernelRoute
from thorn_programmer.monitor import LinkEvent, LinkMonitor
from thorn_programmer.reconcile import reconcile
from thorn_programmer.repair import LocalRepair

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="needs root for network namespaces",
)

PRIMARY, BACKUP = "10.0.1.2", "10.0.2.2"
PROTECTED = ("10.224.0.16", "10.224.0.17")
UNPROTECTED = "10.224.0.18"


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@dataclass
class Triangle:
    s: str
    b: str
    c: str

    def routes(self) -> list[dict[str, Any]]:
        """THORN's routes in s: (dst, gateway, dev, metric) as `ip -j` shows them."""
        routes: list[dict[str, Any]] = json.loads(
            sh("ip", "-n", self.s, "-j", "route", "show", "proto", "146")
        )
        return routes

    def table(self) -> set[tuple[str, str, int]]:
        return {(r["dst"], r["dev"], r.get("metric", 0)) for r in self.routes()}

    def route_get(self, dst: str) -> str:
        [answer] = json.loads(sh("ip", "-n", self.s, "-j", "route", "get", dst))
        return str(answer["dev"])

    def tx_packets(self, dev: str) -> int:
        out = sh("ip", "-n", self.s, "-s", "-j", "link", "show", "dev", dev)
        return int(json.loads(out)[0]["stats64"]["tx"]["packets"])


@pytest.fixture
def triangle() -> Iterator[Triangle]:
    tag = uuid.uuid4().hex[:6]
    t = Triangle(f"tr{tag}-s", f"tr{tag}-b", f"tr{tag}-c")
    made: list[str] = []
    try:
        for ns in (t.s, t.b, t.c):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # A veth whose peer has its own ifindex gets its carrier events at once; with equal
        # indexes (each first in a fresh namespace) the kernel treats them like a physical
        # port's and may hold a carrier loss back up to a second (linkwatch's rate limit,
        # docs/datapath.md). This test is about what the kernel does with the event.
        sh("ip", "-n", t.b, "link", "add", "pad0", "type", "veth", "peer", "name", "pad1")
        sh("ip", "-n", t.c, "link", "add", "pad0", "type", "veth", "peer", "name", "pad1")
        for ours, far, theirs in (("a1", t.b, "b1"), ("a2", t.c, "c1")):
            sh("ip", "-n", t.s, "link", "add", ours, "type", "veth", "peer", "name", theirs,
               "netns", far)  # fmt: skip
        for ns, dev, cidr in ((t.s, "a1", "10.0.1.1/30"), (t.b, "b1", "10.0.1.2/30"),
                              (t.s, "a2", "10.0.2.1/30"), (t.c, "c1", "10.0.2.2/30")):  # fmt: skip
            sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        yield t
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def document(revision: int = 1) -> SwitchState:
    """What pathcomp writes for s (the routes' colours and stages do not matter here)."""
    backup = Backup(port="a2", neighbour="c", via=BACKUP)
    routes = [
        Route(prefix=f"{dst}/32", colour="red", port="a1", neighbour="b", via=PRIMARY, stage=1,
              backup=backup if dst in PROTECTED else None)
        for dst in (*PROTECTED, UNPROTECTED)
    ]  # fmt: skip
    return SwitchState(node="s", plan_revision=revision, topology_revision=1, routes=routes)


INSTALLED = {
    *((f"{dst}", "a1", 10) for dst in PROTECTED),
    *((f"{dst}", "a2", 20) for dst in PROTECTED),
    (UNPROTECTED, "a1", 10),
}


@pytest.fixture
async def switch(triangle: Triangle) -> AsyncIterator[SwitchRouteDriver]:
    async with SwitchRouteDriver.open(triangle.s) as driver:
        assert isinstance(driver, SwitchRouteDriver)
        await driver.setup()
        result = await reconcile(driver, switch_intent(document()))
        assert result.ok, result.errors
        yield driver


def wait_for(check: Any, timeout: float = 3.0) -> float:
    """Poll `check()` until true; the seconds it took (fails the test on timeout)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.001)
    return time.monotonic() - start


def send_udp(t: Triangle, dst: str, count: int) -> None:
    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for n in range(count):
                s.sendto(f"probe {n}".encode(), (dst, 47000))

    run_in_netns(t.s, send)


async def test_a_backup_is_a_second_route_and_a_second_reconcile_changes_nothing(
    triangle: Triangle,
) -> None:
    # A route of an older version (no metric) for one of the prefixes: replaced.
    sh("ip", "-n", triangle.s, "route", "add", f"{PROTECTED[0]}/32", "via", PRIMARY,
       "proto", "146")  # fmt: skip
    async with SwitchRouteDriver.open(triangle.s) as driver:
        await driver.setup()
        first = await reconcile(driver, switch_intent(document()))
        again = await reconcile(driver, switch_intent(document(revision=2)))
    assert first.ok, first.errors
    assert triangle.table() == INSTALLED
    assert again.applied == []


async def test_a_switch_reads_back_exactly_the_thorn_routes_the_general_reader_finds(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    """The switch's own lean reader (raw dumps, only what a route needs) against pyroute2's
    full decoding, with routes it must leave out around them: other protocols, another
    table, and an IPv6 THORN route."""
    ns = triangle.s
    sh("ip", "-n", ns, "-6", "addr", "add", "fd00:1::1/64", "dev", "a1", "nodad")
    sh("ip", "-n", ns, "-6", "route", "add", "fd00:224::/64", "via", "fd00:1::2", "dev", "a1",
       "metric", "10", "proto", "146")  # fmt: skip
    sh("ip", "-n", ns, "route", "add", "10.99.0.0/24", "via", PRIMARY)  # proto boot
    sh("ip", "-n", ns, "route", "add", "10.98.0.0/24", "via", PRIMARY, "proto", "146",
       "table", "100")  # fmt: skip
    read = await switch.read()
    lean = [o for o in read if isinstance(o, KernelRoute) and o.table == RT_TABLE_MAIN]
    full = [o for o in await NetlinkDatapath.read(switch) if isinstance(o, KernelRoute)]
    assert sorted(lean, key=repr) == sorted(full, key=repr)
    # and beside them the U-turn rule and table of a1 (the primaries' port), nothing else
    table = uturn_table(switch.ifindex["a1"])
    assert {o for o in read if o not in lean} == {
        PortRule(family=4, iif="a1", table=table),
        *(KernelRoute(f"{dst}/32", "a2", BACKUP, 20, table) for dst in PROTECTED),
    }
    assert {(o.prefix, o.dev, o.metric) for o in lean} >= {("fd00:224::/64", "a1", 10)}
    assert not {o.prefix for o in lean} & {"10.99.0.0/24", "10.98.0.0/24"}


async def test_setup_has_the_kernel_skip_routes_through_ports_without_carrier(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    for family in ("ipv4", "ipv6"):
        for dev in ("all", "default", "a1", "a2"):
            path = f"/proc/sys/net/{family}/conf/{dev}/ignore_routes_with_linkdown"
            assert sh("ip", "netns", "exec", triangle.s, "cat", path).strip() == "1", path


async def test_carrier_loss_at_the_primary_moves_traffic_to_the_backup_and_back_with_no_agent(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    assert triangle.route_get(PROTECTED[0]) == "a1"
    sh("ip", "-n", triangle.b, "link", "set", "b1", "down")  # the far end: s loses carrier
    wait_for(lambda: triangle.route_get(PROTECTED[0]) == "a2")
    assert triangle.route_get(PROTECTED[1]) == "a2"
    before = triangle.tx_packets("a2")
    send_udp(triangle, PROTECTED[0], 20)
    assert triangle.tx_packets("a2") - before >= 20
    assert triangle.table() == INSTALLED  # nothing was deleted: the kernel skips the primary
    sh("ip", "-n", triangle.b, "link", "set", "b1", "up")
    wait_for(lambda: triangle.route_get(PROTECTED[0]) == "a1")


def route_get_from(t: Triangle, dst: str, source: str, iif: str) -> str:
    """The device s forwards a packet to `dst` out of, arriving on `iif` from `source`."""
    [answer] = json.loads(sh("ip", "-n", t.s, "-j", "route", "get", dst, "from", source,
                             "iif", iif))  # fmt: skip
    return str(answer["dev"])


async def test_a_packet_that_arrives_on_its_primarys_port_takes_the_backup_a_u_turn(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    """The U-turn rule: a1 is the protected routes' primary port, so a packet for them
    that comes in on a1 (b's backup sent it here, b's own link toward the destination
    having failed) leaves by the backup, a2, instead of going back to b. Packets coming in
    on a2 follow the primaries as ever, and an unprotected route has nowhere else to go."""
    t = triangle
    [rule] = [r for r in json.loads(sh("ip", "-n", t.s, "-j", "rule", "show"))
              if r.get("iif") == "a1"]  # fmt: skip
    assert (rule["priority"], rule["table"], rule.get("protocol")) == (
        UTURN_RULE_PRIORITY, str(uturn_table(switch.ifindex["a1"])), "146")  # fmt: skip
    assert {route_get_from(t, dst, PRIMARY, "a1") for dst in PROTECTED} == {"a2"}
    assert {route_get_from(t, dst, BACKUP, "a2") for dst in PROTECTED} == {"a1"}
    assert route_get_from(t, UNPROTECTED, PRIMARY, "a1") == "a1"
    # Real packets from b, sent toward s for a protected destination, leave s on a2.
    sh("ip", "-n", t.b, "route", "add", f"{PROTECTED[0]}/32", "via", "10.0.1.1")

    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for n in range(20):
                sock.sendto(f"u-turn {n}".encode(), (PROTECTED[0], 47000))

    before = t.tx_packets("a2")
    await asyncio.to_thread(run_in_netns, t.b, send)
    assert t.tx_packets("a2") - before >= 20
    # A document without backups takes the rule and its table away.
    bare = SwitchState(node="s", plan_revision=2, topology_revision=1, routes=[
        r.model_copy(update={"backup": None}) for r in document().routes])  # fmt: skip
    result = await reconcile(switch, switch_intent(bare))
    assert result.ok, result.errors
    assert not [r for r in json.loads(sh("ip", "-n", t.s, "-j", "rule", "show"))
                if r.get("iif") == "a1"]  # fmt: skip
    assert not [o for o in await switch.read() if isinstance(o, PortRule | KernelRoute)
                and (isinstance(o, PortRule) or o.table != RT_TABLE_MAIN)]  # fmt: skip


async def test_admin_down_of_the_primary_port_leaves_the_backup(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    sh("ip", "-n", triangle.s, "link", "set", "a1", "down")
    assert triangle.table() == {(dst, "a2", 20) for dst in PROTECTED}
    assert {triangle.route_get(dst) for dst in PROTECTED} == {"a2"}


async def test_routes_through_an_admin_down_port_are_deferred_and_back_when_it_comes_up(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    """A switch going down (every port admin down) loses its routes and the kernel refuses
    new ones through its ports. Its agent still acknowledges its document (the routes are
    deferred, not errors) and puts them back as soon as each port is up, from the link
    monitor's event, with nothing else asked of it."""
    repair = LocalRepair("s")
    repair.attach(switch)
    monitor = LinkMonitor(triangle.s)
    monitor.start()

    async def follow() -> None:
        async for item in monitor:
            if isinstance(item, LinkEvent):
                repair.link(item)

    follower = asyncio.create_task(follow())
    try:
        await asyncio.sleep(0.2)  # the monitor's first dump: every port up
        sh("ip", "-n", triangle.s, "link", "set", "a1", "down")
        result = await reconcile(switch, switch_intent(document(revision=2)))
        assert result.errors == []
        assert {(c.change.obj.key[1], c.change.obj.dev) for c in result.deferred} == {
            (f"{dst}/32", "a1") for dst in (*PROTECTED, UNPROTECTED)
        }
        sh("ip", "-n", triangle.s, "link", "set", "a1", "up")
        await asyncio.to_thread(wait_for, lambda: triangle.table() == INSTALLED)
        await repair.idle()
        assert repair.last is not None and (repair.last.op, repair.last.port) == ("reassert", "a1")
        again = await reconcile(switch, switch_intent(document(revision=3)))
        assert again.applied == [] and again.ok
    finally:
        follower.cancel()
        monitor.close()


def config(disc: int, peer: str, local: str) -> SessionConfig:
    return SessionConfig(disc, peer, local, 10_000, 10_000, 3)


async def test_bfd_down_withdraws_the_primaries_in_one_message_until_the_session_is_up(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    loop = asyncio.get_running_loop()
    events = EventQueue(loop)
    manager = BfdManager(events.put, name=f"repair-{uuid.uuid4().hex[:6]}")
    manager.start()
    repair = LocalRepair("s", up_hold=0.3)
    repair.attach(switch)
    sessions = BfdSessions(
        "s", triangle.s, manager, Discriminators(), mode="links", interval_ms=10, multiplier=3,
        report=lambda _: None, colour_of=lambda _: None, flip=lambda *_: None,
        withdraw=repair.withdraw, restore=repair.restore,
        restore_after_hold=repair.restore_after_hold,
    )  # fmt: skip

    async def dispatch() -> None:
        async for event in events:
            sessions.event(event)

    dispatcher = asyncio.create_task(dispatch())
    intent: SwitchIntent = switch_intent(document())
    try:
        await sessions.update(intent)  # s: one session per link (a2 carries only backups)
        far = {"b1": (1001, triangle.b), "c1": (1002, triangle.c)}
        for (disc, ns), (peer, local, dev) in zip(far.values(), ((
                "10.0.1.1", PRIMARY, "b1"), ("10.0.2.1", BACKUP, "c1")), strict=True):  # fmt: skip
            await asyncio.to_thread(manager.add, config(disc, peer, local), ifname=dev, netns=ns)

        async def until(check: Any, within: float = 10) -> None:
            for _ in range(int(within / 0.005)):
                if check():
                    return
                await asyncio.sleep(0.005)
            raise AssertionError(f"not so within {within} s")

        def all_up() -> bool:
            return set(sessions.states.values()) == {State.UP}

        await until(all_up)
        assert len(sessions.states) == 2

        # b goes silent (carrier stays up): s's session on a1 times out.
        await asyncio.to_thread(manager.remove, far["b1"][0], admin_down=False)
        await until(lambda: repair.last is not None)
        await repair.idle()
        assert repair.last is not None
        assert (repair.last.op, repair.last.port) == ("withdraw", "a1")
        assert (repair.last.routes, repair.last.sendmsgs, repair.last.errors) == (2, 1, [])
        withdrawn = {(dst, "a2", 20) for dst in PROTECTED} | {(UNPROTECTED, "a1", 10)}
        assert triangle.table() == withdrawn
        assert {triangle.route_get(dst) for dst in PROTECTED} == {"a2"}

        # The controller's document still names the primaries: they stay out.
        again = await reconcile(switch, switch_intent(document(revision=2)))
        assert again.applied == []
        assert triangle.table() == withdrawn

        # b answers again: Up puts the primaries back once it has stayed Up for the hold.
        disc, ns = far["b1"]
        await asyncio.to_thread(manager.add, config(disc, "10.0.1.1", PRIMARY), ifname="b1",
                                netns=ns)  # fmt: skip
        await until(all_up)
        assert repair.holding() == ["a1"] and triangle.table() == withdrawn
        await until(lambda: repair.last is not None and repair.last.op == "restore", 2)
        assert repair.last is not None
        # its two primaries back, and its unprotected route re-asserted (an add that finds
        # the route in place changes nothing)
        assert (repair.last.op, repair.last.routes, repair.last.sendmsgs) == ("restore", 3, 1)
        assert triangle.table() == INSTALLED
        assert (await reconcile(switch, switch_intent(document(revision=3)))).applied == []
    finally:
        dispatcher.cancel()
        await asyncio.gather(dispatcher, return_exceptions=True)
        await asyncio.to_thread(manager.close, admin_down=False)


async def test_the_bfd_runtime_withdraws_an_armed_ports_primaries_itself(
    triangle: Triangle, switch: SwitchRouteDriver
) -> None:
    """The agent arms s's link sessions with the route deletes of each port's protected
    primaries (`SwitchRouteDriver.armed`). When b goes silent, the BFD runtime sends them
    itself, on its own thread, before the event reaches the agent (whose own withdraw
    here does nothing): the kernel has left them to their backups, and the agent is told
    what was done, and how long after detection."""
    loop = asyncio.get_running_loop()
    events = EventQueue(loop)
    manager = BfdManager(events.put, name=f"armed-{uuid.uuid4().hex[:6]}")
    manager.start()
    done: list[tuple[str, int, float, tuple[str, ...]]] = []
    sessions = BfdSessions(
        "s", triangle.s, manager, Discriminators(), mode="links", interval_ms=10, multiplier=3,
        report=lambda _: None, colour_of=lambda _: None, flip=lambda *_: None,
        withdraw=lambda *_: None, restore=lambda *_: None,
        withdrawn=lambda port, _reason, routes, ms, errors: done.append(
            (port, routes, ms, errors)),
    )  # fmt: skip

    async def dispatch() -> None:
        async for event in events:
            sessions.event(event)

    dispatcher = asyncio.create_task(dispatch())
    try:
        await sessions.update(switch_intent(document()))
        armed = switch.armed()
        assert set(armed) == {"a1"} and len(armed["a1"]) == 2  # the unprotected one stays
        await sessions.arm(armed)
        far = {"b1": (1001, triangle.b), "c1": (1002, triangle.c)}
        for (disc, ns), (peer, local, dev) in zip(far.values(), ((
                "10.0.1.1", PRIMARY, "b1"), ("10.0.2.1", BACKUP, "c1")), strict=True):  # fmt: skip
            await asyncio.to_thread(manager.add, config(disc, peer, local), ifname=dev, netns=ns)
        for _ in range(2000):
            if set(sessions.states.values()) == {State.UP} and len(sessions.states) == 2:
                break
            await asyncio.sleep(0.005)
        await asyncio.to_thread(manager.remove, far["b1"][0], admin_down=False)
        for _ in range(2000):
            if done:
                break
            await asyncio.sleep(0.005)
        [(port, routes, ms, errors)] = done
        assert (port, routes, errors) == ("a1", 2, ())
        assert 0 <= ms < 1000
        withdrawn = {(dst, "a2", 20) for dst in PROTECTED} | {(UNPROTECTED, "a1", 10)}
        assert triangle.table() == withdrawn
        # The agent's record of it: the port is withdrawn (a reconcile keeps the primaries
        # out), the kernel already had them gone (no error), and the failover names them.
        repair, failovers = LocalRepair("s"), []
        repair.attach(switch)
        repair.on_failover = failovers.append
        repair.withdrawn_by_runtime(port, "bfd down", routes, ms, errors)
        await repair.idle()
        assert repair.last is not None and repair.last.by_runtime
        assert (repair.last.routes, repair.last.errors) == (2, [])
        assert [f.peers for f in failovers] == [[f"{dst}/32" for dst in PROTECTED]]
        assert (await reconcile(switch, switch_intent(document(revision=2)))).applied == []
        assert triangle.table() == withdrawn
    finally:
        dispatcher.cancel()
        await asyncio.gather(dispatcher, return_exceptions=True)
        await asyncio.to_thread(manager.close, admin_down=False)
