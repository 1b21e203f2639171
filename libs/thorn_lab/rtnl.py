"""The lab's only contact with pyroute2 (untyped): a small typed facade over rtnetlink.

An `Rtnl` is bound to the namespace it was opened in (`Rtnl.open(namespace)` makes the
netlink socket inside it); every call is one request/answer on that socket. Netlink
errors come out as `OSError` with the kernel's errno.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Self

from pyroute2 import IPRoute  # type: ignore[import-untyped,unused-ignore]
from pyroute2.netlink.exceptions import (  # type: ignore[import-untyped,unused-ignore]
    NetlinkError,
)

from thorn import netns

__all__ = ["AtOnce", "LinkState", "Rtnl", "change_at_once", "set_admin_at_once"]

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
ETH_P_ALL = 0x0003
CLSACT_INGRESS = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
FAULT_PREF = 1  # ingress filter priority the lab reserves for injected faults
FAULT_HANDLE = 1


@dataclass(frozen=True)
class LinkState:
    index: int
    ifname: str
    kind: str | None  # "veth", None for lo
    mac: str | None
    admin_up: bool  # IFF_UP: what `ip link set ... up|down` sets
    carrier: bool  # IFF_LOWER_UP: for a veth, whether the peer is admin up
    operstate: str  # RFC 2863 as the kernel reports it: UP, DOWN, LOWERLAYERDOWN, UNKNOWN
    rx_packets: int
    tx_packets: int
    rx_dropped: int
    tx_dropped: int


@contextmanager
def _errors(what: str) -> Iterator[None]:
    try:
        yield
    except NetlinkError as exc:
        code = int(exc.code)
        raise OSError(code, f"{what}: {os.strerror(code)}") from None


def _link_state(msg: Any) -> LinkState:
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    stats = msg.get_attr("IFLA_STATS64") or {}
    flags = int(msg["flags"])
    mac = msg.get_attr("IFLA_ADDRESS")
    return LinkState(
        index=int(msg["index"]),
        ifname=str(msg.get_attr("IFLA_IFNAME")),
        kind=str(kind) if kind is not None else None,
        mac=str(mac) if mac else None,
        admin_up=bool(flags & IFF_UP),
        carrier=bool(flags & IFF_LOWER_UP),
        operstate=str(msg.get_attr("IFLA_OPERSTATE") or "UNKNOWN"),
        rx_packets=int(stats.get("rx_packets", 0)),
        tx_packets=int(stats.get("tx_packets", 0)),
        rx_dropped=int(stats.get("rx_dropped", 0)),
        tx_dropped=int(stats.get("tx_dropped", 0)),
    )


class Rtnl:
    """rtnetlink in one namespace (or the caller's, for `namespace=None`)."""

    def __init__(self, ipr: Any, namespace: str | None) -> None:
        self._ipr = ipr
        self.namespace = namespace

    @classmethod
    def open(cls, namespace: str | None = None) -> Self:
        if namespace is None:
            return cls(IPRoute(), None)
        with netns.entered(namespace):
            return cls(IPRoute(), namespace)

    def close(self) -> None:
        self._ipr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- links ---------------------------------------------------------------------------

    def links(self) -> dict[str, LinkState]:
        with _errors(f"list links in {self.namespace}"):
            return {s.ifname: s for s in map(_link_state, self._ipr.get_links())}

    def add_veth(
        self,
        a: tuple[str, int, str | None],
        b: tuple[str, int, str | None],
        a_index: int | None = None,
    ) -> None:
        """One veth pair made directly in two namespaces: each end (ifname, netns fd, MAC
        or None) is created where it belongs, so no name ever appears in this namespace.
        `a_index` asks for the a end's ifindex (the b end's is the kernel's choice)."""
        (a_name, a_fd, a_mac), (b_name, b_fd, b_mac) = a, b
        peer: dict[str, Any] = {"ifname": b_name, "net_ns_fd": b_fd}
        if b_mac:
            peer["address"] = b_mac
        extra: dict[str, Any] = {"address": a_mac} if a_mac else {}
        if a_index is not None:
            extra["index"] = a_index
        with _errors(f"create veth {a_name}/{b_name}"):
            self._ipr.link("add", ifname=a_name, kind="veth", net_ns_fd=a_fd, peer=peer, **extra)

    def set_admin(self, index: int, up: bool) -> None:
        with _errors(f"set link {index} {'up' if up else 'down'} in {self.namespace}"):
            self._ipr.link("set", index=index, state="up" if up else "down")

    def set_mac(self, index: int, mac: str) -> None:
        with _errors(f"set MAC of link {index} in {self.namespace}"):
            self._ipr.link("set", index=index, address=mac)

    def delete_link(self, index: int) -> None:
        with _errors(f"delete link {index} in {self.namespace}"):
            self._ipr.link("del", index=index)

    # --- addresses and routes ------------------------------------------------------------

    def addresses(self) -> dict[int, set[str]]:
        """ifindex -> {"address/prefixlen", ...}."""
        found: dict[int, set[str]] = {}
        with _errors(f"list addresses in {self.namespace}"):
            for msg in self._ipr.get_addr():
                addr = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
                found.setdefault(int(msg["index"]), set()).add(f"{addr}/{msg['prefixlen']}")
        return found

    def add_address(self, index: int, cidr: str, label: str | None = None) -> None:
        address, _, length = cidr.partition("/")
        extra = {"label": label} if label and ":" not in address else {}  # IPv4 only
        with _errors(f"add {cidr} in {self.namespace}"):
            self._ipr.addr("add", index=index, address=address, prefixlen=int(length), **extra)

    def add_route(self, dst: str, *, gateway: str | None = None, oif: int | None = None) -> None:
        """A route in the main table; an existing identical one is kept (idempotent)."""
        spec: dict[str, Any] = {"dst": dst}
        if gateway is not None:
            spec["gateway"] = gateway
        if oif is not None:
            spec["oif"] = oif
        if gateway is None:
            spec["scope"] = 253  # link: directly reachable, like a connected route
        try:
            with _errors(f"add route {dst} in {self.namespace}"):
                self._ipr.route("add", **spec)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise

    def replace_route(self, dst: str, gateway: str) -> None:
        with _errors(f"replace route {dst} in {self.namespace}"):
            self._ipr.route("replace", dst=dst, gateway=gateway)

    # --- tc: the ingress hook the fault injector uses ------------------------------------

    def ensure_clsact(self, index: int) -> None:
        try:
            with _errors(f"add clsact on link {index} in {self.namespace}"):
                self._ipr.tc("add", "clsact", index)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise

    def attach_ingress_bpf(self, index: int, prog_fd: int, name: str) -> None:
        """A direct-action BPF filter first in the ingress chain (pref 1, handle 1)."""
        self.ensure_clsact(index)
        change_at_once({self.namespace: AtOnce(drop=[index])}, program=(prog_fd, name))

    def detach_ingress_bpf(self, index: int) -> bool:
        """Remove the fault filter; False if there was none."""
        try:
            with _errors(f"detach filter on link {index} in {self.namespace}"):
                self._ipr.tc(
                    "del-filter",
                    "bpf",
                    index,
                    FAULT_HANDLE,
                    parent=CLSACT_INGRESS,
                    prio=FAULT_PREF,
                    protocol=ETH_P_ALL,
                )
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINVAL):
                return False
            raise
        return True

    def ingress_drops(self) -> dict[int, int]:
        """ifindex -> packets the clsact hook dropped (what a fault filter discarded)."""
        found: dict[int, int] = {}
        with _errors(f"list qdiscs in {self.namespace}"):
            for msg in self._ipr.get_qdiscs():
                if msg.get_attr("TCA_KIND") != "clsact":
                    continue
                stats = msg.get_attr("TCA_STATS2")
                queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
                found[int(msg["index"])] = int(queue["drops"]) if queue else 0
        return found


