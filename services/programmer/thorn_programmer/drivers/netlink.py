"""Reading and writing THORN's kernel objects over rtnetlink (pyroute2's AsyncIPRoute).

`NetlinkDatapath` is the shared part of every driver: devices, TEP addresses, routes, clsact
qdiscs, u32 redirects and FDB entries, in one network namespace (the node's: the agent's own
in production, a lab namespace in emulation). Drivers add their own rule kinds by extending
`read` and through `_apply_rule`, and choose what to render (`render`). Reads decode raw
dumps by hand (drivers/reads.py); devices and addresses are written through pyroute2.

Each change is applied on its own; a failure (a missing device, a kernel refusal) becomes an
`ApplyError` in the report, carrying the kernel's message, and the rest is still applied.
Changes a driver can prebuild as one message (`_message`: routes, FDB entries, tc rules and
actions) go out in batches, many per sendmsg (`TcSocket.send_batch`), in order; the kernel's
refusals come back with their position and land on the right change.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELTFILTER, RTM_NEWTFILTER

from thorn.desired import TEP_LABEL
from thorn.events import OffloadReport
from thorn.netns import netlink_socket, run_in_netns
from thorn_programmer import u32
from thorn_programmer.drivers.reads import (
    dump_addresses_message,
    dump_fdb_message,
    dump_qdiscs_message,
    parse_fdb,
    parse_labelled_address,
    parse_qdisc,
    parse_u32_redirect,
    parse_vxlan,
)
from thorn_programmer.drivers.routes import (
    dump_links_message,
    dump_routes_message,
    parse_link_name,
    parse_thorn_route,
    route_message,
)
from thorn_programmer.intent import Intent
from thorn_programmer.kernel import (
    PRIO_BAND,
    PRIO_BASE,
    TEP_DEVICE,
    ZERO_MAC,
    Address,
    Change,
    Clsact,
    DecapRule,
    Device,
    Fdb,
    FloodRule,
    KernelObject,
    Redirect,
    Route,
)
from thorn_programmer.netlink import TcBatchError, TcError, TcSocket, filter_dump

CHUNK = 1024  # prebuilt messages per batch handed to the sender
INLINE_MESSAGES = 64  # a batch this small (and alone) is sent without the sender thread
MAIN_TABLE = 254
NUD_NOARP_PERMANENT = 0xC0
NTF_SELF = 0x02
ADDR_GEN_MODE_NONE = 1
OWN_DEVICE_PREFIXES = ("thv", "thorn-")


class MissingDevice(LookupError):
    """The desired state names a device this node does not have."""

    def __init__(self, dev: str, what: KernelObject) -> None:
        super().__init__(f"device {dev!r} does not exist (needed by {what})")
        self.dev = dev


# What one batch's send came back with: its sendmsg calls, and the refusals if any.
Sent = tuple[int, TcBatchError | None]


@dataclass(frozen=True, slots=True)
class ApplyError:
    change: Change
    message: str
    errno: int | None = None


@dataclass(slots=True)
class ApplyReport:
    applied: list[Change] = field(default_factory=list)
    errors: list[ApplyError] = field(default_factory=list)
    # Refused for a reason that is no fault of the desired state and passes by itself (a
    # switch route through a port that is admin down now): not errors, done when it clears.
    deferred: list[ApplyError] = field(default_factory=list)
    sendmsgs: int = 0  # sendmsg calls that carried the prebuilt messages


def owned_prio(prio: int) -> bool:
    return PRIO_BASE <= prio < PRIO_BASE + PRIO_BAND


def is_own_device(name: str) -> bool:
    return name.startswith(OWN_DEVICE_PREFIXES)


async def _done(responses: Any) -> None:
    """Drain a request's responses (errors are raised here)."""
    async for _ in responses:
        pass


async def rtnl(netns: str | None) -> AsyncIPRoute:
    """pyroute2's AsyncIPRoute in `netns`, on a socket made there without a fork (off the
    event loop: entering a namespace is a thread's system calls)."""
    if netns is None:
        return AsyncIPRoute()
    return AsyncIPRoute(use_socket=await asyncio.to_thread(netlink_socket, netns))


