"""Synthetic fabric generators: shapes, counts, addressing, determinism, validity."""

from __future__ import annotations

import ipaddress
import time
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from thorn.fabric import Fabric
from thorn.generators import (
    GENERATORS,
    MAX_NODES,
    DualPlaneParams,
    FatTreeParams,
    LeafSpineParams,
    RailOptimizedParams,
    dual_plane,
    fat_tree,
    generate,
    leaf_spine,
    rail_optimized,
)
from thorn.model import Colour, FabricDocument, Role

# --- helpers --------------------------------------------------------------------------------


def _valid(doc: FabricDocument) -> Fabric:
    """The real whole-fabric validator accepts the document (raises FabricError otherwise)."""
    return Fabric.from_document(doc)


def _hosts(doc: FabricDocument) -> list[str]:
    return [n.name for n in doc.nodes if n.role is Role.host]


def _switches(doc: FabricDocument) -> list[str]:
    return [n.name for n in doc.nodes if n.role is Role.switch]


def _neighbours(doc: FabricDocument) -> dict[str, list[tuple[str, str, str]]]:
    """node -> [(own port, peer node, peer port)] from the links."""
    out: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for link in doc.links:
        out[link.a.node].append((link.a.port, link.b.node, link.b.port))
        out[link.b.node].append((link.b.port, link.a.node, link.a.port))
    return out


def _labels(doc: FabricDocument) -> dict[str, dict[str, str]]:
    return {n.name: n.labels for n in doc.nodes}


def _every_port_linked_once(doc: FabricDocument) -> None:
    ports = {(n.name, p.name) for n in doc.nodes for p in n.ports}
    ends = [(lk.a.node, lk.a.port) for lk in doc.links] + [
        (lk.b.node, lk.b.port) for lk in doc.links
    ]
    assert len(ends) == len(set(ends))
    assert set(ends) == ports


