"""The switch route driver: a Linux switch (SONiC, Cumulus, a lab namespace) routes each
(host, colour) TEP prefix along that colour's tree; routes carry protocol RTPROT_THORN."""

from __future__ import annotations

from typing import ClassVar

from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.intent import Intent, SwitchIntent
from thorn_programmer.kernel import KernelObject
from thorn_programmer.render import switch_objects


class SwitchRouteDriver(NetlinkDatapath):
    name: ClassVar[str] = "switch-routes"

    async def setup(self) -> None:
        await super().setup()
        await self.sysctl("net/ipv4/ip_forward", "1")
        await self.sysctl("net/ipv6/conf/all/forwarding", "1")

    def render(self, intent: Intent) -> list[KernelObject]:
        assert isinstance(intent, SwitchIntent)
        return switch_objects(intent)
