"""Actions: tunnel_key / mirred / gact models, standalone messages, binding by index."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_netlink_strategies import INDEX, STANDALONE, tunnel_key_sets

from thorn_programmer.netlink import (
    Action,
    ActionRef,
    Control,
    FlowerFilter,
    Gact,
    Mirred,
    MirredAction,
    TunnelKeySet,
    TunnelKeyUnset,
    action_add,
    action_delete,
    action_dump,
    action_get,
    action_replace,
    decode_action,
    decode_filter,
    filter_add,
)
from thorn_programmer.netlink.codec import encode_message
from thorn_programmer.netlink.constants import RTM_GETACTION, NlmFlag
from thorn_programmer.netlink.messages import tcamsg
from thorn_programmer.netlink.tunnel_key import options

RED = TunnelKeySet(
    src=ip_address("10.1.0.1"), dst=ip_address("10.2.0.1"), key_id=100, dst_port=4789, index=7
)


def flags_of(msg: bytes) -> int:
    return int.from_bytes(msg[6:8], "little")


def test_the_tunnel_key_nla_map_follows_the_kernel_enum() -> None:
    position = {name: i for i, (name, _type) in enumerate(options.nla_map)}
    assert position["TCA_TUNNEL_KEY_PARMS"] == 2
    assert position["TCA_TUNNEL_KEY_ENC_KEY_ID"] == 7
    assert position["TCA_TUNNEL_KEY_ENC_DST_PORT"] == 9
    assert position["TCA_TUNNEL_KEY_NO_CSUM"] == 10
    assert position["TCA_TUNNEL_KEY_ENC_TTL"] == 13


def test_mirred_controls_default_as_in_tc() -> None:
    assert Mirred.redirect(4).control == Control.STOLEN
    assert Mirred.redirect(4, ingress=True).action == MirredAction.INGRESS_REDIRECT
    assert Mirred.mirror(4).control == Control.PIPE
    assert Mirred.mirror(4, ingress=True).action == MirredAction.INGRESS_MIRROR
    assert Mirred(ifindex=4, action=MirredAction.EGRESS_REDIRECT, control=Control.PIPE).control == 3


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: replace(RED, dst=ip_address("2001:db8::1")), "mixed"),
        (lambda: replace(RED, ttl=0), "ttl"),
        (lambda: replace(RED, dst_port=70000), "dst_port"),
        (lambda: Mirred(ifindex=0), "ifindex"),
        (lambda: ActionRef("tunnel_key", 0), "index"),
        (lambda: ActionRef("pedit", 3), "cannot bind"),  # type: ignore[arg-type]
    ],
)
def test_invalid_actions_are_refused(build: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        build()  # type: ignore[operator]


def test_a_tos_of_zero_is_no_tos() -> None:
    assert replace(RED, tos=0) == RED


def test_standalone_messages_carry_tc_header_flags() -> None:
    base = NlmFlag.REQUEST | NlmFlag.ACK
    assert flags_of(action_add(RED)) == base | NlmFlag.EXCL | NlmFlag.CREATE
    assert flags_of(action_replace(RED)) == base | NlmFlag.REPLACE | NlmFlag.CREATE
    assert flags_of(action_delete("tunnel_key", 7)) == base
    assert flags_of(action_get("tunnel_key", 7)) == base
    assert flags_of(action_dump("tunnel_key")) == NlmFlag.REQUEST | NlmFlag.DUMP


def test_offload_flags_of_a_shared_action_round_trip() -> None:
    (state,) = decode_action(action_replace(RED, skip_hw=True))
    assert state.action == RED and state.skip_hw and not state.skip_sw
    (state,) = decode_action(action_add(Gact(Control.SHOT, index=9), skip_sw=True))
    assert state.skip_sw and not state.skip_hw


def test_an_action_ref_cannot_be_created_on_its_own() -> None:
    with pytest.raises(ValueError, match="only binds"):
        action_add(ActionRef("tunnel_key", 7))


def test_delete_and_get_name_the_action_by_kind_and_index() -> None:
    for build in (action_delete, action_get):
        msg = tcamsg(build("tunnel_key", 7))
        msg.decode()
        (entry,) = msg.get_attr("TCA_ROOT_TAB")
        assert (entry.get_attr("TCA_ACT_KIND"), entry.get_attr("TCA_ACT_INDEX")) == (
            "tunnel_key",
            7,
        )


def test_a_dump_asks_for_more_than_32_actions() -> None:
    msg = tcamsg(action_dump("tunnel_key"))
    msg.decode()
    assert msg.get_attr("TCA_ROOT_FLAGS") == {"flags": 1, "selector": 1}


def test_an_action_dump_part_may_hold_more_than_32_actions() -> None:
    # LARGE_DUMP_ON dumps number the entries past TCA_ACT_MAX_PRIO (and from 0).
    entries = [
        {"attrs": [["TCA_ACT_KIND", "gact"], ["TCA_ACT_OPTIONS", gact(i)]]} for i in range(40)
    ]
    part = encode_message(
        tcamsg, RTM_GETACTION, NlmFlag.MULTI, {"attrs": [["TCA_ROOT_TAB", entries]]}
    )
    states = decode_action(part)
    assert [s.index for s in states] == list(range(40))


def gact(index: int) -> dict[str, object]:
    return {"attrs": [["TCA_GACT_PARMS", {"index": index, "action": Control.SHOT}]]}


@settings(max_examples=300, deadline=None)
@given(STANDALONE, st.booleans(), st.booleans())
def test_any_standalone_action_round_trips(action: Action, skip_hw: bool, skip_sw: bool) -> None:
    for build in (action_add, action_replace):
        msg = build(action, skip_hw=skip_hw, skip_sw=skip_sw)
        assert msg == build(action, skip_hw=skip_hw, skip_sw=skip_sw, engine="pyroute2")
        (state,) = decode_action(msg)
        assert (state.action, state.skip_hw, state.skip_sw) == (action, skip_hw, skip_sw)
        assert decode_action(msg, engine="pyroute2") == (state,)


@settings(max_examples=100, deadline=None)
@given(tunnel_key_sets(index=INDEX))
def test_the_failover_flip_is_one_prebuilt_message(new: TunnelKeySet) -> None:
    flip = action_replace(new, skip_hw=True)
    assert int.from_bytes(flip[0:4], "little") == len(flip)
    (state,) = decode_action(flip)
    assert state.action == new and state.index == new.index


@pytest.mark.parametrize("kind", ["tunnel_key", "mirred"])
def test_a_reference_in_a_filter_decodes_as_a_reference(kind: str) -> None:
    spec = FlowerFilter(ifindex=1, priority=1, actions=(ActionRef(kind, 42),))  # type: ignore[arg-type]
    (state,) = decode_filter(filter_add(spec)).actions
    assert state.action == ActionRef(kind, 42)  # type: ignore[arg-type]


def test_a_gact_reference_is_what_tc_sends_and_reads_as_gact_ok() -> None:
    by_ref = FlowerFilter(ifindex=1, priority=1, actions=(ActionRef("gact", 9),))
    by_value = FlowerFilter(ifindex=1, priority=1, actions=(Gact(Control.OK, index=9),))
    assert filter_add(by_ref) == filter_add(by_value)
    assert decode_filter(filter_add(by_ref)).spec == by_value


def test_unset_encodes_release() -> None:
    (state,) = decode_action(action_add(TunnelKeyUnset(index=3)))
    assert state.action == TunnelKeyUnset(index=3)
