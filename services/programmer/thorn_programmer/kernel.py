"""The kernel objects THORN owns on a node, as values, and the diff between two sets of them.

Drivers render an intent into these objects (pure), read the same objects back from the
kernel, and apply the difference. Identity (`key`) is structural: a route by its prefix and
metric, an FDB entry by its MAC, an encap rule by its device and inner destination, so reading back
needs no bookkeeping of our own, and restarting the agent finds its objects again without
touching them. Kernel-assigned numbers (filter handles, action indexes) ride along in
fields that equality ignores.

What THORN owns, and so may change or delete (anything else is never touched):
- devices it created (`thv<vni>` VXLAN devices, `thorn-vx`);
- addresses labelled `TEP_LABEL` (the TEPs, on the loopback device);
- routes with protocol `RTPROT_THORN` (in the main table, or in a U-turn table of its band);
- policy rules with protocol `RTPROT_THORN` (a switch port's U-turn rule);
- tc filters at priorities `PRIO_BASE` .. `PRIO_BASE + PRIO_BAND - 1` on any device;
- tc actions with an index in `ACTION_INDEX_BASE` .. `+ ACTION_INDEX_BAND - 1`;
- FDB entries on its own VXLAN devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

RTPROT_THORN = 146  # rtnetlink protocol of THORN's routes ("thorn" in rt_protos.d)
PRIO_BASE = 0xC000  # tc priorities of THORN's filters: this band, and only this band
PRIO_BAND = 0x400
ACTION_INDEX_BASE = 0x54480000  # "TH": indexes of THORN's shared tc actions
ACTION_INDEX_BAND = 0x10000
# THORN's probes of what the kernel accepts (added and deleted at once; a leftover is THORN's
# own and reconcile removes it): a filter at the band's first priority, an action at its last
# index.
PROBE_PRIO = PRIO_BASE
PROBE_INDEX = ACTION_INDEX_BASE + ACTION_INDEX_BAND - 1
TEP_DEVICE = "lo"  # the TEPs live on the loopback device (not every kernel has dummy) ...
# ... labelled (TEP_LABEL, from thorn.desired), so THORN knows its own addresses
VXLAN_PORT = 4789
ZERO_MAC = "00:00:00:00:00:00"  # FDB: the flood list (ingress replication)
BROADCAST_MAC = "ff:ff:ff:ff:ff:ff"
# Route metrics (RTA_PRIORITY): a route's own next hop, and its loop-free backup, which the
# kernel uses only while the primary is skipped (its port has no carrier, with
# ignore_routes_with_linkdown) or gone (its port is admin down, or the agent withdrew it).
PRIMARY_METRIC = 10
BACKUP_METRIC = 20
RT_TABLE_MAIN = 254
# A switch port's U-turn table (docs/datapath.md "Switch-local repair"): the band's base plus
# the port's ifindex, looked up by the port's `ip rule iif PORT` at UTURN_RULE_PRIORITY
# (before the main table's rule at 32766).
# Ifindexes run high (a lab's veth peers from 100000, a busy host's past a million): the band
# is wide, and clear of the small ids VRFs and admins use.
UTURN_TABLE_BASE = 0x70000000
UTURN_TABLE_BAND = 0x10000000
UTURN_RULE_PRIORITY = 20000

# Priorities inside the band, by role (a lower number is tried first). Priorities are per
# device: representors carry LOCAL..FLOOD, tunnel devices DECAP..DECAP_FLOOD.
PRIO_LOCAL = PRIO_BASE + 0x100  # + n: representor ingress, to another workload on this host
PRIO_LOCAL_FLOOD = PRIO_BASE + 0x1FE  # representor ingress: BUM, copied to local workloads too
PRIO_ENCAP = PRIO_BASE + 0x1FF  # representor ingress: into the tunnel
PRIO_FLOOD = PRIO_BASE + 0x200  # + part: representor ingress, BUM replication (flower)
FLOOD_PARTS = PRIO_BAND - 0x200
PRIO_DECAP = PRIO_BASE + 0x200  # (+ n): tunnel ingress, to a local workload
PRIO_DECAP_FLOOD = PRIO_BASE + PRIO_BAND - 1  # tunnel ingress: BUM, to every local workload


def vxlan_name(vni: int) -> str:
    return f"thv{vni}"  # at most 11 characters (VNI < 2^24), inside IFNAMSIZ


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    kind: Literal["vxlan"]
    vni: int | None = None  # None with external: one collect_md device for every VNI
    local: str | None = None
    port: int = VXLAN_PORT
    external: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        return ("device", self.name)


@dataclass(frozen=True, slots=True)
class Address:
    dev: str
    address: str  # with its prefix length, e.g. 10.224.0.1/32

    @property
    def key(self) -> tuple[object, ...]:
        return ("address", self.dev, self.address)


@dataclass(frozen=True, slots=True)
class Route:
    prefix: str
    dev: str
    via: str | None
    metric: int  # PRIMARY_METRIC or BACKUP_METRIC (read back: whatever the kernel has)
    table: int = RT_TABLE_MAIN  # or a port's U-turn table

    @property
    def key(self) -> tuple[object, ...]:
        # One prefix can hold a primary and a backup: the metric tells them apart (and is
        # what the kernel itself matches a replace or delete on).
        return ("route", self.prefix, self.metric, self.table)


@dataclass(frozen=True, slots=True)
class PortRule:
    """`ip rule add iif PORT lookup TABLE pref PRIORITY proto thorn` for one address family
    (4 or 6): packets that arrive on `iif` are looked up in its U-turn table first (the
    kernel goes on to the main table when that has no usable route)."""

    family: int
    iif: str
    table: int
    priority: int = UTURN_RULE_PRIORITY

    @property
    def key(self) -> tuple[object, ...]:
        return ("port-rule", self.family, self.iif)


def uturn_table(ifindex: int) -> int | None:
    """The U-turn table of the port with `ifindex` (None: beyond the band)."""
    return UTURN_TABLE_BASE + ifindex if 0 < ifindex < UTURN_TABLE_BAND else None


def is_uturn_table(table: int) -> bool:
    return UTURN_TABLE_BASE < table < UTURN_TABLE_BASE + UTURN_TABLE_BAND


@dataclass(frozen=True, slots=True)
class Clsact:
    """The clsact qdisc a device's filters hang off. Ensured, never removed (it may carry
    other owners' filters); it goes away with a device THORN deletes."""

    dev: str

    @property
    def key(self) -> tuple[object, ...]:
        return ("clsact", self.dev)


