"""Random fabrics for property tests (hypothesis): switches joined by given edges, hosts
attached to given switches; 2-vertex- and 2-edge-connected shapes."""

from __future__ import annotations

from hypothesis import strategies as st

from thorn.fabric import Fabric
from thorn.model import FabricDocument, LinkSpec, NodeSpec, PortSpec, Role


def build(edges: list[tuple[int, int]], hosts: list[list[int]]) -> Fabric:
    """Switches s0..sN joined by `edges` (parallel edges allowed), hosts on the given switches."""
    used: dict[int, int] = {}

    def port(switch: int) -> str:
        used[switch] = used.get(switch, 0) + 1
        return f"s{switch}:p{used[switch]}"

    links = [LinkSpec(a=port(a), b=port(b)) for a, b in edges]
    host_nodes = []
    for h, switches in enumerate(hosts):
        ports = [PortSpec(name=f"e{j}") for j in range(len(switches))]
        host_nodes.append(NodeSpec(name=f"h{h}", role=Role.host, ports=ports))
        links += [LinkSpec(a=f"h{h}:e{j}", b=port(s)) for j, s in enumerate(switches)]
    switch_nodes = [
        NodeSpec(
            name=f"s{i}",
            role=Role.switch,
            ports=[PortSpec(name=f"p{j}") for j in range(1, used.get(i, 0) + 1)],
        )
        for i in range(max(used) + 1)
    ]
    return Fabric.from_document(FabricDocument(nodes=switch_nodes + host_nodes, links=links))


@st.composite
def biconnected(draw: st.DrawFn) -> Fabric:
    """A Hamiltonian cycle plus chords (2-vertex-connected), hosts dual-homed."""
    n = draw(st.integers(3, 9))
    cycle = draw(st.permutations(range(n)))
    edges = list(zip(cycle, cycle[1:] + cycle[:1], strict=True))
    chords = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=6))
    edges += [(a, b) for a, b in chords if a != b]
    hosts = draw(
        st.lists(
            st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True),
            min_size=2,
            max_size=4,
        )
    )
    return build(edges, hosts)


@st.composite
def two_edge_connected(draw: st.DrawFn) -> Fabric:
    """Cycles glued at single switches (cut vertices), doubled links as 2-cycles."""
    edges: list[tuple[int, int]] = []
    n = 0
    for c in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 4))
        ring = ([draw(st.integers(0, n - 1))] if c else []) + list(range(n, n + size))
        n += size
        if len(ring) == 2:
            edges += [(ring[0], ring[1])] * 2
        elif len(ring) > 2:
            edges += list(zip(ring, ring[1:] + ring[:1], strict=True))
    if not edges:
        edges, n = [(0, 1), (0, 1)], 2
    hosts = draw(
        st.lists(
            st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True),
            min_size=2,
            max_size=4,
        )
    )
    return build(edges, hosts)
