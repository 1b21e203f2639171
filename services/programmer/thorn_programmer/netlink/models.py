"""Typed, frozen models of the TC state THORN writes and reads back.

The same classes describe a request (encoded by `messages`) and a dump (decoded by `decode`),
so a round trip is an equality. Constructors validate and normalise: the kernel silently
ignores some inconsistent keys (an IPv4 match on a filter whose protocol is not IP, a port
without ip_proto), so those are refused here instead of becoming rules that match everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import ClassVar, Literal

from thorn_programmer.netlink.constants import (
    ETH_P_ALL,
    ETH_P_IP,
    ETH_P_IPV6,
    IPPROTO_TCP,
    IPPROTO_UDP,
    TC_H_INGRESS,
    Control,
    MirredAction,
)

IPNetwork = IPv4Network | IPv6Network
IPAddress = IPv4Address | IPv6Address

FULL_MAC_MASK = "ff:ff:ff:ff:ff:ff"
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_U8, _U16, _U32 = 0xFF, 0xFFFF, 0xFFFFFFFF


def _in_range(name: str, value: int | None, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise ValueError(f"{name}={value} is outside {low}..{high}")


def _mac(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    mac = value.lower()
    if not _MAC.match(mac):
        raise ValueError(f"{name}={value!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    return mac


def _same_family(name: str, *values: IPNetwork | IPAddress | None) -> int | None:
    versions = {v.version for v in values if v is not None}
    if len(versions) > 1:
        raise ValueError(f"{name}: IPv4 and IPv6 mixed")
    return versions.pop() if versions else None


@dataclass(frozen=True, slots=True)
class FlowerMatch:
    """Flower keys. Unset fields are wildcards; IP fields are prefixes (a /32 is a host).

    `eth_type` is the filter's protocol; it is inferred from `src_ip`/`dst_ip` when left out.
    A MAC mask of all ones is the same as no mask and normalises to None.
    """

    eth_type: int | None = None
    eth_dst: str | None = None
    eth_dst_mask: str | None = None
    eth_src: str | None = None
    eth_src_mask: str | None = None
    ip_proto: int | None = None
    src_ip: IPNetwork | None = None
    dst_ip: IPNetwork | None = None
    src_port: int | None = None
    dst_port: int | None = None
    enc_key_id: int | None = None
    enc_src_ip: IPNetwork | None = None
    enc_dst_ip: IPNetwork | None = None
    enc_dst_port: int | None = None

    def __post_init__(self) -> None:
        for name in ("eth_dst", "eth_dst_mask", "eth_src", "eth_src_mask"):
            object.__setattr__(self, name, _mac(name, getattr(self, name)))
        for key in ("eth_dst", "eth_src"):
            mask = getattr(self, f"{key}_mask")
            if mask is not None and getattr(self, key) is None:
                raise ValueError(f"{key}_mask without {key}")
            if mask == FULL_MAC_MASK:
                object.__setattr__(self, f"{key}_mask", None)
        _in_range("eth_type", self.eth_type, 0, _U16)
        _in_range("ip_proto", self.ip_proto, 0, _U8)
        for name in ("src_port", "dst_port", "enc_dst_port"):
            _in_range(name, getattr(self, name), 0, _U16)
        _in_range("enc_key_id", self.enc_key_id, 0, _U32)
        _same_family("enc_src_ip/enc_dst_ip", self.enc_src_ip, self.enc_dst_ip)
        version = _same_family("src_ip/dst_ip", self.src_ip, self.dst_ip)
        if version is not None:
            wanted = ETH_P_IP if version == 4 else ETH_P_IPV6
            if self.eth_type is None:
                object.__setattr__(self, "eth_type", wanted)
            elif self.eth_type != wanted:
                raise ValueError(f"IPv{version} keys need eth_type {wanted:#06x}")
        if self.ip_proto is not None and self.eth_type not in (ETH_P_IP, ETH_P_IPV6):
            raise ValueError("ip_proto needs eth_type IPv4 or IPv6")
        ports = self.src_port is not None or self.dst_port is not None
        if ports and self.ip_proto not in (IPPROTO_TCP, IPPROTO_UDP):
            raise ValueError("src_port/dst_port need ip_proto TCP or UDP")


@dataclass(frozen=True, slots=True)
class TunnelKeySet:
    """`tunnel_key set`: the encap metadata a collect_md VXLAN device then uses."""

    kind: ClassVar[str] = "tunnel_key"
    src: IPAddress
    dst: IPAddress
    key_id: int | None = None
    dst_port: int | None = None
    nocsum: bool = False
    tos: int | None = None
    ttl: int | None = None
    index: int = 0
    control: int = Control.PIPE

    def __post_init__(self) -> None:
        _same_family("tunnel_key src/dst", self.src, self.dst)
        _in_range("key_id", self.key_id, 0, _U32)
        _in_range("dst_port", self.dst_port, 0, _U16)
        _in_range("tos", self.tos, 0, _U8)
        _in_range("ttl", self.ttl, 1, _U8)
        _in_range("index", self.index, 0, _U32)
        # The kernel reports an unset TOS as 0: keep one spelling.
        if self.tos == 0:
            object.__setattr__(self, "tos", None)


@dataclass(frozen=True, slots=True)
class TunnelKeyUnset:
    """`tunnel_key unset`: drop the tunnel metadata after decap."""

    kind: ClassVar[str] = "tunnel_key"
    index: int = 0
    control: int = Control.PIPE

    def __post_init__(self) -> None:
        _in_range("index", self.index, 0, _U32)


@dataclass(frozen=True, slots=True)
class Mirred:
    """`mirred`: redirect or mirror to `ifindex`.

    `control` defaults as in tc: STOLEN after a redirect, PIPE after a mirror.
    """

    kind: ClassVar[str] = "mirred"
    ifindex: int
    action: MirredAction = MirredAction.EGRESS_REDIRECT
    control: int | None = None
    index: int = 0

    def __post_init__(self) -> None:
        _in_range("ifindex", self.ifindex, 1, _U32)
        _in_range("index", self.index, 0, _U32)
        object.__setattr__(self, "action", MirredAction(self.action))
        if self.control is None:
            redirect = self.action in (MirredAction.EGRESS_REDIRECT, MirredAction.INGRESS_REDIRECT)
            object.__setattr__(self, "control", Control.STOLEN if redirect else Control.PIPE)

    @classmethod
    def redirect(cls, ifindex: int, *, ingress: bool = False, index: int = 0) -> Mirred:
        action = MirredAction.INGRESS_REDIRECT if ingress else MirredAction.EGRESS_REDIRECT
        return cls(ifindex=ifindex, action=action, index=index)

    @classmethod
    def mirror(cls, ifindex: int, *, ingress: bool = False, index: int = 0) -> Mirred:
        action = MirredAction.INGRESS_MIRROR if ingress else MirredAction.EGRESS_MIRROR
        return cls(ifindex=ifindex, action=action, index=index)


@dataclass(frozen=True, slots=True)
class Gact:
    """`gact`: a verdict (OK = `pass`, SHOT = `drop`, PIPE, ...)."""

    kind: ClassVar[str] = "gact"
    control: int = Control.OK
    index: int = 0

    def __post_init__(self) -> None:
        _in_range("index", self.index, 0, _U32)


BindableKind = Literal["tunnel_key", "mirred", "gact"]


@dataclass(frozen=True, slots=True)
class ActionRef:
    """Bind a filter to an existing shared action (`action <kind> index N`).

    On the wire this is what tc sends; a gact reference is byte-identical to
    `Gact(Control.OK, index)` (tc has no other spelling), so it decodes as that.
    """

    kind: BindableKind
    index: int

    def __post_init__(self) -> None:
        if self.kind not in ("tunnel_key", "mirred", "gact"):
            raise ValueError(f"cannot bind to a {self.kind!r} action")
        _in_range("index", self.index, 1, _U32)


@dataclass(frozen=True, slots=True)
class OtherAction:
    """An action of a kind this package does not model, seen in a dump (not encodable)."""

    kind: str
    index: int


Action = TunnelKeySet | TunnelKeyUnset | Mirred | Gact | ActionRef
AnyAction = Action | OtherAction


@dataclass(frozen=True, slots=True)
class FlowerFilter:
    """One flower filter: where it hangs, what it matches, what it does.

    `priority` is tc's `pref`; `handle` 0 lets the kernel pick one on add, but replace and
    delete need the real one. Offload flags go to TCA_FLOWER_FLAGS; a shared action bound by
    this filter must carry the same skip_hw/skip_sw or the kernel refuses the filter.
    """

    ifindex: int
    priority: int
    match: FlowerMatch = field(default_factory=FlowerMatch)
    actions: tuple[AnyAction, ...] = ()
    handle: int = 0
    parent: int = TC_H_INGRESS
    chain: int = 0
    classid: int | None = None
    skip_sw: bool = False
    skip_hw: bool = False

    def __post_init__(self) -> None:
        _in_range("ifindex", self.ifindex, 1, 0x7FFFFFFF)
        _in_range("priority", self.priority, 0, _U16)
        _in_range("handle", self.handle, 0, _U32)
        _in_range("chain", self.chain, 0, _U32)
        _in_range("classid", self.classid, 0, _U32)
        if len(self.actions) > 32:
            raise ValueError("at most 32 actions per filter (TCA_ACT_MAX_PRIO)")
        object.__setattr__(self, "actions", tuple(self.actions))

    @property
    def protocol(self) -> int:
        """The filter protocol (tcm_info's low half): eth_type, or all."""
        return ETH_P_ALL if self.match.eth_type is None else self.match.eth_type


@dataclass(frozen=True, slots=True)
class Counters:
    """Action counters from TCA_ACT_STATS (gnet_stats); hw_* are the offloaded share."""

    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    hw_bytes: int = 0
    hw_packets: int = 0


@dataclass(frozen=True, slots=True)
class ActionState:
    """An action as the kernel reports it, in a filter or in an action dump.

    `action` is the spec with its index filled in, so it can be fed back to an encoder.
    """

    action: AnyAction
    index: int
    refcnt: int = 0
    bindcnt: int = 0
    counters: Counters = field(default_factory=Counters)
    skip_hw: bool = False
    skip_sw: bool = False
    in_hw_count: int | None = None

    @property
    def kind(self) -> str:
        return self.action.kind


@dataclass(frozen=True, slots=True)
class FilterState:
    """A flower filter read back: the spec plus what only the kernel knows."""

    spec: FlowerFilter
    actions: tuple[ActionState, ...] = ()
    in_hw: bool = False
    not_in_hw: bool = False
    in_hw_count: int | None = None
    # Attribute names present in the dump that the models cannot express (foreign keys).
    unmodelled: tuple[str, ...] = ()