@dataclass(frozen=True, slots=True)
class Redirect:
    """u32 on `dev`'s ingress at `prio`: packets to `dst_mac` (None: every packet; the
    broadcast MAC: every group address) are mirrored to `mirror` and redirected to `to`."""

    dev: str
    prio: int
    dst_mac: str | None
    to: str
    mirror: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[object, ...]:
        return ("u32", self.dev, self.prio)


@dataclass(frozen=True, slots=True)
class Fdb:
    """A static FDB entry of a VXLAN device: frames to `mac` go to the TEP `dst`."""

    dev: str
    mac: str
    dst: str

    @property
    def key(self) -> tuple[object, ...]:
        # The flood list holds one entry per destination; any other MAC has one entry.
        if self.mac == ZERO_MAC:
            return ("fdb", self.dev, self.mac, self.dst)
        return ("fdb", self.dev, self.mac)


@dataclass(frozen=True, slots=True)
class TunnelAction:
    """A shared tunnel_key set action: every encap rule toward (`peer`, `vni`) binds to it,
    so moving that peer to its other colour is one message (replace by index)."""

    peer: str
    vni: int
    src: str
    dst: str
    index: int = field(default=0, compare=False)  # assigned when created
    skip_sw: bool = False  # in the NIC only (skip_sw), else in software only (skip_hw)

    @property
    def key(self) -> tuple[object, ...]:
        return ("tunnel", self.peer, self.vni)


