"""Datapath drivers and the choice between them.

- `FlowerDriver`: hosts in production (switchdev NICs, kernels with flower): an external
  VXLAN device, flower encap/decap, shared tunnel_key actions;
- `EmulationDriver`: hosts on kernels without cls_flower/act_tunnel_key: a VXLAN device
  per VNI, u32 + mirred, a static FDB entry per peer;
- `SwitchRouteDriver`: Linux switches: /32 or prefix routes per (host, colour), each with
  its loop-free backup at a higher metric.

`open_driver(kind, netns, choice)` opens the right one for a node. With choice "auto" a host
gets flower when the kernel has it: `probe_flower` asks the kernel itself (a tunnel_key
action and a flower filter on THORN's own tunnel device, both removed again), once per
process, and the decision is logged with the kernel's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

import structlog
from pyroute2.netlink.exceptions import NetlinkError

from thorn_programmer.drivers.emulation import EmulationDriver
from thorn_programmer.drivers.flower import FlowerDriver
from thorn_programmer.drivers.netlink import NetlinkDatapath, rtnl
from thorn_programmer.drivers.switch import SwitchRouteDriver
from thorn_programmer.kernel import PROBE_INDEX, PROBE_PRIO, VXLAN_PORT
from thorn_programmer.netlink import (
    FlowerFilter,
    FlowerMatch,
    TcError,
    TcSocket,
    TunnelKeySet,
    action_add,
    action_delete,
    filter_add,
    filter_delete,
)
from thorn_programmer.render import FLOWER_TUNNEL

if TYPE_CHECKING:
    from thorn_programmer.repair import LocalRepair  # which imports the switch driver

__all__ = ["DatapathChoice", "NetlinkDatapath", "open_driver", "probe_flower"]

log = structlog.get_logger("thorn.programmer")

DatapathChoice = Literal["auto", "flower", "emulation"]
_probed: tuple[bool, str] | None = None
_probe_lock = asyncio.Lock()


async def probe_flower(netns: str | None) -> tuple[bool, str]:
    """(True, "") if this kernel has act_tunnel_key and cls_flower, else (False, why)."""
    global _probed
    async with _probe_lock:
        if _probed is None:
            _probed = await _probe(netns)
            log.info("datapath_probe", flower=_probed[0], reason=_probed[1] or "ok")
        return _probed


async def _probe(netns: str | None) -> tuple[bool, str]:
    action = TunnelKeySet(src=ipaddress.ip_address("192.0.2.1"),
                          dst=ipaddress.ip_address("192.0.2.2"), key_id=1,
                          dst_port=VXLAN_PORT, index=PROBE_INDEX)  # fmt: skip
    with TcSocket(netns) as tc:
        try:
            tc.request(action_add(action, skip_hw=True))
            tc.request(action_delete("tunnel_key", PROBE_INDEX))
        except TcError as exc:
            return False, f"act_tunnel_key: {exc}"
        async with await rtnl(netns) as ip:
            created = not await ip.link_lookup(ifname=FLOWER_TUNNEL)
            if created:
                await ip.link("add", ifname=FLOWER_TUNNEL, kind="vxlan",
                              vxlan_collect_metadata=1, vxlan_port=VXLAN_PORT)  # fmt: skip
            [index] = await ip.link_lookup(ifname=FLOWER_TUNNEL)
            with contextlib.suppress(NetlinkError):  # EEXIST: it has one already
                await ip.tc("add", "clsact", index)
            spec = FlowerFilter(
                ifindex=index,
                priority=PROBE_PRIO,
                handle=1,
                match=FlowerMatch(eth_dst="02:00:00:00:00:01"),
                skip_hw=True,
            )
            try:
                tc.request(filter_add(spec))
                tc.request(filter_delete(spec))
            except TcError as exc:
                return False, f"cls_flower: {exc}"
            finally:
                if created:
                    await ip.link("del", index=index)
    return True, ""


@asynccontextmanager
async def open_driver(
    kind: str, netns: str | None, choice: DatapathChoice = "auto", repair: LocalRepair | None = None
) -> AsyncIterator[NetlinkDatapath]:
    """`repair`: the node's switch-local repair (BFD withdraws), which a switch's driver
    serves while it is open."""
    if kind == "switch":
        async with SwitchRouteDriver.open(netns) as driver:
            assert isinstance(driver, SwitchRouteDriver)
            if repair is None:
                yield driver
                return
            repair.attach(driver)
            try:
                yield driver
            finally:
                repair.detach(driver)
        return
    flower = choice == "flower"
    if choice == "auto":
        flower, _ = await probe_flower(netns)
    driver_cls: type[NetlinkDatapath] = FlowerDriver if flower else EmulationDriver
    async with driver_cls.open(netns) as driver:
        yield driver
