"""The host emulation driver: THORN's host datapath on kernels without cls_flower.

Same behaviour as the flower driver, built from what such kernels have (measured in
ARCHITECTURE.md): a VXLAN device per VNI (`nolearning`), u32 + mirred from each representor
into its VNI's device and back, and a static FDB entry per peer MAC pointing at the peer's
TEP of the active colour. Failover is `fdb replace` of the peer's MACs: one message per
peer workload (the flower driver needs one per peer host and VNI).
"""

from __future__ import annotations

from typing import ClassVar

from thorn_programmer.drivers.netlink import NetlinkDatapath
from thorn_programmer.intent import HostIntent, Intent
from thorn_programmer.kernel import KernelObject
from thorn_programmer.render import emulation_objects


class EmulationDriver(NetlinkDatapath):
    name: ClassVar[str] = "emulation"

    def render(self, intent: Intent) -> list[KernelObject]:
        assert isinstance(intent, HostIntent)
        return emulation_objects(intent)
