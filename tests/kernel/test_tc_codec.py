"""Our flower/tunnel_key encoder against a real kernel: install, read back twice, flip, refuse.

Everything here is installed with `thorn_programmer.netlink` (never `tc`), then read back
both with `tc -j` (iproute2's own decoder, JSON) and with our decoder, and both must say what
was asked. One emulated host per test, in a namespace of its own:

    vf0 ── rep0 (ingress: encap filters)        vxlan0 (external; ingress: decap filters)
    lo 10.1.0.1 = the local TEP                 red 10.2.0.254/24, blue 10.3.0.254/24:
                                                veths toward the red and blue TEPs

Outside the kernel lane (THORN_KERNEL_LANE unset) the tests skip when the kernel lacks the
modules; inside it that is a failure.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
from netlab import NetnsFactory, entered

from thorn_programmer.netlink import (
    IPPROTO_UDP,
    ROCEV2_PORT,
    Action,
    ActionRef,
    Control,
    FilterState,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
    TcBatchError,
    TcError,
    TcExistsError,
    TcInvalidError,
    TcNotFoundError,
    TcNotSupportedError,
    TcSocket,
    TunnelKeySet,
    TunnelKeyUnset,
    action_add,
    action_delete,
    action_dump,
    action_get,
    action_replace,
    decode_action,
    decode_filters,
    filter_add,
    filter_delete,
    filter_dump,
)

IN_LANE = os.environ.get("THORN_KERNEL_LANE") == "1"
MODULES = ("cls_flower", "act_tunnel_key", "act_mirred", "act_gact", "vxlan", "veth")

LOCAL_TEP, RED_TEP, BLUE_TEP = "10.1.0.1", "10.2.0.1", "10.3.0.1"
PEERS = ("10.0.2.5", "10.0.2.6")
SHARED = 7


def shared_tunnel_key(tep: str) -> TunnelKeySet:
    return TunnelKeySet(
        src=ip_address(LOCAL_TEP), dst=ip_address(tep), key_id=100, dst_port=4789, index=SHARED
    )


RED, BLUE = shared_tunnel_key(RED_TEP), shared_tunnel_key(BLUE_TEP)


@pytest.fixture(scope="module", autouse=True)
def flower_kernel() -> None:
    """Skip without cls_flower & co., except in the lane, where that is a failure."""
    if os.geteuid() == 0:
        subprocess.run(["modprobe", "-q", "-a", *MODULES], check=False)
    missing = [m for m in MODULES if not Path(f"/sys/module/{m}").exists()]
    if not missing:
        return
    reason = f"kernel without {', '.join(missing)} (or not root)"
    if IN_LANE:
        pytest.fail(f"THORN_KERNEL_LANE=1 but {reason}")
    pytest.skip(f"{reason}: run `.venv/bin/python tests/kernel/lane.py`")


def run(*args: str, stdin: str | None = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"`{' '.join(args)}`: {result.stderr.strip()}"
    return result.stdout


def tc_json(ns: str, *args: str) -> Any:
    return json.loads(run("tc", "-n", ns, "-j", *args))


@dataclass(frozen=True)
class Site:
    ns: str
    rep0: int
    vxlan0: int


def links(ns: str) -> dict[str, dict[str, Any]]:
    return {link["ifname"]: link for link in json.loads(run("ip", "-n", ns, "-j", "-s", "link"))}


@pytest.fixture
def site(netns: NetnsFactory) -> Iterator[Site]:
    ns = netns("codec")
    commands = [
        "link add rep0 type veth peer name vf0",
        "link add red type veth peer name red-peer",
        "link add blue type veth peer name blue-peer",
        "link add vxlan0 type vxlan dstport 4789 external",
        f"addr add {LOCAL_TEP}/32 dev lo",
        "addr add 10.0.2.1/24 dev vf0",
        "addr add 10.2.0.254/24 dev red",
        "addr add 10.3.0.254/24 dev blue",
        *(f"link set {dev} up" for dev in ("rep0", "vf0", "red", "red-peer", "blue")),
        *(f"link set {dev} up" for dev in ("blue-peer", "vxlan0")),
        # Static neighbours: no ARP in the counters, no wait for resolution.
        *(f"neigh add {peer} lladdr 02:00:00:00:00:0{i} dev vf0" for i, peer in enumerate(PEERS)),
        f"neigh add {RED_TEP} lladdr 02:00:00:00:02:01 dev red",
        f"neigh add {BLUE_TEP} lladdr 02:00:00:00:03:01 dev blue",
    ]
    run("ip", "-n", ns, "-batch", "-", stdin="\n".join(commands) + "\n")
    run(
        "tc",
        "-n",
        ns,
        "-batch",
        "-",
        stdin="qdisc add dev rep0 ingress\nqdisc add dev vxlan0 ingress\n",
    )
    deadline = time.monotonic() + 10
    while any(links(ns)[dev]["operstate"] != "UP" for dev in ("vf0", "rep0", "red", "blue")):
        assert time.monotonic() < deadline, "veths did not come up"
        time.sleep(0.2)
    found = links(ns)
    yield Site(ns, found["rep0"]["ifindex"], found["vxlan0"]["ifindex"])


def encap(site: Site, handle: int, peer: str) -> FlowerFilter:
    return FlowerFilter(
        ifindex=site.rep0,
        priority=10,
        handle=handle,
        skip_hw=True,
        match=FlowerMatch(dst_ip=ip_network(f"{peer}/32")),
        actions=(ActionRef("tunnel_key", SHARED), Mirred.redirect(site.vxlan0)),
    )


def install_encap(site: Site, sock: TcSocket) -> list[FlowerFilter]:
    sock.request(action_add(RED, skip_hw=True))
    specs = [encap(site, handle, peer) for handle, peer in enumerate(PEERS, start=1)]
    for spec in specs:
        sock.request(filter_add(spec))
    return specs


def as_read_back(asked: FlowerFilter, state: FilterState, shared: Action) -> FlowerFilter:
    """What a dump must show for `asked`: references resolved, kernel-chosen indexes filled."""
    actions = tuple(
        shared if isinstance(a, ActionRef) else replace(a, index=s.index)
        for a, s in zip(asked.actions, state.actions, strict=True)
    )
    return replace(asked, actions=actions)


def tc_filters(ns: str, dev: str, *extra: str) -> list[dict[str, Any]]:
    """`tc -j filter show`, without the per-priority head entries."""
    entries = tc_json(ns, *extra, "filter", "show", "dev", dev, "ingress")
    return [entry for entry in entries if "options" in entry]


def tc_actions(ns: str, kind: str) -> list[dict[str, Any]]:
    parts = tc_json(ns, "actions", "ls", "action", kind)
    return [action for part in parts for action in part.get("actions", [])]


def send_udp(ns: str, counts: dict[str, int]) -> None:
    with entered(ns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for peer, count in counts.items():
            for _ in range(count):
                sock.sendto(b"x" * 64, (peer, ROCEV2_PORT))


def tx_packets(ns: str) -> dict[str, int]:
    found = links(ns)
    return {dev: found[dev]["stats64"]["tx"]["packets"] for dev in ("red", "blue")}


def test_encap_filters_and_their_shared_action_read_back_as_asked(site: Site) -> None:
    with TcSocket(site.ns) as sock:
        asked = install_encap(site, sock)
        states = sock.filters(site.rep0)
        shared = sock.action("tunnel_key", SHARED)
        listed = sock.actions("tunnel_key")
        dump = sock.dump(action_dump("tunnel_key"))
    assert [s.spec for s in states] == [
        as_read_back(a, s, RED) for a, s in zip(asked, states, strict=True)
    ]
    for state in states:
        assert (state.not_in_hw, state.in_hw, state.in_hw_count, state.unmodelled) == (
            True,
            False,
            0,
            (),
        )
        assert state.actions[0].bindcnt == 2 and state.actions[1].index > 0
    assert (shared.action, shared.refcnt, shared.bindcnt, shared.skip_hw) == (RED, 3, 2, True)
    assert listed == [shared]
    assert [s for part in dump for s in decode_action(part, engine="pyroute2")] == listed

    # iproute2's reading of the same kernel state.
    theirs = tc_filters(site.ns, "rep0")
    assert [(t["protocol"], t["pref"], t["options"]["handle"]) for t in theirs] == [
        ("ip", 10, 1),
        ("ip", 10, 2),
    ]
    for t, state, peer in zip(theirs, states, PEERS, strict=True):
        options = t["options"]
        assert options["keys"] == {"eth_type": "ipv4", "dst_ip": peer}
        assert options["skip_hw"] is True and options["not_in_hw"] is True
        tunnel, mirred = options["actions"]
        assert {k: tunnel[k] for k in ("kind", "mode", "src_ip", "dst_ip", "key_id")} == {
            "kind": "tunnel_key",
            "mode": "set",
            "src_ip": LOCAL_TEP,
            "dst_ip": RED_TEP,
            "key_id": 100,
        }
        assert (tunnel["dst_port"], tunnel["index"], tunnel["bind"]) == (4789, SHARED, 2)
        assert (mirred["kind"], mirred["mirred_action"], mirred["to_dev"]) == (
            "mirred",
            "redirect",
            "vxlan0",
        )
        assert mirred["index"] == state.actions[1].index
    (action,) = tc_actions(site.ns, "tunnel_key")
    assert (action["index"], action["dst_ip"], action["ref"], action["bind"]) == (
        SHARED,
        RED_TEP,
        3,
        2,
    )
    assert action["skip_hw"] is True


def test_every_modelled_key_and_action_reads_back(site: Site) -> None:
    asked = FlowerFilter(
        ifindex=site.vxlan0,
        priority=20,
        handle=5,
        chain=3,
        classid=0x10005,
        skip_hw=True,
        match=FlowerMatch(
            eth_dst="02:00:00:00:00:01",
            eth_dst_mask="ff:ff:ff:00:00:00",
            eth_src="02:00:00:00:00:02",
            ip_proto=IPPROTO_UDP,
            src_ip=ip_network("2001:db8::/64"),
            dst_ip=ip_network("2001:db8:1::1/128"),
            src_port=49152,
            dst_port=ROCEV2_PORT,
            enc_key_id=100,
            enc_src_ip=ip_network("10.2.0.0/16"),
            enc_dst_ip=ip_network(f"{LOCAL_TEP}/32"),
            enc_dst_port=4789,
        ),
        actions=(
            TunnelKeyUnset(),
            Gact(Control.PIPE),
            Mirred.mirror(site.rep0),
            TunnelKeySet(
                src=ip_address("2001:db8::1"),
                dst=ip_address("2001:db8::2"),
                key_id=5,
                dst_port=4789,
                tos=0x10,
                ttl=64,
                nocsum=True,
            ),
            Mirred.redirect(site.rep0),
        ),
    )
    with TcSocket(site.ns) as sock:
        sock.request(filter_add(asked))
        (state,) = sock.filters(site.vxlan0)
        dump = sock.dump(filter_dump(site.vxlan0))
    assert state.spec == as_read_back(asked, state, RED)
    assert state.unmodelled == ()
    assert decode_filters(dump, engine="pyroute2") == [state]  # the reference decoder agrees

    (theirs,) = tc_filters(site.ns, "vxlan0")
    assert (theirs["protocol"], theirs["pref"], theirs["chain"]) == ("ipv6", 20, 3)
    assert theirs["options"]["classid"] == "1:5"
    assert theirs["options"]["keys"] == {
        "dst_mac": "02:00:00:00:00:01/24",
        "src_mac": "02:00:00:00:00:02",
        "eth_type": "ipv6",
        "ip_proto": "udp",
        "dst_ip": "2001:db8:1::1",
        "src_ip": "2001:db8::/64",
        "dst_port": ROCEV2_PORT,
        "src_port": 49152,
        "enc_dst_ip": LOCAL_TEP,
        "enc_src_ip": "10.2.0.0/16",
        "enc_key_id": 100,
        "enc_dst_port": 4789,
    }
    kinds = [
        (a["kind"], a.get("mode") or a.get("mirred_action")) for a in theirs["options"]["actions"]
    ]
    assert kinds == [
        ("tunnel_key", "unset"),
        ("gact", None),
        ("mirred", "mirror"),
        ("tunnel_key", "set"),
        ("mirred", "redirect"),
    ]
    v6 = theirs["options"]["actions"][3]
    assert (v6["src_ip"], v6["dst_ip"], v6["flag"], v6["tos"], v6["ttl"]) == (
        "2001:db8::1",
        "2001:db8::2",
        "nocsum",
        0x10,
        64,
    )


def test_one_replace_by_index_moves_both_filters_and_their_traffic(site: Site) -> None:
    flip_to_blue = action_replace(BLUE, skip_hw=True)  # prebuilt, as the agent keeps it
    with TcSocket(site.ns) as sock:
        install_encap(site, sock)
        before = tx_packets(site.ns)
        send_udp(site.ns, {PEERS[0]: 5, PEERS[1]: 3})
        red = tx_packets(site.ns)
        assert (red["red"] - before["red"], red["blue"] - before["blue"]) == (8, 0)
        states = sock.filters(site.rep0)
        assert [s.actions[0].counters.packets for s in states] == [8, 8]
        assert [s.actions[1].counters.packets for s in states] == [5, 3]
        theirs = tc_filters(site.ns, "rep0", "-s")
        for t, state in zip(theirs, states, strict=True):
            for their_action, ours in zip(t["options"]["actions"], state.actions, strict=True):
                stats = their_action["stats"]
                assert (stats["bytes"], stats["packets"]) == (
                    ours.counters.bytes,
                    ours.counters.packets,
                )

        sock.request(flip_to_blue)
        assert [s.actions[0].action for s in sock.filters(site.rep0)] == [BLUE, BLUE]
        assert [t["options"]["actions"][0]["dst_ip"] for t in tc_filters(site.ns, "rep0")] == [
            BLUE_TEP,
            BLUE_TEP,
        ]
        send_udp(site.ns, {PEERS[0]: 4, PEERS[1]: 4})
        blue = tx_packets(site.ns)
        assert (blue["red"] - red["red"], blue["blue"] - red["blue"]) == (0, 8)
        assert sock.action("tunnel_key", SHARED).counters.packets == 16


def test_refusals_come_back_typed_with_the_kernels_words(site: Site) -> None:
    unflagged = FlowerFilter(
        ifindex=site.rep0, priority=30, actions=(ActionRef("tunnel_key", SHARED),)
    )
    cases: list[tuple[bytes, type[TcError], int, str | None]] = [
        (action_add(RED, skip_hw=True), TcExistsError, 17, "TC IDR already exists"),
        (filter_add(encap(site, 1, PEERS[0])), TcExistsError, 17, "Filter already exists"),
        (
            action_get("tunnel_key", 99),
            TcNotFoundError,
            2,
            "TC action with specified index not found",
        ),
        (
            filter_delete(encap(site, 77, PEERS[0])),
            TcNotFoundError,
            2,
            "Specified filter handle not found",
        ),
        (
            filter_delete(replace(encap(site, 1, PEERS[0]), priority=77)),
            TcNotFoundError,
            2,
            "Filter with specified priority/protocol not found",
        ),
        (
            filter_add(unflagged),
            TcInvalidError,
            22,
            "Mismatch between action and filter offload flags",
        ),
        (
            filter_add(replace(unflagged, skip_hw=True, actions=(ActionRef("tunnel_key", 99),))),
            TcInvalidError,
            22,
            "Unknown tunnel key action",
        ),
        # veth cannot offload: skip_sw has nowhere to go (6.1 gives no extack here).
        (
            filter_add(replace(unflagged, skip_sw=True, actions=(Gact(),))),
            TcNotSupportedError,
            95,
            None,
        ),
        (action_delete("tunnel_key", SHARED), TcError, 1, "Failed to delete TC action"),
    ]
    with TcSocket(site.ns) as sock:
        install_encap(site, sock)
        for msg, cls, code, extack in cases:
            with pytest.raises(cls) as refused:
                sock.request(msg)
            assert (refused.value.errno, refused.value.extack) == (code, extack)
        # Nothing was half-applied: the two filters and the action are as they were.
        assert len(sock.filters(site.rep0)) == 2
        assert sock.action("tunnel_key", SHARED).bindcnt == 2


def test_a_batch_installs_many_rules_and_names_each_refusal(site: Site) -> None:
    count = 400
    specs = [
        replace(
            encap(site, handle, PEERS[0]),
            priority=100,
            match=FlowerMatch(dst_ip=ip_network(f"10.100.{handle // 256}.{handle % 256}/32")),
        )
        for handle in range(1, count + 1)
    ]
    msgs = [filter_add(spec) for spec in specs]
    msgs.insert(250, filter_add(specs[0]))  # a duplicate of handle 1
    with TcSocket(site.ns) as sock:
        sock.request(action_add(RED, skip_hw=True))
        start = time.perf_counter()
        with pytest.raises(TcBatchError) as refused:
            sock.send_batch(msgs)
        elapsed = time.perf_counter() - start
        assert [(e.index, e.errno, e.extack) for e in refused.value.errors] == [
            (250, 17, "Filter already exists")
        ]
        states = sock.filters(site.rep0)
        assert sorted(s.spec.handle for s in states) == list(range(1, count + 1))
        assert sock.action("tunnel_key", SHARED).bindcnt == count
        # A large action dump (more than TCA_ACT_MAX_PRIO per message, numbered from 0).
        sock.send_batch([action_add(Gact(Control.SHOT, index=i)) for i in range(1, 101)])
        assert sorted(a.index for a in sock.actions("gact")) == list(range(1, 101))
    print(f"\n{count + 1} flower filter requests in one batch: {elapsed * 1e3:.0f} ms (TCG)")
    assert len(tc_filters(site.ns, "rep0")) == count
    assert len(tc_actions(site.ns, "gact")) == 100
