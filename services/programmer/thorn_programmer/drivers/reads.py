"""A host's THORN objects read back from raw rtnetlink dumps, without pyroute2's parser.

Why: through pyroute2 a host's read (links, addresses, routes, qdiscs, u32 filters, FDB) took
~13 ms of CPU and left ~2,350 objects in reference cycles per read (its messages point at
their parents). Under make-run's lab a re-protection reads every host, and the collector then
walked those cycles in pauses of 50-130 ms that stopped the agents' event loop, source flips
included. These decode only the fields THORN's objects hold, into plain values.

The layouts are the kernel's uapi structs (linux/rtnetlink.h, if_link.h, if_addr.h,
neighbour.h, pkt_cls.h, tc_act/tc_mirred.h). Each parser takes one whole message (with its
netlink header) and returns None for anything that is not THORN's.
"""

from __future__ import annotations

import socket
import struct

from thorn_programmer import u32
from thorn_programmer.drivers.routes import _HEADER, _IFINFOMSG, _U32, _attrs
from thorn_programmer.kernel import Device, Fdb, Redirect
from thorn_programmer.netlink.constants import NlmFlag

RTM_GETADDR, RTM_GETNEIGH, RTM_GETQDISC = 22, 30, 38
IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_INFO_DATA = 18, 1, 2
IFLA_VXLAN_ID, IFLA_VXLAN_LOCAL, IFLA_VXLAN_PORT = 1, 4, 15
IFLA_VXLAN_LOCAL6, IFLA_VXLAN_COLLECT_METADATA = 17, 25
IFA_ADDRESS, IFA_LABEL = 1, 3
NDA_DST, NDA_LLADDR = 1, 2
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_U32_SEL, TCA_U32_ACT = 5, 7
TCA_ACT_KIND, TCA_ACT_OPTIONS = 1, 2
TCA_MIRRED_PARMS = 2
AF_BRIDGE = 7

_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_MIRRED = struct.Struct("=IIiiiiI")  # tc_gen (index capab action refcnt bindcnt) eaction ifindex
_BE16 = struct.Struct("!H")


def _dump(mtype: int, body: bytes) -> bytes:
    flags = NlmFlag.REQUEST | NlmFlag.DUMP
    return _HEADER.pack(_HEADER.size + len(body), mtype, int(flags), 0, 0) + body


def dump_addresses_message() -> bytes:
    return _dump(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))


def dump_qdiscs_message() -> bytes:
    return _dump(RTM_GETQDISC, _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))


def dump_fdb_message() -> bytes:
    """Every bridge-family neighbour (FDB entry) of the namespace."""
    return _dump(RTM_GETNEIGH, _NDMSG.pack(AF_BRIDGE, 0, 0, 0, 0))


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _ip(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def parse_vxlan(message: bytes, name: str) -> Device:
    """The VXLAN device `name` an RTM_NEWLINK message describes (THORN creates no other
    kind; a foreign kind reads with no VNI and port 0, and so differs from anything
    desired)."""
    attrs = _attrs(message, _HEADER.size + _IFINFOMSG.size)
    info = _attrs(attrs.get(IFLA_LINKINFO, b""), 0)
    data = _attrs(info.get(IFLA_INFO_DATA, b""), 0)
    external = bool(data.get(IFLA_VXLAN_COLLECT_METADATA, b"\0")[0])
    vni = data.get(IFLA_VXLAN_ID)
    local = data.get(IFLA_VXLAN_LOCAL) or data.get(IFLA_VXLAN_LOCAL6)
    port = data.get(IFLA_VXLAN_PORT)
    return Device(
        name=name,
        kind="vxlan",
        vni=None if external or vni is None else _U32.unpack(vni[:4])[0],
        local=None if external or local is None else _ip(local),
        port=_BE16.unpack(port[:2])[0] if port else 0,
        external=external,
    )


def parse_labelled_address(message: bytes, label: str) -> tuple[int, str] | None:
    """(ifindex, "address/prefixlen") of an RTM_NEWADDR message with label `label`."""
    _family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(message, _HEADER.size)
    attrs = _attrs(message, _HEADER.size + _IFADDRMSG.size)
    if IFA_LABEL not in attrs or _text(attrs[IFA_LABEL]) != label or IFA_ADDRESS not in attrs:
        return None
    return index, f"{_ip(attrs[IFA_ADDRESS])}/{prefixlen}"


def parse_qdisc(message: bytes) -> tuple[int, str]:
    """(ifindex, kind) of an RTM_NEWQDISC message."""
    _family, index, _handle, _parent, _info = _TCMSG.unpack_from(message, _HEADER.size)
    kind = _attrs(message, _HEADER.size + _TCMSG.size).get(TCA_KIND, b"")
    return index, _text(kind)


def parse_u32_redirect(message: bytes, dev: str, names: dict[int, str]) -> Redirect | None:
    """The u32 redirect an RTM_NEWTFILTER message holds, if it has a selector (a hash
    table's head has none); whether its priority is THORN's is the caller's question."""
    _family, _index, _handle, _parent, info = _TCMSG.unpack_from(message, _HEADER.size)
    prio = info >> 16
    attrs = _attrs(message, _HEADER.size + _TCMSG.size)
    if _text(attrs.get(TCA_KIND, b"")) != "u32":
        return None
    options = _attrs(attrs.get(TCA_OPTIONS, b""), 0)
    if TCA_U32_SEL not in options:
        return None
    try:
        mac = u32.keys_mac(u32.unpack_selector(options[TCA_U32_SEL]))
    except ValueError:
        mac = "?"  # not a selector THORN writes: differs from anything desired, so replaced
    to, mirror = "?", []
    for action in _attrs(options.get(TCA_U32_ACT, b""), 0).values():  # in order: 1, 2, ...
        fields = _attrs(action, 0)
        if _text(fields.get(TCA_ACT_KIND, b"")) != "mirred":
            continue
        parms = _attrs(fields.get(TCA_ACT_OPTIONS, b""), 0).get(TCA_MIRRED_PARMS)
        if parms is None or len(parms) < _MIRRED.size:
            continue
        *_, eaction, ifindex = _MIRRED.unpack_from(parms)
        target = names.get(ifindex, "?")
        if eaction == u32.MIRRED_EGRESS_MIRROR:
            mirror.append(target)
        else:
            to = target
    return Redirect(dev=dev, prio=prio, dst_mac=mac, to=to, mirror=tuple(mirror))


def parse_fdb(message: bytes, names: dict[int, str]) -> Fdb | None:
    """The FDB entry an RTM_NEWNEIGH (bridge family) message holds, if it has a remote
    destination (a VXLAN device's entry)."""
    family, index, _state, _flags, _type = _NDMSG.unpack_from(message, _HEADER.size)
    attrs = _attrs(message, _HEADER.size + _NDMSG.size)
    if family != AF_BRIDGE or NDA_DST not in attrs or NDA_LLADDR not in attrs:
        return None
    return Fdb(dev=names.get(index, "?"), mac=_mac(attrs[NDA_LLADDR]), dst=_ip(attrs[NDA_DST]))
