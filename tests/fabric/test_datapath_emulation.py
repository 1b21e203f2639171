"""The host emulation driver and the switch route driver on this machine's own kernel.

Two hosts joined by two links, the red one and the blue one (each host's TEP of a colour is
routed over that colour's link), each host with one workload behind a representor. The
drivers are given intents directly (no controller): what they must prove here is the
datapath itself, reconcile's idempotence, and that failover is one `fdb replace` per peer.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyroute2 import netns as pyroute2_netns

from thorn.desired import ColourName
from thorn_programmer.drivers.emulation import EmulationDriver
from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.intent import (
    HostIntent,
    LocalWorkload,
    Peer,
    UnderlayRoute,
)
from thorn_programmer.kernel import Fdb, Redirect
from thorn_programmer.reconcile import plan_changes, reconcile

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="needs root for network namespaces",
)

VNI = 1000
PORT = 47000


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run fn in a fresh thread that has entered `ns` (setns is per thread)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            pyroute2_netns.setns(ns)
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class TwoHosts:
    """h1 and h2, links red (eth1 <-> eth1) and blue (eth2 <-> eth2), workloads w1, w2."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = {n: f"td{tag}-{n}" for n in ("h1", "h2", "w1", "w2")}
        self.teps: dict[str, dict[ColourName, str]] = {
            "h1": {"red": "10.224.0.1", "blue": "10.240.0.1"},
            "h2": {"red": "10.224.0.2", "blue": "10.240.0.2"},
        }
        self.macs = {"w1": "06:00:00:00:00:01", "w2": "06:00:00:00:00:02"}
        self.ips = {"w1": "100.64.0.1", "w2": "100.64.0.2"}

    def up(self) -> None:
        ns = self.ns
        for name in ns.values():
            sh("ip", "netns", "add", name)
            sh("ip", "-n", name, "link", "set", "dev", "lo", "up")
        for n, (a, b) in enumerate((("10.0.0.0", "10.0.0.1"), ("10.0.1.0", "10.0.1.1")), 1):
            sh("ip", "-n", ns["h1"], "link", "add", "name", f"eth{n}", "type", "veth",
               "peer", "name", f"eth{n}", "netns", ns["h2"])  # fmt: skip
            sh("ip", "-n", ns["h1"], "addr", "add", f"{a}/31", "dev", f"eth{n}")
            sh("ip", "-n", ns["h2"], "addr", "add", f"{b}/31", "dev", f"eth{n}")
            for h in ("h1", "h2"):
                sh("ip", "-n", ns[h], "link", "set", "dev", f"eth{n}", "up")
        for h, w in (("h1", "w1"), ("h2", "w2")):
            sh("ip", "-n", ns[h], "link", "add", "name", "vf0_rep", "type", "veth",
               "peer", "name", "vf0", "netns", ns[w])  # fmt: skip
            sh("ip", "-n", ns[h], "link", "set", "dev", "vf0_rep", "up")
            sh("ip", "-n", ns[w], "link", "set", "dev", "vf0", "address", self.macs[w])
            sh("ip", "-n", ns[w], "addr", "add", f"{self.ips[w]}/24", "dev", "vf0")
            sh("ip", "-n", ns[w], "link", "set", "dev", "vf0", "up")

    def down(self) -> None:
        for name in self.ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def intent(self, host: str, revision: int = 1, colour: ColourName = "red") -> HostIntent:
        me, peer = (host, "h2" if host == "h1" else "h1")
        mine, theirs = ("w1", "w2") if host == "h1" else ("w2", "w1")
        near, far = ("10.0.0.1", "10.0.1.1") if host == "h1" else ("10.0.0.0", "10.0.1.0")
        return HostIntent(
            node=me,
            revision=revision,
            teps=self.teps[me],
            routes=(
                UnderlayRoute(f"{self.teps[peer]['red']}/32", "eth1", near),
                UnderlayRoute(f"{self.teps[peer]['blue']}/32", "eth2", far),
            ),
            local=(LocalWorkload(mine, VNI, "vf0_rep", self.macs[mine], self.ips[mine]),),
            peers=(
                Peer(
                    theirs, VNI, self.macs[theirs], self.ips[theirs], peer, self.teps[peer], colour
                ),
            ),
        )


@pytest.fixture
def hosts() -> Iterator[TwoHosts]:
    lab = TwoHosts()
    try:
        lab.up()
        yield lab
    finally:
        lab.down()


def udp_exchange(lab: TwoHosts, count: int = 20) -> int:
    """Send `count` datagrams w1 -> w2 (after one to resolve ARP); how many arrived."""
    received: list[bytes] = []
    ready = threading.Event()

    def receive() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((lab.ips["w2"], PORT))
        s.settimeout(1.0)
        ready.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(received) < count:
            try:
                received.append(s.recv(64))
            except TimeoutError:
                continue
        s.close()

    receiver = threading.Thread(target=in_netns, args=(lab.ns["w2"], receive))
    receiver.start()
    ready.wait(5)

    def send() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for n in range(count):
            s.sendto(f"probe {n}".encode(), (lab.ips["w2"], PORT))
            time.sleep(0.005)
        s.close()

    in_netns(lab.ns["w1"], send)
    receiver.join(10)
    return len(received)


def tx_packets(lab: TwoHosts, host: str, dev: str) -> int:
    out = subprocess.run(
        ["ip", "-n", lab.ns[host], "-s", "-j", "link", "show", "dev", dev],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    import json

    return int(json.loads(out)[0]["stats64"]["tx"]["packets"])


async def program(lab: TwoHosts, colour: ColourName = "red") -> None:
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
    assert ("route", "10.250.0.0/24") in failed
    assert any(k[:2] == ("u32", "vf7_rep") for k in failed)
    # Everything else is in place: the peer's FDB entry, the working workload's redirect.
    assert {c.obj.key for c in left} <= failed
    actual = await _read(hosts.ns["h1"])
    assert Fdb("thv1000", "06:00:00:00:00:02", "10.224.0.2") in actual
    assert any(isinstance(o, Redirect) and o.dev == "vf0_rep" for o in actual)


async def _read(ns: str) -> list[Any]:
    async with NetlinkDatapath.open(ns) as driver:
        return await driver.read()
