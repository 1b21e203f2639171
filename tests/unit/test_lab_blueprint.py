"""The lab plan: every namespace, veth, address and setting a fabric becomes (no root needed)."""

from __future__ import annotations

import itertools

import pytest

from thorn.generators import dual_plane, fat_tree, leaf_spine
from thorn.model import FabricDocument, Role
from thorn_lab import names
from thorn_lab.blueprint import LabPlan, NamespaceKind, PlanError, plan_lab


def _all_names(plan: LabPlan) -> tuple[set[str], set[tuple[str, str]]]:
    namespaces = {ns.name for ns in plan.namespaces}
    interfaces = {(e.namespace, e.ifname) for v in plan.veths for e in (v.a, v.b)}
    return namespaces, interfaces


def _doc(ports: dict[str, list[str]], links: list[tuple[str, str]]) -> FabricDocument:
    return FabricDocument.model_validate(
        {
            "nodes": [
                {"name": n, "role": "switch", "ports": [{"name": p} for p in ps]}
                for n, ps in ports.items()
            ],
            "links": [{"a": a, "b": b} for a, b in links],
        }
    )


# --- names -------------------------------------------------------------------------------


def test_every_interface_name_fits_the_kernel_limit() -> None:
    plan = plan_lab(fat_tree(4), "thorn")
    for veth in plan.veths:
        for end in (veth.a, veth.b):
            assert names.valid_ifname(end.ifname), end.ifname
            assert len(end.ifname) <= names.MAX_IFNAME


def test_interfaces_keep_the_fabric_port_names() -> None:
    plan = plan_lab(leaf_spine(2, 2, 2), "thorn")
    assert plan.ports["leaf1"] == {f"swp{i}": f"swp{i}" for i in range(1, 5)}
    assert plan.ports["host1"] == {"eth1": "eth1"}


def test_port_names_linux_refuses_are_mapped_to_distinct_valid_names() -> None:
    assert names.port_ifname("Ethernet1/1") == "Ethernet1_1"
    long_a = names.port_ifname("ethernet-1/1/breakout-1")
    long_b = names.port_ifname("ethernet-1/1/breakout-2")
    assert long_a != long_b
    assert all(names.valid_ifname(n) for n in (long_a, long_b))


def test_two_ports_that_would_share_an_interface_name_are_refused() -> None:
    doc = _doc({"s1": ["a/b", "a_b"], "s2": ["x", "y"]}, [("s1:a/b", "s2:x"), ("s1:a_b", "s2:y")])
    with pytest.raises(PlanError, match="would both be interface 'a_b'"):
        plan_lab(doc, "thorn")


def test_representors_are_vf_rep_and_fit_fifteen_characters() -> None:
    assert names.representor_ifname("vf0") == "vf0_rep"
    long = names.representor_ifname("vf-long-name")  # 12 + 4 > 15
    assert len(long) <= names.MAX_IFNAME and long.endswith("_rep")


@pytest.mark.parametrize("prefix", ["", "Thorn", "th-orn", "1abc", "a" * 17, "a.b"])
def test_a_prefix_must_be_short_lowercase_and_without_dashes(prefix: str) -> None:
    with pytest.raises(PlanError, match="lab prefix"):
        plan_lab(leaf_spine(1, 1, 1), prefix)


def test_two_prefixes_never_collide() -> None:
    # "t" and "t1" are the risky pair: "t-" must never start a "t1-..." name.
    doc = leaf_spine(2, 2, 2)
    prefixes = ["t", "t1", "thorn", "thorn2"]
    plans = {p: plan_lab(doc, p) for p in prefixes}
    for p, q in itertools.permutations(prefixes, 2):
        ours, _ = _all_names(plans[p])
        theirs, _ = _all_names(plans[q])
        assert not ours & theirs
        assert not any(names.is_lab_namespace(p, n) for n in theirs)
    for p in prefixes:
        assert all(names.is_lab_namespace(p, n) for n in _all_names(plans[p])[0])


def test_a_node_and_a_workload_that_would_share_a_namespace_are_refused() -> None:
    doc = leaf_spine(1, 1, 1).model_dump()
    doc["nodes"].append({"name": "w-host1-vf0", "role": "switch"})
    with pytest.raises(PlanError, match="would share namespace 'thorn-w-host1-vf0'"):
        plan_lab(FabricDocument.model_validate(doc), "thorn")


