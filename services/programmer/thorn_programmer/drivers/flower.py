"""The host flower driver: the production datapath (docs/datapath.md).

- encap, on each representor's ingress: `flower dst_mac <peer workload>` -> the shared
  `tunnel_key set` action of (peer host, VNI) -> `mirred egress redirect dev thorn-vx`;
- BUM, on each representor's ingress: `flower dst_mac <group bit>` -> for every peer host of
  the VNI, its shared tunnel action + `mirred egress mirror dev thorn-vx`, then a verdict;
- decap, on thorn-vx's ingress (external VXLAN): `flower enc_key_id <VNI> dst_mac <local
  workload>` -> `tunnel_key unset` -> `mirred egress redirect dev <representor>`.

Every rule toward a peer host binds that host's one tunnel action, so moving the host to
its other colour is a single `RTM_NEWACTION` replace, for unicast and BUM alike. Shared
actions take indexes in THORN's band (`ACTION_INDEX_BASE`), filters THORN's priorities.

Offload: rules and their shared actions carry `skip_hw`, or `skip_sw` where the node's
policy and its NIC allow (drivers/offload.py, decided in `prepare` before each render); the
two must agree or the kernel refuses the filter. A change of mode cannot be a replace (a
shared action's flags are fixed while filters are bound to it): `apply` deletes the rules
and actions of the old mode first, then adds the new ones. Read back, every rule's
in_hw/not_in_hw/in_hw_count and every action's in_hw_count land in `offload_report()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import structlog
from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from thorn.desired import OffloadName
from thorn.events import OffloadReport
from thorn_programmer.drivers import offload
from thorn_programmer.drivers.netlink import (
    ApplyReport,
    MissingDevice,
    NetlinkDatapath,
    owned_prio,
)
from thorn_programmer.drivers.templates import (
    PLACEHOLDER_DST,
    PLACEHOLDER_INDEX,
    PLACEHOLDER_MAC,
    PLACEHOLDER_SRC,
    PLACEHOLDER_VNI,
    Template,
)
from thorn_programmer.intent import HostIntent, Intent
from thorn_programmer.kernel import (
    ACTION_INDEX_BAND,
    ACTION_INDEX_BASE,
    BROADCAST_MAC,
    PRIO_DECAP,
    PRIO_ENCAP,
    PRIO_FLOOD,
    RANK,
    VXLAN_PORT,
    Change,
    DecapRule,
    EncapRule,
    FloodRule,
    KernelObject,
    StrayRule,
    TunnelAction,
)
from thorn_programmer.netlink import (
    ActionRef,
    AnyAction,
    Control,
    FilterState,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
    TcError,
    TcSocket,
    TunnelKeySet,
    TunnelKeyUnset,
    action_add,
    action_delete,
    action_replace,
    filter_add,
    filter_delete,
    filter_replace,
)
from thorn_programmer.render import FLOWER_TUNNEL, flower_objects

GROUP_BIT = "01:00:00:00:00:00"  # dst_mac/mask for every group (broadcast, multicast) address
OFFLOADED = (TunnelAction, EncapRule, FloodRule, DecapRule)  # the objects with a skip_sw flag
UNBIND_WAIT_S = 2.0  # a change of mode waits this long at most for deleted rules to unbind

log = structlog.get_logger("thorn.programmer")


def owned_index(index: int) -> bool:
    return ACTION_INDEX_BASE <= index < ACTION_INDEX_BASE + ACTION_INDEX_BAND


class FlowerDriver(NetlinkDatapath):
    name: ClassVar[str] = "flower"

    def __init__(self, ip: AsyncIPRoute, netns: str | None, tc: TcSocket) -> None:
        super().__init__(ip, netns, tc)
        # Software until `prepare` has heard the node's policy: what THORN always did.
        self.decision = offload.Decision("software", "software")
        self._decided_for: tuple[object, ...] | None = None
        self._readback: tuple[list[tuple[bool, bool, int | None]], list[int | None]] = ([], [])
        self._peer_of_tep: dict[str, str] = {}
        self._index: dict[tuple[str, int], int] = {}  # (peer, vni) -> shared action index
        self._handles: dict[tuple[object, ...], int] = {}  # rule key -> filter handle
        self._templates: dict[object, Template | None] = {}
        self._next_index = ACTION_INDEX_BASE

    @property
    def skip_sw(self) -> bool:
        return self.decision.skip_sw

    def render(self, intent: Intent) -> list[KernelObject]:
        assert isinstance(intent, HostIntent)
        # Reading back needs to know whose TEP a tunnel action points at.
        self._peer_of_tep = {tep: peer.host for peer in intent.peers for tep in peer.teps.values()}
        return flower_objects(intent, skip_sw=self.skip_sw)

    # --- offload policy ----------------------------------------------------------------------

    async def prepare(self, intent: Intent) -> None:
        """Decide the node's mode when its policy, its set of representors, or which of them
        exist (as of the last read) changed; otherwise this costs nothing."""
        assert isinstance(intent, HostIntent)
        devices = tuple(sorted({w.rep for w in intent.local}))
        key = (intent.offload, devices, tuple(d in self.ifindex for d in devices))
        if key == self._decided_for:
            return
        decision = await self._decide(intent.offload, devices)
        self.decision, self._decided_for = decision, key
        fell_back = decision.reason is not None
        (log.warning if fell_back else log.info)(
            "offload_decided", policy=decision.policy, mode=decision.mode,
            reason=decision.reason, devices=decision.devices,
        )  # fmt: skip

    async def _decide(self, policy: OffloadName, devices: tuple[str, ...]) -> offload.Decision:
        if policy == "software":
            return offload.decide(policy, {})
        sock = self.reads()
        ports = await asyncio.to_thread(offload.read_ports, sock)
        handles = {h for d in devices if d in ports
                   if (h := offload.devlink_handle(ports[d], ports)) is not None}  # fmt: skip
        modes = (
            await asyncio.to_thread(offload.eswitch_modes, handles, self.netns) if handles else {}
        )
        verdicts = offload.eswitch_verdicts(devices, ports, modes)
        refusal = None
        if offload.needs_trial(policy, verdicts):
            await self._links()
            present = {d: self.ifindex[d] for d in devices if d in self.ifindex}
            for index in present.values():
                with contextlib.suppress(NetlinkError):  # EEXIST: it has one already
                    await self.ip.tc("add", "clsact", index)
            refusal = await asyncio.to_thread(offload.trial, sock, present)
        return offload.decide(policy, verdicts, refusal)

    def offload_report(self) -> OffloadReport | None:
        """The decision and what the last read found in the kernel."""
        filters, actions = self._readback
        return offload.report(self.decision, filters, actions)

    # --- reading ---------------------------------------------------------------------------

    async def read(self) -> list[KernelObject]:
        objects = await super().read()  # devices, addresses, routes, clsact, u32
        names = {i: n for n, i in self.ifindex.items()}
        by_index: dict[int, tuple[str, int]] = {}
        self._index, self._handles = {}, {}
        filters_hw: list[tuple[bool, bool, int | None]] = []
        actions_hw: list[int | None] = []
        for state in await asyncio.to_thread(self.tc.actions, "tunnel_key"):
            if not owned_index(state.index):
                continue
            actions_hw.append(state.in_hw_count)
            spec = state.action
            if not isinstance(spec, TunnelKeySet) or spec.key_id is None:
                objects.append(TunnelAction(f"?{state.index}", -1, "", "", index=state.index))
                continue
            peer = self._peer_of_tep.get(str(spec.dst), f"?{spec.dst}")
            action = TunnelAction(peer, spec.key_id, str(spec.src), str(spec.dst),
                                  index=state.index, skip_sw=state.skip_sw)  # fmt: skip
            by_index[state.index] = (peer, spec.key_id)
            self._index[(peer, spec.key_id)] = state.index
            objects.append(action)
        for dev in self.clsact_devices:
            try:
                filters = await asyncio.to_thread(self.tc.filters, self.ifindex[dev])
            except OSError:
                continue  # no clsact on it: no filters
            for f in filters:
                if owned_prio(f.spec.priority):
                    rule = self._rule(dev, f, by_index, names)
                    self._handles[rule.key] = f.spec.handle
                    objects.append(rule)
                    filters_hw.append((f.in_hw, f.not_in_hw, f.in_hw_count))
        self._readback = (filters_hw, actions_hw)
        return objects

    def _rule(
        self,
        dev: str,
        f: FilterState,
        by_index: dict[int, tuple[str, int]],
        names: dict[int, str],
    ) -> KernelObject:
        spec, match, prio = f.spec, f.spec.match, f.spec.priority
        stray = StrayRule(dev, prio, spec.handle, "flower")
        sw = spec.skip_sw
        mac = BROADCAST_MAC if match.eth_dst_mask == GROUP_BIT else match.eth_dst
        if f.unmodelled or mac is None:
            return stray
        kinds = [type(a.action) for a in f.actions]
        mirrors = [names.get(a.action.ifindex, "?") for a in f.actions
                   if isinstance(a.action, Mirred)]  # fmt: skip
        bound = [by_index.get(a.index, (f"?{a.index}", -1)) for a in f.actions
                 if isinstance(a.action, TunnelKeySet)]  # fmt: skip
        if dev == FLOWER_TUNNEL and prio == PRIO_DECAP and match.enc_key_id is not None:
            if kinds[:1] == [TunnelKeyUnset] and mirrors:
                return DecapRule(match.enc_key_id, mac, tuple(mirrors), handle=spec.handle,
                                 skip_sw=sw)  # fmt: skip
        elif prio == PRIO_ENCAP and len(bound) == 1 and mirrors == [FLOWER_TUNNEL]:
            peer, vni = bound[0]
            return EncapRule(dev, mac, peer, vni, handle=spec.handle, skip_sw=sw)
        elif prio >= PRIO_FLOOD and f.actions and isinstance(f.actions[-1].action, Gact):
            verdict = f.actions[-1].action.control
            locals_ = tuple(m for m in mirrors if m != FLOWER_TUNNEL)
            vni = bound[0][1] if bound else -1
            return FloodRule(dev, prio - PRIO_FLOOD, vni, tuple(p for p, _ in bound),
                             last=verdict == Control.SHOT, mirrors=locals_,
                             handle=spec.handle, skip_sw=sw)  # fmt: skip
        return stray

    # --- writing ---------------------------------------------------------------------------

    async def apply(self, changes: Sequence[Change]) -> ApplyReport:
        old_mode, rest = remade_for_mode(changes)
        if not old_mode:
            return await super().apply(changes)
        # A filter lets go of its actions only after an RCU grace period (cls_flower destroys
        # it in deferred work): until then a delete of the action is refused as still bound.
        rules = [c for c in old_mode if not isinstance(c.obj, TunnelAction)]
        actions = [c.old for c in old_mode if isinstance(c.old, TunnelAction)]
        first = await super().apply(rules)
        await self._unbound([a.index for a in actions if a.index])
        second = await super().apply(
            [*(c for c in old_mode if isinstance(c.obj, TunnelAction)), *rest]
        )
        return ApplyReport(applied=first.applied + second.applied,
                           errors=first.errors + second.errors,
                           deferred=first.deferred + second.deferred,
                           sendmsgs=first.sendmsgs + second.sendmsgs)  # fmt: skip

    async def _unbound(self, indexes: list[int]) -> None:
        """Wait (up to UNBIND_WAIT_S) until no filter is bound to these tunnel actions."""
        deadline = time.monotonic() + UNBIND_WAIT_S
        waiting = list(indexes)
        while waiting and time.monotonic() < deadline:
            still = []
            for index in waiting:
                try:
                    state = await asyncio.to_thread(self.tc.action, "tunnel_key", index)
                except TcError:
                    continue  # gone already
                if state.bindcnt:
                    still.append(index)
            waiting = still
            if waiting:
                await asyncio.sleep(0.01)

    def _message(self, change: Change) -> bytes | None:
        obj = change.obj
        match obj:
            case TunnelAction():
                return self._tunnel_message(change, obj)
            case EncapRule() | FloodRule() | DecapRule():
                return self._filter_message(change)
            case StrayRule():
                return filter_delete(self._filter_at(obj.dev, obj.prio, obj.handle, obj))
        return super()._message(change)  # routes

    def _tunnel_key(self, t: TunnelAction, index: int) -> TunnelKeySet:
        return TunnelKeySet(
            src=ipaddress.ip_address(t.src), dst=ipaddress.ip_address(t.dst), key_id=t.vni,
            dst_port=VXLAN_PORT, index=index,
        )  # fmt: skip

    def _tunnel_message(self, change: Change, obj: TunnelAction) -> bytes:
        if change.old is not None:
            assert isinstance(change.old, TunnelAction)
            obj = change.old
        # The kernel's index: from the object read back, else from what this driver last
        # read or made (a flip diffs two renderings, which carry no indexes).
        known = obj.index or self._index.get((obj.peer, obj.vni), 0)
        if change.op == "delete":
            self._index.pop((obj.peer, obj.vni), None)
            return action_delete("tunnel_key", known)
        new = change.new
        assert isinstance(new, TunnelAction)
        hw, sw = not new.skip_sw, new.skip_sw
        if change.op == "replace":  # the failover flip: every bound rule follows
            if not known:
                raise MissingDevice(f"tunnel action of {new.peer}/{new.vni}", new)
            return action_replace(self._tunnel_key(new, known), skip_hw=hw, skip_sw=sw)
        index = self._free_index()
        self._index[(new.peer, new.vni)] = index  # rules later in this batch bind to it
        stamp = self._action_template(sw)
        if stamp is not None and _is_v4(new.src) and _is_v4(new.dst):
            return stamp.stamp(index=index, src=new.src, dst=new.dst, vni=new.vni)
        return action_add(self._tunnel_key(new, index), skip_hw=hw, skip_sw=sw)

    def _action_template(self, skip_sw: bool) -> Template | None:
        key = ("action_add", skip_sw)
        if key not in self._templates:
            placeholder = TunnelAction("", PLACEHOLDER_VNI, PLACEHOLDER_SRC, PLACEHOLDER_DST)
            raw = action_add(self._tunnel_key(placeholder, PLACEHOLDER_INDEX),
                             skip_hw=not skip_sw, skip_sw=skip_sw)  # fmt: skip
            self._templates[key] = Template.of(raw, _TEMPLATE_FIELDS["action_add"])
        return self._templates[key]

    def _free_index(self) -> int:
        used = self._index.values()
        if len(used) >= ACTION_INDEX_BAND - 1:  # the last index is the template placeholder's
            raise RuntimeError("THORN's tc action index band is full")
        taken = set(used)
        while self._next_index in taken or self._next_index == PLACEHOLDER_INDEX:
            self._next_index += 1
            if self._next_index >= ACTION_INDEX_BASE + ACTION_INDEX_BAND:
                self._next_index = ACTION_INDEX_BASE
        return self._next_index

    def _bound(self, peer: str, vni: int, what: KernelObject) -> ActionRef:
        index = self._index.get((peer, vni))
        if index is None:
            raise MissingDevice(f"tunnel action of {peer}/{vni}", what)
        return ActionRef("tunnel_key", index)

    def _filter_at(self, dev: str, prio: int, handle: int, what: KernelObject) -> FlowerFilter:
        # A delete names the filter by where it is; its flags do not matter.
        return FlowerFilter(ifindex=self.index_of(dev, what), priority=prio, handle=handle,
                            skip_hw=True)  # fmt: skip

    def _spec_bound(self, obj: EncapRule, index: int) -> FlowerFilter:
        """An encap rule's filter bound to action `index` (the template's placeholder)."""
        tunnel = self.index_of(FLOWER_TUNNEL, obj)
        return FlowerFilter(ifindex=self.index_of(obj.dev, obj), priority=PRIO_ENCAP,
                            match=FlowerMatch(eth_dst=obj.mac),
                            actions=(ActionRef("tunnel_key", index), Mirred.redirect(tunnel)),
                            skip_hw=not obj.skip_sw, skip_sw=obj.skip_sw)  # fmt: skip

    def _spec(self, obj: KernelObject, handle: int) -> FlowerFilter:
        tunnel = self.index_of(FLOWER_TUNNEL, obj)
        actions: Sequence[AnyAction]
        match obj:
            case EncapRule():
                dev, prio = obj.dev, PRIO_ENCAP
                match_ = FlowerMatch(eth_dst=obj.mac)
                actions = (self._bound(obj.peer, obj.vni, obj), Mirred.redirect(tunnel))
            case FloodRule():
                dev, prio = obj.dev, PRIO_FLOOD + obj.part
                match_ = FlowerMatch(eth_dst=GROUP_BIT, eth_dst_mask=GROUP_BIT)
                copies: list[AnyAction] = [Mirred.mirror(self.index_of(m, obj))
                                           for m in obj.mirrors]  # fmt: skip
                for peer in obj.peers:
                    copies += [self._bound(peer, obj.vni, obj), Mirred.mirror(tunnel)]
                # UNSPEC: classification goes on to the next part; the last one drops.
                verdict = Control.SHOT if obj.last else Control.UNSPEC
                actions = (*copies, Gact(verdict))
            case DecapRule():
                dev, prio = FLOWER_TUNNEL, PRIO_DECAP
                if obj.mac == BROADCAST_MAC:
                    match_ = FlowerMatch(enc_key_id=obj.vni, eth_dst=GROUP_BIT,
                                         eth_dst_mask=GROUP_BIT)  # fmt: skip
                else:
                    match_ = FlowerMatch(enc_key_id=obj.vni, eth_dst=obj.mac)
                reps = [self.index_of(r, obj) for r in obj.reps]
                outs: list[AnyAction] = [Mirred.mirror(r) for r in reps[:-1]]
                actions = (TunnelKeyUnset(), *outs, Mirred.redirect(reps[-1]))
            case _:
                raise TypeError(obj)
        sw = bool(getattr(obj, "skip_sw", False))
        return FlowerFilter(ifindex=self.index_of(dev, obj), priority=prio, match=match_,
                            actions=tuple(actions), handle=handle, skip_hw=not sw,
                            skip_sw=sw)  # fmt: skip

    def _filter_message(self, change: Change) -> bytes:
        obj = change.new
        if change.op == "add" and isinstance(obj, EncapRule):
            # Thousands of these: stamped from a template (per representor) when possible.
            index = self._index.get((obj.peer, obj.vni))
            stamp = self._encap_template(obj) if index is not None else None
            if stamp is not None and index is not None:
                return stamp.stamp_encap(obj.mac, index)
        old_handle = _handle(change.old) or self._handles.get(change.obj.key, 0)
        if change.op == "delete":
            assert change.old is not None
            return filter_delete(self._spec(change.old, old_handle))
        assert obj is not None
        if change.op == "replace":
            return filter_replace(self._spec(obj, old_handle))
        return filter_add(self._spec(obj, 0))

    def _encap_template(self, obj: EncapRule) -> Template | None:
        key = ("encap_add", obj.dev, self.ifindex.get(obj.dev), self.ifindex.get(FLOWER_TUNNEL),
               obj.skip_sw)  # fmt: skip
        if key in self._templates:
            return self._templates[key]
        placeholder = EncapRule(obj.dev, PLACEHOLDER_MAC, "", 0, skip_sw=obj.skip_sw)
        raw = filter_add(self._spec_bound(placeholder, PLACEHOLDER_INDEX))
        self._templates[key] = Template.of(raw, _TEMPLATE_FIELDS["encap_add"])
        return self._templates[key]


_TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "action_add": ("index", "src", "dst", "vni"),
    "encap_add": ("mac", "index"),
}


def remade_for_mode(changes: Sequence[Change]) -> tuple[list[Change], list[Change]]:
    """A rule or action whose offload mode changes cannot be replaced in place (a shared
    action keeps its flags while filters are bound to it, and the kernel refuses a binding
    whose flags differ): such replaces become a delete of the old one and an add of the new
    one where it was. Returns (the deletes, in reverse rank: rules before the actions they
    bind; everything else, in order). No change of mode: ([], changes)."""
    switched = [c for c in changes if c.op == "replace" and isinstance(c.old, OFFLOADED)
                and isinstance(c.new, OFFLOADED) and c.old.skip_sw != c.new.skip_sw]  # fmt: skip
    if not switched:
        return [], list(changes)
    gone = set(map(id, switched))
    deletes = sorted((Change("delete", None, c.old) for c in switched),
                     key=lambda c: -RANK[type(c.obj)])  # fmt: skip
    rest = [Change("add", c.new, None) if id(c) in gone else c for c in changes]
    return deletes, rest


def _is_v4(address: str) -> bool:
    return "." in address


def _handle(obj: Any) -> int:
    return int(getattr(obj, "handle", 0))
