"""The switch route driver: a Linux switch (SONiC, Cumulus, a lab namespace) routes each
(host, colour) TEP prefix along that colour's tree; routes carry protocol RTPROT_THORN.

Switch-local repair (tier 1, docs/datapath.md "Switch-local repair"): a route with a
loop-free backup is two kernel routes, the primary at PRIMARY_METRIC and the backup at
BACKUP_METRIC, and `ignore_routes_with_linkdown` is on, so the kernel itself moves to the
backup when the primary's port loses carrier (and back when carrier returns); an admin-down
port's routes are deleted by the kernel, which leaves the backup. A failure only BFD sees is
`withdraw_port`: the primaries through the port go in one batch, and stay out of every
rendering until `restore_port`.

The U-turn rule (tier 1 where a switch has no downstream alternate, e.g. a spine's last hop
down to a leaf): every port that is some route's primary gets `ip rule iif PORT lookup
<its table>`, holding that route's backup; a packet arriving on the port its primary would
send it back out of takes the backup instead. A neighbour's backup can so be a U-turn
through this switch (pathcomp chooses it only where that is loop-free). The table number is
the band's base plus the port's ifindex, so a restarted agent finds its rules as they are.

A port that is admin down (a switch going down, a lab's `node_down`) has lost its routes,
and the kernel refuses new ones through it: those are deferred, not errors (the agent still
acknowledges its document), and `reassert_port` puts them back the moment the port is up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import socket
from collections.abc import Sequence
from typing import ClassVar

from pyroute2 import AsyncIPRoute

from thorn_programmer.drivers.netlink import ApplyReport, NetlinkDatapath
from thorn_programmer.drivers.routes import (
    dump_links_message,
    dump_routes_message,
    dump_rules_message,
    parse_link_name,
    parse_thorn_route,
    parse_thorn_rule,
    route_message,
    rule_message,
)
from thorn_programmer.intent import Intent, SwitchIntent
from thorn_programmer.kernel import (
    PRIMARY_METRIC,
    Change,
    KernelObject,
    PortRule,
    Route,
    diff,
    uturn_table,
)
from thorn_programmer.netlink import TcBatchError, TcSocket
from thorn_programmer.render import switch_objects

LINKDOWN = "ignore_routes_with_linkdown"
IFF_UP = 0x1
# What the kernel answers for a route through an admin-down port ("Nexthop has invalid
# gateway" is ENETUNREACH; a device without IFF_UP, ENETDOWN).
PORT_DOWN_ERRNOS = frozenset({errno.ENETUNREACH, errno.ENETDOWN})


class SwitchRouteDriver(NetlinkDatapath):
    name: ClassVar[str] = "switch-routes"
    # Routes and port rules are independent kernel objects, each keyed as rendered: after a
    # pass that applied every change, reading ~2,000 routes back finds nothing to do.
    settles_in_one_pass = True

    def __init__(self, ip: AsyncIPRoute, netns: str | None, tc: TcSocket) -> None:
        super().__init__(ip, netns, tc)
        # Ports whose primaries are withdrawn (BFD Down). A LocalRepair puts its own set here,
        # so the override outlives this driver (a restarted agent opens a new one).
        self.withdrawn: set[str] = set()
        self.intent: SwitchIntent | None = None  # the last one rendered, as the agent gave it
        # A withdraw or restore and a reconcile both diff renderings against the kernel: one
        # at a time (see `exclusive`).
        self._exclusive = asyncio.Lock()

    async def read(self) -> list[KernelObject]:
        """A switch's THORN objects are its routes: read from two route dumps and a link
        dump (for the names), decoding only what a route needs. Each dump is a few
        kernel microseconds plus well under a millisecond of Python here, so it runs on the
        loop's thread."""
        sock = self.reads()
        links = [parse_link_name(m) for m in sock.dump(dump_links_message())]
        self.ifindex = {name: index for index, name in filter(None, links)}
        names = {index: name for name, index in self.ifindex.items()}
        objects: list[KernelObject] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for message in sock.dump(dump_routes_message(family)):
                route = parse_thorn_route(message, names)
                if route is not None:
                    objects.append(route)
            for message in sock.dump(dump_rules_message(family)):
                rule = parse_thorn_rule(message)
                if rule is not None:
                    objects.append(rule)
        return objects

    async def setup(self) -> None:
        await super().setup()  # also reads the links
        values = {"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"}
        required = {*values, f"net/ipv4/conf/all/{LINKDOWN}", f"net/ipv4/conf/default/{LINKDOWN}"}
        # IPv4 ORs `all` with the device's own value; IPv6 reads the device's only (`all`
        # sets every existing device on this kernel, not on every kernel); `default` is what
        # devices made later start with. So: all three, for both families.
        devices = ["all", "default", *sorted(self.ifindex)]
        for family in ("ipv4", "ipv6"):
            for dev in devices:
                values[f"net/{family}/conf/{dev}/{LINKDOWN}"] = "1"
        # A device may be gone since it was listed; a kernel may have no IPv6.
        await self.sysctls(values, optional=set(values) - required)

    def render(self, intent: Intent) -> list[KernelObject]:
        assert isinstance(intent, SwitchIntent)
        self.intent = intent
        # The local override is read at every rendering, so a reconcile planned after a
        # withdraw never puts the primaries back (one planned just before it may, once: its
        # next pass renders again and takes them out).
        return self._objects(self.withdrawn)

    def _objects(self, withdrawn: set[str] | frozenset[str]) -> list[KernelObject]:
        assert self.intent is not None
        tables = {port: table for port, index in self.ifindex.items()
                  if (table := uturn_table(index)) is not None}  # fmt: skip
        return switch_objects(self._overridden(self.intent, withdrawn), tables)

    def armed(self) -> dict[str, tuple[bytes, ...]]:
        """Per port, the deletes of the primaries through it that have a backup on another
        port, as prebuilt messages: what `withdraw_port` would send, for the BFD runtime to
        send itself the moment the port's link session goes Down."""
        intent = self.intent
        if intent is None:
            return {}
        out: dict[str, list[bytes]] = {}
        for r in intent.routes:
            index = self.ifindex.get(r.dev)
            if r.backup is None or r.backup.dev == r.dev or index is None:
                continue
            primary = Route(prefix=r.prefix, dev=r.dev, via=r.via, metric=PRIMARY_METRIC)
            out.setdefault(r.dev, []).append(route_message("delete", primary, index))
        return {port: tuple(messages) for port, messages in out.items()}

    def _message(self, change: Change) -> bytes | None:
        obj = change.obj
        if isinstance(obj, PortRule):  # a replace is two messages: `_apply_rule`
            return None if change.op == "replace" else rule_message(change.op, obj)
        return super()._message(change)

    async def _apply_rule(self, change: Change) -> None:
        if not isinstance(change.obj, PortRule):
            await super()._apply_rule(change)
            return
        assert isinstance(change.old, PortRule) and isinstance(change.new, PortRule)
        try:
            self.tc.send_batch([rule_message("delete", change.old),
                                rule_message("add", change.new)])  # fmt: skip
        except TcBatchError as exc:
            raise exc.errors[0] from None

    @staticmethod
    def _overridden(intent: SwitchIntent, withdrawn: set[str] | frozenset[str]) -> SwitchIntent:
        return dataclasses.replace(intent, withdrawn=intent.withdrawn | withdrawn)

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        report = await super().apply(changes)
        suspects = {e.change.obj.dev for e in report.errors
                    if isinstance(e.change.obj, Route) and e.errno in PORT_DOWN_ERRNOS}  # fmt: skip
        if suspects:  # the error path only: one link read per port
            down = {dev for dev in suspects if not await self._admin_up(dev)}
            refused = [e for e in report.errors if isinstance(e.change.obj, Route)
                       and e.errno in PORT_DOWN_ERRNOS and e.change.obj.dev in down]  # fmt: skip
            report.deferred += refused
            report.errors = [e for e in report.errors if e not in refused]
        return report

    async def _admin_up(self, dev: str) -> bool:
        index = self.ifindex.get(dev)
        if index is None:
            return True  # gone: not an admin-down port, the error stands
        links = list(await self.ip.link("get", index=index))  # "get" answers a list
        return bool(links and links[0]["flags"] & IFF_UP)

    async def reassert_port(self, port: str) -> ApplyReport:
        """`port` is admin up again: the kernel deleted its routes when it went down, so
        every route of the last rendering through it goes back now, one batch (an add is a
        replace: routes still there are left as they are)."""
        async with self._exclusive:
            if self.intent is None:
                return ApplyReport()
            rendered = self._objects(self.withdrawn)
            return await self.apply([Change("add", o, None) for o in rendered
                                     if isinstance(o, Route) and o.dev == port])  # fmt: skip

    async def withdraw_port(self, port: str) -> ApplyReport:
        """The link on `port` failed (its BFD session went Down): remove the primaries through
        it that have a backup on another port, now. Computed from the last rendering, without
        reading the kernel, and sent as one batch (one sendmsg for up to 1,024 routes); every
        later rendering leaves them out until `restore_port`."""
        return await self._move(port, withdraw=True)

    async def restore_port(self, port: str) -> ApplyReport:
        """The link on `port` works again (BFD Up): its primaries go back, one batch, with
        every other route through it (the port may have been admin down meanwhile, which
        deleted them)."""
        return await self._move(port, withdraw=False)

    def exclusive(self) -> asyncio.Lock:
        """A withdraw or restore waits for a reconcile that has read the kernel to apply
        what it planned, and a reconcile reads only after one is done. Otherwise a plan
        rendered before a restore (the port still withdrawn) could apply after it, or one
        rendered before a withdraw could put the primaries back into the failed link."""
        return self._exclusive

    async def _move(self, port: str, *, withdraw: bool) -> ApplyReport:
        async with self._exclusive:
            return await self._move_now(port, withdraw=withdraw)

    async def _move_now(self, port: str, *, withdraw: bool) -> ApplyReport:
        before = frozenset(self.withdrawn)
        if withdraw:
            self.withdrawn.add(port)
        else:
            self.withdrawn.discard(port)
        if self.intent is None:  # nothing rendered yet: the first reconcile sees the override
            return ApplyReport()
        now = self._objects(self.withdrawn)
        changes = diff(now, self._objects(before))
        if not withdraw:
            moved = {c.obj.key for c in changes}
            changes += [Change("add", o, None) for o in now if isinstance(o, Route)
                        and o.dev == port and o.key not in moved]  # fmt: skip
        return await self.apply(changes)
