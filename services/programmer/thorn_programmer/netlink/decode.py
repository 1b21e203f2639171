"""Read flower filters and actions back into the typed models.

The bytes are decoded by `codec` (default) or by pyroute2 itself (`engine="pyroute2"`, the
reference, ~10x slower), both from our `tcmsg`/`tcamsg` classes and into the same tree shape;
this module maps that tree onto `FilterState`/`ActionState`. Keys the models do not carry
(VLAN, ICMP, ct, masked ports, attributes of a newer kernel...) are not dropped silently:
their names land in `FilterState.unmodelled`, so a reconciler can tell a foreign filter.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any

from thorn_programmer.netlink import flower, tunnel_key
from thorn_programmer.netlink.codec import decode_message
from thorn_programmer.netlink.constants import (
    ETH_P_ALL,
    ActFlag,
    ClsFlag,
    Control,
    MirredAction,
    TunnelKeyAction,
)
from thorn_programmer.netlink.errors import TcDecodeError
from thorn_programmer.netlink.messages import Engine, tcamsg, tcmsg
from thorn_programmer.netlink.models import (
    ActionRef,
    ActionState,
    AnyAction,
    BindableKind,
    Counters,
    FilterState,
    FlowerFilter,
    FlowerMatch,
    Gact,
    IPNetwork,
    Mirred,
    OtherAction,
    TunnelKeySet,
    TunnelKeyUnset,
)

Bytes = bytes | bytearray | memoryview


def _modelled() -> frozenset[str]:
    """Attributes the models represent (or that are no match key), as TCA_FLOWER_<name>."""
    names = {"CLASSID", "ACT", "FLAGS", "IN_HW_COUNT", "KEY_ETH_TYPE", "KEY_IP_PROTO"}
    names |= {"KEY_ENC_KEY_ID", "KEY_ETH_DST", "KEY_ETH_DST_MASK", "KEY_ETH_SRC"}
    names.add("KEY_ETH_SRC_MASK")
    for enc in ("", "ENC_"):
        for version in (4, 6):
            for side in ("SRC", "DST"):
                names |= {f"KEY_{enc}IPV{version}_{side}", f"KEY_{enc}IPV{version}_{side}_MASK"}
    return frozenset(names)


_MODELLED = _modelled()
# Exact-match masks the kernel dumps next to a key we send without one.
_BINDABLE: dict[str, BindableKind] = {
    "tunnel_key": "tunnel_key",
    "mirred": "mirred",
    "gact": "gact",
}
_FULL_MASKS = {
    "KEY_TCP_SRC_MASK",
    "KEY_TCP_DST_MASK",
    "KEY_UDP_SRC_MASK",
    "KEY_UDP_DST_MASK",
    "KEY_ENC_UDP_DST_PORT_MASK",
}


def _attrs(nla: Any) -> Iterator[tuple[str, Any]]:
    for slot in nla["attrs"]:
        yield slot[0], slot[1]


def _prefix(mask: str) -> int | None:
    bits = int(ip_address(mask))
    width = 128 if ":" in mask else 32
    prefix = bin(bits).count("1")
    return prefix if bits == ((1 << prefix) - 1) << (width - prefix) else None


def _network(opts: Any, key: str, unmodelled: list[str]) -> IPNetwork | None:
    """The prefix of key "SRC", "DST", "ENC_SRC" or "ENC_DST", whichever family is there."""
    enc, _, side = key.rpartition("_")
    for version in (4, 6):
        name = f"TCA_FLOWER_KEY_{enc}{'_' if enc else ''}IPV{version}_{side}"
        addr = opts.get_attr(name)
        if addr is None:
            continue
        mask = opts.get_attr(f"{name}_MASK")
        prefix = _prefix(mask) if mask is not None else (32 if version == 4 else 128)
        if prefix is None:
            unmodelled.append(f"{name}_MASK")  # not a prefix: the model cannot hold it
            return None
        return ip_network(f"{addr}/{prefix}", strict=False)
    return None


def _match(opts: Any, protocol: int) -> tuple[FlowerMatch, tuple[str, ...]]:
    unmodelled: list[str] = []
    ports: dict[str, int] = {}
    for name, value in _attrs(opts):
        short = name.removeprefix("TCA_FLOWER_")
        if short in _MODELLED:
            continue
        if short in _FULL_MASKS and value == 0xFFFF:
            continue
        if short in ("KEY_TCP_SRC", "KEY_TCP_DST", "KEY_UDP_SRC", "KEY_UDP_DST"):
            ports[short[-3:].lower()] = int(value)
        elif short == "KEY_ENC_UDP_DST_PORT":
            ports["enc"] = int(value)
        else:
            unmodelled.append(name)
    eth_type = opts.get_attr("TCA_FLOWER_KEY_ETH_TYPE")
    if eth_type is None and protocol != ETH_P_ALL:
        eth_type = protocol
    match_keys = dict(
        eth_type=eth_type,
        eth_dst=opts.get_attr("TCA_FLOWER_KEY_ETH_DST"),
        eth_dst_mask=opts.get_attr("TCA_FLOWER_KEY_ETH_DST_MASK"),
        eth_src=opts.get_attr("TCA_FLOWER_KEY_ETH_SRC"),
        eth_src_mask=opts.get_attr("TCA_FLOWER_KEY_ETH_SRC_MASK"),
        ip_proto=opts.get_attr("TCA_FLOWER_KEY_IP_PROTO"),
        src_ip=_network(opts, "SRC", unmodelled),
        dst_ip=_network(opts, "DST", unmodelled),
        src_port=ports.get("src"),
        dst_port=ports.get("dst"),
        enc_key_id=opts.get_attr("TCA_FLOWER_KEY_ENC_KEY_ID"),
        enc_src_ip=_network(opts, "ENC_SRC", unmodelled),
        enc_dst_ip=_network(opts, "ENC_DST", unmodelled),
        enc_dst_port=ports.get("enc"),
    )
    try:
        match = FlowerMatch(**match_keys)
    except ValueError as exc:
        raise TcDecodeError(f"flower keys the model refuses: {exc}") from exc
    return match, tuple(unmodelled)


def _control(value: int) -> int:
    try:
        return Control(value)
    except ValueError:
        return value  # goto chain / jump carry an opcode in the high bits


def _address(opts: Any, side: str) -> IPv4Address | IPv6Address:
    for version in (4, 6):
        value = opts.get_attr(f"TCA_TUNNEL_KEY_ENC_IPV{version}_{side}")
        if value is not None:
            return ip_address(value)
    raise TcDecodeError(f"tunnel_key set without {side.lower()} address")


def _tunnel_key(opts: Any) -> AnyAction:
    parms = opts.get_attr("TCA_TUNNEL_KEY_PARMS")
    index, control, t_action = parms["index"], _control(parms["action"]), parms["t_action"]
    if t_action == TunnelKeyAction.BIND:
        return ActionRef("tunnel_key", index)
    if t_action == TunnelKeyAction.RELEASE:
        return TunnelKeyUnset(index=index, control=control)
    return TunnelKeySet(
        src=_address(opts, "SRC"),
        dst=_address(opts, "DST"),
        key_id=opts.get_attr("TCA_TUNNEL_KEY_ENC_KEY_ID"),
        dst_port=opts.get_attr("TCA_TUNNEL_KEY_ENC_DST_PORT"),
        nocsum=bool(opts.get_attr("TCA_TUNNEL_KEY_NO_CSUM")),
        tos=opts.get_attr("TCA_TUNNEL_KEY_ENC_TOS") or None,
        ttl=opts.get_attr("TCA_TUNNEL_KEY_ENC_TTL") or None,
        index=index,
        control=control,
    )


def _action(kind: str, opts: Any, index: int) -> tuple[AnyAction, Any]:
    """The model and the raw tc_gen parms (index, refcnt, bindcnt) of one action."""
    if opts is None:
        # Kind and index only: a delete/get request or a terse dump names an action.
        named = ActionRef(_BINDABLE[kind], index) if kind in _BINDABLE and index else None
        return named or OtherAction(kind=kind, index=index), {"index": index}
    if kind == tunnel_key.KIND:
        return _tunnel_key(opts), opts.get_attr("TCA_TUNNEL_KEY_PARMS")
    if kind == "mirred":
        parms = opts.get_attr("TCA_MIRRED_PARMS")
        if parms["eaction"] == 0:
            return ActionRef("mirred", parms["index"]), parms
        mirred = Mirred(
            ifindex=parms["ifindex"],
            action=MirredAction(parms["eaction"]),
            control=_control(parms["action"]),
            index=parms["index"],
        )
        return mirred, parms
    if kind == "gact":
        parms = opts.get_attr("TCA_GACT_PARMS")
        return Gact(control=_control(parms["action"]), index=parms["index"]), parms
    return OtherAction(kind=kind, index=index), {"index": index}


def _counters(stats: Any) -> Counters:
    if stats is None:
        return Counters()
    basic = stats.get_attr("TCA_STATS_BASIC") or {}
    hw = stats.get_attr("TCA_STATS_BASIC_HW") or {}
    queue = stats.get_attr("TCA_STATS_QUEUE") or {}
    return Counters(
        bytes=basic.get("bytes", 0),
        # The kernel adds PKT64 only when the 32-bit packet count wrapped.
        packets=stats.get_attr("TCA_STATS_PKT64") or basic.get("packets", 0),
        drops=queue.get("drops", 0),
        overlimits=queue.get("overlimits", 0),
        hw_bytes=hw.get("bytes", 0),
        hw_packets=hw.get("packets", 0),
    )


def _action_state(entry: Any) -> ActionState:
    kind = entry.get_attr("TCA_ACT_KIND")
    action, parms = _action(
        kind, entry.get_attr("TCA_ACT_OPTIONS"), entry.get_attr("TCA_ACT_INDEX") or 0
    )
    flags = (entry.get_attr("TCA_ACT_FLAGS") or {}).get("flags", 0)
    return ActionState(
        action=action,
        index=parms["index"],
        refcnt=parms.get("refcnt", 0),
        bindcnt=parms.get("bindcnt", 0),
        counters=_counters(entry.get_attr("TCA_ACT_STATS")),
        skip_hw=bool(flags & ActFlag.SKIP_HW),
        skip_sw=bool(flags & ActFlag.SKIP_SW),
        in_hw_count=entry.get_attr("TCA_ACT_IN_HW_COUNT"),
    )


def _action_list(entries: Any) -> tuple[ActionState, ...]:
    # An nla array: the entries in order, whatever their attribute type numbers.
    return tuple(_action_state(entry) for entry in entries or ())


def _decode(cls: Any, data: Bytes, engine: Engine) -> Any:
    if engine == "fast":
        return decode_message(cls, bytes(data))
    msg = cls(bytes(data))
    msg.decode()
    return msg


def _flower_options(data: Bytes, engine: Engine) -> tuple[Any, Any]:
    msg = _decode(tcmsg, data, engine)
    return msg, msg.get_attr("TCA_OPTIONS") if msg.get_attr("TCA_KIND") == flower.KIND else None


def decode_filter(data: Bytes, *, engine: Engine = "fast") -> FilterState:
    """One RTM_NEWTFILTER/RTM_DELTFILTER message (a dump entry or a request) -> FilterState."""
    msg, opts = _flower_options(data, engine)
    if opts is None:
        kind = msg.get_attr("TCA_KIND")
        if kind != flower.KIND:
            raise TcDecodeError(f"not a flower filter: {kind!r}")
        raise TcDecodeError("no TCA_OPTIONS: a classifier head in a dump, not a filter")
    return _filter_state(msg, opts)


def decode_filters(parts: Iterable[Bytes], *, engine: Engine = "fast") -> list[FilterState]:
    """The flower filters of a dump; classifier heads and other kinds are skipped."""
    states: list[FilterState] = []
    for data in parts:
        msg, opts = _flower_options(data, engine)
        if opts is not None:
            states.append(_filter_state(msg, opts))
    return states


def _filter_state(msg: Any, opts: Any) -> FilterState:
    info = msg["info"]
    match, unmodelled = _match(opts, socket.ntohs(info & 0xFFFF))
    actions = _action_list(opts.get_attr("TCA_FLOWER_ACT"))
    flags = opts.get_attr("TCA_FLOWER_FLAGS") or 0
    spec = FlowerFilter(
        ifindex=msg["index"],
        priority=info >> 16,
        match=match,
        actions=tuple(state.action for state in actions),
        handle=msg["handle"],
        parent=msg["parent"],
        chain=msg.get_attr("TCA_CHAIN") or 0,
        classid=opts.get_attr("TCA_FLOWER_CLASSID"),
        skip_sw=bool(flags & ClsFlag.SKIP_SW),
        skip_hw=bool(flags & ClsFlag.SKIP_HW),
    )
    return FilterState(
        spec=spec,
        actions=actions,
        in_hw=bool(flags & ClsFlag.IN_HW),
        not_in_hw=bool(flags & ClsFlag.NOT_IN_HW),
        in_hw_count=opts.get_attr("TCA_FLOWER_IN_HW_COUNT"),
        unmodelled=unmodelled,
    )


def decode_action(data: Bytes, *, engine: Engine = "fast") -> tuple[ActionState, ...]:
    """One RTM_*ACTION message (dump part, get reply or request) -> its actions."""
    msg = _decode(tcamsg, data, engine)
    return _action_list(msg.get_attr("TCA_ROOT_TAB"))
