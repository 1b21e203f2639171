"""Whole rtnetlink requests for flower filters and shared actions, built as bytes.

Every builder returns one encoded netlink message with sequence number 0 and port id 0: the
sender stamps its own sequence number (see `batch`), so a message can be built long before it
is sent, e.g. the failover flip. Header flags and attribute order follow what iproute2 6.1's
`tc` sends for the same command (captured in the golden tests).

`tcmsg` and `tcamsg` are pyroute2 message classes: pyroute2's own `tcmsg` stops at TCA_STAB
(no TCA_CHAIN, no TCA_HW_OFFLOAD) and it has no `tcamsg` for RTM_*ACTION at all.
"""

# pyroute2's nla classes are untyped; subclassing them is the plugin contract.
# mypy: allow-subclassing-any

from __future__ import annotations

import socket
from typing import Any, Literal

from pyroute2.netlink import nlmsg  # type: ignore[import-untyped,unused-ignore]

from thorn_programmer.netlink import flower
from thorn_programmer.netlink.actions import action_list, bitfield32, stats2, tca_act
from thorn_programmer.netlink.codec import encode_message
from thorn_programmer.netlink.constants import (
    RTM_DELACTION,
    RTM_DELTFILTER,
    RTM_GETACTION,
    RTM_GETTFILTER,
    RTM_NEWACTION,
    RTM_NEWTFILTER,
    TC_H_INGRESS,
    TCA_ACT_FLAG_LARGE_DUMP_ON,
    ActFlag,
    NlmFlag,
)
from thorn_programmer.netlink.models import Action, ActionRef, FlowerFilter

_ADD = NlmFlag.REQUEST | NlmFlag.ACK | NlmFlag.EXCL | NlmFlag.CREATE
_DEL = NlmFlag.REQUEST | NlmFlag.ACK
_DUMP = NlmFlag.REQUEST | NlmFlag.DUMP


class tcmsg(nlmsg):
    prefix = "TCA_"
    fields = (
        ("family", "B"),
        ("pad1", "B"),
        ("pad2", "H"),
        ("index", "i"),
        ("handle", "I"),
        ("parent", "I"),
        ("info", "I"),
    )
    # rtnetlink.h, whole 6.1 enum.
    nla_map = (
        ("TCA_UNSPEC", "none"),
        ("TCA_KIND", "asciiz"),
        ("TCA_OPTIONS", "get_options"),
        ("TCA_STATS", "hex"),
        ("TCA_XSTATS", "hex"),
        ("TCA_RATE", "hex"),
        ("TCA_FCNT", "hex"),
        ("TCA_STATS2", "stats2"),
        ("TCA_STAB", "hex"),
        ("TCA_PAD", "none"),
        ("TCA_DUMP_INVISIBLE", "flag"),
        ("TCA_CHAIN", "uint32"),
        ("TCA_HW_OFFLOAD", "uint8"),
        ("TCA_INGRESS_BLOCK", "uint32"),
        ("TCA_EGRESS_BLOCK", "uint32"),
        ("TCA_DUMP_FLAGS", "bitfield32"),
        ("TCA_EXT_WARN_MSG", "asciiz"),
    )
    stats2 = stats2
    bitfield32 = bitfield32

    @staticmethod
    def get_options(self: Any, *argv: Any, **kwarg: Any) -> Any:
        return flower.options if self.get_attr("TCA_KIND") == flower.KIND else self.hex


class tcamsg(nlmsg):
    prefix = "TCA_ROOT_"
    # struct tcamsg
    fields = (("family", "B"), ("pad1", "B"), ("pad2", "H"))
    nla_map = (
        ("TCA_ROOT_UNSPEC", "none"),
        ("TCA_ROOT_TAB", "*tca_act"),
        ("TCA_ROOT_FLAGS", "bitfield32"),
        ("TCA_ROOT_COUNT", "uint32"),
        ("TCA_ROOT_TIME_DELTA", "uint32"),
        ("TCA_ROOT_EXT_WARN_MSG", "asciiz"),
    )
    tca_act = tca_act
    bitfield32 = bitfield32


Engine = Literal["fast", "pyroute2"]


def _encode(cls: Any, mtype: int, flags: int, value: dict[str, Any], engine: Engine) -> bytes:
    if engine == "fast":
        return encode_message(cls, mtype, int(flags), value)
    msg = cls()
    msg.update(value)
    msg["header"] = {"type": mtype, "flags": int(flags)}
    msg.encode()
    return bytes(msg.data)


