"""Two hosts for datapath tests: h1 and h2 joined by a red link (eth1) and a blue link
(eth2), each host's TEP of a colour routed over that colour's link, and one workload behind
a representor on each host. Plus helpers to run code in a namespace and to send probes."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from thorn.model import Colour
from thorn.netns import run_in_netns
from thorn_programmer.intent import HostIntent, LocalWorkload, Peer, UnderlayRoute

VNI = 1000
PORT = 47000


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run fn in a fresh thread that has entered `ns` (setns is per thread)."""
    return run_in_netns(ns, fn)


class TwoHosts:
    """h1 and h2, links red (eth1 <-> eth1) and blue (eth2 <-> eth2), workloads w1, w2."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.ns = {n: f"td{tag}-{n}" for n in ("h1", "h2", "w1", "w2")}
        self.teps: dict[str, dict[Colour, str]] = {
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

    def intent(self, host: str, revision: int = 1, colour: Colour = "red") -> HostIntent:
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
    return int(json.loads(out)[0]["stats64"]["tx"]["packets"])


def documents(lab: TwoHosts, blue_peers: dict[str, list[str]] | None = None) -> dict[str, bytes]:
    """The desired-state KV entries pathcomp would write for the two hosts."""
    from thorn.desired import HostState, Route, VniMember, VniState
    from thorn.desired import LocalWorkload as LocalDoc

    blue_peers = blue_peers or {}
    docs: dict[str, bytes] = {}
    members = []
    for host, workload in (("h1", "w1"), ("h2", "w2")):
        intent = lab.intent(host)
        routes = [
            Route(prefix=r.prefix, colour=colour, port=r.dev, neighbour="other", via=r.via,
                  stage=1000)
            for r, colour in zip(intent.routes, ("red", "blue"), strict=True)
        ]  # fmt: skip
        state = HostState(
            node=host, plan_revision=1, topology_revision=1, teps=lab.teps[host], routes=routes,
            local=[LocalDoc(name=workload, vni=VNI, vf="vf0", mac=lab.macs[workload],
                            ip=lab.ips[workload])],
            vnis=[VNI], blue_peers=blue_peers.get(host, []),
        )  # fmt: skip
        docs[f"node.{host}"] = state.model_dump_json().encode()
        members.append(VniMember(name=workload, mac=lab.macs[workload], ip=lab.ips[workload],
                                 host=host, red=lab.teps[host]["red"],
                                 blue=lab.teps[host]["blue"]))  # fmt: skip
    vni = VniState(vni=VNI, chunk=0, chunks=1, topology_revision=1, members=members)
    docs[f"vni.{VNI}.0"] = vni.model_dump_json().encode()
    return docs


@pytest.fixture(name="hosts")
def hosts_fixture() -> Iterator[TwoHosts]:
    """Two hosts up for one test, always taken down after it."""
    lab = TwoHosts()
    try:
        lab.up()
        yield lab
    finally:
        lab.down()
