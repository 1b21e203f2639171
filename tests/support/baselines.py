"""The baselines `make bench-failover` compares THORN with, set up on the same lab.

Both carry the same overlay as THORN's emulation driver, built from the lab's plan: in every
host namespace one Linux bridge per VNI joins the workloads' representors (``<vf>_rep``)
and one VXLAN device (``local`` = the host's red TEP on ``lo``, UDP 4789, ``nolearning``),
with a static FDB entry per remote workload MAC -> its host's red TEP and one flood entry
(all-zero MAC) per remote host, for ARP. Every host routes by default to its leaf. They
differ only in how the switches route the TEP /32s:

`Frr`
    What an operator would deploy instead: Debian's FRR (8.4) in every switch namespace,
    zebra + bfdd + bgpd each (hosts speak no BGP). eBGP per RFC 7938: all spines share one
    ASN, each leaf has its own; ECMP (``maximum-paths``, ``bgp bestpath as-path
    multipath-relax``, an L4 multipath hash on the switches, so VXLAN's source port spreads
    flows); BFD 10 ms x 3 on every BGP session (profile ``fast``); the hidden ``no zebra
    nexthop kernel enable`` (8.4 restores ECMP routes wrongly through kernel nexthop
    objects). Each leaf holds a kernel route to its own hosts' TEPs and redistributes it.
    Daemons are started and stopped as docs/bfd.md's recipe says (pid files,
    ``-N NAME``, up to 5 s to stop). bfdd runs at SCHED_FIFO like THORN's BFD child unless
    ``bfdd_realtime=False``. `problems` says what keeps it from converged.

`Static`
    No protection at all: one /32 route per host TEP on every switch, along a single path
    (host k's TEP is reached through spine k mod #spines, so every spine carries traffic),
    no BFD, nothing reacts to a failure. A port set admin down loses its routes in Linux;
    `restored` puts them back once the fault is undone (as a router's configured static
    routes reappear when the port comes back up), never while the failure lasts, so a hit
    flow's gap is the whole time the failure is held plus what Linux takes to forward again
    after the restore (the link's operstate, re-resolving the neighbour).

The lab's faults (`thorn_lab.faults`) act on veth admin state and tc ingress filters, so
they apply to both unchanged. Layouts other than a two-tier leaf-spine with single-homed
hosts are refused (`LayoutError`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thorn import netns
from thorn.model import Colour
from thorn_lab.blueprint import EndPlan, NamespaceKind
from thorn_lab.handle import Lab
from thorn_programmer.bfd.process import RT_PRIORITY as BFD_RT_PRIORITY

__all__ = ["Frr", "Layout", "LayoutError", "NotConverged", "Static"]

VXLAN_PORT = 4789
ZERO_MAC = "00:00:00:00:00:00"
SPINE_ASN, FIRST_LEAF_ASN = 65000, 65001
BFD_INTERVAL_MS, BFD_MULTIPLIER = 10, 3
FRR_BIN = Path("/usr/lib/frr")
FRR_RUN = Path("/var/run/frr")
DAEMONS = ("zebra", "bfdd", "bgpd")  # started in this order (bfdd and bgpd talk to zebra)
START_WAIT_S = 5.0  # a daemon's vty socket appears within this
STOP_WAIT_S = 5.0  # a quick SIGKILL leaves stale kernel nexthops: give each daemon 5 s
CMD_TIMEOUT_S = 20.0


class LayoutError(ValueError):
    """The lab is not a two-tier leaf-spine with single-homed hosts."""


class NotConverged(RuntimeError):
    """FRR did not reach its steady state in time; the message lists what is missing."""


def sh(*args: str, stdin: str | None = None) -> str:
    """Run a command; raise RuntimeError with its stderr if it fails."""
    done = subprocess.run(args, input=stdin, capture_output=True, text=True,
                          timeout=CMD_TIMEOUT_S, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def ip_batch(namespace: str, lines: list[str], tool: str = "ip") -> None:
    """`ip -n NS -batch -` (or `bridge`): every line one command, all in one process."""
    if lines:
        sh(tool, "-n", namespace, "-batch", "-", stdin="\n".join(lines) + "\n")


def _address(end: EndPlan) -> str:
    return end.addresses[0].split("/")[0]


# --- what the lab's plan gives -----------------------------------------------------------


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    tep: str  # the red TEP (no prefix length): the overlay's tunnel endpoint
    ifname: str  # the host's port toward its leaf
    gateway: str  # the leaf's address on that link
    leaf: str
    leaf_ifname: str  # the leaf's port toward the host
    address: str  # the host's address on that link


@dataclass(frozen=True)
class Uplink:
    """One leaf-spine link."""

    leaf: str
    spine: str
    leaf_ifname: str
    leaf_address: str
    spine_ifname: str
    spine_address: str


@dataclass(frozen=True)
class Layout:
    hosts: list[Host]
    leaves: list[str]
    spines: list[str]
    uplinks: list[Uplink]
    namespaces: dict[str, str]  # node -> namespace

    @classmethod
    def of(cls, lab: Lab) -> Layout:
        kinds = {ns.node: ns.kind for ns in lab.plan.namespaces
                 if ns.kind is not NamespaceKind.workload}  # fmt: skip
        teps = {t.node: str(t.address) for t in lab.fabric.teps if t.colour is Colour.red}
        order = {node: i for i, node in enumerate(kinds)}  # the plan's order
        hosts: dict[str, Host] = {}
        fabric_links: list[tuple[EndPlan, EndPlan]] = []
        for veth in lab.plan.links():
            if kinds[veth.b.node] is NamespaceKind.host:
                host_end, other = veth.b, veth.a
            else:
                host_end, other = veth.a, veth.b
            if kinds[host_end.node] is not NamespaceKind.host:
                fabric_links.append((veth.a, veth.b))
                continue
            if kinds[other.node] is not NamespaceKind.switch or host_end.node in hosts:
                raise LayoutError(f"{host_end.node}: baselines need single-homed hosts")
            hosts[host_end.node] = Host(
                name=host_end.node, namespace=host_end.namespace, tep=teps[host_end.node],
                ifname=host_end.ifname, gateway=_address(other), leaf=other.node,
                leaf_ifname=other.ifname, address=_address(host_end),
            )  # fmt: skip
        leaves = sorted({h.leaf for h in hosts.values()}, key=order.__getitem__)
        spines = [n for n, k in kinds.items() if k is NamespaceKind.switch and n not in leaves]
        uplinks = []
        for a, b in fabric_links:
            leaf, spine = (a, b) if a.node in leaves else (b, a)
            if leaf.node not in leaves or spine.node not in spines:
                raise LayoutError(f"{a.node}--{b.node}: baselines need a two-tier leaf-spine")
            uplinks.append(Uplink(leaf.node, spine.node, leaf.ifname, _address(leaf),
                                  spine.ifname, _address(spine)))  # fmt: skip
        ordered = sorted(hosts.values(), key=lambda h: order[h.name])
        return cls(ordered, leaves, spines, uplinks, lab.namespaces())

    def uplinks_of(self, node: str) -> list[Uplink]:
        return [u for u in self.uplinks if node in (u.leaf, u.spine)]

    def uplink(self, leaf: str, spine: str) -> Uplink:
        return next(u for u in self.uplinks if u.leaf == leaf and u.spine == spine)


def overlay(lab: Lab, layout: Layout) -> None:
    """Per host: bridge + VXLAN per VNI, static FDB toward the remote workloads' hosts, and
    a default route to the leaf."""
    tep = {h.name: h.tep for h in layout.hosts}
    for host in layout.hosts:
        mine = [w for w in lab.plan.workloads if w.node == host.name]
        links = [f"route replace default via {host.gateway} dev {host.ifname}"]
        fdb = []
        for vni in sorted({w.vni for w in mine}):
            br, vx = f"br{vni}", f"vx{vni}"
            links += [
                f"link add {br} type bridge",
                f"link add {vx} type vxlan id {vni} local {host.tep} dstport {VXLAN_PORT} "
                "nolearning",
                f"link set {vx} master {br}",
                *(f"link set {w.rep} master {br}" for w in mine if w.vni == vni),
                f"link set {vx} up",
                f"link set {br} up",
            ]
            remote = [w for w in lab.plan.workloads if w.vni == vni and w.node != host.name]
            fdb += [f"fdb add {w.mac} dev {vx} dst {tep[w.node]} self permanent" for w in remote]
            fdb += [f"fdb append {ZERO_MAC} dev {vx} dst {tep[n]} self permanent"
                    for n in sorted({w.node for w in remote})]  # fmt: skip
        ip_batch(host.namespace, links)
        ip_batch(host.namespace, fdb, tool="bridge")


def leaf_host_routes(layout: Layout) -> dict[str, list[str]]:
    """namespace -> `ip` lines: each leaf's route to its own hosts' TEPs."""
    routes: dict[str, list[str]] = {layout.namespaces[leaf]: [] for leaf in layout.leaves}
    for h in layout.hosts:
        routes[layout.namespaces[h.leaf]].append(
            f"route replace {h.tep}/32 via {h.address} dev {h.leaf_ifname}"
        )
    return routes


def _multipath_hash_l4(namespace: str) -> None:
    """Hash ECMP on the 5-tuple (VXLAN's source port carries the inner flow's entropy)."""
    with netns.entered(namespace):
        Path("/proc/sys/net/ipv4/fib_multipath_hash_policy").write_text("1")


# --- static single path --------------------------------------------------------------------


class Static:
    """One path per destination TEP, installed once; nothing reacts."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.layout = Layout.of(lab)
        self.routes = leaf_host_routes(self.layout)
        for host in self.layout.hosts:
            spine = self.spine_for(host.name)
            for leaf in self.layout.leaves:
                if leaf != host.leaf:
                    up = self.layout.uplink(leaf, spine)
                    self.routes[self.layout.namespaces[leaf]].append(
                        f"route replace {host.tep}/32 via {up.spine_address} dev {up.leaf_ifname}"
                    )
            down = self.layout.uplink(host.leaf, spine)
            self.routes.setdefault(self.layout.namespaces[spine], []).append(
                f"route replace {host.tep}/32 via {down.leaf_address} dev {down.spine_ifname}"
            )

    def spine_for(self, host: str) -> str:
        """The one spine every path toward `host`'s TEP crosses: host k's is spine k mod #spines."""
        k = [h.name for h in self.layout.hosts].index(host)
        return self.layout.spines[k % len(self.layout.spines)]

    def start(self) -> None:
        overlay(self.lab, self.layout)
        self.restored()

    def restored(self) -> None:
        """Put back routes the kernel deleted when a port went admin down."""
        for namespace, lines in self.routes.items():
            ip_batch(namespace, lines)

    def settle(self) -> None:
        """Between failures: forget neighbours that failed to resolve while a link was out.
        Linux retries an unresolved one only once a second, which would spill one failure's
        outage into the next round; the first packet then resolves it at once."""
        for namespace in self.layout.namespaces.values():
            ip_batch(namespace, ["neigh flush nud failed", "neigh flush nud incomplete"])

    def stop(self) -> None:
        """Nothing runs; the lab's teardown removes the devices and routes."""


