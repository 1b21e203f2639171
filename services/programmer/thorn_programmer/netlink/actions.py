"""The TC action list (TCA_ACT_*) as pyroute2 nla classes, and typed actions into them.

pyroute2's `common_act.tca_act` stops at TCA_ACT_STATS and its plugin table has no
tunnel_key; this is the same structure with the kernel's full 6.1 enum (TCA_ACT_FLAGS and
TCA_ACT_IN_HW_COUNT are what tell us about offload) and our tunnel_key plugin. mirred and gact
reuse pyroute2's own option classes.
"""

# pyroute2's nla classes are untyped; subclassing them is the plugin contract.
# mypy: allow-subclassing-any

from __future__ import annotations

from typing import Any

from pyroute2.netlink import nla  # type: ignore[import-untyped,unused-ignore]
from pyroute2.netlink.rtnl.tcmsg import (  # type: ignore[import-untyped,unused-ignore]
    act_gact,
    act_mirred,
)

from thorn_programmer.netlink import tunnel_key
from thorn_programmer.netlink.models import (
    Action,
    ActionRef,
    AnyAction,
    Gact,
    Mirred,
    OtherAction,
    TunnelKeySet,
    TunnelKeyUnset,
)

# TCA_ACT_KIND -> the nla class of its TCA_ACT_OPTIONS.
PLUGINS: dict[str, Any] = {
    "gact": act_gact.options,
    "mirred": act_mirred.options,
    tunnel_key.KIND: tunnel_key.options,
}


class bitfield32(nla):
    # struct nla_bitfield32 {value, selector}; "value" is a reserved key in pyroute2 dicts.
    fields = (("flags", "I"), ("selector", "I"))


class stats2(nla):
    # gen_stats.h, whole 6.1 enum: BASIC_HW and PKT64 matter for offloaded / busy actions.
    nla_map = (
        ("TCA_STATS_UNSPEC", "none"),
        ("TCA_STATS_BASIC", "basic"),
        ("TCA_STATS_RATE_EST", "rate_est"),
        ("TCA_STATS_QUEUE", "queue"),
        ("TCA_STATS_APP", "hex"),
        ("TCA_STATS_RATE_EST64", "rate_est64"),
        ("TCA_STATS_PAD", "none"),
        ("TCA_STATS_BASIC_HW", "basic"),
        ("TCA_STATS_PKT64", "uint64"),
    )

    class basic(nla):
        fields = (("bytes", "Q"), ("packets", "I"))

    class rate_est(nla):
        fields = (("bps", "I"), ("pps", "I"))

    class rate_est64(nla):
        fields = (("bps", "Q"), ("pps", "Q"))

    class queue(nla):
        fields = (
            ("qlen", "I"),
            ("backlog", "I"),
            ("drops", "I"),
            ("requeues", "I"),
            ("overlimits", "I"),
        )


class tca_act(nla):
    # One action of a list. Lists are declared "*tca_act" (a pyroute2 nla array): the n-th
    # entry's attribute type is its position, 1-based in requests, 0-based and past 32 in
    # LARGE_DUMP_ON dumps, so no fixed TCA_ACT_PRIO_n table can name them all.
    nla_map = (
        ("TCA_ACT_UNSPEC", "none"),
        ("TCA_ACT_KIND", "asciiz"),
        ("TCA_ACT_OPTIONS", "get_act_options"),
        ("TCA_ACT_INDEX", "uint32"),
        ("TCA_ACT_STATS", "stats2"),
        ("TCA_ACT_PAD", "none"),
        ("TCA_ACT_COOKIE", "hex"),
        ("TCA_ACT_FLAGS", "bitfield32"),
        ("TCA_ACT_HW_STATS", "bitfield32"),
        ("TCA_ACT_USED_HW_STATS", "bitfield32"),
        ("TCA_ACT_IN_HW_COUNT", "uint32"),
    )
    stats2 = stats2
    bitfield32 = bitfield32

    @staticmethod
    def get_act_options(self: Any, *argv: Any, **kwarg: Any) -> Any:
        # Called by pyroute2 with the enclosing tca_act; KIND precedes OPTIONS.
        return PLUGINS.get(self.get_attr("TCA_ACT_KIND"), self.hex)


def options_value(action: Action) -> tuple[str, dict[str, Any]]:
    """(kind, TCA_ACT_OPTIONS value) of a typed action, as tc would send it."""
    if isinstance(action, TunnelKeySet | TunnelKeyUnset):
        return tunnel_key.KIND, tunnel_key.parameters(action)
    if isinstance(action, Mirred):
        parms = {
            "index": action.index,
            "action": action.control,
            "eaction": action.action,
            "ifindex": action.ifindex,
        }
        return "mirred", {"attrs": [["TCA_MIRRED_PARMS", parms]]}
    if isinstance(action, Gact):
        parms = {"index": action.index, "action": action.control}
        return "gact", {"attrs": [["TCA_GACT_PARMS", parms]]}
    if isinstance(action, ActionRef):
        if action.kind == tunnel_key.KIND:
            return action.kind, tunnel_key.bind_parameters(action.index)
        # mirred/gact: tc sends PARMS with only the index set.
        name = "TCA_MIRRED_PARMS" if action.kind == "mirred" else "TCA_GACT_PARMS"
        return action.kind, {"attrs": [[name, {"index": action.index}]]}
    raise TypeError(f"not an encodable action: {action!r}")


def action_list(actions: tuple[AnyAction, ...], flags: int = 0) -> list[dict[str, Any]]:
    """The value of a TCA_FLOWER_ACT / TCA_ROOT_TAB array: one tca_act per action."""
    entries: list[dict[str, Any]] = []
    for action in actions:
        if isinstance(action, OtherAction):
            raise TypeError(f"cannot encode a {action.kind!r} action")
        kind, opts = options_value(action)
        attrs: list[list[Any]] = [["TCA_ACT_KIND", kind], ["TCA_ACT_OPTIONS", opts]]
        if flags:
            attrs.append(["TCA_ACT_FLAGS", {"flags": flags, "selector": flags}])
        entries.append({"attrs": attrs})
    return entries