# --- fat-tree -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 4, 6, 8, 16])
def test_fat_tree_counts_and_validity(k: int) -> None:
    doc = fat_tree(k)
    half = k // 2
    tiers = Counter(n.labels["tier"] for n in doc.nodes)
    assert tiers == {"core": half * half, "agg": k * half, "edge": k * half, "host": k**3 // 4}
    assert len(_hosts(doc)) == k**3 // 4
    assert len(_switches(doc)) == 5 * k * k // 4
    assert len(doc.links) == 3 * k**3 // 4
    # Every switch has exactly k ports, every host one; all of them linked.
    for node in doc.nodes:
        assert len(node.ports) == (1 if node.role is Role.host else k), node.name
    _every_port_linked_once(doc)
    summary = _valid(doc).summary()
    assert (summary.nodes, summary.links, summary.hosts) == (
        len(doc.nodes),
        len(doc.links),
        k**3 // 4,
    )


def test_fat_tree_k4_exact_shape() -> None:
    doc = fat_tree(4)
    assert (len(doc.nodes), len(doc.links), len(_hosts(doc))) == (36, 48, 16)
    names = {n.name for n in doc.nodes}
    assert {"core1", "core4", "agg1-1", "agg4-2", "edge1-1", "edge4-2"} <= names
    assert {"host1-1-1", "host4-2-2"} <= names
    nb = _neighbours(doc)
    # host<pod>-<edge>-<i> sits on edge<pod>-<edge> port swp<i>.
    assert nb["host3-2-1"] == [("eth1", "edge3-2", "swp1")]
    # edge i of a pod reaches every agg of that pod on swp3..4; agg j on its swp<i>.
    assert sorted(nb["edge2-1"])[2:] == [("swp3", "agg2-1", "swp1"), ("swp4", "agg2-2", "swp1")]
    # agg j of every pod connects to cores (j-1)*k/2+1 .. j*k/2, the core's swp<pod> facing it.
    ups = sorted(p for p in nb["agg3-2"] if p[1].startswith("core"))
    assert ups == [("swp3", "core3", "swp3"), ("swp4", "core4", "swp3")]
    # Each core has one link to each pod.
    pods = sorted(_labels(doc)[peer]["pod"] for _, peer, _ in nb["core1"])
    assert pods == ["1", "2", "3", "4"]
    labels = _labels(doc)
    assert labels["agg3-2"] == {"tier": "agg", "pod": "3"}
    assert labels["host3-2-1"] == {"tier": "host", "pod": "3"}
    assert labels["core1"] == {"tier": "core"}


def test_fat_tree_k16_counts() -> None:
    doc = fat_tree(16)
    assert len(_hosts(doc)) == 1024
    assert len(_switches(doc)) == 320
    assert len(doc.links) == 3072
    _valid(doc)


def test_fat_tree_k32_is_fast() -> None:
    start = time.perf_counter()
    doc = fat_tree(32)
    elapsed = time.perf_counter() - start
    assert len(_hosts(doc)) == 8192
    assert len(_switches(doc)) == 1280
    assert len(doc.links) == 3 * 8192
    # About 1.5 s on the 2-core CI machine; the bound only catches an order-of-magnitude slip.
    assert elapsed < 15, f"fat_tree(32) took {elapsed:.1f} s"


@pytest.mark.parametrize("k", [0, 1, 3, 5, 33, -2, 42, 1000])
def test_fat_tree_rejects_bad_k(k: int) -> None:
    with pytest.raises(ValueError, match="k must be"):
        fat_tree(k)


def test_fat_tree_rejects_non_integer() -> None:
    with pytest.raises(ValueError, match="integer"):
        fat_tree(4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer"):
        fat_tree(True)


# --- leaf-spine -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spines", "leaves", "hosts_per_leaf"), [(1, 1, 1), (2, 4, 4), (4, 8, 16), (16, 64, 16)]
)
def test_leaf_spine_counts(spines: int, leaves: int, hosts_per_leaf: int) -> None:
    doc = leaf_spine(spines, leaves, hosts_per_leaf)
    hosts = leaves * hosts_per_leaf
    assert len(doc.nodes) == spines + leaves + hosts
    assert len(_hosts(doc)) == hosts
    assert len(doc.links) == leaves * spines + hosts
    nb = _neighbours(doc)
    for s in range(1, spines + 1):
        # Each spine reaches every leaf once, swp<l> facing leaf<l>.
        assert sorted(nb[f"spine{s}"]) == sorted(
            (f"swp{li}", f"leaf{li}", f"swp{hosts_per_leaf + s}") for li in range(1, leaves + 1)
        )
    for li in range(1, leaves + 1):
        peers = [peer for _, peer, _ in nb[f"leaf{li}"]]
        assert sum(p.startswith("spine") for p in peers) == spines
        assert sum(p.startswith("host") for p in peers) == hosts_per_leaf
    for host in _hosts(doc):
        assert [p for p, _, _ in nb[host]] == ["eth1"]
    _every_port_linked_once(doc)
    _valid(doc)


def test_leaf_spine_dual_homed_degree() -> None:
    doc = leaf_spine(2, 6, 3, dual_homed=True)
    hosts = _hosts(doc)
    assert len(hosts) == 6 // 2 * 3
    assert len(doc.links) == 6 * 2 + 2 * len(hosts)
    nb = _neighbours(doc)
    for n, host in enumerate(hosts):
        pair = n // 3  # hosts 1-3 on leaves 1+2, 4-6 on 3+4, ...
        assert sorted((p, peer) for p, peer, _ in nb[host]) == [
            ("eth1", f"leaf{2 * pair + 1}"),
            ("eth2", f"leaf{2 * pair + 2}"),
        ]
    for li in range(1, 7):
        assert sum(peer.startswith("host") for _, peer, _ in nb[f"leaf{li}"]) == 3
    _every_port_linked_once(doc)
    _valid(doc)


def test_leaf_spine_dual_homed_needs_even_leaves() -> None:
    with pytest.raises(ValueError, match="leaves must be even; got leaves=3"):
        leaf_spine(2, 3, 2, dual_homed=True)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 2, 2), "spines must be between 1 and"),
        ((2, 0, 2), "leaves must be between 1 and"),
        ((2, 2, 0), "hosts_per_leaf must be between 1 and"),
        ((2, 2, -1), "hosts_per_leaf must be between 1 and"),
        ((256, 1024, 512), "nodes; the limit is"),
    ],
)
def test_leaf_spine_rejects_bad_parameters(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        leaf_spine(*args)


# --- rail-optimized -------------------------------------------------------------------------


def test_rail_optimized_shape() -> None:
    doc = rail_optimized(servers_per_su=4, rails=8, scalable_units=2, spines=4)
    labels = _labels(doc)
    assert len(_hosts(doc)) == 8
    leaves = [n for n in _switches(doc) if labels[n]["tier"] == "leaf"]
    assert len(leaves) == 2 * 8
    assert len(doc.links) == 8 * 8 + 16 * 4
    nb = _neighbours(doc)
    for host in _hosts(doc):
        su = labels[host]["su"]
        ports = sorted(nb[host], key=lambda x: int(x[0][3:]))
        assert [p for p, _, _ in ports] == [f"eth{r}" for r in range(1, 9)]
        for r, (_, leaf, _) in enumerate(ports, start=1):
            # Rail r of every server lands on its SU's rail-r leaf.
            assert labels[leaf] == {"tier": "leaf", "rail": str(r), "su": su}
    for leaf in leaves:
        peers = [peer for _, peer, _ in nb[leaf]]
        assert sum(p.startswith("spine") for p in peers) == 4
        assert {labels[p]["su"] for p in peers if p.startswith("host")} == {labels[leaf]["su"]}
    _every_port_linked_once(doc)
    _valid(doc)


def test_rail_optimized_defaults_are_valid() -> None:
    doc = generate("rail_optimized", {})
    assert len(_hosts(doc)) == 32
    assert all(len(n.ports) == 8 for n in doc.nodes if n.role is Role.host)
    _valid(doc)


# --- dual-plane -----------------------------------------------------------------------------


def test_dual_plane_shape_and_srlgs() -> None:
    doc = dual_plane(spines_per_plane=2, leaves_per_plane=3, hosts_per_leaf=2)
    labels = _labels(doc)
    hosts = _hosts(doc)
    assert len(hosts) == 6
    assert len(doc.nodes) == 2 * (2 + 3) + 6
    assert len(doc.links) == 2 * (3 * 2 + 6)

    def plane(node: str) -> str | None:
        return labels[node].get("plane")

    for link in doc.links:
        planes = {plane(link.a.node), plane(link.b.node)} - {None}
        assert len(planes) == 1, f"{link.a} - {link.b} crosses planes"
        assert link.srlgs == [f"plane-{planes.pop()}"]
    nb = _neighbours(doc)
    for n, host in enumerate(hosts):
        li = n // 2 + 1
        assert sorted((p, peer) for p, peer, _ in nb[host]) == [
            ("eth1", f"leaf-a{li}"),
            ("eth2", f"leaf-b{li}"),
        ]
    assert labels["spine-b2"] == {"tier": "spine", "plane": "b"}
    _every_port_linked_once(doc)
    _valid(doc)


# --- addressing, overlay, naming ------------------------------------------------------------

_LINKS = ipaddress.ip_network("10.0.0.0/9")
_TEPS = ipaddress.ip_network("10.224.0.0/11")
_MGMT = ipaddress.ip_network("172.16.0.0/12")
_OVERLAY = ipaddress.ip_network("100.64.0.0/10")


def _all_small_docs() -> list[FabricDocument]:
    return [
        leaf_spine(2, 4, 3),
        leaf_spine(2, 4, 3, dual_homed=True),
        fat_tree(4),
        rail_optimized(3, 4, 2, 2),
        dual_plane(2, 2, 3),
    ]


@pytest.mark.parametrize("doc", _all_small_docs())
def test_addressing_plan(doc: FabricDocument) -> None:
    ports = {(n.name, p.name): p for n in doc.nodes for p in n.ports}
    for index, link in enumerate(doc.links):
        a, b = ports[(link.a.node, link.a.port)], ports[(link.b.node, link.b.port)]
        assert a.address is not None and b.address is not None
        net = ipaddress.IPv4Network((int(_LINKS.network_address) + 2 * index, 31))
        assert a.address.network == net == b.address.network
        assert int(a.address.ip) % 2 == 0 and int(b.address.ip) == int(a.address.ip) + 1
        assert a.speed_mbps == b.speed_mbps
        host_link = any(n in _hosts(doc) for n in (link.a.node, link.b.node))
        assert a.speed_mbps == (400_000 if host_link else 800_000)
    for port in ports.values():
        assert port.mac is not None and port.mac.startswith("02:")
    for node in doc.nodes:
        assert node.mgmt_address in _MGMT
        assert "tier" in node.labels
        prefix = "eth" if node.role is Role.host else "swp"
        assert [p.name for p in node.ports] == [
            f"{prefix}{i}" for i in range(1, len(node.ports) + 1)
        ]
    hosts = _hosts(doc)
    assert sorted((t.node, t.colour) for t in doc.teps) == sorted(
        (h, c) for h in hosts for c in (Colour.red, Colour.blue)
    )
    assert all(t.address in _TEPS for t in doc.teps)
    assert [t.name for t in doc.tenants] == ["default"]
    assert [(v.vni, v.name, v.tenant) for v in doc.vnis] == [(1000, "default", "default")]
    assert sorted(w.node for w in doc.workloads) == sorted(hosts)
    for wl in doc.workloads:
        assert (wl.name, wl.vf, wl.vni) == (f"{wl.node}-vf0", "vf0", 1000)
        assert wl.ip in _OVERLAY
        assert wl.mac.startswith("06:")
    _valid(doc)


def test_workloads_can_be_left_out() -> None:
    for name in GENERATORS:
        doc = generate(name, {"workloads": False})
        assert doc.workloads == []
        assert len(doc.teps) == 2 * len(_hosts(doc))
        assert [v.vni for v in doc.vnis] == [1000]
        _valid(doc)


# --- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("leaf_spine", {"spines": 3, "leaves": 4, "hosts_per_leaf": 5, "dual_homed": True}),
        ("fat_tree", {"k": 6}),
        ("rail_optimized", {"servers_per_su": 5, "rails": 4, "scalable_units": 2, "spines": 3}),
        ("dual_plane", {"spines_per_plane": 3, "leaves_per_plane": 2, "hosts_per_leaf": 5}),
    ],
)
def test_same_parameters_same_document(name: str, params: dict[str, object]) -> None:
    first = generate(name, params)
    second = generate(name, dict(params))
    assert first == second
    assert first.model_dump_json() == second.model_dump_json()
    # And the document survives a JSON round trip unchanged (it is in normal form).
    assert FabricDocument.model_validate_json(first.model_dump_json()) == first


