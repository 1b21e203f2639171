"""The host emulation driver and the switch route driver on this machine's own kernel.

Two hosts joined by two links, the red one and the blue one (each host's TEP of a colour is
routed over that colour's link), each host with one workload behind a representor. The
drivers are given intents directly (no controller): what they must prove here is the
datapath itself, reconcile's idempotence, and that failover is one `fdb replace` per peer.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from twohosts import VNI, TwoHosts, hosts_fixture, sh, tx_packets, udp_exchange  # noqa: F401  (hosts_fixture: the `hosts` fixture)

from thorn.model import Colour
from thorn_programmer.drivers.emulation import EmulationDriver
from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.intent import HostIntent, LocalWorkload, UnderlayRoute
from thorn_programmer.kernel import PRIMARY_METRIC, RT_TABLE_MAIN, Fdb, Redirect
from thorn_programmer.reconcile import plan_changes, reconcile

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="needs root for network namespaces",
)


async def program(lab: TwoHosts, colour: Colour = "red") -> None:
    for host in ("h1", "h2"):
        async with EmulationDriver.open(lab.ns[host]) as driver:
            await driver.setup()
            result = await reconcile(driver, lab.intent(host, colour=colour))
            assert result.ok, result.errors


async def test_workload_traffic_crosses_the_tunnel_on_the_active_colour(hosts: TwoHosts) -> None:
    await program(hosts)
    red_before = tx_packets(hosts, "h1", "eth1")
    assert udp_exchange(hosts) == 20
    assert tx_packets(hosts, "h1", "eth1") - red_before >= 20  # over the red link


async def test_a_second_reconcile_changes_nothing(hosts: TwoHosts) -> None:
    await program(hosts)
    async with EmulationDriver.open(hosts.ns["h1"]) as driver:
        assert await plan_changes(driver, hosts.intent("h1")) == []
        again = await reconcile(driver, hosts.intent("h1"))
    assert again.applied == [] and again.passes == 0


async def test_failover_is_one_fdb_replace_per_peer_mac(hosts: TwoHosts) -> None:
    await program(hosts)
    assert udp_exchange(hosts) == 20
    sh("ip", "-n", hosts.ns["h1"], "link", "set", "dev", "eth1", "down")  # the red link fails
    assert udp_exchange(hosts, 5) == 0
    async with EmulationDriver.open(hosts.ns["h1"]) as driver:
        result = await reconcile(driver, hosts.intent("h1", revision=2, colour="blue"))
    kinds = sorted((c.op, type(c.obj).__name__) for c in result.applied)
    # The peer's MAC and the flood list move to the blue TEP; nothing else is touched.
    assert kinds == [("add", "Fdb"), ("delete", "Fdb"), ("replace", "Fdb")]
    blue_before = tx_packets(hosts, "h1", "eth2")
    assert udp_exchange(hosts) == 20
    assert tx_packets(hosts, "h1", "eth2") - blue_before >= 20


async def test_reconcile_leaves_foreign_rules_and_routes_alone(hosts: TwoHosts) -> None:
    ns = hosts.ns["h1"]
    sh("ip", "-n", ns, "route", "add", "192.0.2.0/24", "via", "10.0.0.1")
    sh("tc", "-n", ns, "qdisc", "add", "dev", "vf0_rep", "clsact")
    sh("tc", "-n", ns, "filter", "add", "dev", "vf0_rep", "ingress", "prio", "7", "protocol",
       "all", "u32", "match", "ether", "dst", "02:00:00:00:00:99", "action", "mirred",
       "egress", "redirect", "dev", "eth2")  # fmt: skip
    await program(hosts)
    async with EmulationDriver.open(ns) as driver:
        await reconcile(driver, hosts.intent("h1", revision=2, colour="blue"))
    shown = sh("tc", "-n", ns, "filter", "show", "dev", "vf0_rep", "ingress")
    assert "pref 7 " in shown and "00000099/ffffffff at -12" in shown
    routes = sh("ip", "-n", ns, "route")
    assert "192.0.2.0/24 via 10.0.0.1" in routes


async def test_a_missing_device_is_reported_and_the_rest_applied(hosts: TwoHosts) -> None:
    intent = hosts.intent("h1")
    broken = HostIntent(
        node=intent.node, revision=intent.revision, teps=intent.teps,
        routes=(*intent.routes, UnderlayRoute("10.250.0.0/24", "eth9", None)),
        local=(*intent.local, LocalWorkload("ghost", VNI, "vf7_rep", "06:00:00:00:00:77",
                                            "100.64.0.77")),
        peers=intent.peers,
    )  # fmt: skip
    async with EmulationDriver.open(hosts.ns["h1"]) as driver:
        result = await reconcile(driver, broken)
        left = await plan_changes(driver, broken)
    failed = {c.change.obj.key for c in result.errors}
    assert all("does not exist" in e.message for e in result.errors)
    assert ("route", "10.250.0.0/24", PRIMARY_METRIC, RT_TABLE_MAIN) in failed
    assert any(k[:2] == ("u32", "vf7_rep") for k in failed)
    # Everything else is in place: the peer's FDB entry, the working workload's redirect.
    assert {c.obj.key for c in left} <= failed
    actual = await _read(hosts.ns["h1"])
    assert Fdb("thv1000", "06:00:00:00:00:02", "10.224.0.2") in actual
    assert any(isinstance(o, Redirect) and o.dev == "vf0_rep" for o in actual)


async def _read(ns: str) -> list[Any]:
    async with NetlinkDatapath.open(ns) as driver:
        return await driver.read()