class NetlinkDatapath:
    """One namespace's THORN objects: read, diff (kernel.diff), apply."""

    name: ClassVar[str] = "netlink"
    # Whether applying a change can never remove or alter another of THORN's objects, so a
    # pass whose changes all applied leaves the kernel as rendered and reconcile need not
    # read it back (`reconcile`). Not so by default: replacing a VXLAN device drops its FDB.
    settles_in_one_pass: bool = False

    def __init__(self, ip: AsyncIPRoute, netns: str | None, tc: TcSocket) -> None:
        self.ip = ip
        self.netns = netns
        self.tc = tc  # a raw rtnetlink socket for prebuilt messages and batches
        self.ifindex: dict[str, int] = {}
        # Devices with a clsact qdisc (where filters can be): THORN's rules are found there
        # by their priority, whatever the device is called.
        self.clsact_devices: list[str] = []
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netlink-send")
        self._reads: TcSocket | None = None

    @classmethod
    @asynccontextmanager
    async def open(cls, netns: str | None = None) -> AsyncIterator[NetlinkDatapath]:
        async with await rtnl(netns) as ip:
            with TcSocket(netns) as tc:
                driver = cls(ip, netns, tc)
                try:
                    yield driver
                finally:
                    driver._sender.shutdown(wait=True)
                    driver.close()

    def close(self) -> None:
        """Release what a driver opened of its own (called once, by `open`)."""
        if self._reads is not None:
            self._reads.close()
            self._reads = None

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[object]:
        """Held by a reconcile from its read of the kernel to its apply, and by any change a
        driver makes outside reconcile (a switch's local repair), so neither acts on a
        reading the other has just made stale. Nothing changes the kernel outside
        reconcile here: a no-op."""
        return contextlib.nullcontext()

    def render(self, intent: Intent) -> list[KernelObject]:
        raise NotImplementedError

    async def prepare(self, intent: Intent) -> None:
        """Before a reconcile renders `intent`: what a driver must ask the kernel first (the
        flower driver's offload mode). Nothing, here."""

    def offload_report(self) -> OffloadReport | None:
        """Where the rules run, for drivers that can offload them (None: no such thing)."""
        return None

    async def setup(self) -> None:
        """Once at start: the loopback device (home of the TEPs) is up."""
        await self._links()
        if TEP_DEVICE in self.ifindex:
            await self.ip.link("set", index=self.ifindex[TEP_DEVICE], state="up")

    # --- reading ---------------------------------------------------------------------------

    async def _links(self) -> list[Any]:
        links = [link async for link in await self.ip.link("dump")]
        self.ifindex = {link.get("ifname"): link["index"] for link in links}
        return links

    def reads(self) -> TcSocket:
        """A socket of the reads' own (sends may be in flight on `tc`), opened on first use."""
        if self._reads is None:
            self._reads = TcSocket(self.netns, rcvbuf=4 << 20, sndbuf=1 << 16)
        return self._reads

    async def read(self) -> list[KernelObject]:
        """THORN's objects in the namespace, from raw dumps decoded by hand (drivers/reads.py:
        pyroute2's parser cost ~13 ms and ~2,350 objects in reference cycles per read). Each
        dump is kernel microseconds plus a few ms of Python here, so it runs on the loop."""
        sock = self.reads()
        links = [(m, parse_link_name(m)) for m in sock.dump(dump_links_message())]
        self.ifindex = {found[1]: found[0] for _, found in links if found is not None}
        names = {i: n for n, i in self.ifindex.items()}
        objects: list[KernelObject] = [
            parse_vxlan(message, found[1]) for message, found in links
            if found is not None and is_own_device(found[1])
        ]  # fmt: skip
        for message in sock.dump(dump_addresses_message()):
            if (tep := parse_labelled_address(message, TEP_LABEL)) is not None:
                objects.append(Address(dev=names.get(tep[0], "?"), address=tep[1]))
        for family in (socket.AF_INET, socket.AF_INET6):
            for message in sock.dump(dump_routes_message(family)):
                route = parse_thorn_route(message, names)
                if route is not None and route.table == MAIN_TABLE:
                    objects.append(route)
        qdiscs = (parse_qdisc(m) for m in sock.dump(dump_qdiscs_message()))
        self.clsact_devices = [names[i] for i, kind in qdiscs if kind == "clsact" and i in names]
        for dev in self.clsact_devices:
            objects.append(Clsact(dev=dev))
            for message in sock.dump(filter_dump(self.ifindex[dev], u32.INGRESS)):
                redirect = parse_u32_redirect(message, dev, names)
                if redirect is not None and owned_prio(redirect.prio):
                    objects.append(redirect)
        for message in sock.dump(dump_fdb_message()):
            fdb = parse_fdb(message, names)
            if fdb is not None and fdb.dev.startswith("thv"):
                objects.append(fdb)
        return objects

    # --- writing ---------------------------------------------------------------------------

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        report = ApplyReport()
        # Interface indexes come from the last read; a dump costs ~1 ms, which a failover
        # (a few prebuilt messages) should not pay unless a device is missing.
        names = {d for c in changes for d in _devices(c.obj)}
        if not self.ifindex or not names <= self.ifindex.keys():
            await self._links()
        batch: list[tuple[Change, bytes]] = []
        # Full chunks go out while the next are built: the kernel works (in sendmsg, without
        # the GIL) while Python encodes. One sender thread keeps them in order.
        sending: list[tuple[list[tuple[Change, bytes]], asyncio.Future[Sent]]] = []
        for change in changes:
            try:
                message = self._message(change)
            except MissingDevice as exc:
                report.errors.append(ApplyError(change, str(exc)))
                continue
            if message is not None:
                batch.append((change, message))
                if len(batch) >= CHUNK:
                    sending.append((batch, self._send(batch)))
                    batch = []
                continue
            if batch:
                sending.append((batch, self._send(batch)))
                batch = []
            await self._collect(sending, report)  # what came before goes first
            try:
                await self._apply(change)
            except MissingDevice as exc:
                report.errors.append(ApplyError(change, str(exc)))
            except NetlinkError as exc:
                report.errors.append(ApplyError(change, _kernel_message(exc), exc.code))
            except TcError as exc:  # the flower driver's own socket: errno and extack
                report.errors.append(ApplyError(change, str(exc), exc.errno))
            else:
                report.applied.append(change)
        if batch:
            sending.append((batch, self._send(batch, inline=not sending)))
        await self._collect(sending, report)
        return report

    def _send(
        self, batch: list[tuple[Change, bytes]], *, inline: bool = False
    ) -> asyncio.Future[Sent]:
        loop = asyncio.get_running_loop()
        messages = [m for _, m in batch]
        if inline and len(messages) <= INLINE_MESSAGES:
            # A failover's few messages: sent from the loop thread itself (microseconds in
            # the kernel), not handed to the sender thread, which under load waits for the
            # GIL behind whatever else the process is doing. Nothing else is in flight.
            done: asyncio.Future[Sent] = loop.create_future()
            try:
                done.set_result(self._send_now(messages))
            except Exception as exc:  # as from the executor: raised where it is awaited
                done.set_exception(exc)
            return done
        return loop.run_in_executor(self._sender, self._send_now, messages)

    def _send_now(self, messages: list[bytes]) -> Sent:
        try:
            return self.tc.send_batch(messages), None
        except TcBatchError as exc:
            return exc.sendmsgs, exc  # carried back to _collect, which knows the changes

    async def _collect(
        self,
        sending: list[tuple[list[tuple[Change, bytes]], asyncio.Future[Sent]]],
        report: ApplyReport,
    ) -> None:
        for batch, future in sending:
            calls, failure = await future
            report.sendmsgs += calls
            refused: dict[int, TcError] = {}
            if failure is not None:
                refused = {e.index: e for e in failure.errors if e.index is not None}
            for n, (change, _) in enumerate(batch):
                if n in refused:
                    report.errors.append(ApplyError(change, str(refused[n]), refused[n].errno))
                else:
                    report.applied.append(change)
        sending.clear()

    def _message(self, change: Change) -> bytes | None:
        """The change as one prebuilt netlink message, for a batch; None: apply it alone.
        Drivers with rule kinds of their own extend this (and pass the rest up)."""
        obj = change.obj
        if isinstance(obj, Route):
            if change.op == "delete":  # a route whose device is gone is deleted without it
                return route_message("delete", obj, self.ifindex.get(obj.dev))
            return route_message(change.op, obj, self.index_of(obj.dev, obj))
        return None

    def index_of(self, dev: str, what: KernelObject) -> int:
        try:
            return self.ifindex[dev]
        except KeyError:
            raise MissingDevice(dev, what) from None

    async def _apply(self, change: Change) -> None:
        obj = change.obj
        match obj:
            case Device():
                await self._apply_device(change, obj)
            case Address():
                await self._apply_address(change, obj)
            case Clsact():
                await self.ip.tc("add", "clsact", self.index_of(obj.dev, obj))
            case Redirect():
                await self._apply_redirect(change, obj)
            case Fdb():
                await self._apply_fdb(change, obj)
            case _:
                await self._apply_rule(change)

    async def _apply_rule(self, change: Change) -> None:
        raise NotImplementedError(f"{self.name} driver has no rule kind {type(change.obj)}")

    async def _apply_device(self, change: Change, obj: Device) -> None:
        if change.op in ("replace", "delete"):
            # A VXLAN device's identity cannot change in place: delete and create again.
            await self.ip.link("del", index=self.index_of(obj.name, obj))
            self.ifindex.pop(obj.name, None)
        if change.op == "delete":
            return
        new = change.new
        assert isinstance(new, Device)
        if new.external:
            await self.ip.link("add", ifname=new.name, kind="vxlan", vxlan_collect_metadata=1,
                               vxlan_port=new.port)  # fmt: skip
        else:
            await self.ip.link("add", ifname=new.name, kind="vxlan", vxlan_id=new.vni,
                               vxlan_local=new.local, vxlan_port=new.port,
                               vxlan_learning=0)  # fmt: skip
        [index] = await self.ip.link_lookup(ifname=new.name)
        self.ifindex[new.name] = index
        # No IPv6 link-local address: a tunnel device must not send its own ND/MLD.
        inet6 = {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", ADDR_GEN_MODE_NONE)]}
        await self.ip.link("set", index=index, IFLA_AF_SPEC={"attrs": [("AF_INET6", inet6)]})
        await self.ip.link("set", index=index, state="up")

    async def _apply_address(self, change: Change, obj: Address) -> None:
        net = ipaddress.ip_interface(obj.address)
        index = self.index_of(obj.dev, obj)
        command = "del" if change.op == "delete" else "add"
        await self.ip.addr(command, index=index, address=str(net.ip),
                           prefixlen=net.network.prefixlen,
                           **({"label": TEP_LABEL} if net.version == 4 else {}))  # fmt: skip

    async def _apply_redirect(self, change: Change, obj: Redirect) -> None:
        index = self.index_of(obj.dev, obj)
        if change.op in ("replace", "delete"):
            await _done(await self.ip.nlm_request(
                u32.delete_message(index, obj.prio), RTM_DELTFILTER,
                NLM_F_REQUEST | NLM_F_ACK))  # fmt: skip
        if change.op == "delete":
            return
        new = change.new
        assert isinstance(new, Redirect)
        actions = u32.mirred_actions(
            self.index_of(new.to, new), tuple(self.index_of(m, new) for m in new.mirror)
        )
        message = u32.filter_message(index, new.prio, u32.mac_keys(new.dst_mac), actions)
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        await _done(await self.ip.nlm_request(message, RTM_NEWTFILTER, flags))

    async def _apply_fdb(self, change: Change, obj: Fdb) -> None:
        index = self.index_of(obj.dev, obj)
        if change.op == "delete":
            await self.ip.fdb("del", ifindex=index, lladdr=obj.mac, dst=obj.dst)
            return
        # The flood list (all-zero MAC) holds one entry per TEP: append; any other MAC has
        # one entry, which `replace` moves in one message (the emulation's failover).
        command = "append" if obj.mac == ZERO_MAC else "replace"
        await self.ip.fdb(command, ifindex=index, lladdr=obj.mac, dst=obj.dst,
                          flags=NTF_SELF, state=NUD_NOARP_PERMANENT)  # fmt: skip

    async def sysctl(self, path: str, value: str) -> None:
        """Write /proc/sys/<path> in this datapath's namespace (a thread that enters it)."""
        await self.sysctls({path: value})

    async def sysctls(self, values: Mapping[str, str], *, optional: Collection[str] = ()) -> None:
        """Write several /proc/sys paths in one visit to the namespace; a path in `optional`
        that does not exist (a device gone since, no IPv6) is skipped."""
        await asyncio.to_thread(_write_sysctls, self.netns, dict(values), frozenset(optional))


def _write_sysctls(netns: str | None, values: dict[str, str], optional: frozenset[str]) -> None:
    def write() -> None:
        for path, value in values.items():
            try:
                with open(f"/proc/sys/{path}", "w") as f:
                    f.write(value)
            except FileNotFoundError:
                if path not in optional:
                    raise

    if netns is None:
        write()
    else:  # a fresh thread enters the namespace: the event loop's threads never move
        run_in_netns(netns, write)


def _devices(obj: KernelObject) -> tuple[str, ...]:
    """The devices a kernel object needs to exist (by name)."""
    match obj:
        case Device():
            return ()  # created by this very change
        case Redirect():
            return (obj.dev, obj.to, *obj.mirror)
        case DecapRule():
            return obj.reps
        case FloodRule():
            return (obj.dev, *obj.mirrors)
        case _:
            dev = getattr(obj, "dev", None)
            return (dev,) if isinstance(dev, str) else ()


def _kernel_message(exc: NetlinkError) -> str:
    return str(exc.args[1]) if len(exc.args) > 1 else str(exc)
