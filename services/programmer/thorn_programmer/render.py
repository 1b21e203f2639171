"""Intent -> the kernel objects each driver wants (pure; tested without a kernel).

Three renderings of the same semantics:
- `switch_objects`: a Linux switch routes each (host, colour) TEP prefix along its tree, with
  the route's loop-free backup beside it at a higher metric (the kernel falls back to it);
- `flower_objects`: the production host datapath (docs/datapath.md): one external
  VXLAN device, flower encap rules on each representor bound to one shared tunnel_key
  action per (peer host, VNI), flower decap rules on the tunnel device;
- `emulation_objects`: the same behaviour from what kernels without flower have: a VXLAN
  device per VNI, u32 + mirred between representor and tunnel, and a static FDB entry per
  peer MAC pointing at the TEP of the active colour (the flood list: one all-zero entry per
  peer host).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping

from thorn.model import Colour
from thorn_programmer.intent import HostIntent, Intent, LocalWorkload, Peer, SwitchIntent
from thorn_programmer.kernel import (
    BACKUP_METRIC,
    BROADCAST_MAC,
    FLOOD_PARTS,
    PRIMARY_METRIC,
    PRIO_DECAP,
    PRIO_DECAP_FLOOD,
    PRIO_ENCAP,
    PRIO_LOCAL,
    PRIO_LOCAL_FLOOD,
    TEP_DEVICE,
    ZERO_MAC,
    Address,
    Clsact,
    DecapRule,
    Device,
    EncapRule,
    Fdb,
    FloodRule,
    KernelObject,
    PortRule,
    Redirect,
    Route,
    TunnelAction,
    vxlan_name,
)

FLOWER_TUNNEL = "thorn-vx"  # the flower driver's one external (collect_md) VXLAN device
# A flower rule holds at most 32 actions: 15 (tunnel_key set, mirred mirror) pairs + a verdict.
FLOOD_TARGETS_PER_RULE = 15


class RenderError(ValueError):
    """The intent cannot be expressed by this datapath (the message says what and why)."""


def _host_prefix(address: str) -> str:
    return str(ipaddress.ip_network(address))  # a bare address is its own /32 or /128


def _underlay(intent: HostIntent) -> Iterator[KernelObject]:
    for r in intent.routes:
        yield Route(prefix=r.prefix, dev=r.dev, via=r.via, metric=PRIMARY_METRIC)


def switch_objects(
    intent: SwitchIntent, uturn_tables: Mapping[str, int] | None = None
) -> list[KernelObject]:
    """Per route its primary at PRIMARY_METRIC and, if it has one, its backup at BACKUP_METRIC.
    A primary through a withdrawn port is left out while its backup's port is not withdrawn
    too (with both out, the primary stays: dropping it would gain nothing).

    With `uturn_tables` (port -> its U-turn table), the U-turn rule too: a packet that
    arrives on the port its primary would send it out of takes the backup. Per such port an
    `ip rule iif PORT` (per address family) and, in its table, each backup of a route
    through it. Normal forwarding never sends a packet back where it came from, so this
    only acts when a neighbour's backup is a U-turn through this switch."""
    objects: list[KernelObject] = []
    rules: dict[tuple[int, str], int] = {}  # (family, port) -> its U-turn table
    for r in intent.routes:
        backup = r.backup
        left_to_backup = (
            backup is not None and r.dev in intent.withdrawn and backup.dev not in intent.withdrawn
        )
        if not left_to_backup:
            objects.append(Route(prefix=r.prefix, dev=r.dev, via=r.via, metric=PRIMARY_METRIC))
        if backup is None:
            continue
        objects.append(Route(prefix=r.prefix, dev=backup.dev, via=backup.via,
                             metric=BACKUP_METRIC))  # fmt: skip
        table = uturn_tables.get(r.dev) if uturn_tables is not None else None
        if table is not None and backup.dev != r.dev:
            objects.append(Route(prefix=r.prefix, dev=backup.dev, via=backup.via,
                                 metric=BACKUP_METRIC, table=table))  # fmt: skip
            rules[(6 if ":" in r.prefix else 4, r.dev)] = table
    for (family, port), table in sorted(rules.items()):
        objects.append(PortRule(family=family, iif=port, table=table))
    return objects


def _teps(intent: HostIntent) -> Iterator[KernelObject]:
    for address in sorted(set(intent.teps.values())):
        yield Address(dev=TEP_DEVICE, address=_host_prefix(address))


def _by_vni(intent: HostIntent) -> dict[int, tuple[list[LocalWorkload], list[Peer]]]:
    out: dict[int, tuple[list[LocalWorkload], list[Peer]]] = {}
    for w in intent.local:
        out.setdefault(w.vni, ([], []))[0].append(w)
    for p in intent.peers:
        if p.vni in out:
            out[p.vni][1].append(p)
    return out


def _local_switching(locals_: list[LocalWorkload], tunnel: str | None) -> Iterator[KernelObject]:
    """Between workloads of one VNI on this host: straight from representor to representor;
    with `tunnel`, BUM is also copied to the others on its way into the tunnel (the flower
    driver copies it in its flood rules instead)."""
    if len(locals_) < 2:
        return
    for w in locals_:
        others = [o for o in locals_ if o is not w]
        for n, o in enumerate(others):
            yield Redirect(dev=w.rep, prio=PRIO_LOCAL + n, dst_mac=o.mac, to=o.rep)
        if tunnel is not None:
            yield Redirect(dev=w.rep, prio=PRIO_LOCAL_FLOOD, dst_mac=BROADCAST_MAC, to=tunnel,
                           mirror=tuple(o.rep for o in others))  # fmt: skip


