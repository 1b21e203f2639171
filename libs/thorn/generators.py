"""Synthetic fabrics: pure, deterministic functions that return a valid `FabricDocument`.

Four shapes are offered, each also reachable by name through `GENERATORS` / `generate()`
(the REST API and the CLI use those; each has a pydantic params model with defaults,
descriptions and bounds):

- `leaf_spine`: a two-tier Clos, every leaf to every spine, hosts on leaves, optionally
  dual-homed to a leaf pair.
- `fat_tree`: the three-tier k-ary fat-tree of Al-Fares et al. (SIGCOMM 2008).
- `rail_optimized`: GPU servers with one NIC per rail, rail r of every server in a scalable
  unit on rail-leaf r, rail leaves to spines.
- `dual_plane`: two independent leaf-spine planes, every host with one port in each.

The same parameters always give the same document (no randomness, no clock, no I/O).

Naming
    Switches are ``spine1``, ``leaf1`` ... numbered from 1; hosts ``host1`` ... The fat-tree
    uses ``core<i>``, ``agg<pod>-<i>``, ``edge<pod>-<i>`` and ``host<pod>-<edge>-<i>`` (pods,
    switches and hosts numbered from 1). Dual-plane switches carry their plane:
    ``spine-a1``, ``leaf-b3``. Host ports are ``eth1..N``, switch ports ``swp1..N``. On a
    switch the down-facing ports come first (``swp1..`` towards hosts or the tier below),
    then the up-facing ones; a spine's or core's ``swp<i>`` faces leaf or pod ``i``.

Labels
    Every node has ``tier`` (``spine``, ``leaf``, ``core``, ``agg``, ``edge`` or ``host``);
    fat-tree nodes below the core have ``pod``; dual-plane switches have ``plane``
    (``a``/``b``); rail-optimized leaves have ``rail`` and ``su`` and servers ``su``.

Addressing (every number is allocated from a counter, in document order)
    - Link ``n`` (0-based, in the order of ``links``) is the /31 ``10.0.0.0 + 2n`` inside
      10.0.0.0/9: its ``a`` end (the lower tier: host, leaf, edge, agg) gets the even
      address, its ``b`` end (the upper tier) the odd one. Every port is in exactly one
      link, so every port has an address.
    - Host ``h`` (0-based, in node order) has the red TEP ``10.224.0.0 + h`` (in
      10.224.0.0/12) and the blue TEP ``10.240.0.0 + h`` (in 10.240.0.0/12): /32s outside
      every link network. Hosts are numbered switch by switch, so the TEPs of one
      attachment group form aligned blocks when the group size is a power of two (fat-tree
      and leaf-spine with 2^n hosts per leaf): switches then route one prefix per group and
      colour instead of one /32 per host.
    - Node ``n`` (0-based, in node order) has the management address
      ``172.16.0.0 + n + 1`` inside 172.16.0.0/12.
    - Port ``p`` (1-based, in creation order) has the MAC ``02:00:<p as 4 bytes>``
      (locally administered, unicast).
    - Workload ``w`` (1-based, one per host) has the MAC ``06:00:<w as 4 bytes>`` and the
      overlay IP ``100.64.0.0 + w`` inside 100.64.0.0/10.
    - Host ports run at 400000 Mb/s, switch-to-switch ports at 800000 Mb/s (a host link's
      switch end runs at the host's speed).

Overlay
    Every document has the tenant ``default`` and VNI 1000 named ``default``; unless
    ``workloads=False`` each host also gets one workload ``<host>-vf0`` on VF ``vf0`` in
    VNI 1000. Every host has a red and a blue TEP either way.

Size limits
    Every generator refuses parameters that would give more than `MAX_NODES` nodes or
    `MAX_LINKS` links (20,000 and 100,000: a typo should not build ten million nodes). That
    allows up to a k=40 fat-tree (18,000 nodes, 48,000 links) or a 16x64x16 leaf-spine.
    Measured on a 2-core machine: k=16 in 0.15 s, k=32 (9,472 nodes, 24,576 links) in
    about 1.5 s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from ipaddress import IPv4Address
from typing import Annotated, Any, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from thorn.model import Colour, FabricDocument, JsonInt, Role
from thorn.watchdog import gc_paused

__all__ = [
    "GENERATORS",
    "MAX_LINKS",
    "MAX_NODES",
    "DualPlaneParams",
    "FatTreeParams",
    "Generator",
    "LeafSpineParams",
    "RailOptimizedParams",
    "dual_plane",
    "fat_tree",
    "generate",
    "leaf_spine",
    "rail_optimized",
]

MAX_NODES = 20_000
MAX_LINKS = 100_000

HOST_SPEED_MBPS = 400_000
FABRIC_SPEED_MBPS = 800_000
DEFAULT_TENANT = "default"
DEFAULT_VNI = 1000
DEFAULT_VNI_NAME = "default"
WORKLOAD_VF = "vf0"

_LINK_BASE = int(IPv4Address("10.0.0.0"))  # 10.0.0.0/9
_LINK_MAX = 1 << 22  # /31s in a /9
_TEP_BASE = int(IPv4Address("10.224.0.0"))  # 10.224.0.0/11: red in the lower /12
_TEP_COLOUR_STRIDE = 1 << 20  # blue TEPs in the upper /12, 10.240.0.0/12
_MGMT_BASE = int(IPv4Address("172.16.0.0"))  # 172.16.0.0/12
_OVERLAY_BASE = int(IPv4Address("100.64.0.0"))  # 100.64.0.0/10

# Bounds of the individual parameters (the totals are bounded by MAX_NODES / MAX_LINKS).
MAX_SPINES = 256
MAX_LEAVES = 1024
MAX_HOSTS_PER_LEAF = 512
MAX_FAT_TREE_K = 40
MAX_RAILS = 32
MAX_SERVERS_PER_SU = 512
MAX_SCALABLE_UNITS = 256


def _ip(value: int) -> str:
    return f"{value >> 24}.{(value >> 16) & 255}.{(value >> 8) & 255}.{value & 255}"


def _mac(first: int, value: int) -> str:
    return (
        f"{first:02x}:00:{(value >> 24) & 255:02x}:{(value >> 16) & 255:02x}:"
        f"{(value >> 8) & 255:02x}:{value & 255:02x}"
    )


_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _port_order(name: str) -> tuple[str, int]:
    match = _TRAILING_NUMBER.match(name)
    if match is None:  # pragma: no cover - every generated port name ends in a number
        return (name, 0)
    return (match.group(1), int(match.group(2)))


class _Builder:
    """Collects a fabric as plain data, allocating addresses and MACs from counters."""

    def __init__(self, workloads: bool) -> None:
        self.with_workloads = workloads
        self.nodes: list[dict[str, Any]] = []
        self.ports: dict[str, list[dict[str, Any]]] = {}
        self.links: list[tuple[str, str, str, str, list[str]]] = []
        self.hosts: list[str] = []
        self.mac_counter = 0

    def node(self, name: str, role: Role, labels: dict[str, str]) -> str:
        self.nodes.append(
            {
                "name": name,
                "role": role,
                "mgmt_address": _MGMT_BASE + len(self.nodes) + 1,
                "labels": labels,
            }
        )
        self.ports[name] = []
        if role is Role.host:
            self.hosts.append(name)
        return name

    def _port(self, node: str, name: str, address: int, speed: int) -> None:
        self.mac_counter += 1
        self.ports[node].append(
            {
                "name": name,
                "mac": _mac(0x02, self.mac_counter),
                "address": address,
                "speed_mbps": speed,
            }
        )

    def link(
        self,
        a: str,
        a_port: str,
        b: str,
        b_port: str,
        *,
        host: bool = False,
        srlgs: list[str] | None = None,
    ) -> None:
        """Join a:a_port (lower tier, even address) and b:b_port (upper tier, odd address)."""
        index = len(self.links)
        if index >= _LINK_MAX:  # pragma: no cover - MAX_LINKS is far below
            raise ValueError("out of /31s in 10.0.0.0/9")
        speed = HOST_SPEED_MBPS if host else FABRIC_SPEED_MBPS
        self._port(a, a_port, _LINK_BASE + 2 * index, speed)
        self._port(b, b_port, _LINK_BASE + 2 * index + 1, speed)
        self.links.append((a, a_port, b, b_port, sorted(srlgs) if srlgs else []))

    # --- output -------------------------------------------------------------------------

    def _overlay(self) -> tuple[list[tuple[str, Colour, int]], list[tuple[str, str, int]]]:
        teps: list[tuple[str, Colour, int]] = []
        workloads: list[tuple[str, str, int]] = []
        for h, host in enumerate(self.hosts):
            teps.append((host, Colour.red, _TEP_BASE + h))
            teps.append((host, Colour.blue, _TEP_BASE + _TEP_COLOUR_STRIDE + h))
            if self.with_workloads:
                workloads.append((host, _mac(0x06, h + 1), _OVERLAY_BASE + h + 1))
        return teps, workloads

    def _sorted_ports(self, node: str) -> list[dict[str, Any]]:
        return sorted(self.ports[node], key=lambda p: _port_order(p["name"]))

    def to_dict(self) -> dict[str, Any]:
        """The document as plain JSON-like data (what `FabricDocument.model_validate` takes)."""
        teps, workloads = self._overlay()
        return {
            "nodes": [
                {
                    **n,
                    "role": n["role"].value,
                    "mgmt_address": _ip(n["mgmt_address"]),
                    "ports": [
                        {**p, "address": f"{_ip(p['address'])}/31"}
                        for p in self._sorted_ports(n["name"])
                    ],
                }
                for n in self.nodes
            ],
            "links": [
                {
                    "a": {"node": a, "port": ap},
                    "b": {"node": b, "port": bp},
                    "srlgs": srlgs,
                }
                for a, ap, b, bp, srlgs in self.links
            ],
            "tenants": [{"name": DEFAULT_TENANT}],
            "vnis": [{"vni": DEFAULT_VNI, "name": DEFAULT_VNI_NAME, "tenant": DEFAULT_TENANT}],
            "workloads": [
                {
                    "name": f"{host}-{WORKLOAD_VF}",
                    "node": host,
                    "vni": DEFAULT_VNI,
                    "vf": WORKLOAD_VF,
                    "mac": mac,
                    "ip": _ip(ip),
                }
                for host, mac, ip in workloads
            ],
            "teps": [{"node": n, "colour": c.value, "address": _ip(a)} for n, c, a in teps],
        }

    def build(self) -> FabricDocument:
        """Validate the collected data into a document, in one `model_validate` call.

        The cyclic garbage collector is paused meanwhile: the hundreds of thousands of
        short-lived containers would otherwise trigger many full collections (measured at
        k=32: 3.3 s with it running, 1.1 s paused). `model_construct` of every object
        would be about twice as fast again but would skip the model's checks.
        """
        with gc_paused():
            return FabricDocument.model_validate(self.to_dict())


# --- parameter checks (shared by the functions and the params models) ----------------------


def _int_in(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _check_size(what: str, nodes: int, links: int) -> None:
    if nodes > MAX_NODES:
        raise ValueError(f"{what} would have {nodes} nodes; the limit is {MAX_NODES}")
    if links > MAX_LINKS:
        raise ValueError(f"{what} would have {links} links; the limit is {MAX_LINKS}")


def _check_leaf_spine(spines: int, leaves: int, hosts_per_leaf: int, dual_homed: bool) -> None:
    _int_in("spines", spines, 1, MAX_SPINES)
    _int_in("leaves", leaves, 1, MAX_LEAVES)
    _int_in("hosts_per_leaf", hosts_per_leaf, 1, MAX_HOSTS_PER_LEAF)
    if dual_homed and leaves % 2:
        raise ValueError(
            f"dual-homed hosts attach to leaf pairs (leaf 2i-1 and leaf 2i), so leaves must be "
            f"even; got leaves={leaves}"
        )
    hosts = leaves // 2 * hosts_per_leaf if dual_homed else leaves * hosts_per_leaf
    _check_size(
        f"leaf_spine(spines={spines}, leaves={leaves}, hosts_per_leaf={hosts_per_leaf})",
        spines + leaves + hosts,
        leaves * spines + leaves * hosts_per_leaf,
    )


def _check_fat_tree(k: int) -> None:
    _int_in("k", k, 2, MAX_FAT_TREE_K)
    if k % 2:
        raise ValueError(f"k must be even (a k-ary fat-tree splits k ports in halves); got {k}")


def _check_rail_optimized(
    servers_per_su: int, rails: int, scalable_units: int, spines: int
) -> None:
    _int_in("servers_per_su", servers_per_su, 1, MAX_SERVERS_PER_SU)
    _int_in("rails", rails, 1, MAX_RAILS)
    _int_in("scalable_units", scalable_units, 1, MAX_SCALABLE_UNITS)
    _int_in("spines", spines, 1, MAX_SPINES)
    leaves = scalable_units * rails
    servers = scalable_units * servers_per_su
    _check_size(
        f"rail_optimized(servers_per_su={servers_per_su}, rails={rails}, "
        f"scalable_units={scalable_units}, spines={spines})",
        spines + leaves + servers,
        servers * rails + leaves * spines,
    )


def _check_dual_plane(spines_per_plane: int, leaves_per_plane: int, hosts_per_leaf: int) -> None:
    _int_in("spines_per_plane", spines_per_plane, 1, MAX_SPINES)
    _int_in("leaves_per_plane", leaves_per_plane, 1, MAX_LEAVES)
    _int_in("hosts_per_leaf", hosts_per_leaf, 1, MAX_HOSTS_PER_LEAF)
    hosts = leaves_per_plane * hosts_per_leaf
    _check_size(
        f"dual_plane(spines_per_plane={spines_per_plane}, leaves_per_plane={leaves_per_plane}, "
        f"hosts_per_leaf={hosts_per_leaf})",
        2 * (spines_per_plane + leaves_per_plane) + hosts,
        2 * (leaves_per_plane * spines_per_plane + hosts),
    )


# --- the generators ------------------------------------------------------------------------


def leaf_spine(
    spines: int,
    leaves: int,
    hosts_per_leaf: int,
    dual_homed: bool = False,
    *,
    workloads: bool = True,
) -> FabricDocument:
    """A two-tier leaf-spine (folded Clos): every leaf to every spine, hosts on the leaves.

    Each leaf has `hosts_per_leaf` host-facing ports ``swp1..swp<hosts_per_leaf>`` and one
    uplink per spine after them (``swp<hosts_per_leaf + s>`` to ``spine<s>``); ``spine<s>``
    port ``swp<l>`` faces ``leaf<l>``.

    Single-homed: ``leaves * hosts_per_leaf`` hosts, each with ``eth1`` on one leaf.
    Dual-homed: hosts attach to a leaf pair (``leaf<2i-1>``, ``leaf<2i>``, so `leaves` must be
    even) with ``eth1`` on the odd and ``eth2`` on the even leaf; each leaf still has
    `hosts_per_leaf` host ports, so there are ``leaves / 2 * hosts_per_leaf`` hosts.
    """
    _check_leaf_spine(spines, leaves, hosts_per_leaf, dual_homed)
    b = _Builder(workloads)
    spine_names = [
        b.node(f"spine{s}", Role.switch, {"tier": "spine"}) for s in range(1, spines + 1)
    ]
    leaf_names = [b.node(f"leaf{i}", Role.switch, {"tier": "leaf"}) for i in range(1, leaves + 1)]
    host = 0
    if dual_homed:
        for pair in range(leaves // 2):
            odd, even = leaf_names[2 * pair], leaf_names[2 * pair + 1]
            for j in range(1, hosts_per_leaf + 1):
                host += 1
                name = b.node(f"host{host}", Role.host, {"tier": "host"})
                b.link(name, "eth1", odd, f"swp{j}", host=True)
                b.link(name, "eth2", even, f"swp{j}", host=True)
    else:
        for leaf in leaf_names:
            for j in range(1, hosts_per_leaf + 1):
                host += 1
                name = b.node(f"host{host}", Role.host, {"tier": "host"})
                b.link(name, "eth1", leaf, f"swp{j}", host=True)
    for li, leaf in enumerate(leaf_names, start=1):
        for si, spine in enumerate(spine_names, start=1):
            b.link(leaf, f"swp{hosts_per_leaf + si}", spine, f"swp{li}")
    return b.build()


def fat_tree(k: int, *, workloads: bool = True) -> FabricDocument:
    """A three-tier k-ary fat-tree (Al-Fares, Loukissas, Vahdat, SIGCOMM 2008).

    k pods, each with k/2 edge switches ``edge<pod>-<i>`` and k/2 aggregation switches
    ``agg<pod>-<i>``; (k/2)^2 core switches ``core<c>``; k^3/4 hosts
    ``host<pod>-<edge>-<i>``, k/2 on each edge switch. Every edge switch connects to every
    aggregation switch of its pod; aggregation switch i of every pod connects to the core
    switches ``core<(i-1)*k/2 + 1>`` .. ``core<i*k/2>``, one each. Every switch has k ports:
    ``swp1..swp<k/2>`` down, ``swp<k/2+1>..swp<k>`` up (a core's ``swp<p>`` faces pod p).
    k must be even, 2 <= k <= MAX_FAT_TREE_K; k=16 gives 1,024 hosts and 320 switches.
    """
    _check_fat_tree(k)
    half = k // 2
    b = _Builder(workloads)
    cores = [b.node(f"core{c}", Role.switch, {"tier": "core"}) for c in range(1, half * half + 1)]
    aggs: list[list[str]] = []
    edges: list[list[str]] = []
    for pod in range(1, k + 1):
        labels = {"pod": str(pod)}
        aggs.append(
            [
                b.node(f"agg{pod}-{i}", Role.switch, {"tier": "agg", **labels})
                for i in range(1, half + 1)
            ]
        )
    for pod in range(1, k + 1):
        labels = {"pod": str(pod)}
        edges.append(
            [
                b.node(f"edge{pod}-{i}", Role.switch, {"tier": "edge", **labels})
                for i in range(1, half + 1)
            ]
        )
    for pod in range(1, k + 1):
        for e, edge in enumerate(edges[pod - 1], start=1):
            for h in range(1, half + 1):
                host = b.node(f"host{pod}-{e}-{h}", Role.host, {"tier": "host", "pod": str(pod)})
                b.link(host, "eth1", edge, f"swp{h}", host=True)
    for pod in range(1, k + 1):
        for e, edge in enumerate(edges[pod - 1], start=1):
            for a, agg in enumerate(aggs[pod - 1], start=1):
                b.link(edge, f"swp{half + a}", agg, f"swp{e}")
    for pod in range(1, k + 1):
        for a, agg in enumerate(aggs[pod - 1], start=1):
            for j in range(1, half + 1):
                core = cores[(a - 1) * half + (j - 1)]
                b.link(agg, f"swp{half + j}", core, f"swp{pod}")
    return b.build()


def rail_optimized(
    servers_per_su: int = 32,
    rails: int = 8,
    scalable_units: int = 1,
    spines: int = 8,
    *,
    workloads: bool = True,
) -> FabricDocument:
    """A rail-optimized GPU fabric: scalable units (SUs) of servers with one NIC per rail.

    Modelling choice: a GPU server is ONE host node (``host<n>``, numbered across SUs) with
    `rails` ports ``eth1..eth<rails>``, one per NIC; port ``eth<r>`` is rail r. (One host
    node per NIC would split a server's TEPs and workloads across nodes that really share a
    kernel and a PCIe complex, and lose the fact that the NICs fail together.) Each SU has
    `rails` rail leaves; leaf ``(su, r)`` is ``leaf<(su-1)*rails + r>`` (labels ``rail``,
    ``su``) and takes rail r of every server of that SU on ``swp1..swp<servers_per_su>``.
    Every rail leaf connects to every spine (``swp<servers_per_su + s>`` to ``spine<s>``;
    ``spine<s>`` port ``swp<l>`` faces ``leaf<l>``). Each server has one red and one blue
    TEP and (unless workloads=False) one workload, like every other host.
    """
    _check_rail_optimized(servers_per_su, rails, scalable_units, spines)
    b = _Builder(workloads)
    spine_names = [
        b.node(f"spine{s}", Role.switch, {"tier": "spine"}) for s in range(1, spines + 1)
    ]
    leaf_names: list[list[str]] = []
    for su in range(1, scalable_units + 1):
        leaf_names.append(
            [
                b.node(
                    f"leaf{(su - 1) * rails + r}",
                    Role.switch,
                    {"tier": "leaf", "rail": str(r), "su": str(su)},
                )
                for r in range(1, rails + 1)
            ]
        )
    server = 0
    for su in range(1, scalable_units + 1):
        for j in range(1, servers_per_su + 1):
            server += 1
            host = b.node(f"host{server}", Role.host, {"tier": "host", "su": str(su)})
            for r, leaf in enumerate(leaf_names[su - 1], start=1):
                b.link(host, f"eth{r}", leaf, f"swp{j}", host=True)
    for li, leaf in enumerate((lf for su_leaves in leaf_names for lf in su_leaves), start=1):
        for si, spine in enumerate(spine_names, start=1):
            b.link(leaf, f"swp{servers_per_su + si}", spine, f"swp{li}")
    return b.build()


def dual_plane(
    spines_per_plane: int = 2,
    leaves_per_plane: int = 4,
    hosts_per_leaf: int = 4,
    *,
    workloads: bool = True,
) -> FabricDocument:
    """Two independent, identical leaf-spine planes A and B; every host has a port in each.

    Plane p (``a`` or ``b``) has ``spine-<p><s>`` and ``leaf-<p><l>`` (label ``plane``), every
    leaf to every spine of its plane, nothing between the planes. Host ``host<n>`` sits on
    leaf ``l = ceil(n / hosts_per_leaf)`` of both planes: ``eth1`` on ``leaf-a<l>``, ``eth2``
    on ``leaf-b<l>`` (same ``swp<j>`` on both). Every link of plane A, host links included,
    is in SRLG ``plane-a``; plane B's in ``plane-b``. Leaf ports as in `leaf_spine`.
    """
    _check_dual_plane(spines_per_plane, leaves_per_plane, hosts_per_leaf)
    b = _Builder(workloads)
    planes = ("a", "b")
    spine_names: dict[str, list[str]] = {}
    leaf_names: dict[str, list[str]] = {}
    for p in planes:
        spine_names[p] = [
            b.node(f"spine-{p}{s}", Role.switch, {"tier": "spine", "plane": p})
            for s in range(1, spines_per_plane + 1)
        ]
    for p in planes:
        leaf_names[p] = [
            b.node(f"leaf-{p}{i}", Role.switch, {"tier": "leaf", "plane": p})
            for i in range(1, leaves_per_plane + 1)
        ]
    host = 0
    for li in range(leaves_per_plane):
        for j in range(1, hosts_per_leaf + 1):
            host += 1
            name = b.node(f"host{host}", Role.host, {"tier": "host"})
            for port, p in enumerate(planes, start=1):
                b.link(
                    name,
                    f"eth{port}",
                    leaf_names[p][li],
                    f"swp{j}",
                    host=True,
                    srlgs=[f"plane-{p}"],
                )
    for p in planes:
        for li, leaf in enumerate(leaf_names[p], start=1):
            for si, spine in enumerate(spine_names[p], start=1):
                b.link(leaf, f"swp{hosts_per_leaf + si}", spine, f"swp{li}", srlgs=[f"plane-{p}"])
    return b.build()


# --- the registry --------------------------------------------------------------------------


# A parameter is a JSON integer: 4 or 4.0, not true (JsonInt).
Count = Annotated[int, JsonInt]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _workloads_field() -> Any:
    return Field(
        default=True,
        strict=True,  # JSON's true or false: pydantic would also read 1, "yes"
        description="give every host one workload (<host>-vf0) in VNI 1000 of tenant 'default'",
    )


class LeafSpineParams(_Params):
    """Two-tier leaf-spine: every leaf to every spine, hosts on leaves."""

    # A dual-homed fabric pairs its leaves (checked by _check_leaf_spine, with its reason).
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"dual_homed": {"const": True}}, "required": ["dual_homed"]},
            "then": {"properties": {"leaves": {"multipleOf": 2}}},
        }
    )

    spines: Count = Field(default=2, ge=1, le=MAX_SPINES, description="number of spine switches")
    leaves: Count = Field(default=4, ge=1, le=MAX_LEAVES, description="number of leaf switches")
    hosts_per_leaf: Count = Field(
        default=4,
        ge=1,
        le=MAX_HOSTS_PER_LEAF,
        description="host-facing ports per leaf (hosts per leaf pair when dual-homed)",
    )
    dual_homed: bool = Field(
        default=False,
        strict=True,
        description="attach each host to a leaf pair (leaf 2i-1 and 2i); needs an even leaf count",
    )
    workloads: bool = _workloads_field()

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_leaf_spine(self.spines, self.leaves, self.hosts_per_leaf, self.dual_homed)
        return self


class FatTreeParams(_Params):
    """Three-tier k-ary fat-tree (Al-Fares): k pods, (k/2)^2 cores, k^3/4 hosts."""

    k: Count = Field(
        default=4,
        ge=2,
        le=MAX_FAT_TREE_K,
        description="switch radix; even. k=16: 1,024 hosts, 320 switches",
        json_schema_extra={"multipleOf": 2},  # checked by _check_fat_tree, with its reason
    )
    workloads: bool = _workloads_field()

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_fat_tree(self.k)
        return self


class RailOptimizedParams(_Params):
    """Rail-optimized GPU fabric: one host per server with a port per rail, rail leaves, spines."""

    servers_per_su: Count = Field(
        default=32, ge=1, le=MAX_SERVERS_PER_SU, description="GPU servers per scalable unit"
    )
    rails: Count = Field(
        default=8, ge=1, le=MAX_RAILS, description="NICs (rails) per server = rail leaves per SU"
    )
    scalable_units: Count = Field(
        default=1, ge=1, le=MAX_SCALABLE_UNITS, description="number of scalable units"
    )
    spines: Count = Field(
        default=8, ge=1, le=MAX_SPINES, description="spine switches; each connects to every leaf"
    )
    workloads: bool = _workloads_field()

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_rail_optimized(self.servers_per_su, self.rails, self.scalable_units, self.spines)
        return self


class DualPlaneParams(_Params):
    """Two independent leaf-spine planes A and B; every host has one port in each."""

    spines_per_plane: Count = Field(
        default=2, ge=1, le=MAX_SPINES, description="spine switches in each plane"
    )
    leaves_per_plane: Count = Field(
        default=4, ge=1, le=MAX_LEAVES, description="leaf switches in each plane"
    )
    hosts_per_leaf: Count = Field(
        default=4, ge=1, le=MAX_HOSTS_PER_LEAF, description="hosts on each leaf (in each plane)"
    )
    workloads: bool = _workloads_field()

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_dual_plane(self.spines_per_plane, self.leaves_per_plane, self.hosts_per_leaf)
        return self


class Generator(NamedTuple):
    """A registry entry: the function and the model of its keyword parameters."""

    function: Callable[..., FabricDocument]
    params: type[BaseModel]


GENERATORS: Mapping[str, Generator] = {
    "leaf_spine": Generator(leaf_spine, LeafSpineParams),
    "fat_tree": Generator(fat_tree, FatTreeParams),
    "rail_optimized": Generator(rail_optimized, RailOptimizedParams),
    "dual_plane": Generator(dual_plane, DualPlaneParams),
}


def generate(name: str, params: Mapping[str, Any] | None = None) -> FabricDocument:
    """Run generator `name` with `params` (validated by its params model; defaults fill gaps).

    Raises ValueError for an unknown name and pydantic.ValidationError (a ValueError) for
    bad parameters.
    """
    entry = GENERATORS.get(name)
    if entry is None:
        raise ValueError(f"unknown generator '{name}'; known: {', '.join(sorted(GENERATORS))}")
    validated = entry.params.model_validate(dict(params or {}))
    return entry.function(**validated.model_dump())
