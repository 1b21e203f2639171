"""Hypothesis strategies for the netlink models, shared by the test_netlink_* files.

Only valid specs: every combination the models accept, nothing they refuse (those are tested
one by one in test_netlink_flower.py).
"""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Literal

from hypothesis import strategies as st

from thorn_programmer.netlink import (
    ETH_P_IP,
    ETH_P_IPV6,
    IPPROTO_TCP,
    IPPROTO_UDP,
    TC_H_EGRESS,
    TC_H_INGRESS,
    Action,
    ActionRef,
    Control,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
    MirredAction,
    TunnelKeySet,
    TunnelKeyUnset,
)

U8 = st.integers(0, 0xFF)
U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFFFFFF)
INDEX = st.integers(1, 0xFFFFFFFF)
CONTROLS = st.sampled_from(list(Control))
IPVersion = Literal[4, 6]
VERSIONS: tuple[IPVersion, ...] = (4, 6)
MACS = st.binary(min_size=6, max_size=6).map(lambda b: ":".join(f"{x:02x}" for x in b))


def networks(version: IPVersion) -> st.SearchStrategy[IPv4Network | IPv6Network]:
    width = 32 if version == 4 else 128
    return st.builds(
        lambda addr, prefix: ip_network((addr, prefix), strict=False),
        st.ip_addresses(v=version),
        st.integers(0, width),
    )


def optional_networks(version: IPVersion) -> st.SearchStrategy[IPv4Network | IPv6Network | None]:
    return st.none() | networks(version)


@st.composite
def flower_matches(draw: st.DrawFn) -> FlowerMatch:
    keys: dict[str, object] = {}
    family = draw(st.none() | st.sampled_from(VERSIONS))
    if family is None:
        keys["eth_type"] = draw(st.sampled_from([None, 0x0806, 0x88CC]))
    else:
        keys["eth_type"] = ETH_P_IP if family == 4 else ETH_P_IPV6
        keys["src_ip"] = draw(optional_networks(family))
        keys["dst_ip"] = draw(optional_networks(family))
        proto = draw(st.sampled_from([None, IPPROTO_TCP, IPPROTO_UDP, 1, 132]))
        keys["ip_proto"] = proto
        if proto in (IPPROTO_TCP, IPPROTO_UDP):
            keys["src_port"] = draw(st.none() | U16)
            keys["dst_port"] = draw(st.none() | U16)
    for side in ("dst", "src"):
        mac = draw(st.none() | MACS)
        keys[f"eth_{side}"] = mac
        keys[f"eth_{side}_mask"] = draw(st.none() | MACS) if mac else None
    keys["enc_key_id"] = draw(st.none() | U32)
    enc_family = draw(st.sampled_from(VERSIONS))
    keys["enc_src_ip"] = draw(optional_networks(enc_family))
    keys["enc_dst_ip"] = draw(optional_networks(enc_family))
    keys["enc_dst_port"] = draw(st.none() | U16)
    return FlowerMatch(**keys)  # type: ignore[arg-type]


def tunnel_key_sets(index: st.SearchStrategy[int] = U32) -> st.SearchStrategy[TunnelKeySet]:
    return st.sampled_from(VERSIONS).flatmap(
        lambda v: st.builds(
            TunnelKeySet,
            src=st.ip_addresses(v=v),
            dst=st.ip_addresses(v=v),
            key_id=st.none() | U32,
            dst_port=st.none() | U16,
            nocsum=st.booleans(),
            tos=st.none() | U8,
            ttl=st.none() | st.integers(1, 0xFF),
            index=index,
            control=CONTROLS,
        )
    )


MIRREDS = st.builds(
    Mirred,
    ifindex=INDEX,
    action=st.sampled_from(list(MirredAction)),
    control=CONTROLS,
    index=U32,
)
GACTS = st.builds(Gact, control=CONTROLS, index=U32)
UNSETS = st.builds(TunnelKeyUnset, index=U32, control=CONTROLS)
# A gact reference is byte-identical to Gact(OK, index): it decodes as that (see its test).
REFS = st.builds(ActionRef, kind=st.sampled_from(["tunnel_key", "mirred"]), index=INDEX)
STANDALONE: st.SearchStrategy[Action] = st.one_of(tunnel_key_sets(), UNSETS, MIRREDS, GACTS)
ACTIONS: st.SearchStrategy[Action] = st.one_of(STANDALONE, REFS)

FILTERS = st.builds(
    FlowerFilter,
    ifindex=st.integers(1, 0x7FFFFFFF),
    priority=U16,
    match=flower_matches(),
    actions=st.lists(ACTIONS, max_size=4).map(tuple),
    handle=U32,
    parent=st.sampled_from([TC_H_INGRESS, TC_H_EGRESS, 0x10000]),
    chain=st.integers(0, 0xFFFFFFFF),
    classid=st.none() | U32,
    skip_sw=st.booleans(),
    skip_hw=st.booleans(),
)
