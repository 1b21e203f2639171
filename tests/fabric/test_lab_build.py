"""A lab comes up as planned, re-up is a no-op that repairs, down leaves nothing behind."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from thorn import netns
from thorn.generators import leaf_spine
from thorn_lab import build, names, state
from thorn_lab.handle import Lab
from thorn_lab.status import collect


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _sysctl(lab: Lab, node: str, key: str) -> str:
    def read() -> str:
        with open(f"/proc/sys/{key}") as handle:
            return handle.read().strip()

    return lab.run(node, read)


def test_a_lab_has_every_namespace_interface_address_and_tep(
    make_lab: Callable[..., Lab],
) -> None:
    lab = make_lab()
    ours = {n for n in netns.listed() if names.is_lab_namespace(lab.prefix, n)}
    assert ours == {ns.name for ns in lab.plan.namespaces}

    report = collect(lab)
    assert report.healthy
    for link in report.links:
        for end in (link.a, link.b):
            assert (end.present, end.admin_up, end.carrier, end.operstate) == (
                True,
                True,
                True,
                "UP",
            ), link.name

    # iproute2 sees the same lab: names, MACs and addresses from the fabric document.
    port = next(p for n in lab.fabric.nodes if n.name == "leaf1" for p in n.ports)
    shown = _ip("-n", lab.namespace("leaf1"), "-br", "addr", "show", "dev", port.name)
    assert str(port.address) in shown
    assert port.mac in _ip("-n", lab.namespace("leaf1"), "link", "show", port.name)
    teps = _ip("-n", lab.namespace("host1"), "-br", "addr", "show", "dev", "lo")
    assert {"10.224.0.0/32", "10.240.0.0/32"} <= set(teps.split())

    workload = lab.workload("host1-vf0")
    vf = _ip("-n", workload.namespace, "-br", "addr", "show", "dev", "vf0")
    assert "100.64.0.1/32" in vf
    assert "vf0_rep" in _ip("-n", lab.namespace("host1"), "-br", "link")


def test_the_two_ends_of_every_veth_have_different_ifindexes(
    make_lab: Callable[..., Lab],
) -> None:
    """Equal ifindexes make linkwatch treat a veth like a physical port and report its
    carrier changes up to a second late (see tests/fabric/test_link_monitor.py)."""
    lab = make_lab()
    indexes = {ns.name: _ifindexes(ns.name) for ns in lab.plan.namespaces}
    for veth in lab.plan.veths:
        a = indexes[veth.a.namespace][veth.a.ifname]
        b = indexes[veth.b.namespace][veth.b.ifname]
        assert a != b, veth.name


def _ifindexes(namespace: str) -> dict[str, int]:
    out = _ip("-n", namespace, "-o", "link")
    return {line.split(": ")[1].split("@")[0]: int(line.split(":")[0]) for line in out.splitlines()}


def test_switches_forward_and_ipv6_is_off(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab()
    assert _sysctl(lab, "spine1", "net/ipv4/ip_forward") == "1"
    assert _sysctl(lab, "host1", "net/ipv4/ip_forward") == "0"
    assert _sysctl(lab, "leaf1", "net/ipv4/conf/all/rp_filter") == "0"
    assert _sysctl(lab, "leaf1", "net/ipv6/conf/swp1/disable_ipv6") == "1"
    assert _sysctl(lab, "host1-vf0", "net/ipv6/conf/vf0/disable_ipv6") == "1"


def test_up_again_is_a_no_op_and_repairs_what_was_removed(
    make_lab: Callable[..., Lab],
) -> None:
    doc = leaf_spine(2, 2, 2)
    lab = make_lab(doc)
    again = build.up(doc, lab.prefix)
    assert (again.created_namespaces, again.created_veths, again.repairs) == (0, 0, [])

    # Damage: a whole namespace (its veths die with it), a peer's address, a port taken down.
    netns.remove(lab.namespace("leaf2"))
    with lab.rtnl("spine1") as spine:
        swp1 = spine.links()["swp1"]
        spine.set_admin(swp1.index, False)
    _ip("-n", lab.namespace("host1"), "addr", "flush", "dev", "eth1")

    repaired = build.up(doc, lab.prefix)
    assert repaired.created_namespaces == 1
    assert repaired.created_veths == 4  # leaf2's two hosts and two spines
    assert any("host1:eth1" in r for r in repaired.repairs)
    assert any("spine1:swp1 admin up" in r for r in repaired.repairs)
    assert collect(lab).healthy


def test_up_refuses_another_fabric_under_the_same_prefix_unless_replacing(
    make_lab: Callable[..., Lab],
) -> None:
    lab = make_lab(leaf_spine(1, 1, 1))
    with pytest.raises(build.LabConflict, match="another fabric"):
        build.up(leaf_spine(2, 2, 2), lab.prefix)
    result = build.up(leaf_spine(1, 2, 1), lab.prefix, replace=True)
    assert result.created_namespaces == result.namespaces
    assert Lab.open(lab.prefix).namespaces().keys() == {
        "spine1",
        "leaf1",
        "leaf2",
        "host1",
        "host2",
    }


def test_down_leaves_nothing_behind_and_is_idempotent(make_lab: Callable[..., Lab]) -> None:
    lab = make_lab()
    result = build.down(lab.prefix)
    assert result.namespaces == len(lab.plan.namespaces)
    assert not [n for n in netns.listed() if names.is_lab_namespace(lab.prefix, n)]
    assert lab.prefix not in _ip("-o", "link", "show", "type", "veth")
    assert not names.state_dir(lab.prefix).exists()
    assert not (names.STATE_ROOT / f".{lab.prefix}.lock").exists()
    assert state.load_description(lab.prefix) is None
    again = build.down(lab.prefix)
    assert (again.namespaces, again.state_removed) == (0, False)


def test_two_labs_coexist_and_one_going_down_leaves_the_other(
    make_lab: Callable[..., Lab],
) -> None:
    first, second = make_lab(), make_lab()
    assert first.namespace("leaf1") != second.namespace("leaf1")
    assert collect(first).healthy and collect(second).healthy
    build.down(first.prefix)
    assert collect(second).healthy
    assert netns.exists(second.namespace("leaf1"))


def test_a_2x4x4_lab_builds_well_under_20_seconds(make_lab: Callable[..., Lab]) -> None:
    doc = leaf_spine(2, 4, 4)
    lab = make_lab(leaf_spine(1, 1, 1))
    build.down(lab.prefix)
    result = build.up(doc, lab.prefix)
    assert (result.namespaces, result.veths) == (38, 40)
    assert result.not_up == []
    assert result.seconds < 20
