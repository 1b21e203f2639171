"""Two emulated SmartNIC hosts joined by a red and a blue underlay path, built with iproute2.

    workload A ─ rep0 [host A] red ── [router red] ── red [host B] rep0 ─ workload B
                               blue ─ [router blue] ─ blue

Each host namespace plays a SmartNIC eswitch: the workload's netdev is a veth whose peer
`rep0` is the representor, `vxlan0` is an external (collect_md) VXLAN device, and every
host has one TEP address per colour (its uplink address on that colour's path). The
workload netdevs sit in namespaces of their own (`vf0`) or, for Soft-RoCE, in the guest's
root namespace (`vfA`, `vfB`): rxe only works there on Debian's 6.1.

The tunnel itself (flower + tunnel_key encap/decap) is programmed separately:
`program_tunnel_with_tc` here, behind `roce.program_tunnel` for the RoCE harness.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

NetnsFactory = Callable[[str], str]
Colour = Literal["red", "blue"]
COLOURS: tuple[Colour, Colour] = ("red", "blue")

# Loaded once per lane session by conftest; a module that does not load fails the session.
LANE_MODULES = (
    "cls_flower",
    "act_tunnel_key",
    "act_mirred",
    "act_gact",
    "vxlan",
    "veth",
    "rdma_rxe",
)
VNI = 100
VXLAN_PORT = 4789
SHARED_ACTION_INDEX = 7  # every encap filter toward the peer binds this tunnel_key action
UNDERLAY_MTU = 9000  # room for the VXLAN header around full-size inner frames

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def sh(*args: str, stdin: str | None = None, check: bool = True) -> str:
    """Run a command, return its stdout; a failure shows the command and its stderr."""
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"`{' '.join(args)}` exited {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def _netns_args(ns: str | None) -> tuple[str, ...]:
    return ("-n", ns) if ns else ()


def ip(ns: str | None, command: str, check: bool = True) -> str:
    """`ip -n NS COMMAND`; the root namespace when `ns` is None."""
    return sh("ip", *_netns_args(ns), *command.split(), check=check)


def tc(ns: str | None, command: str, check: bool = True) -> str:
    return sh("tc", *_netns_args(ns), *command.split(), check=check)


class Batch:
    """iproute2 commands grouped per (tool, namespace), each group run as one `-batch`.

    Under TCG every process costs 0.1-0.5 s: one `ip -batch` per namespace instead of one
    `ip` per command builds a fabric in seconds instead of tens of seconds.
    """

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str | None], list[str]] = {}

    def ip(self, ns: str | None, command: str) -> None:
        self.groups.setdefault(("ip", ns), []).append(command)

    def tc(self, ns: str | None, command: str) -> None:
        self.groups.setdefault(("tc", ns), []).append(command)

    def run(self, force: bool = False) -> None:
        """Groups run in the order they were first used; a failing line stops its group,
        unless `force` (for undoing: carry on past what is already gone)."""
        for (tool, ns), lines in self.groups.items():
            options = ("-force",) if force else ()
            sh(tool, *_netns_args(ns), *options, "-batch", "-",
               stdin="\n".join(lines) + "\n", check=not force)  # fmt: skip
        self.groups.clear()


class Prestarted:
    """One iproute2 command whose process is started ahead of time and fed when it is due.

    Under TCG starting `tc` costs 0.1-0.3 s, more than the whole failover budget: the
    process (`tc -batch -`) already waits on its stdin, calling this object sends the line
    and returns once the process has exited (the change is in the kernel by then).
    """

    def __init__(self, tool: str, ns: str | None, command: str) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            [tool, *_netns_args(ns), "-batch", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __call__(self) -> None:
        self.send()
        self.wait()

    def send(self) -> None:
        """Hand the command over and return at once: it runs while we go on."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.command + "\n")
        self.proc.stdin.close()

    def wait(self) -> None:
        assert self.proc.stderr is not None
        if self.proc.wait(timeout=30) != 0:
            err = self.proc.stderr.read()
            raise AssertionError(f"`{self.command}` exited {self.proc.returncode}: {err}")

    def close(self) -> None:
        """End the process; if the command was never sent, nothing runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stderr):
            if pipe:
                pipe.close()


@contextlib.contextmanager
def prestarted(tool: str, ns: str | None, command: str) -> Iterator[Prestarted]:
    pending = Prestarted(tool, ns, command)
    try:
        yield pending
    finally:
        pending.close()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def entered(ns: str | None) -> Iterator[None]:
    """Run the block in namespace `ns` (this thread only); sockets made there stay there."""
    if ns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def sysctl(ns: str | None, key: str, value: str | int) -> None:
    # /proc/sys/net shows the namespace of whoever opens it.
    with entered(ns):
        Path("/proc/sys", *key.split(".")).write_text(f"{value}\n")


def tx_packets(ns: str | None, dev: str) -> int:
    """The device's transmitted packets, from /proc/net/dev (no process to start)."""
    with entered(ns):
        table = Path("/proc/thread-self/net/dev").read_text()
    for line in table.splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == dev:
            return int(counters.split()[9])  # 8 receive columns, tx bytes, tx packets
    raise AssertionError(f"no {dev} in {ns or 'the root namespace'}")