def test_an_invalid_fabric_is_refused_with_the_validator_s_reason() -> None:
    doc = _doc({"s1": ["p1"], "s2": ["p1"]}, [("s1:p1", "s2:nope")])
    with pytest.raises(PlanError, match="not valid"):
        plan_lab(doc, "thorn")


# --- contents ----------------------------------------------------------------------------


def test_every_node_port_link_workload_and_tep_is_in_the_plan() -> None:
    doc = leaf_spine(2, 4, 4)
    plan = plan_lab(doc, "lab")
    nodes = {n.name for n in doc.nodes}
    assert {ns.node for ns in plan.namespaces if ns.kind is not NamespaceKind.workload} == nodes
    assert {ns.workload for ns in plan.namespaces if ns.workload} == {w.name for w in doc.workloads}
    assert len(plan.namespaces) == 6 + 16 + 16

    ends = {(e.node, e.port): e for v in plan.links() for e in (v.a, v.b)}
    for node in doc.nodes:
        for port in node.ports:
            end = ends[(node.name, port.name)]
            assert end.namespace == f"lab-{node.name}"
            assert end.mac == port.mac
            assert end.addresses == [str(port.address)]
    assert {v.name for v in plan.links()} == {f"{lk.a}--{lk.b}" for lk in doc.links}

    loopbacks = {ns.node: ns.loopback for ns in plan.namespaces if ns.kind is NamespaceKind.host}
    for tep in doc.teps:
        assert f"{tep.address}/32" in loopbacks[tep.node]

    for wl in doc.workloads:
        (placed,) = [w for w in plan.workloads if w.name == wl.name]
        assert placed.namespace == f"lab-w-{wl.name}"
        assert (placed.vf, placed.rep, placed.mac, placed.ip) == (
            wl.vf,
            "vf0_rep",
            wl.mac,
            f"{wl.ip}/32",
        )
        (pair,) = [v for v in plan.veths if v.kind == "workload" and v.name == wl.name]
        assert (pair.a.namespace, pair.a.ifname) == (placed.namespace, "vf0")
        assert (pair.b.namespace, pair.b.ifname) == (f"lab-{wl.node}", "vf0_rep")


def test_a_workload_reaches_its_vni_peers_through_a_link_route() -> None:
    plan = plan_lab(leaf_spine(2, 4, 4), "lab")
    # 16 workloads 100.64.0.1-16: the smallest network holding them all is a /27.
    assert {w.subnet for w in plan.workloads} == {"100.64.0.0/27"}


def test_switches_forward_hosts_and_workloads_do_not_and_nobody_filters_reverse_paths() -> None:
    plan = plan_lab(leaf_spine(2, 2, 2), "lab")
    for ns in plan.namespaces:
        assert ns.sysctls["net/ipv4/ip_forward"] == (
            "1" if ns.kind is NamespaceKind.switch else "0"
        )
        assert ns.sysctls["net/ipv4/conf/all/rp_filter"] == "0"
        assert ns.sysctls["net/ipv6/conf/default/disable_ipv6"] == "1"


def test_a_namespace_with_ipv6_addresses_keeps_ipv6_without_autoconfiguration() -> None:
    doc = FabricDocument.model_validate(
        {
            "nodes": [
                {"name": "s1", "role": "switch", "ports": [{"name": "p", "address": "fd00::/127"}]},
                {
                    "name": "s2",
                    "role": "switch",
                    "ports": [{"name": "p", "address": "fd00::1/127"}],
                },
            ],
            "links": [{"a": "s1:p", "b": "s2:p"}],
        }
    )
    (s1, _) = plan_lab(doc, "lab").namespaces
    assert s1.sysctls["net/ipv6/conf/all/disable_ipv6"] == "0"
    assert s1.sysctls["net/ipv6/conf/default/addr_gen_mode"] == "1"
    assert s1.sysctls["net/ipv6/conf/all/forwarding"] == "1"


def test_ports_in_no_link_get_no_device_and_are_reported() -> None:
    doc = _doc({"s1": ["p1", "spare"], "s2": ["p1"]}, [("s1:p1", "s2:p1")])
    plan = plan_lab(doc, "lab")
    assert plan.unlinked_ports == ["s1:spare"]
    assert len(plan.veths) == 1


def test_the_plan_is_deterministic_and_survives_json() -> None:
    doc = dual_plane(2, 2, 2)
    plan = plan_lab(doc, "lab")
    assert plan == plan_lab(doc, "lab")
    assert LabPlan.model_validate_json(plan.model_dump_json()) == plan
    assert all(n.role in (Role.host, Role.switch) for n in doc.nodes)