# --- FRR eBGP + BFD ------------------------------------------------------------------------


def frr_config(layout: Layout, switch: str) -> str:
    """The whole configuration of one switch (zebra, bfdd and bgpd parts), for vtysh -f."""
    leaf = switch in layout.leaves
    asn = FIRST_LEAF_ASN + layout.leaves.index(switch) if leaf else SPINE_ASN
    links = layout.uplinks_of(switch)
    if leaf:
        peers = [(u.spine_address, SPINE_ASN) for u in links]
    else:
        peers = [(u.leaf_address, FIRST_LEAF_ASN + layout.leaves.index(u.leaf)) for u in links]
    router_id = links[0].leaf_address if leaf else links[0].spine_address
    lines = [
        "no zebra nexthop kernel enable",
        "bfd",
        " profile fast",
        f"  transmit-interval {BFD_INTERVAL_MS}",
        f"  receive-interval {BFD_INTERVAL_MS}",
        f"  detect-multiplier {BFD_MULTIPLIER}",
        " exit",
        "exit",
        f"router bgp {asn}",
        f" bgp router-id {router_id}",
        " no bgp ebgp-requires-policy",
        " bgp bestpath as-path multipath-relax",
        " timers bgp 3 9",
    ]
    for address, remote in peers:
        lines += [
            f" neighbor {address} remote-as {remote}",
            f" neighbor {address} bfd profile fast",
            f" neighbor {address} timers connect 1",
            f" neighbor {address} advertisement-interval 0",
        ]
    lines += [" address-family ipv4 unicast", "  maximum-paths 64"]
    lines += [f"  neighbor {address} activate" for address, _ in peers]
    if leaf:
        lines.append("  redistribute kernel")
    lines += [" exit-address-family", "exit"]
    return "\n".join(lines) + "\n"