# --- many changes at once -------------------------------------------------------------------
RTM_NEWLINK, RTM_NEWTFILTER, NLMSG_ERROR = 16, 44, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
NLA_F_NESTED = 0x8000
_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_NLATTR = struct.Struct("=HH")


@dataclass(frozen=True)
class AtOnce:
    """One namespace's share of `change_at_once`, carried out in this order: the drop
    program on the ingress of `drop` (ifindexes; each needs its clsact qdisc already, see
    `Rtnl.ensure_clsact`), then the links `admin` set admin up or down."""

    drop: Sequence[int] = ()
    admin: Sequence[int] = ()


def _attr(kind: int, payload: bytes) -> bytes:
    header = _NLATTR.pack(_NLATTR.size + len(payload), kind)
    return header + payload + b"\0" * (-len(payload) % 4)


def _message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def _admin_request(seq: int, index: int, up: bool) -> bytes:
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, IFF_UP if up else 0, IFF_UP)
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, body)


def _ingress_bpf_request(seq: int, index: int, prog_fd: int, name: str) -> bytes:
    """`tc filter add dev X ingress pref 1 handle 1 protocol all bpf da fd F name N`."""
    info = FAULT_PREF << 16 | socket.htons(ETH_P_ALL)
    options = (_attr(TCA_BPF_FD, struct.pack("=I", prog_fd))
               + _attr(TCA_BPF_NAME, name.encode() + b"\0")
               + _attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))  # fmt: skip
    body = (_TCMSG.pack(socket.AF_UNSPEC, index, FAULT_HANDLE, CLSACT_INGRESS, info)
            + _attr(TCA_KIND, b"bpf\0") + _attr(TCA_OPTIONS | NLA_F_NESTED, options))  # fmt: skip
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _message(RTM_NEWTFILTER, flags, seq, body)