# --- registry and params models -------------------------------------------------------------


def test_registry_lists_the_four_generators() -> None:
    assert set(GENERATORS) == {"leaf_spine", "fat_tree", "rail_optimized", "dual_plane"}
    assert GENERATORS["fat_tree"].params is FatTreeParams
    function, params = GENERATORS["leaf_spine"]
    assert (function, params) == (leaf_spine, LeafSpineParams)
    assert GENERATORS["rail_optimized"].params is RailOptimizedParams
    assert GENERATORS["dual_plane"].params is DualPlaneParams


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_defaults_give_a_valid_fabric(name: str) -> None:
    doc = generate(name, {})
    assert doc.nodes and doc.links
    _valid(doc)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_params_models_document_every_field(name: str) -> None:
    schema = GENERATORS[name].params.model_json_schema()
    assert schema["additionalProperties"] is False
    for field_name, prop in schema["properties"].items():
        assert prop.get("description"), f"{name}.{field_name} has no description"
        assert "default" in prop, f"{name}.{field_name} has no default"


def test_generate_rejects_unknown_generator_and_fields() -> None:
    with pytest.raises(ValueError, match="unknown generator 'torus'; known: dual_plane"):
        generate("torus", {})
    with pytest.raises(ValidationError, match="extra"):
        generate("fat_tree", {"k": 4, "pods": 2})


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("fat_tree", {"k": 5}, "k must be even"),
        ("fat_tree", {"k": 64}, "less than or equal to 40"),
        ("fat_tree", {"k": "four"}, "valid integer"),
        ("leaf_spine", {"leaves": 3, "dual_homed": True}, "leaves must be even"),
        ("leaf_spine", {"spines": 0}, "greater than or equal to 1"),
        ("leaf_spine", {"spines": 200, "leaves": 1000, "hosts_per_leaf": 100}, "the limit is"),
        ("rail_optimized", {"rails": 0}, "greater than or equal to 1"),
        ("rail_optimized", {"servers_per_su": 512, "scalable_units": 100}, "the limit is"),
        ("dual_plane", {"hosts_per_leaf": 1000}, "less than or equal to 512"),
    ],
)
def test_generate_validates_parameters(name: str, params: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        generate(name, params)


def test_size_limit_allows_the_documented_maximums() -> None:
    FatTreeParams(k=40)  # 18,000 nodes
    LeafSpineParams(spines=16, leaves=64, hosts_per_leaf=16)
    with pytest.raises(ValidationError, match=f"limit is {MAX_NODES}"):
        LeafSpineParams(spines=8, leaves=100, hosts_per_leaf=200)


def test_params_take_json_integers_and_booleans_only() -> None:
    """As the OpenAPI document says (JSON Schema's integer and boolean): 2.0 is the integer
    2; the text "2" and true are not integers, 1 is not a boolean (the API fuzz lane found
    all three accepted)."""
    params = LeafSpineParams.model_validate({"spines": 2.0, "leaves": 2, "hosts_per_leaf": 1})
    assert params.spines == 2
    assert generate("leaf_spine", params.model_dump()) == leaf_spine(2, 2, 1)
    for wrong in ({"spines": "2"}, {"spines": True}, {"dual_homed": 1}, {"workloads": "yes"}):
        with pytest.raises(ValidationError):
            LeafSpineParams.model_validate(wrong)


# --- property-based -------------------------------------------------------------------------

_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(
    spines=st.integers(1, 4),
    pairs=st.integers(1, 4),
    hosts_per_leaf=st.integers(1, 4),
    dual_homed=st.booleans(),
    workloads=st.booleans(),
)
def test_leaf_spine_property(
    spines: int, pairs: int, hosts_per_leaf: int, dual_homed: bool, workloads: bool
) -> None:
    leaves = 2 * pairs
    doc = leaf_spine(spines, leaves, hosts_per_leaf, dual_homed, workloads=workloads)
    hosts = pairs * hosts_per_leaf if dual_homed else leaves * hosts_per_leaf
    assert len(_hosts(doc)) == hosts
    assert len(doc.links) == leaves * spines + leaves * hosts_per_leaf
    assert len(doc.workloads) == (hosts if workloads else 0)
    _every_port_linked_once(doc)
    _valid(doc)


@_SETTINGS
@given(k=st.sampled_from([2, 4, 6]))
def test_fat_tree_property(k: int) -> None:
    doc = fat_tree(k)
    degree = Counter(n for lk in doc.links for n in (lk.a.node, lk.b.node))
    assert all(degree[s] == k for s in _switches(doc))
    assert all(degree[h] == 1 for h in _hosts(doc))
    _valid(doc)


@_SETTINGS
@given(
    servers=st.integers(1, 5),
    rails=st.integers(1, 8),
    sus=st.integers(1, 3),
    spines=st.integers(1, 4),
)
def test_rail_optimized_property(servers: int, rails: int, sus: int, spines: int) -> None:
    doc = rail_optimized(servers, rails, sus, spines)
    assert len(_hosts(doc)) == servers * sus
    assert len(_switches(doc)) == spines + rails * sus
    assert len(doc.links) == servers * sus * rails + rails * sus * spines
    assert all(len(n.ports) == rails for n in doc.nodes if n.role is Role.host)
    _valid(doc)


@_SETTINGS
@given(spines=st.integers(1, 4), leaves=st.integers(1, 5), hosts_per_leaf=st.integers(1, 4))
def test_dual_plane_property(spines: int, leaves: int, hosts_per_leaf: int) -> None:
    doc = dual_plane(spines, leaves, hosts_per_leaf)
    srlgs = Counter(s for lk in doc.links for s in lk.srlgs)
    per_plane = leaves * spines + leaves * hosts_per_leaf
    assert srlgs == {"plane-a": per_plane, "plane-b": per_plane}
    assert all(len(n.ports) == 2 for n in doc.nodes if n.role is Role.host)
    _valid(doc)