def _json_documents(text: str) -> list[Any]:
    """vtysh prints one JSON document per `-c`: split them."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at < len(text):
            doc, at = decoder.raw_decode(text, at)
            docs.append(doc)
    return docs


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Frr:
    """FRR eBGP + BFD in every switch namespace; `wait_converged` before measuring."""

    def __init__(self, lab: Lab, *, bfdd_realtime: bool = True) -> None:
        if not (FRR_BIN / "bgpd").exists() or shutil.which("vtysh") is None:
            raise RuntimeError("FRR is not installed: make test-deps (apt-get install -y frr)")
        self.lab = lab
        self.layout = Layout.of(lab)
        self.switches = [*self.layout.spines, *self.layout.leaves]
        self.bfdd_realtime = bfdd_realtime
        self.started: list[tuple[str, str]] = []  # (switch, daemon), in start order

    def instance(self, switch: str) -> str:
        """FRR's instance name (-N) for a switch: its namespace's name, unique per lab."""
        return self.layout.namespaces[switch]

    def pidfile(self, switch: str, daemon: str) -> Path:
        return FRR_RUN / self.instance(switch) / f"{daemon}.pid"

    def start(self) -> None:
        overlay(self.lab, self.layout)
        for namespace, lines in leaf_host_routes(self.layout).items():
            ip_batch(namespace, lines)
        for switch in self.switches:
            _multipath_hash_l4(self.layout.namespaces[switch])
            rundir = FRR_RUN / self.instance(switch)
            rundir.mkdir(parents=True, exist_ok=True)
            shutil.chown(rundir, "frr", "frr")
            for daemon in DAEMONS:
                extra = ["-s", "90000000"] if daemon == "zebra" else []
                self.started.append((switch, daemon))
                sh("ip", "netns", "exec", self.layout.namespaces[switch], str(FRR_BIN / daemon),
                   "-d", "-N", self.instance(switch), "-A", "127.0.0.1", "-f", "/dev/null",
                   "-i", str(self.pidfile(switch, daemon)), *extra)  # fmt: skip
        for switch in self.switches:
            self._wait_vty(switch)
            if self.bfdd_realtime:
                _realtime(self.pids()[(switch, "bfdd")])
            with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
                f.write(frr_config(self.layout, switch))
                f.flush()
                out = sh("ip", "netns", "exec", self.layout.namespaces[switch], "vtysh", "-N",
                         self.instance(switch), "-f", f.name)  # fmt: skip
            if "%" in out:  # vtysh prints "% Unknown command" and the like, exit 0 or not
                raise RuntimeError(f"{switch}: FRR refused part of its configuration:\n{out}")

    def _wait_vty(self, switch: str) -> None:
        rundir = FRR_RUN / self.instance(switch)
        deadline = time.monotonic() + START_WAIT_S
        missing = list(DAEMONS)
        while missing and time.monotonic() < deadline:
            missing = [d for d in DAEMONS if not (rundir / f"{d}.vty").exists()]
            if missing:
                time.sleep(0.05)
        if missing:
            raise RuntimeError(f"{switch}: FRR {', '.join(missing)} did not start in "
                               f"{START_WAIT_S:.0f} s (no vty socket in {rundir})")  # fmt: skip

    def vtysh(self, switch: str, *commands: str) -> list[Any]:
        args = [a for c in commands for a in ("-c", c)]
        return _json_documents(sh("vtysh", "-N", self.instance(switch), *args))

    def problems(self) -> list[str]:
        """What keeps FRR from its steady state: sessions not Established, BFD peers not up,
        TEP routes missing or without every equal-cost next hop. Empty: converged."""
        found = []
        for switch in self.switches:
            bgp, bfd = self.vtysh(switch, "show bgp summary json", "show bfd peers json")
            peers = bgp.get("ipv4Unicast", {}).get("peers", {})
            want = [u.spine_address if switch in self.layout.leaves else u.leaf_address
                    for u in self.layout.uplinks_of(switch)]  # fmt: skip
            for address in want:
                state = peers.get(address, {}).get("state", "absent")
                if state != "Established":
                    found.append(f"{switch}: BGP {address} {state}")
            bfd_up = {p.get("peer") for p in bfd if p.get("status") == "up"}
            found += [f"{switch}: BFD {a} not up" for a in want if a not in bfd_up]
            found += self._route_problems(switch)
        return found

    def _route_problems(self, switch: str) -> list[str]:
        routes = json.loads(sh("ip", "-n", self.layout.namespaces[switch], "-j", "route", "show",
                               "proto", "bgp"))  # fmt: skip
        hops = {r["dst"]: len(r.get("nexthops", [])) or 1 for r in routes}
        leaf = switch in self.layout.leaves
        ecmp = len(self.layout.uplinks_of(switch)) if leaf else 1
        found = []
        for h in self.layout.hosts:
            if h.leaf == switch:
                continue
            have = hops.get(h.tep, 0)
            if have < ecmp:
                found.append(f"{switch}: route to {h.name}'s TEP {h.tep}: {have}/{ecmp} next hops")
        return found

    def wait_converged(self, timeout: float) -> float:
        """Seconds until `problems` is empty; NotConverged (listing them) after `timeout`."""
        start = time.monotonic()
        left: list[str] = []
        for _ in range(int(timeout / 0.1) + 1):
            left = self.problems()
            if not left or time.monotonic() - start > timeout:
                break
            time.sleep(0.1)
        if left:
            shown = "; ".join(left[:8]) + (f"; and {len(left) - 8} more" if len(left) > 8 else "")
            raise NotConverged(f"FRR not converged after {timeout:.0f} s: {shown}")
        return time.monotonic() - start

    def restored(self) -> None:
        """FRR repairs itself: nothing to do."""

    def pids(self) -> dict[tuple[str, str], int]:
        """(switch, daemon) -> pid, for daemons that are ours and alive (by pid file and
        command line, so a reused pid or another lab's daemon is never touched)."""
        found = {}
        for switch, daemon in self.started:
            try:
                pid = int(self.pidfile(switch, daemon).read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if self.instance(switch).encode() in cmdline and cmdline[0].endswith(daemon.encode()):
                found[(switch, daemon)] = pid
        return found

    def cpu_seconds(self) -> dict[str, float]:
        """daemon -> CPU seconds (user + system) used so far, summed over the switches."""
        totals = dict.fromkeys(DAEMONS, 0.0)
        for (_, daemon), pid in self.pids().items():
            with suppress(OSError, IndexError, ValueError):  # it just exited
                totals[daemon] += _cpu_seconds(pid)
        return totals

    def bfd_sessions(self) -> int:
        """BFD sessions, counting each end once (every uplink is one session with two)."""
        return len(self.layout.uplinks)

    def bfd_downs(self) -> int:
        """Session Down transitions so far, summed over both ends of every session."""
        return sum(int(p.get("session-down", 0)) for switch in self.switches
                   for p in self.vtysh(switch, "show bfd peers counters json")[0])  # fmt: skip

    def stop(self) -> None:
        """bgpd and bfdd first, then zebra (it removes its routes); SIGTERM by pid file, up
        to STOP_WAIT_S for each wave, SIGKILL what is left; then the run directories."""
        for wave in (("bgpd", "bfdd"), ("zebra",)):
            pids = [pid for (_, d), pid in self.pids().items() if d in wave]
            for pid in pids:
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p)]
                if pids:
                    time.sleep(0.05)
            for pid in pids:
                _signal(pid, signal.SIGKILL)
        for switch in dict.fromkeys(s for s, _ in self.started):
            shutil.rmtree(FRR_RUN / self.instance(switch), ignore_errors=True)
        self.started.clear()


def _realtime(pid: int) -> None:
    """Every thread of `pid` at SCHED_FIFO BFD_RT_PRIORITY, as THORN's BFD child runs."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(BFD_RT_PRIORITY))


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie (daemonised: reaped by init) has stopped
