"""Soft-RoCE harness: two rxe devices whose RoCEv2 traffic rides THORN's flower tunnel.

Debian's 6.1 rxe routes in the root namespace only (it looks routes up in `init_net`), so
both RDMA endpoints' netdevs, `vfA` and `vfB`, live in the guest's root namespace and their
veth peers are the hosts' representors. Policy routing makes each endpoint leave through
its own netdev instead of loopback:

    ip rule add pref 10 oif vfA lookup 100     10.100.0.2 dev vfA (table 100)
    ip rule add pref 11 oif vfB lookup 101     10.100.0.1 dev vfB (table 101)
    local rule moved from pref 0 to pref 100; accept_local=1 and rp_filter=0 (a packet from
    a local address arrives on vfB); static neighbours (no ARP across the tunnel).

rxe binds its route lookups to its netdev (`flowi4_oif`), so only RoCE traffic takes the
`oif` rules; the RC probe's own TCP exchange of QP numbers goes over loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from netlab import (
    VNI,
    Batch,
    Colour,
    Fabric,
    Host,
    NetnsFactory,
    Workload,
    build_fabric,
    ip,
    sh,
    sysctl,
)

from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.intent import HostIntent, Intent, LocalWorkload, Peer
from thorn_programmer.kernel import Address, KernelObject
from thorn_programmer.reconcile import reconcile

ROUTE_TABLE = {"A": 100, "B": 101}
RULE_PREF = {"A": 10, "B": 11}
LOCAL_RULE_PREF = 100
PERFTEST_PORT = 18515


# --- the tunnel: programmed by THORN's own flower driver ------------------------------------


class _HarnessFlower(FlowerDriver):
    """The production flower driver, minus the TEP addresses: in this harness each TEP is
    its uplink's own address (netlab), not a /32 on the loopback as THORN's nodes have it."""

    def render(self, intent: Intent) -> list[KernelObject]:
        return [o for o in super().render(intent) if not isinstance(o, Address)]


def host_intent(fabric: Fabric, host: Host, colour: Colour) -> HostIntent:
    """What pathcomp's desired state would give `host`: its workload, and the peer's on
    `colour` (the peers' TEP routes are netlab's, through the colour's router)."""
    peer, w, pw = fabric.peer(host), host.workload, fabric.peer(host).workload
    return HostIntent(
        node=host.name, revision=1, teps=dict(host.tep), routes=(),
        local=(LocalWorkload(w.name, VNI, "rep0", w.mac, w.ip),),
        peers=(Peer(pw.name, VNI, pw.mac, pw.ip, peer.name, dict(peer.tep), colour),),
    )  # fmt: skip


def program_tunnel(fabric: Fabric) -> None:
    """Encap and decap on both hosts by reconcile with the flower driver, all on red."""

    async def program() -> None:
        for host in (fabric.a, fabric.b):
            async with _HarnessFlower.open(host.ns) as driver:
                await driver.setup()
                result = await reconcile(driver, host_intent(fabric, host, "red"))
                assert result.ok, result.errors

    asyncio.run(program())


# --- the lab ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoceLab:
    fabric: Fabric
    rxe: dict[str, str]  # workload name ("A", "B") -> rxe device
    gid_index: dict[str, int]  # workload name -> the GID index of its IPv4 RoCEv2 GID


@contextlib.contextmanager
def roce_lab(netns: NetnsFactory) -> Iterator[RoceLab]:
    """Fabric, policy routing, tunnel and one rxe device per workload; all undone after."""
    fabric = build_fabric(netns, workloads_in_root=True, tunnel_device=False)
    with root_namespace_endpoints(fabric.a.workload, fabric.b.workload) as (rxe, gid_index):
        program_tunnel(fabric)
        yield RoceLab(fabric, rxe, gid_index)


@contextlib.contextmanager
def root_namespace_endpoints(
    a: Workload, b: Workload
) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """Policy routing between two root-namespace workload netdevs and an rxe device on each:
    yields (workload name -> rxe device, workload name -> its RoCE v2 GID index). The
    netdevs themselves are deleted after (their veth peers, the representors, with them)."""
    saved = steer_root_namespace(a, b)
    rxe: dict[str, str] = {}
    try:
        for w in (a, b):
            rxe[w.name] = f"rxe{w.name}"
            sh("rdma", "link", "add", rxe[w.name], "type", "rxe", "netdev", w.dev)
        yield rxe, {w.name: ipv4_gid_index(rxe[w.name], w.ip) for w in (a, b)}
    finally:
        for device in rxe.values():
            sh("rdma", "link", "delete", device, check=False)
        for w in (a, b):
            # Deleting one end deletes the representor too, at once (the namespaces'
            # teardown would do it later, asynchronously, after the next test started).
            ip(None, f"link delete dev {w.dev}", check=False)
        _unsteer_root_namespace(saved)


def steer_root_namespace(a: Workload, b: Workload) -> dict[str, str]:
    """Policy routing for root-namespace endpoints A and B; returns the sysctls it changed."""
    saved: dict[str, str] = {}
    for dev in ("all", a.dev, b.dev):
        for key, value in (("rp_filter", 0), ("accept_local", 1)):
            name = f"net.ipv4.conf.{dev}.{key}"
            saved[name] = Path("/proc/sys", *name.split(".")).read_text().strip()
            sysctl(None, name, value)
    batch = Batch()
    batch.ip(None, f"rule add pref {LOCAL_RULE_PREF} lookup local")
    batch.ip(None, "rule del pref 0 lookup local")
    for src, dst in ((a, b), (b, a)):
        table = ROUTE_TABLE[src.name]
        batch.ip(None, f"rule add pref {RULE_PREF[src.name]} oif {src.dev} lookup {table}")
        batch.ip(None, f"route add {dst.ip}/32 dev {src.dev} src {src.ip} table {table}")
        batch.ip(None, f"neigh replace {dst.ip} lladdr {dst.mac} dev {src.dev} nud permanent")
    batch.run()
    return saved


def _unsteer_root_namespace(saved: dict[str, str]) -> None:
    batch = Batch()
    batch.ip(None, "rule add pref 0 lookup local")
    batch.ip(None, f"rule del pref {LOCAL_RULE_PREF} lookup local")
    for name in ("A", "B"):
        batch.ip(None, f"rule del pref {RULE_PREF[name]}")
        batch.ip(None, f"route flush table {ROUTE_TABLE[name]}")
    batch.run(force=True)
    for name, value in saved.items():
        with contextlib.suppress(OSError):  # the device may be gone already
            sysctl(None, name, value)


def ipv4_gid_index(device: str, addr: str, timeout_s: float = 20.0) -> int:
    """Index of the RoCEv2 GID that carries `addr` (::ffff:a.b.c.d); rxe adds it shortly
    after the device appears, so wait for it."""
    wanted = ipaddress.IPv6Address(f"::ffff:{addr}")
    port = Path(f"/sys/class/infiniband/{device}/ports/1")
    deadline = time.monotonic() + timeout_s
    while True:
        for gid in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
            try:
                kind = (port / "gid_attrs" / "types" / gid.name).read_text().strip()
                value = ipaddress.IPv6Address(gid.read_text().strip())
            except (OSError, ValueError):  # unused entries refuse to be read
                continue
            if value == wanted and kind == "RoCE v2":
                return int(gid.name)
        if time.monotonic() > deadline:
            raise AssertionError(f"{device} has no RoCE v2 GID for {addr}")
        time.sleep(0.2)