@dataclass(frozen=True, slots=True)
class EncapRule:
    """flower on a representor's ingress: frames to `mac` take the (peer, vni) tunnel."""

    dev: str
    mac: str
    peer: str
    vni: int
    handle: int = field(default=0, compare=False)
    skip_sw: bool = False  # as TunnelAction's (the kernel wants a rule's and its action's equal)

    @property
    def key(self) -> tuple[object, ...]:
        return ("encap", self.dev, self.mac)


@dataclass(frozen=True, slots=True)
class FloodRule:
    """flower on a representor's ingress: group-addressed frames are copied to the other
    local workloads (`mirrors`) and through each peer host's shared tunnel action (`peers`:
    ingress replication), `part` of several; the last part drops the original. Binding the
    peers' own tunnel actions keeps a failover at one message for BUM traffic too."""

    dev: str
    part: int
    # A representor belongs to one VNI; a rule with no peers names none, so it is not compared.
    vni: int = field(compare=False)
    peers: tuple[str, ...] = ()
    last: bool = True
    mirrors: tuple[str, ...] = ()
    handle: int = field(default=0, compare=False)
    skip_sw: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        return ("flood", self.dev, self.part)


@dataclass(frozen=True, slots=True)
class StrayRule:
    """A filter in THORN's priority band that THORN would not write (an older version's, a
    half-applied change's): read back so that reconcile removes it."""

    dev: str
    prio: int
    handle: int
    kind: str

    @property
    def key(self) -> tuple[object, ...]:
        return ("stray", self.dev, self.prio, self.handle)


@dataclass(frozen=True, slots=True)
class DecapRule:
    """flower on the tunnel device's ingress: frames of `vni` to `mac` are decapsulated and
    redirected to `rep` (the broadcast MAC: every group address, copied to each of `reps`)."""

    vni: int
    mac: str
    reps: tuple[str, ...]
    handle: int = field(default=0, compare=False)
    skip_sw: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        return ("decap", self.vni, self.mac)


KernelObject = (
    (Device | Address | Route | Clsact | Redirect | Fdb | TunnelAction | EncapRule | FloodRule)
    | DecapRule
    | StrayRule
    | PortRule
)

# Creation order; deletion runs the other way (rules before the actions and devices they use).
RANK: Mapping[type, int] = {
    Device: 0,
    Address: 1,
    Route: 2,
    Clsact: 3,
    TunnelAction: 4,
    Fdb: 5,
    DecapRule: 6,
    Redirect: 7,
    EncapRule: 8,
    FloodRule: 9,
    StrayRule: 10,
    PortRule: 11,  # after the routes of its table; deleted before them
}
NEVER_DELETED: tuple[type, ...] = (Clsact,)

Op = Literal["add", "replace", "delete"]


@dataclass(frozen=True, slots=True)
class Change:
    op: Op
    new: KernelObject | None  # what it becomes (add, replace)
    old: KernelObject | None  # what is in the kernel now (replace, delete)

    @property
    def obj(self) -> KernelObject:
        target = self.new if self.new is not None else self.old
        assert target is not None
        return target


def index(objects: Iterable[KernelObject]) -> dict[tuple[object, ...], KernelObject]:
    out: dict[tuple[object, ...], KernelObject] = {}
    for obj in objects:
        if obj.key in out:
            raise ValueError(f"two kernel objects share the key {obj.key}: {obj}")
        out[obj.key] = obj
    return out


def diff(desired: Iterable[KernelObject], actual: Iterable[KernelObject]) -> list[Change]:
    """The fewest changes that turn `actual` into `desired`, in a safe order: creations and
    replacements by rank (devices first, rules last), then deletions in reverse rank."""
    want, have = index(desired), index(actual)
    upserts: list[Change] = []
    for key, obj in want.items():
        current = have.get(key)
        if current is None:
            upserts.append(Change("add", obj, None))
        elif current != obj:
            upserts.append(Change("replace", obj, current))
    deletes = [
        Change("delete", None, obj)
        for key, obj in have.items()
        if key not in want and not isinstance(obj, NEVER_DELETED)
    ]
    upserts.sort(key=lambda c: RANK[type(c.obj)])
    deletes.sort(key=lambda c: -RANK[type(c.obj)])
    return upserts + deletes
