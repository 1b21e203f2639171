"""A fifth host for `leaf_spine(2, 2, 2)`-shaped fabrics: one write's worth of changes that
touches hosts only (a new leaf1 port, the host, its link, both TEPs, a workload in VNI
1000), for tests of replaying and planning such changes."""

from __future__ import annotations

from thorn.fabric import Change, Fabric
from thorn.model import Colour, LinkSpec, NodeSpec, PortSpec, Role, Tep, Workload


def new_host(f: Fabric, name: str = "host5") -> list[Change]:
    """`name` single-homed on a new leaf1 port, with both TEPs and a workload."""
    changes = f.add_port("leaf1", PortSpec(name="swp9", address="10.0.9.0/31"))
    port = PortSpec(name="eth1", address="10.0.9.1/31")
    changes += f.add_node(NodeSpec(name=name, role=Role.host, ports=[port]))
    changes += f.add_link(LinkSpec.model_validate({"a": f"{name}:eth1", "b": "leaf1:swp9"}))
    changes += f.add_tep(Tep(node=name, colour=Colour.red, address="10.224.9.9"))
    changes += f.add_tep(Tep(node=name, colour=Colour.blue, address="10.240.9.9"))
    changes += f.add_workload(Workload(name=f"{name}-vf0", node=name, vni=1000,
                                       mac="06:00:00:00:09:09", ip="100.64.9.9"))  # fmt: skip
    return changes
