"""The traffic meter on a real path: loss-free when the path is whole, and a cut mid-stream
shows up as lost packets and one gap about as long as the cut.

No agents exist yet, so this module installs static routes itself, along one path:
host1 -> leaf1 -> spine1 -> leaf2 -> host3, for host3's red TEP and for the workload
host3-vf0 (routed as if its IP were underlay; host1 answers its workload's ARP by proxy).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from thorn_lab import faults, traffic
from thorn_lab.handle import Lab
from thorn_lab.packets import Kind

PATH = [("host1", "eth1"), ("leaf1", "swp3"), ("spine1", "swp2"), ("leaf2", "swp1")]
CUT_S = 0.3


def _next_hop(lab: Lab, node: str, port: str) -> str:
    return lab.link(f"{node}:{port}").far.addresses[0].split("/")[0]


def _write(key: str, value: str) -> None:
    Path("/proc/sys", key).write_text(value)


@pytest.fixture(scope="module")
def routed(shared_lab: Lab) -> Lab:
    lab = shared_lab
    tep = next(str(t.address) for t in lab.fabric.teps if t.node == "host3")
    workload = lab.workload("host3-vf0").ip
    for node, port in PATH:
        with lab.rtnl(node) as rtnl:
            for dst in (f"{tep}/32", workload):
                rtnl.add_route(dst, gateway=_next_hop(lab, node, port))
    # The workloads' hosts route their traffic (test-only: a real host encapsulates it).
    lab.run("host1", _write, "net/ipv4/ip_forward", "1")
    lab.run("host3", _write, "net/ipv4/ip_forward", "1")
    lab.run("host1", _write, "net/ipv4/conf/vf0_rep/proxy_arp", "1")
    lab.run("host1", _write, "net/ipv4/neigh/vf0_rep/proxy_delay", "0")  # default: up to 0.8 s
    with lab.rtnl("host3") as rtnl:
        rtnl.add_route(workload, oif=rtnl.links()["vf0_rep"].index)
    return lab


def _spec(**fields: object) -> traffic.StreamSpec:
    return traffic.StreamSpec.model_validate(
        {"src": "host1", "dst": "host3", "rate_pps": 1000, "count": 1000, **fields}
    )


def test_a_stream_over_a_whole_path_loses_nothing(routed: Lab) -> None:
    report = traffic.run(routed, _spec())
    assert (report.sent, report.received, report.lost) == (1000, 1000, 0)
    assert (report.reordered, report.duplicates, report.send_errors) == (0, 0, 0)
    assert report.src_ip == "10.224.0.0" and report.dst_ip == "10.224.0.2"
    # 1 ms pacing: no silence anywhere near the 30 ms a failover test must see (the meter's
    # own precision is a benchmark matter: 1.1-1.7 ms on this machine, idle).
    assert report.max_gap_ms < 30
    assert 900 < report.send_rate_pps < 1100


def test_a_roce_shaped_stream_is_metered_by_its_psn(routed: Lab) -> None:
    report = traffic.run(routed, _spec(kind=Kind.roce, size=256, count=500))
    assert report.dst_port == 4791
    assert report.start_psn is not None
    assert (report.received, report.lost, report.strays) == (500, 0, 0)


def test_workloads_are_endpoints_in_their_own_namespaces(routed: Lab) -> None:
    report = traffic.run(routed, _spec(src="host1-vf0", dst="host3-vf0", count=300))
    assert report.src_namespace == routed.workload("host1-vf0").namespace
    assert (report.src_ip, report.dst_ip) == ("100.64.0.1", "100.64.0.3")
    assert report.received == 300


def test_a_cut_mid_stream_shows_as_loss_and_a_gap_as_long_as_the_cut(routed: Lab) -> None:
    stream = traffic.start(routed, _spec(count=2000))
    time.sleep(0.5)
    # The cut starts somewhere inside silent_drop() and ends inside restore(): bound it.
    before_cut = time.monotonic()
    faults.silent_drop(routed, "spine1--leaf2")
    cut_surely = time.monotonic()
    time.sleep(CUT_S)
    surely_cut = time.monotonic()
    faults.restore(routed, "spine1--leaf2")
    after_cut = time.monotonic()
    report = stream.wait()

    assert report.sent == 2000
    assert report.lost == 2000 - report.received
    # Every loss is in the one gap, and the gap is the cut (plus one 1 ms interval).
    assert report.lost_ranges == [(report.max_gap_before_seq + 1, report.max_gap_after_seq - 1)]
    shortest, longest = (surely_cut - cut_surely) * 1000, (after_cut - before_cut) * 1000
    assert shortest - 2 < report.max_gap_ms < longest + 2
    assert CUT_S * 1000 <= report.max_gap_ms < CUT_S * 1000 + 100
    assert 400 < report.max_gap_offset_ms < 700  # it began about 0.5 s into the stream
    assert report.reordered == report.duplicates == 0


def test_a_group_meters_each_of_its_streams_apart_and_a_cut_only_in_those_it_hit(
    routed: Lab,
) -> None:
    """One process for many streams (the failover benchmark's 24 flows): each keeps its own
    sequence, meter and report; a cut shows in the streams it crosses, at its length."""
    specs = [
        _spec(count=1500, port=5101),
        _spec(kind=Kind.roce, size=256, count=1500),
        _spec(src="host1-vf0", dst="host3-vf0", count=1500, port=5102),
    ]
    group = traffic.start_group(routed, specs)
    time.sleep(0.5)
    faults.silent_drop(routed, "spine1--leaf2")
    time.sleep(CUT_S)
    faults.restore(routed, "spine1--leaf2")
    udp, roce, workloads = group.wait()
    for report in (udp, roce, workloads):
        assert report.sent == 1500
        assert report.lost == 1500 - report.received
        assert report.reordered == report.duplicates == report.strays == 0
    assert roce.dst_port == 4791 and roce.start_psn is not None
    assert workloads.src_namespace == routed.workload("host1-vf0").namespace
    for report in (udp, roce, workloads):  # all three cross spine1--leaf2
        assert report.lost_ranges_total == 1
        assert CUT_S * 1000 <= report.max_gap_ms < CUT_S * 1000 + 100


def test_a_stopped_group_reports_what_each_stream_sent_until_then(routed: Lab) -> None:
    group = traffic.start_group(routed, [_spec(count=5000, port=5103),
                                         _spec(count=5000, port=5104)])  # fmt: skip
    time.sleep(0.4)
    group.stop()
    reports = group.wait()
    for report in reports:
        assert 200 < report.sent < 1000
        assert report.received == report.sent
