"""act_tunnel_key as a pyroute2 action plugin: pyroute2 0.9.7 ships none.

Same contract as pyroute2's `tcmsg/act_*.py`: `options` is the nla class that encodes and decodes
TCA_ACT_OPTIONS (attributes in the kernel's enum order, `tc_tunnel_key.h`), `parameters()`
turns a typed action into the value that class encodes. Wire details checked against
iproute2's `tc/m_tunnel_key.c`: the key id is a be32 (the header comment says be64, the kernel
policy and tc use 32 bits), NO_CSUM is always sent, and binding to an existing action by index
is a PARMS with t_action 0 and control PIPE.
"""

# pyroute2's nla classes are untyped; subclassing them is the plugin contract.
# mypy: allow-subclassing-any

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from pyroute2.netlink import NLA_F_NESTED, nla  # type: ignore[import-untyped,unused-ignore]

from thorn_programmer.netlink.constants import Control, TunnelKeyAction
from thorn_programmer.netlink.models import TunnelKeySet, TunnelKeyUnset

KIND = "tunnel_key"


class options(nla):
    nla_flags = NLA_F_NESTED
    nla_map = (
        ("TCA_TUNNEL_KEY_UNSPEC", "none"),
        ("TCA_TUNNEL_KEY_TM", "none"),
        ("TCA_TUNNEL_KEY_PARMS", "tca_tunnel_key_parms"),
        ("TCA_TUNNEL_KEY_ENC_IPV4_SRC", "ip4addr"),
        ("TCA_TUNNEL_KEY_ENC_IPV4_DST", "ip4addr"),
        ("TCA_TUNNEL_KEY_ENC_IPV6_SRC", "ip6addr"),
        ("TCA_TUNNEL_KEY_ENC_IPV6_DST", "ip6addr"),
        ("TCA_TUNNEL_KEY_ENC_KEY_ID", "be32"),
        ("TCA_TUNNEL_KEY_PAD", "none"),
        ("TCA_TUNNEL_KEY_ENC_DST_PORT", "be16"),
        ("TCA_TUNNEL_KEY_NO_CSUM", "uint8"),
        ("TCA_TUNNEL_KEY_ENC_OPTS", "hex"),
        ("TCA_TUNNEL_KEY_ENC_TOS", "uint8"),
        ("TCA_TUNNEL_KEY_ENC_TTL", "uint8"),
    )

    class tca_tunnel_key_parms(nla):
        # struct tc_tunnel_key: tc_gen + t_action
        fields = (
            ("index", "I"),
            ("capab", "I"),
            ("action", "i"),
            ("refcnt", "i"),
            ("bindcnt", "i"),
            ("t_action", "i"),
        )


def parameters(action: TunnelKeySet | TunnelKeyUnset) -> dict[str, Any]:
    """The TCA_ACT_OPTIONS value for `options`, attributes in the order tc emits them."""
    attrs: list[list[Any]] = []
    if isinstance(action, TunnelKeySet):
        family = "IPV4" if isinstance(action.src, IPv4Address) else "IPV6"
        attrs.append([f"TCA_TUNNEL_KEY_ENC_{family}_SRC", str(action.src)])
        attrs.append([f"TCA_TUNNEL_KEY_ENC_{family}_DST", str(action.dst)])
        if action.key_id is not None:
            attrs.append(["TCA_TUNNEL_KEY_ENC_KEY_ID", action.key_id])
        if action.dst_port is not None:
            attrs.append(["TCA_TUNNEL_KEY_ENC_DST_PORT", action.dst_port])
        if action.tos is not None:
            attrs.append(["TCA_TUNNEL_KEY_ENC_TOS", action.tos])
        if action.ttl is not None:
            attrs.append(["TCA_TUNNEL_KEY_ENC_TTL", action.ttl])
        attrs.append(["TCA_TUNNEL_KEY_NO_CSUM", int(action.nocsum)])
        t_action = TunnelKeyAction.SET
    else:
        attrs.append(["TCA_TUNNEL_KEY_NO_CSUM", 0])
        t_action = TunnelKeyAction.RELEASE
    attrs.append(["TCA_TUNNEL_KEY_PARMS", _parms(action.index, action.control, t_action)])
    return {"attrs": attrs}


def bind_parameters(index: int) -> dict[str, Any]:
    """What `tc ... action tunnel_key index N` sends: the kernel binds and ignores the rest."""
    return {
        "attrs": [
            ["TCA_TUNNEL_KEY_NO_CSUM", 0],
            ["TCA_TUNNEL_KEY_PARMS", _parms(index, Control.PIPE, TunnelKeyAction.BIND)],
        ]
    }


def _parms(index: int, control: int, t_action: int) -> dict[str, int]:
    return {"index": index, "action": control, "t_action": t_action}