def wait_oper_up(ns: str | None, devs: Iterable[str], timeout_s: float = 10.0) -> None:
    """A new veth can be DOWN for a moment after `up`: wait until all of `devs` are UP."""
    wanted = set(devs)
    deadline = time.monotonic() + timeout_s
    while True:
        states = {link["ifname"]: link["operstate"] for link in json.loads(ip(ns, "-j link"))}
        pending = {dev: states.get(dev) for dev in wanted if states.get(dev) != "UP"}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not up in {ns or 'the root namespace'}: {pending}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Workload:
    name: str  # "A" or "B"
    ns: str | None  # None: the guest's root namespace
    dev: str
    ip: str
    mac: str


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    tep: dict[Colour, str]  # this host's TEP address per colour (its uplink's address)
    gateway: dict[Colour, str]  # the colour's router: next hop toward the peer's TEP
    workload: Workload

    @property
    def router_port(self) -> str:
        return f"to_{self.name.lower()}"


@dataclass(frozen=True)
class Fabric:
    a: Host
    b: Host
    routers: dict[Colour, str]  # colour -> router namespace

    def peer(self, host: Host) -> Host:
        return self.b if host is self.a else self.a


def build_fabric(
    netns: NetnsFactory, *, workloads_in_root: bool = False, tunnel_device: bool = True
) -> Fabric:
    """Hosts A and B, routers red and blue, the workloads; no tunnel rules yet.

    Host N (1 for A, 2 for B) has the uplink 198.18.C.(4N-3)/30 on colour C (1 red, 2 blue),
    which is also its TEP for that colour; the router's side is 198.18.C.(4N-2). Workload N
    is 10.100.0.N with the MAC 02:00:00:00:00:0N.
    """
    routers: dict[Colour, str] = {c: netns(f"r{c}") for c in COLOURS}
    for router in routers.values():
        sysctl(router, "net.ipv4.ip_forward", 1)
    hosts: list[Host] = []
    for name, n in (("A", 1), ("B", 2)):
        mac, addr = f"02:00:00:00:00:0{n}", f"10.100.0.{n}"
        workload = (
            Workload(name, None, f"vf{name}", addr, mac)
            if workloads_in_root
            else Workload(name, netns(f"w{name}"), "vf0", addr, mac)
        )
        hosts.append(
            Host(
                name,
                netns(f"h{name}"),
                tep={c: f"198.18.{i}.{4 * n - 3}" for i, c in enumerate(COLOURS, start=1)},
                gateway={c: f"198.18.{i}.{4 * n - 2}" for i, c in enumerate(COLOURS, start=1)},
                workload=workload,
            )
        )
    a, b = hosts

    # Every veth pair from the root namespace, each end made in the namespace it belongs to.
    links = Batch()
    for host in hosts:
        for colour in COLOURS:
            links.ip(
                None,
                f"link add {colour} netns {host.ns} mtu {UNDERLAY_MTU} type veth "
                f"peer name {host.router_port} netns {routers[colour]} mtu {UNDERLAY_MTU}",
            )
        w = host.workload
        in_ns = f"netns {w.ns}" if w.ns else ""
        links.ip(
            None,
            f"link add {w.dev} {in_ns} address {w.mac} type veth peer name rep0 netns {host.ns}",
        )
    links.run()

    config = Batch()
    for colour, router in routers.items():
        for host in hosts:
            config.ip(router, f"addr add {host.gateway[colour]}/30 dev {host.router_port}")
            config.ip(router, f"link set dev {host.router_port} up")
    for host in hosts:
        for colour in COLOURS:
            config.ip(host.ns, f"addr add {host.tep[colour]}/30 dev {colour}")
            config.ip(host.ns, f"link set dev {colour} up")
        # Without `tunnel_device` the tunnel is the programmer's to make (its own thorn-vx).
        devices = ("rep0", "vxlan0") if tunnel_device else ("rep0",)
        if tunnel_device:
            config.ip(host.ns, f"link add vxlan0 type vxlan external dstport {VXLAN_PORT}")
        for dev in devices:
            config.ip(host.ns, f"link set dev {dev} up")
            config.tc(host.ns, f"qdisc add dev {dev} clsact")
        # Path pinning: the peer's red TEP only via the red router, its blue TEP via blue.
        peer = b if host is a else a
        for colour in COLOURS:
            config.ip(host.ns, f"route add {peer.tep[colour]}/32 via {host.gateway[colour]}")
        w = host.workload
        # /32 in the root namespace: both workloads' addresses are local there.
        config.ip(w.ns, f"addr add {w.ip}/{24 if w.ns else 32} dev {w.dev}")
        config.ip(w.ns, f"link set dev {w.dev} up")
    config.run()

    for router in routers.values():
        wait_oper_up(router, (h.router_port for h in hosts))
    for host in hosts:
        wait_oper_up(host.ns, (*COLOURS, "rep0"))
        wait_oper_up(host.workload.ns, (host.workload.dev,))
    return Fabric(a, b, routers)