def _flood_hosts(peers: list[Peer]) -> list[tuple[str, str]]:
    """(peer host, its active TEP), one per peer host, in a stable order."""
    return sorted({(p.host, p.tep) for p in peers})


def emulation_objects(intent: HostIntent) -> list[KernelObject]:
    objects: list[KernelObject] = [*_teps(intent), *_underlay(intent)]
    for vni, (locals_, peers) in sorted(_by_vni(intent).items()):
        tunnel = vxlan_name(vni)
        objects.append(Device(name=tunnel, kind="vxlan", vni=vni,
                              local=intent.source_tep(Colour.red)))  # fmt: skip
        objects.append(Clsact(dev=tunnel))
        for w in locals_:
            objects.append(Clsact(dev=w.rep))
            objects.append(Redirect(dev=w.rep, prio=PRIO_ENCAP, dst_mac=None, to=tunnel))
        objects.extend(_local_switching(locals_, tunnel))
        for n, w in enumerate(locals_):
            objects.append(Redirect(dev=tunnel, prio=PRIO_DECAP + n, dst_mac=w.mac, to=w.rep))
        reps = [w.rep for w in locals_]
        objects.append(Redirect(dev=tunnel, prio=PRIO_DECAP_FLOOD, dst_mac=BROADCAST_MAC,
                                to=reps[-1], mirror=tuple(reps[:-1])))  # fmt: skip
        if vni in intent.incomplete:
            continue  # membership still arriving: keep what the kernel has (see reconcile)
        for p in peers:
            objects.append(Fdb(dev=tunnel, mac=p.mac, dst=p.tep))
        for _, tep in _flood_hosts(peers):
            objects.append(Fdb(dev=tunnel, mac=ZERO_MAC, dst=tep))
    return objects


def flower_objects(intent: HostIntent, *, skip_sw: bool = False) -> list[KernelObject]:
    """`skip_sw`: the rules and their shared actions run in the NIC only (drivers/offload.py
    decides), else in software only."""
    objects: list[KernelObject] = [*_teps(intent), *_underlay(intent)]
    by_vni = _by_vni(intent)
    if not by_vni:
        return objects
    objects.append(Device(name=FLOWER_TUNNEL, kind="vxlan", external=True))
    objects.append(Clsact(dev=FLOWER_TUNNEL))
    for vni, (locals_, peers) in sorted(by_vni.items()):
        for w in locals_:
            objects.append(Clsact(dev=w.rep))
        objects.extend(_local_switching(locals_, None))
        for w in locals_:
            objects.append(DecapRule(vni=vni, mac=w.mac, reps=(w.rep,), skip_sw=skip_sw))
        reps = tuple(w.rep for w in locals_)
        objects.append(DecapRule(vni=vni, mac=BROADCAST_MAC, reps=reps, skip_sw=skip_sw))
        if vni in intent.incomplete:
            continue
        tunnels: dict[str, TunnelAction] = {}
        for p in peers:
            if p.host not in tunnels:
                tunnels[p.host] = TunnelAction(
                    peer=p.host,
                    vni=vni,
                    src=intent.source_tep(p.colour),
                    dst=p.tep,
                    skip_sw=skip_sw,
                )
        objects.extend(tunnels.values())
        for w in locals_:
            for p in peers:
                objects.append(EncapRule(dev=w.rep, mac=p.mac, peer=p.host, vni=vni,
                                         skip_sw=skip_sw))  # fmt: skip
        hosts = sorted(tunnels)
        parts = [
            tuple(hosts[i : i + FLOOD_TARGETS_PER_RULE])
            for i in range(0, len(hosts), FLOOD_TARGETS_PER_RULE)
        ]
        if len(parts) > FLOOD_PARTS:
            raise RenderError(
                f"VNI {vni} has {len(hosts)} peer hosts: ingress replication on one host is "
                f"limited to {FLOOD_PARTS * FLOOD_TARGETS_PER_RULE}"
            )
        for w in locals_:
            mirrors = tuple(o.rep for o in locals_ if o is not w)
            # The copies to local workloads get a rule of their own (a rule holds 32
            # actions: 15 peers take 30); with nothing to copy to, one rule just drops.
            rules: list[tuple[str, ...]] = [(), *parts] if mirrors or not parts else parts
            for n, part in enumerate(rules):
                objects.append(FloodRule(dev=w.rep, part=n, vni=vni, peers=part,
                                         last=n == len(rules) - 1,
                                         mirrors=mirrors if n == 0 else (),
                                         skip_sw=skip_sw))  # fmt: skip
    return objects


def held(intent: Intent, obj: KernelObject) -> bool:
    """True for a kernel object of a VNI whose membership is still arriving: reconcile
    neither changes nor removes it until the VNI is complete again."""
    if not isinstance(intent, HostIntent) or not intent.incomplete:
        return False
    match obj:
        case Fdb():
            return any(obj.dev == vxlan_name(v) for v in intent.incomplete)
        case TunnelAction() | EncapRule() | FloodRule():
            return obj.vni in intent.incomplete
    return False