def _filter_msg(
    spec: FlowerFilter, mtype: int, flags: int, options: dict[str, Any], engine: Engine
) -> bytes:
    attrs: list[list[Any]] = []
    if spec.chain:
        attrs.append(["TCA_CHAIN", spec.chain])
    attrs += [["TCA_KIND", flower.KIND], ["TCA_OPTIONS", options]]
    value = {
        "index": spec.ifindex,
        "handle": spec.handle,
        "parent": spec.parent,
        "info": (spec.priority << 16) | socket.htons(spec.protocol),
        "attrs": attrs,
    }
    return _encode(tcmsg, mtype, flags, value, engine)


def filter_add(spec: FlowerFilter, *, engine: Engine = "fast") -> bytes:
    """`tc filter add`: EEXIST if the (priority, handle) is taken."""
    return _filter_msg(spec, RTM_NEWTFILTER, _ADD, flower.parameters(spec), engine)


def filter_replace(spec: FlowerFilter, *, engine: Engine = "fast") -> bytes:
    """`tc filter replace`: creates, or replaces the filter with that handle in place."""
    flags = NlmFlag.REQUEST | NlmFlag.ACK | NlmFlag.CREATE
    return _filter_msg(spec, RTM_NEWTFILTER, flags, flower.parameters(spec), engine)


def filter_delete(spec: FlowerFilter, *, engine: Engine = "fast") -> bytes:
    """`tc filter del ... flower`: only where the filter is counts, not its keys or actions."""
    attrs: list[list[Any]] = [["TCA_FLOWER_FLAGS", flower.flags_of(spec.skip_hw, spec.skip_sw)]]
    if spec.match.eth_type is not None:
        attrs.append(["TCA_FLOWER_KEY_ETH_TYPE", spec.match.eth_type])
    return _filter_msg(spec, RTM_DELTFILTER, _DEL, {"attrs": attrs}, engine)


def filter_dump(ifindex: int, parent: int = TC_H_INGRESS, *, engine: Engine = "fast") -> bytes:
    """`tc filter show dev X ingress`: every chain and priority under that parent."""
    return _encode(tcmsg, RTM_GETTFILTER, _DUMP, {"index": ifindex, "parent": parent}, engine)


def _standalone(action: Action, skip_hw: bool, skip_sw: bool) -> list[list[Any]]:
    if isinstance(action, ActionRef):
        raise ValueError("an ActionRef only binds a filter; create the action itself")
    flags = (ActFlag.SKIP_HW if skip_hw else 0) | (ActFlag.SKIP_SW if skip_sw else 0)
    return [["TCA_ROOT_TAB", action_list((action,), flags)]]


def action_add(
    action: Action, *, skip_hw: bool = False, skip_sw: bool = False, engine: Engine = "fast"
) -> bytes:
    """`tc actions add action ... index N [skip_hw|skip_sw]`: EEXIST if N exists."""
    root = _standalone(action, skip_hw, skip_sw)
    return _encode(tcamsg, RTM_NEWACTION, _ADD, {"attrs": root}, engine)


def action_replace(
    action: Action, *, skip_hw: bool = False, skip_sw: bool = False, engine: Engine = "fast"
) -> bytes:
    """`tc actions replace ... index N`: the one-message failover flip for every bound filter."""
    flags = NlmFlag.REQUEST | NlmFlag.ACK | NlmFlag.REPLACE | NlmFlag.CREATE
    root = _standalone(action, skip_hw, skip_sw)
    return _encode(tcamsg, RTM_NEWACTION, flags, {"attrs": root}, engine)


def _by_index(kind: str, index: int) -> dict[str, Any]:
    entry = {"attrs": [["TCA_ACT_KIND", kind], ["TCA_ACT_INDEX", index]]}
    return {"attrs": [["TCA_ROOT_TAB", [entry]]]}


def action_delete(kind: str, index: int, *, engine: Engine = "fast") -> bytes:
    """`tc actions del action KIND index N`: refused while a filter is bound to it."""
    return _encode(tcamsg, RTM_DELACTION, _DEL, _by_index(kind, index), engine)


def action_get(kind: str, index: int, *, engine: Engine = "fast") -> bytes:
    """`tc actions get action KIND index N`, acked (tc does not ask) so errors come back."""
    return _encode(tcamsg, RTM_GETACTION, _DEL, _by_index(kind, index), engine)


def action_dump(kind: str, *, engine: Engine = "fast") -> bytes:
    """`tc actions ls action KIND`, with LARGE_DUMP_ON so more than 32 come back."""
    entry = {"attrs": [["TCA_ACT_KIND", kind]]}
    flags = {"flags": TCA_ACT_FLAG_LARGE_DUMP_ON, "selector": TCA_ACT_FLAG_LARGE_DUMP_ON}
    root = [["TCA_ROOT_TAB", [entry]], ["TCA_ROOT_FLAGS", flags]]
    return _encode(tcamsg, RTM_GETACTION, _DUMP, {"attrs": root}, engine)
