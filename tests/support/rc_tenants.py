"""A small fabric of tenants and workloads, for the RC budget tests (unit and integration)."""

from __future__ import annotations

from thorn.fabric import Fabric
from thorn.model import NodeSpec, Tenant, Tep, Vni, Workload


def fabric_of_two_tenants() -> Fabric:
    """h1, h2, h3: tenant a's VNI 100 on h1 and h2; tenant b's VNI 200 on h1 and h3; tenant
    c's VNI 300 on h2 alone; tenant d has no VNI."""
    fabric = Fabric()
    for name in ("h1", "h2", "h3"):
        fabric.add_node(NodeSpec(name=name, role="host"))
    for name, timeout in (("a", 14), ("b", None), ("c", 18), ("d", 16)):
        fabric.add_tenant(Tenant(name=name, nccl_ib_timeout=timeout))
    for vni, tenant in ((100, "a"), (200, "b"), (300, "c")):
        fabric.add_vni(Vni(vni=vni, name=f"v{vni}", tenant=tenant))
    placements = [("h1", 100, 1), ("h2", 100, 2), ("h1", 200, 3), ("h3", 200, 4), ("h2", 300, 5)]
    for node, vni, i in placements:
        fabric.add_workload(Workload(name=f"w{i}", node=node, vni=vni, vf=f"vf{i}",
                                     mac=f"06:00:00:00:00:0{i}", ip=f"192.168.0.{i}"))  # fmt: skip
    for i, node in enumerate(("h1", "h2", "h3"), start=1):
        fabric.add_tep(Tep(node=node, colour="red", address=f"10.0.0.{i}"))
        fabric.add_tep(Tep(node=node, colour="blue", address=f"10.0.1.{i}"))
    return fabric
