"""What a node's kernel shows of its ports and VFs, for the registration.

One rtnetlink dump of links (name, MAC, kind, admin state, carrier, physical port name)
and one of addresses, read in the node's namespace, plus each port's speed from ethtool
(`ETHTOOL_GSET`; none when the driver does not say). Pure parts: `parse_link`,
`parse_address` and `build` (dumps in, the registration's ports and VFs out).

VFs: a representor is a netdev named `<vf>_rep` (THORN's convention, the lab's too) or one
whose physical port name says `pf<N>vf<M>` (a switchdev NIC's): each gives a VF, named by
the representor's prefix in the first case (the VF's own netdev lives in the workload's
namespace and is not seen here), and by the representor itself in the second.
"""

from __future__ import annotations

import array
import fcntl
import re
import socket
import struct
from dataclasses import dataclass

from thorn.observed import ObservedPort, ObservedVf
from thorn_programmer.monitor.link import dump
from thorn_programmer.monitor.parse import (
    IFF_LOWER_UP,
    IFF_UP,
    IFLA_CARRIER,
    IFLA_IFNAME,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    RTM_NEWLINK,
    attributes,
)
from thorn_programmer.netlink.transport import open_socket, socket_in_netns
from thorn_programmer.reports import is_fabric_port

RTM_NEWADDR, RTM_GETADDR = 20, 22
IFLA_ADDRESS, IFLA_LINKINFO, IFLA_PHYS_PORT_NAME = 1, 18, 38
IFLA_INFO_KIND = 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
SIOCETHTOOL = 0x8946
ETHTOOL_GSET = 0x1
REP_SUFFIX = "_rep"
_SWITCHDEV_VF = re.compile(r"^pf\d+vf\d+$")
_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBI")
_ETHTOOL_CMD = struct.Struct("=IIIHBBBBBBIIH")  # ethtool_cmd up to speed_hi
_ETHTOOL_SIZE = 44
_UNKNOWN_SPEED = (0xFFFF, 0xFFFFFFFF)


@dataclass(frozen=True, slots=True)
class LinkInfo:
    index: int
    name: str
    mac: str | None
    kind: str | None
    admin_up: bool
    carrier: bool
    phys_port_name: str | None


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(msg_type: int, payload: bytes) -> LinkInfo | None:
    """A link of an RTM_NEWLINK payload (after the netlink header); None for anything else."""
    if msg_type != RTM_NEWLINK or len(payload) < _IFINFOMSG.size:
        return None
    _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(payload)
    attrs = attributes(payload, _IFINFOMSG.size)
    if IFLA_IFNAME not in attrs:
        return None
    raw_mac = attrs.get(IFLA_ADDRESS)
    mac = ":".join(f"{b:02x}" for b in raw_mac) if raw_mac and len(raw_mac) == 6 else None
    kind = attributes(attrs.get(IFLA_LINKINFO, b""), 0).get(IFLA_INFO_KIND)
    carrier = attrs.get(IFLA_CARRIER)
    phys = attrs.get(IFLA_PHYS_PORT_NAME)
    return LinkInfo(
        index=index, name=_text(attrs[IFLA_IFNAME]), mac=mac,
        kind=_text(kind) if kind else None, admin_up=bool(flags & IFF_UP),
        carrier=bool(carrier[0]) if carrier else bool(flags & IFF_LOWER_UP),
        phys_port_name=_text(phys) if phys else None,
    )  # fmt: skip


def parse_address(msg_type: int, payload: bytes) -> tuple[int, str] | None:
    """(ifindex, "address/prefixlen") of an RTM_NEWADDR payload: the local address (for a
    point-to-point address, IFA_LOCAL; else IFA_ADDRESS)."""
    if msg_type != RTM_NEWADDR or len(payload) < _IFADDRMSG.size:
        return None
    family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(payload)
    attrs = attributes(payload, _IFADDRMSG.size)
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if raw is None or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return index, f"{socket.inet_ntop(family, raw)}/{prefixlen}"


def is_representor(link: LinkInfo) -> bool:
    return link.name.endswith(REP_SUFFIX) or bool(
        link.phys_port_name and _SWITCHDEV_VF.match(link.phys_port_name)
    )


def probe_ports(ports: list[ObservedPort], vfs: list[ObservedVf]) -> list[str]:
    """Ports the neighbour probe runs on: physical or veth fabric ports that are up, never
    a VF's representor or a tunnel."""
    representors = {vf.representor for vf in vfs}
    return [
        p.name for p in ports
        if p.admin_up and p.kind in (None, "veth") and p.name not in representors
    ]  # fmt: skip


def build(
    links: list[LinkInfo], addresses: list[tuple[int, str]], speeds: dict[str, int | None]
) -> tuple[list[ObservedPort], list[ObservedVf]]:
    """The registration's ports (every netdev but the loopback and THORN's tunnels) and
    VFs (one per representor)."""
    by_index: dict[int, list[str]] = {}
    for index, address in addresses:
        by_index.setdefault(index, []).append(address)
    ports: list[ObservedPort] = []
    vfs: list[ObservedVf] = []
    for link in sorted(links, key=lambda lk: lk.name):
        if not is_fabric_port(link.name):
            continue
        ports.append(ObservedPort(
            name=link.name, mac=link.mac, kind=link.kind, admin_up=link.admin_up,
            carrier=link.carrier, speed_mbps=speeds.get(link.name),
            addresses=sorted(by_index.get(link.index, [])),
        ))  # fmt: skip
        if is_representor(link):
            vf = link.name[: -len(REP_SUFFIX)] if link.name.endswith(REP_SUFFIX) else link.name
            if vf:
                vfs.append(ObservedVf(name=vf, representor=link.name))
    return ports, vfs


def ethtool_speed(sock: socket.socket, name: str) -> int | None:
    """The port's speed in Mb/s as ethtool reports it; None when unknown or not asked."""
    buffer = array.array("B", struct.pack("=I", ETHTOOL_GSET) + bytes(_ETHTOOL_SIZE - 4))
    address, _ = buffer.buffer_info()
    request = struct.pack("16sP", name.encode()[:15], address)
    try:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, request)
    except OSError:
        return None
    fields = _ETHTOOL_CMD.unpack_from(buffer.tobytes())
    speed, speed_hi = int(fields[3]), int(fields[12])
    if speed in _UNKNOWN_SPEED or (speed_hi << 16 | speed) == 0xFFFFFFFF:
        return None
    return speed_hi << 16 | speed


def _getaddr_dump(seq: int) -> bytes:
    body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETADDR, flags, seq, 0) + body


def read_ports(netns: str | None) -> tuple[list[ObservedPort], list[ObservedVf]]:
    """The node's ports and VFs as its kernel shows them now (blocking)."""
    sock = open_socket(netns, 4 << 20, 1 << 16)
    try:
        sock.settimeout(10.0)
        links = [lk for t, p in dump(sock, 1) if (lk := parse_link(t, p)) is not None]
        addresses = [
            a for t, p in dump(sock, 1000, _getaddr_dump) if (a := parse_address(t, p)) is not None
        ]
    finally:
        sock.close()
    inet = socket_in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        speeds = {lk.name: ethtool_speed(inet, lk.name) for lk in links}
    finally:
        inet.close()
    return build(links, addresses, speeds)


__all__ = [
    "LinkInfo",
    "build",
    "ethtool_speed",
    "parse_address",
    "parse_link",
    "probe_ports",
    "read_ports",
]  # fmt: skip
