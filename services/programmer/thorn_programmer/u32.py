"""u32 filters with mirred actions, encoded and decoded here (the emulation datapath's rules).

pyroute2 0.9.7's u32 selector parser only takes offsets 0..255 from the network header and
mislabels the keys it decodes; matching the Ethernet destination on ingress needs negative
offsets (the MAC header sits 14 bytes before the network header), exactly as iproute2's
`match ether dst` encodes it: two keys, at -16 (last 16 bits: the MAC's first two bytes)
and at -12 (the MAC's last four bytes). So the selector is packed and parsed here, as
`struct tc_u32_sel` + `struct tc_u32_key[]` (include/uapi/linux/pkt_cls.h).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import nla, nlmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common_act import get_tca_action, tca_act_prio

ETH_P_ALL = 0x0003
TC_U32_TERMINAL = 1
INGRESS = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
MIRRED_EGRESS_REDIRECT = 1  # tc_mirred eaction values (tc_act/tc_mirred.h)
MIRRED_EGRESS_MIRROR = 2
_SEL = struct.Struct("=BBBxHHhhI")  # flags offshift nkeys pad offmask off offoff hoff hmask
# tc_u32_key: mask and val in network order, off and offmask in host order.
_KEY_SIZE = 16
_KEY_HOST = struct.Struct("=ii")


@dataclass(frozen=True, slots=True)
class Key:
    mask: int
    value: int
    offset: int


def mac_keys(mac: str | None) -> list[Key]:
    """Keys matching an Ethernet destination; the broadcast MAC means any group address
    (the I/G bit); None means every packet."""
    if mac is None:
        return [Key(0, 0, 0)]
    raw = bytes(int(b, 16) for b in mac.split(":"))
    if raw == b"\xff" * 6:
        return [Key(0x00000100, 0x00000100, -16)]
    head = int.from_bytes(raw[:2], "big")
    tail = int.from_bytes(raw[2:], "big")
    return [Key(0x0000FFFF, head, -16), Key(0xFFFFFFFF, tail, -12)]


def keys_mac(keys: list[Key]) -> str | None:
    """The inverse of `mac_keys`; raises ValueError for a selector it did not make."""
    if keys == [Key(0, 0, 0)]:
        return None
    if keys == [Key(0x00000100, 0x00000100, -16)]:
        return "ff:ff:ff:ff:ff:ff"
    if [(k.mask, k.offset) for k in keys] == [(0x0000FFFF, -16), (0xFFFFFFFF, -12)]:
        raw = keys[0].value.to_bytes(2, "big") + keys[1].value.to_bytes(4, "big")
        return ":".join(f"{b:02x}" for b in raw)
    raise ValueError(f"not a THORN u32 selector: {keys}")


def pack_selector(keys: list[Key]) -> bytes:
    out = _SEL.pack(TC_U32_TERMINAL, 0, len(keys), 0, 0, 0, 0, 0)
    for k in keys:
        out += struct.pack("!II", k.mask, k.value) + _KEY_HOST.pack(k.offset, 0)
    return out


def unpack_selector(raw: bytes) -> list[Key]:
    nkeys = raw[2]
    keys: list[Key] = []
    for n in range(nkeys):
        base = _SEL.size + n * _KEY_SIZE
        mask, value = struct.unpack_from("!II", raw, base)
        offset, _ = _KEY_HOST.unpack_from(raw, base + 8)
        keys.append(Key(mask, value, offset))
    return keys


class u32_filter(nlmsg):  # pyroute2 names message classes in lower case
    """A tcmsg whose TCA_OPTIONS are u32 options with a raw selector. (A fresh nlmsg, not a
    tcmsg subclass: pyroute2 caches a class's compiled attribute table on the class, and a
    subclass would inherit tcmsg's.)"""

    prefix = "TCA_"
    fields = tcmsg.fields
    nla_map = (
        ("TCA_UNSPEC", "none"),
        ("TCA_KIND", "asciiz"),
        ("TCA_OPTIONS", "u32_options"),
    )

    class u32_options(nla):
        nla_map = (
            ("TCA_U32_UNSPEC", "none"),
            ("TCA_U32_CLASSID", "uint32"),
            ("TCA_U32_HASH", "uint32"),
            ("TCA_U32_LINK", "hex"),
            ("TCA_U32_DIVISOR", "uint32"),
            ("TCA_U32_SEL", "cdata"),
            ("TCA_U32_POLICE", "hex"),
            ("TCA_U32_ACT", "tca_act_prio"),
        )
        tca_act_prio = tca_act_prio


def mirred_actions(to: int, mirror: tuple[int, ...]) -> Any:
    """TCA_U32_ACT: mirror to each of `mirror` (pipe), then redirect to `to` (stolen)."""
    actions = [
        {"kind": "mirred", "direction": "egress", "action": "mirror", "ifindex": i} for i in mirror
    ]
    actions.append({"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": to})
    return get_tca_action({"action": actions})


def filter_message(ifindex: int, prio: int, keys: list[Key], actions: Any) -> u32_filter:
    msg = u32_filter()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = ifindex
    msg["handle"] = 0
    msg["parent"] = INGRESS
    msg["info"] = (prio << 16) | socket.htons(ETH_P_ALL)
    msg["attrs"] = [
        ["TCA_KIND", "u32"],
        [
            "TCA_OPTIONS",
            {
                "attrs": [
                    ["TCA_U32_CLASSID", 1],
                    ["TCA_U32_SEL", pack_selector(keys)],
                    ["TCA_U32_ACT", actions],
                ]
            },
        ],
    ]
    return msg


def delete_message(ifindex: int, prio: int) -> u32_filter:
    """Deleting by priority removes the whole u32 tree at that priority (ours, one rule)."""
    msg = u32_filter()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = ifindex
    msg["handle"] = 0
    msg["parent"] = INGRESS
    msg["info"] = (prio << 16) | socket.htons(ETH_P_ALL)
    msg["attrs"] = [["TCA_KIND", "u32"]]
    return msg


def raw_attr(attr: Any) -> bytes:
    """The payload bytes of a decoded nla (pyroute2 keeps the buffer and the offset)."""
    data: bytes = attr.data
    offset: int = attr.offset
    length: int = attr.length
    return bytes(data[offset + 4 : offset + length])