def change_at_once(
    batches: Mapping[str | None, AtOnce],
    *,
    up: bool = False,
    program: tuple[int, str] | None = None,
) -> None:
    """Carry out every namespace's `AtOnce` as close together in time as the kernel allows:
    a raw rtnetlink socket per namespace made first, then one sendmsg per namespace with
    all of its requests, back to back, and only then the answers. `program` (fd, name) is
    the BPF program the drops attach. Through one request each (pyroute2), a switch's ports
    went down ~1 ms apart and a flow lost one packet in flight at each; and even in one
    batch each admin down costs the kernel about a millisecond, which is why a dying node
    drops at its ingress first (`faults.node_down`). OSError with the kernel's errno on a
    refusal; the requests before it in its batch stay done."""
    sockets: list[tuple[str | None, socket.socket, bytes, int]] = []
    try:
        for namespace, batch in batches.items():
            if batch.drop and program is None:
                raise ValueError("drops need the program to attach")
            seq = itertools.count(1)  # an answer names the request it is for
            requests = [_ingress_bpf_request(next(seq), i, *program)
                        for i in batch.drop] if program is not None else []  # fmt: skip
            requests += [_admin_request(next(seq), i, up) for i in batch.admin]
            if not requests:
                continue
            with netns.entered(namespace) if namespace is not None else nullcontext():
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            sock.settimeout(5.0)
            sockets.append((namespace, sock, b"".join(requests), len(requests)))
        for _, sock, body, _ in sockets:
            sock.send(body)
        for namespace, sock, _, expected in sockets:
            answered = 0
            while answered < expected:
                data = sock.recv(1 << 16)
                offset = 0
                while offset + _NLMSGHDR.size <= len(data):
                    length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
                    if kind == NLMSG_ERROR:
                        answered += 1
                        (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
                        if code:
                            batch = batches[namespace]
                            what = (f"attach the drop on link {batch.drop[seq - 1]}"
                                    if seq <= len(batch.drop) else
                                    f"set link {batch.admin[seq - 1 - len(batch.drop)]} "
                                    f"{'up' if up else 'down'}")  # fmt: skip
                            raise OSError(-code, f"{what} in {namespace}: "
                                          f"{os.strerror(-code)}")  # fmt: skip
                    offset += (length + 3) & ~3
    finally:
        for _, sock, _, _ in sockets:
            sock.close()


def set_admin_at_once(links: Mapping[str | None, Sequence[int]], up: bool) -> None:
    """Set every link (namespace -> ifindexes) admin up or down at once (`change_at_once`)."""
    change_at_once({ns: AtOnce(admin=indexes) for ns, indexes in links.items()}, up=up)