def static_neighbours(fabric: Fabric) -> None:
    """Workloads know each other's MAC: no ARP has to cross the tunnel."""
    batch = Batch()
    for src, dst in (
        (fabric.a.workload, fabric.b.workload),
        (fabric.b.workload, fabric.a.workload),
    ):
        batch.ip(src.ns, f"neigh replace {dst.ip} lladdr {dst.mac} dev {src.dev} nud permanent")
    batch.run()


# --- the tunnel, programmed with iproute2 ---------------------------------------------------


def tunnel_key_set(src: Host, dst: Host, colour: Colour) -> str:
    """The shared encap action toward `dst` on `colour`; skip_hw like the filters bound to it
    (the kernel refuses a filter whose action's offload flags differ)."""
    return (
        f"action tunnel_key set src_ip {src.tep[colour]} dst_ip {dst.tep[colour]} "
        f"id {VNI} dst_port {VXLAN_PORT} index {SHARED_ACTION_INDEX} skip_hw"
    )


def program_tunnel_with_tc(fabric: Fabric, colour: Colour = "red") -> None:
    """Encap on each representor through one shared tunnel_key action, decap on vxlan0."""
    batch = Batch()
    for src in (fabric.a, fabric.b):
        dst = fabric.peer(src)
        batch.tc(src.ns, f"actions add {tunnel_key_set(src, dst, colour)}")
        batch.tc(
            src.ns,
            f"filter add dev rep0 ingress protocol ip pref 10 flower skip_hw "
            f"dst_ip {dst.workload.ip} "
            f"action tunnel_key index {SHARED_ACTION_INDEX} "
            f"action mirred egress redirect dev vxlan0",
        )
        batch.tc(
            src.ns,
            f"filter add dev vxlan0 ingress protocol ip pref 10 flower skip_hw "
            f"enc_key_id {VNI} dst_ip {src.workload.ip} "
            f"action tunnel_key unset "
            f"action mirred egress redirect dev rep0",
        )
    batch.run()


def flip_command(fabric: Fabric, src: Host, colour: Colour) -> str:
    """One `tc actions replace` moves every filter bound to the shared action."""
    return f"actions replace {tunnel_key_set(src, fabric.peer(src), colour)}"


def flip_with_tc(fabric: Fabric, src: Host, colour: Colour) -> None:
    tc(src.ns, flip_command(fabric, src, colour))


def tunnel_key_dst(host: Host) -> str:
    """The outer destination the shared action sets now, as the kernel reports it."""
    for group in json.loads(tc(host.ns, "-j actions list action tunnel_key")):
        for action in group.get("actions", []):
            if action.get("index") == SHARED_ACTION_INDEX:
                dst: str = action["dst_ip"]
                return dst
    raise AssertionError(f"no tunnel_key action {SHARED_ACTION_INDEX} in {host.ns}")


# --- workload traffic -----------------------------------------------------------------------


def udp_receiver(w: Workload, port: int) -> socket.socket:
    with entered(w.ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((w.ip, port))
    return sock


def udp_send(src: Workload, dst: Workload, port: int, payloads: list[bytes]) -> None:
    with entered(src.ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        for payload in payloads:
            sock.sendto(payload, (dst.ip, port))


def receive(sock: socket.socket, count: int, timeout_s: float = 5.0) -> list[bytes]:
    """Up to `count` datagrams, stopping after `timeout_s` without one."""
    got: list[bytes] = []
    sock.settimeout(timeout_s)
    with contextlib.suppress(TimeoutError):
        while len(got) < count:
            got.append(sock.recv(2048))
    return got
