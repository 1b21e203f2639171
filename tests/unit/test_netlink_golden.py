"""Golden comparisons: our requests against what iproute2's `tc` sends for the same command.

`tc` encodes and sends its request even where the kernel lacks cls_flower/act_tunnel_key (as
on the development machines) and only then reports the kernel's refusal. So each case runs
`tc` under `strace -e write=all` inside a throwaway network namespace (`unshare --net`, gone
when tc exits; `lo` is ifindex 1 there), takes the bytes of its sendmsg, and checks that our
message for the same intent (1) decodes, with our decoder, to the same models as tc's and
(2) is byte-identical once the sequence number is zeroed.

Needs root (for unshare), strace and tc; skipped with the reason when one is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from thorn_programmer.netlink import (
    ETH_P_IP,
    IPPROTO_TCP,
    IPPROTO_UDP,
    ROCEV2_PORT,
    TC_H_EGRESS,
    ActionRef,
    Control,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
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
    filter_delete,
    filter_dump,
    filter_replace,
)
from thorn_programmer.netlink.constants import NlmFlag

LO = 1
TC_TYPES = range(44, 51)  # RTM_NEWTFILTER .. RTM_GETACTION

_missing = [tool for tool in ("tc", "strace", "unshare") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: unshare --net for a throwaway netns"),
    pytest.mark.skipif(bool(_missing), reason=f"needs {', '.join(_missing)} on PATH"),
]

_HEX_LINE = re.compile(r"^(?:\d+ +)? \| [0-9a-f]{5}  ((?:[0-9a-f]{2} {1,2}){1,16})")
_SENDMSG = re.compile(r"^(?:\d+ +)?sendmsg\(")


def sendmsgs(trace: str) -> list[bytes]:
    """The buffers of every sendmsg in an `strace -e write=all` log."""
    buffers: list[bytearray] = []
    for line in trace.splitlines():
        if _SENDMSG.match(line):
            buffers.append(bytearray())
        elif (hex_line := _HEX_LINE.match(line)) and buffers:
            buffers[-1] += bytes.fromhex(hex_line.group(1).replace(" ", ""))
    return [bytes(b) for b in buffers]


def tc_request(command: str, tmp_path: Path) -> bytes:
    """The TC request `tc <command>` sends, sequence number zeroed."""
    log = tmp_path / "strace.log"
    argv = ["unshare", "--net", "strace", "-f", "-qq", "-e", "trace=sendmsg"]
    argv += ["-e", "write=all", "-o", str(log), "tc", *command.split()]
    # tc's exit status is the kernel's verdict (often "not found" here): not our concern.
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert log.exists(), f"strace did not run: {result.stderr}"
    requests = [
        m for m in sendmsgs(log.read_text()) if int.from_bytes(m[4:6], "little") in TC_TYPES
    ]
    assert len(requests) == 1, f"expected one TC request from `tc {command}`: {result.stderr}"
    return zero_seq(requests[0])


def zero_seq(msg: bytes) -> bytes:
    return msg[:8] + bytes(4) + msg[12:]


RED = TunnelKeySet(
    src=ip_address("10.1.0.1"), dst=ip_address("10.2.0.1"), key_id=100, dst_port=4789, index=7
)
ENCAP = FlowerFilter(
    ifindex=LO,
    priority=10,
    handle=1,
    skip_hw=True,
    match=FlowerMatch(dst_ip=ip_network("10.0.2.5/32")),
    actions=(ActionRef("tunnel_key", 7), Mirred.redirect(LO)),
)


@dataclass(frozen=True)
class Case:
    command: str
    ours: Callable[[], bytes]
    # Header flags ours sets on top of tc's (an acked get).
    extra_flags: int = 0


FILTER_CASES = {
    "encap: shared tunnel_key by index, redirect": Case(
        "filter add dev lo ingress protocol ip pref 10 handle 1 flower skip_hw dst_ip 10.0.2.5 "
        "action tunnel_key index 7 action mirred egress redirect dev lo",
        lambda: filter_add(ENCAP),
    ),
    "decap: enc_key_id + enc_dst_ip, unset, redirect": Case(
        "filter add dev lo ingress protocol ip pref 20 handle 2 flower skip_hw "
        "dst_ip 192.168.1.5 enc_key_id 100 enc_dst_ip 10.9.0.1 "
        "action tunnel_key unset action mirred egress redirect dev lo",
        lambda: filter_add(
            FlowerFilter(
                ifindex=LO,
                priority=20,
                handle=2,
                skip_hw=True,
                match=FlowerMatch(
                    dst_ip=ip_network("192.168.1.5/32"),
                    enc_key_id=100,
                    enc_dst_ip=ip_network("10.9.0.1/32"),
                ),
                actions=(TunnelKeyUnset(), Mirred.redirect(LO)),
            )
        ),
    ),
    "RoCEv2 UDP ports, prefixes, egress, skip_sw, drop": Case(
        "filter add dev lo egress protocol ip pref 30 flower skip_sw ip_proto udp "
        "src_ip 10.0.0.0/24 dst_ip 10.1.0.0/16 src_port 49152 dst_port 4791 action gact drop",
        lambda: filter_add(
            FlowerFilter(
                ifindex=LO,
                priority=30,
                parent=TC_H_EGRESS,
                skip_sw=True,
                match=FlowerMatch(
                    ip_proto=IPPROTO_UDP,
                    src_ip=ip_network("10.0.0.0/24"),
                    dst_ip=ip_network("10.1.0.0/16"),
                    src_port=49152,
                    dst_port=ROCEV2_PORT,
                ),
                actions=(Gact(Control.SHOT),),
            )
        ),
    ),
    "IPv6, MACs with a mask, TCP ports, pass": Case(
        "filter add dev lo ingress protocol ipv6 pref 40 flower dst_mac 00:11:22:33:44:55 "
        "src_mac 00:11:22:00:00:00/ff:ff:ff:00:00:00 ip_proto tcp src_ip 2001:db8::/64 "
        "dst_ip 2001:db8:1::1 src_port 1000 dst_port 2000 action pass",
        lambda: filter_add(
            FlowerFilter(
                ifindex=LO,
                priority=40,
                match=FlowerMatch(
                    eth_dst="00:11:22:33:44:55",
                    eth_src="00:11:22:00:00:00",
                    eth_src_mask="ff:ff:ff:00:00:00",
                    ip_proto=IPPROTO_TCP,
                    src_ip=ip_network("2001:db8::/64"),
                    dst_ip=ip_network("2001:db8:1::1/128"),
                    src_port=1000,
                    dst_port=2000,
                ),
                actions=(Gact(Control.OK),),
            )
        ),
    ),
    "chain, classid, IPv6 tunnel keys, tunnel_key set v6, ingress mirror": Case(
        "filter add dev lo ingress protocol ip pref 50 chain 3 handle 0x10 flower classid 1:5 "
        "enc_key_id 5 enc_src_ip 2001:db8::/48 enc_dst_ip 2001:db8::9 enc_dst_port 4789 "
        "action tunnel_key set src_ip 2001:db8::1 dst_ip 2001:db8::2 id 5 dst_port 4789 "
        "tos 0x10 ttl 64 nocsum action mirred ingress mirror dev lo",
        lambda: filter_add(
            FlowerFilter(
                ifindex=LO,
                priority=50,
                chain=3,
                handle=0x10,
                classid=0x10005,
                match=FlowerMatch(
                    eth_type=ETH_P_IP,
                    enc_key_id=5,
                    enc_src_ip=ip_network("2001:db8::/48"),
                    enc_dst_ip=ip_network("2001:db8::9/128"),
                    enc_dst_port=4789,
                ),
                actions=(
                    TunnelKeySet(
                        src=ip_address("2001:db8::1"),
                        dst=ip_address("2001:db8::2"),
                        key_id=5,
                        dst_port=4789,
                        tos=0x10,
                        ttl=64,
                        nocsum=True,
                    ),
                    Mirred.mirror(LO, ingress=True),
                ),
            )
        ),
    ),
    "protocol all, bind mirred and gact by index": Case(
        "filter add dev lo ingress pref 60 flower dst_mac 02:00:00:00:00:01 "
        "action mirred index 8 action gact index 9",
        lambda: filter_add(
            FlowerFilter(
                ifindex=LO,
                priority=60,
                match=FlowerMatch(eth_dst="02:00:00:00:00:01"),
                actions=(ActionRef("mirred", 8), ActionRef("gact", 9)),
            )
        ),
    ),
    "replace": Case(
        "filter replace dev lo ingress protocol ip pref 10 handle 1 flower skip_hw "
        "dst_ip 10.0.2.5 action tunnel_key index 7 action mirred egress redirect dev lo",
        lambda: filter_replace(ENCAP),
    ),
    "delete": Case(
        "filter del dev lo ingress protocol ip pref 10 handle 1 flower",
        lambda: filter_delete(
            FlowerFilter(ifindex=LO, priority=10, handle=1, match=FlowerMatch(eth_type=ETH_P_IP))
        ),
    ),
}

ACTION_CASES = {
    "shared tunnel_key, skip_hw": Case(
        "actions add action tunnel_key set src_ip 10.1.0.1 dst_ip 10.2.0.1 id 100 "
        "dst_port 4789 index 7 skip_hw",
        lambda: action_add(RED, skip_hw=True),
    ),
    "the failover flip": Case(
        "actions replace action tunnel_key set src_ip 10.1.0.1 dst_ip 10.3.0.1 id 100 "
        "dst_port 4789 index 7 skip_hw",
        lambda: action_replace(
            TunnelKeySet(
                src=ip_address("10.1.0.1"),
                dst=ip_address("10.3.0.1"),
                key_id=100,
                dst_port=4789,
                index=7,
            ),
            skip_hw=True,
        ),
    ),
    "shared unset": Case(
        "actions add action tunnel_key unset index 3", lambda: action_add(TunnelKeyUnset(index=3))
    ),
    "shared mirred": Case(
        "actions add action mirred egress redirect dev lo index 8",
        lambda: action_add(Mirred.redirect(LO, index=8)),
    ),
    "shared gact, skip_sw": Case(
        "actions add action gact drop index 9 skip_sw",
        lambda: action_add(Gact(Control.SHOT, index=9), skip_sw=True),
    ),
    "delete": Case("actions del action tunnel_key index 7", lambda: action_delete("tunnel_key", 7)),
    "get (ours asks for an ack)": Case(
        "actions get action tunnel_key index 7",
        lambda: action_get("tunnel_key", 7),
        extra_flags=NlmFlag.ACK,
    ),
}

DUMP_CASES = {
    "filter show": Case("filter show dev lo ingress", lambda: filter_dump(LO)),
    "actions ls": Case("actions ls action tunnel_key", lambda: action_dump("tunnel_key")),
}


def without_flags(msg: bytes, flags: int) -> bytes:
    value = int.from_bytes(msg[6:8], "little") & ~flags
    return msg[:6] + value.to_bytes(2, "little") + msg[8:]


@pytest.mark.parametrize("case", FILTER_CASES.values(), ids=FILTER_CASES.keys())
def test_filters_decode_alike_and_match_byte_for_byte(case: Case, tmp_path: Path) -> None:
    theirs, ours = tc_request(case.command, tmp_path), case.ours()
    assert decode_filter(ours) == decode_filter(theirs)
    assert decode_filter(theirs) == decode_filter(theirs, engine="pyroute2")
    assert ours == theirs


@pytest.mark.parametrize("case", ACTION_CASES.values(), ids=ACTION_CASES.keys())
def test_actions_decode_alike_and_match_byte_for_byte(case: Case, tmp_path: Path) -> None:
    theirs, ours = tc_request(case.command, tmp_path), case.ours()
    assert decode_action(ours) == decode_action(theirs)
    assert decode_action(theirs) == decode_action(theirs, engine="pyroute2")
    assert without_flags(ours, case.extra_flags) == theirs


@pytest.mark.parametrize("case", DUMP_CASES.values(), ids=DUMP_CASES.keys())
def test_dump_requests_match_byte_for_byte(case: Case, tmp_path: Path) -> None:
    assert case.ours() == tc_request(case.command, tmp_path)


def test_the_strace_parser_reads_pid_prefixed_dumps() -> None:
    trace = (
        "123 sendmsg(3, {...}, 0) = 20\n"
        "123  | 00000  14 00 00 00 30 00 05 06  01 00 00 00 00 00 00 00  ................ |\n"
        "123  | 00010  00 00 00 00                                       ....             |\n"
    )
    assert sendmsgs(trace) == [bytes.fromhex("1400000030000506010000000000000000000000")]
