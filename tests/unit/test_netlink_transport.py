"""TcSocket against this machine's kernel: requests, dumps, batches, typed refusals.

The host kernel has act_mirred but no cls_flower/act_tunnel_key/act_gact, so shared mirred
actions stand in here; flower and tunnel_key run in tests/kernel/test_tc_codec.py. Each test
works in a network namespace of its own, deleted afterwards. Needs root.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from thorn_programmer.netlink import (
    Control,
    FlowerFilter,
    Mirred,
    MirredAction,
    TcBatchError,
    TcExistsError,
    TcInvalidError,
    TcNotFoundError,
    TcSocket,
    action_add,
    action_delete,
    action_replace,
    filter_add,
    from_netlink_error,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"thorn-nl-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "b0")
        yield name
    finally:
        sh("ip", "netns", "delete", name)


def ifindex(ns: str, dev: str) -> int:
    return int(json.loads(sh("ip", "-n", ns, "-j", "link", "show", dev))[0]["ifindex"])


def tc_actions(ns: str, kind: str) -> list[dict[str, object]]:
    """`tc -j actions ls`: a list of per-message objects, some holding an "actions" list."""
    out = json.loads(sh("ip", "netns", "exec", ns, "tc", "-j", "actions", "ls", "action", kind))
    return [action for part in out for action in part.get("actions", [])]


def test_a_shared_action_is_made_read_back_and_replaced_by_index(netns: str) -> None:
    b0 = ifindex(netns, "b0")
    with TcSocket(netns) as sock:
        sock.request(action_add(Mirred.redirect(b0, index=5)))
        state = sock.action("mirred", 5)
        assert state.action == Mirred.redirect(b0, index=5)
        assert (state.index, state.refcnt, state.bindcnt) == (5, 1, 0)
        (listed,) = tc_actions(netns, "mirred")
        assert (listed["index"], listed["to_dev"], listed["mirred_action"]) == (5, "b0", "redirect")

        sock.request(action_replace(Mirred.mirror(b0, index=5)))
        assert sock.action("mirred", 5).action.action == MirredAction.EGRESS_MIRROR  # type: ignore[union-attr]
        (listed,) = tc_actions(netns, "mirred")
        assert listed["mirred_action"] == "mirror"
        assert listed["control_action"] == {"type": "pipe"}

        sock.request(action_delete("mirred", 5))
        assert sock.actions("mirred") == []


def test_refusals_are_typed_with_the_kernels_reason(netns: str) -> None:
    b0 = ifindex(netns, "b0")
    with TcSocket(netns) as sock:
        sock.request(action_add(Mirred.redirect(b0, index=5)))
        with pytest.raises(TcExistsError):
            sock.request(action_add(Mirred.redirect(b0, index=5)))
        with pytest.raises(TcNotFoundError, match="TC action with specified index not found"):
            sock.action("mirred", 6)
        # No qdisc on a0: the filter is refused before its kind matters.
        orphan = FlowerFilter(ifindex=ifindex(netns, "a0"), priority=1)
        with pytest.raises(TcInvalidError) as refused:
            sock.request(filter_add(orphan))
        assert refused.value.extack == "Parent Qdisc doesn't exists"


def test_a_batch_installs_everything_it_can_and_names_each_refusal(netns: str) -> None:
    b0 = ifindex(netns, "b0")
    with TcSocket(netns) as sock:
        for taken in (10, 250):
            sock.request(action_add(Mirred.redirect(b0, index=taken)))
        msgs = [action_add(Mirred.redirect(b0, index=i)) for i in range(1, 301)]
        with pytest.raises(TcBatchError) as refused:
            sock.send_batch(msgs, chunk_bytes=4096)
        assert [e.index for e in refused.value.errors] == [9, 249]
        assert all(isinstance(e, TcExistsError) for e in refused.value.errors)
        assert len(sock.actions("mirred")) == 300

        flips = [action_replace(Mirred.mirror(b0, index=i)) for i in range(1, 301)]
        calls = sock.send_batch(flips, ack_each=True)
        assert 1 <= calls < 10
        states = sock.actions("mirred")
        assert all(isinstance(s.action, Mirred) for s in states) and len(states) == 300
        assert {s.action.control for s in states} == {Control.PIPE}  # type: ignore[union-attr]
        assert len(tc_actions(netns, "mirred")) == 300


def test_pyroute2s_extack_maps_onto_the_same_errors(netns: str) -> None:
    with IPRoute(netns=netns, ext_ack=True) as ipr:
        ipr.link("add", ifname="vx1", kind="vxlan", vxlan_id=10, vxlan_port=4789)
        with pytest.raises(NetlinkError) as refused:
            ipr.link("add", ifname="vx2", kind="vxlan", vxlan_id=10, vxlan_port=4789)
    error = from_netlink_error(refused.value)
    assert isinstance(error, TcExistsError)
    assert error.extack == "A VXLAN device with the specified VNI already exists"


def test_a_batch_drops_only_the_ack_flag_of_the_messages_before_the_last() -> None:
    """Every other flag survives, APPEND included: an IntFlag complement would drop the
    bits the enum does not name, and an FDB append then silently did nothing."""
    import struct

    from thorn_programmer.netlink import TcSocket as Sock

    def message(flags: int) -> bytes:
        return struct.pack("=IHHII", 16, 28, flags, 0, 0)

    append = 0x1 | 0x4 | 0x400 | 0x800  # REQUEST | ACK | CREATE | APPEND
    chunk = Sock._chunk([message(append), message(append)], 0, 2, 7, False)
    first, second = struct.unpack_from("=H", chunk, 6)[0], struct.unpack_from("=H", chunk, 22)[0]
    assert (first, second) == (append & ~0x4, append)
    assert struct.unpack_from("=I", chunk, 8)[0] == 7
