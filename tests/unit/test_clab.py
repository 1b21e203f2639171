"""containerlab import: samples, inheritance, role mapping, skipped parts, broken files."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from textwrap import dedent, indent

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from thorn.clab import ClabError, ClabImport, import_clab, parse_clab
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import FabricDocument, NodeSpec, Role

DATA = Path(__file__).resolve().parent.parent / "data" / "clab"


def _load(name: str) -> ClabImport:
    return parse_clab((DATA / name).read_text())


def _node(doc: FabricDocument, name: str) -> NodeSpec:
    return next(n for n in doc.nodes if n.name == name)


def _links(doc: FabricDocument) -> set[tuple[str, str]]:
    return {(str(lk.a), str(lk.b)) for lk in doc.links}


def _topo(*parts: str) -> str:
    """A clab file whose topology section is the parts (each dedented), in order."""
    body = "\n".join(dedent(part).strip("\n") for part in parts)
    return f"name: t\ntopology:\n{indent(body, '  ')}\n"


# --- the realistic samples ------------------------------------------------------------------


def test_rocefabric_sample_nodes_and_roles() -> None:
    result = _load("rocefabric.clab.yml")
    doc = result.document
    roles = {n.name: n.role for n in doc.nodes}
    assert roles == {
        "spine1": Role.switch,
        "spine2": Role.switch,
        "leaf1": Role.switch,
        "leaf2": Role.switch,
        "border1": Role.switch,
        "gpu1": Role.host,
        "gpu2": Role.host,
        "gpu3": Role.host,
        "gpu4": Role.host,
        "tester": Role.host,  # keysight kind, role from the thorn.role label
    }  # br-mgmt (a bridge) is skipped
    # kinds inheritance through an alias (srl -> nokia_srlinux), defaults labels everywhere.
    spine1 = _node(doc, "spine1")
    assert spine1.labels == {
        "lab": "rocefabric",
        "tier": "spine",
        "clab.kind": "srl",
        "clab.image": "ghcr.io/nokia/srlinux:24.10.1",
    }
    assert spine1.mgmt_address == ipaddress.ip_address("172.30.30.11")
    # The node's own image and labels beat its kind's; IPv6 management address.
    border = _node(doc, "border1")
    assert border.labels["clab.image"] == "ceos:4.32.0F"
    assert border.labels["tier"] == "border"
    assert border.mgmt_address == ipaddress.ip_address("2001:db8:30::31")
    # The kind comes from topology.defaults (linux), with the linux kind's settings.
    gpu3 = _node(doc, "gpu3")
    assert gpu3.labels["clab.kind"] == "linux"
    assert gpu3.labels["tier"] == "host"
    assert gpu3.mgmt_address is None
    # Numeric label values become strings.
    assert _node(doc, "gpu4").labels["graph-level"] == "3"


def test_rocefabric_sample_links_ports_and_warnings() -> None:
    result = _load("rocefabric.clab.yml")
    doc = result.document
    assert _links(doc) == {
        ("leaf1:Ethernet0", "spine1:e1-1"),
        ("leaf1:Ethernet4", "spine2:e1-1"),
        ("leaf2:Ethernet0", "spine1:e1-2"),
        ("leaf2:Ethernet4", "spine2:e1-2"),
        ("border1:eth1", "spine1:e1-3"),
        ("border1:eth2", "spine2:e1-3"),
        ("gpu1:eth1", "leaf1:Ethernet8"),
        ("gpu2:eth1", "leaf1:Ethernet12"),
        ("gpu3:eth1", "leaf2:Ethernet8"),
        ("gpu4:eth1", "leaf2:Ethernet12"),
        ("tester:eth1", "border1:eth3"),
    }
    # Ports come from the endpoints, in order of appearance; extended-syntax MACs are kept
    # (normalised by the model).
    assert [p.name for p in _node(doc, "leaf1").ports] == [
        "Ethernet0",
        "Ethernet4",
        "Ethernet8",
        "Ethernet12",
    ]
    assert [(p.name, p.mac) for p in _node(doc, "gpu4").ports] == [("eth1", "02:aa:00:00:04:01")]
    assert [p.name for p in _node(doc, "gpu1").ports] == ["eth1"]  # eth9 went to the bridge
    assert [(w.loc, w.message.split(" (")[0]) for w in result.warnings] == [
        ("topology.nodes.br-mgmt", "skipped node of kind 'bridge'"),
        ("topology.links[11]", "skipped link to node 'br-mgmt' of kind 'bridge'"),
        ("topology.links[12]", "skipped link to 'host'"),
        ("topology.links[13]", "skipped link of type 'mgmt-net'"),
    ]


@pytest.mark.parametrize("name", ["rocefabric.clab.yml", "srl-groups.clab.yml"])
def test_samples_pass_the_fabric_validator(name: str) -> None:
    doc = _load(name).document
    summary = Fabric.from_document(doc).summary()
    assert summary.links == len(doc.links)
    assert summary.ports == 2 * len(doc.links)


def test_groups_sample() -> None:
    result = _load("srl-groups.clab.yml")
    doc = result.document
    assert result.warnings == []
    assert {n.name: n.role for n in doc.nodes} == {
        "s1": Role.switch,
        "s2": Role.switch,
        "l1": Role.switch,
        "l2": Role.switch,
        "h1": Role.host,
        "h2": Role.host,
    }
    # Group settings: kind, image and labels; kinds keyed by the alias 'srl'.
    h1 = _node(doc, "h1")
    assert h1.labels == {
        "tier": "host",
        "clab.kind": "linux",
        "clab.image": "alpine:3.20",
        "clab.group": "hosts",
    }
    assert _node(doc, "s1").labels["clab.image"] == "ghcr.io/nokia/srlinux:24.10.1"
    assert _node(doc, "l1").labels == {
        "tier": "leaf",
        "clab.kind": "nokia_srlinux",
        "clab.image": "ghcr.io/nokia/srlinux:24.10.1",
    }
    # '/' in interface names is fine (SR Linux ethernet-1/1).
    assert [p.name for p in _node(doc, "s2").ports] == ["ethernet-1/1", "ethernet-1/2"]
    assert len(doc.links) == 8


def test_parse_accepts_bytes_and_import_accepts_parsed_data() -> None:
    text = (DATA / "srl-groups.clab.yml").read_bytes()
    assert parse_clab(text).document == import_clab(yaml.safe_load(text)).document


# --- roles ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "role"),
    [
        ("linux", Role.host),
        ("srl", Role.switch),
        ("nokia_srlinux", Role.switch),
        ("nokia_sros", Role.switch),
        ("vr-sros", Role.switch),
        ("ceos", Role.switch),
        ("arista_ceos", Role.switch),
        ("sonic-vs", Role.switch),
        ("sonic-vm", Role.switch),
        ("dell_sonic", Role.switch),
        ("cvx", Role.switch),
        ("cumulus_cvx", Role.switch),
        ("crpd", Role.switch),
        ("juniper_vjunosswitch", Role.switch),
        ("cisco_xrd", Role.switch),
        ("xrd", Role.switch),
        ("vr-n9kv", Role.switch),
        ("ipinfusion_ocnos", Role.switch),
    ],
)
def test_role_from_kind(kind: str, role: Role) -> None:
    text = _topo(
        f"""
        nodes:
          a: {{kind: {kind}}}
          b: {{kind: linux}}
        links:
          - endpoints: ["a:eth1", "b:eth1"]
        """
    )
    assert _node(parse_clab(text).document, "a").role is role


def test_role_label_wins_over_kind() -> None:
    text = _topo(
        """
        nodes:
          frr: {kind: linux, labels: {thorn.role: switch}}
          srl: {kind: srl, labels: {thorn.role: host}}
          tg: {kind: generic_vm, labels: {thorn.role: host}}
        """
    )
    doc = parse_clab(text).document
    assert [(n.name, n.role) for n in doc.nodes] == [
        ("frr", Role.switch),
        ("srl", Role.host),
        ("tg", Role.host),
    ]


# --- skipped with warnings ------------------------------------------------------------------


def test_external_links_are_skipped_with_warnings() -> None:
    text = _topo(
        """
        nodes:
          a: {kind: linux}
          b: {kind: srl}
          br: {kind: ovs-bridge}
        links:
          - endpoints: ["a:eth1", "b:e1-1"]
          - endpoints: ["a:eth2", "mgmt-net:a-eth2"]
          - endpoints: ["b:e1-2", "macvlan:enp0s3"]
          - endpoints: ["br:p1", "b:e1-3"]
          - type: vxlan
            endpoint: {node: a, interface: eth3}
            remote: 192.0.2.1
            vni: 100
          - type: host
            endpoint: {node: b, interface: e1-4}
            host-interface: b-e1-4
          - type: dummy
            endpoint: {node: a, interface: dummy0}
        """
    )
    result = parse_clab(text)
    assert _links(result.document) == {("a:eth1", "b:e1-1")}
    assert [w.loc for w in result.warnings] == [
        "topology.nodes.br",
        "topology.links[1]",
        "topology.links[2]",
        "topology.links[3]",
        "topology.links[4]",
        "topology.links[5]",
        "topology.links[6]",
    ]
    assert "vxlan" in result.warnings[4].message


def test_unusable_labels_are_skipped_with_a_warning() -> None:
    long_value = "x" * 300
    text = _topo(
        f"""
        nodes:
          a:
            kind: linux
            labels: {{"bad key": "v", ok: yes-this, long: {long_value}}}
        """
    )
    result = parse_clab(text)
    assert _node(result.document, "a").labels == {"ok": "yes-this", "clab.kind": "linux"}
    assert [w.loc for w in result.warnings] == [
        "topology.nodes.a.labels.bad key",
        "topology.nodes.a.labels.long",
    ]


def test_unknown_extended_endpoint_settings_are_warned_about() -> None:
    text = _topo(
        """
        nodes:
          a: {kind: linux}
          b: {kind: srl}
        links:
          - type: veth
            endpoints:
              - {node: a, interface: eth1, vars: {x: 1}}
              - {node: b, interface: e1-1}
        """
    )
    result = parse_clab(text)
    assert len(result.document.links) == 1
    assert [w.loc for w in result.warnings] == ["topology.links[0].endpoints[0].vars"]


# --- broken files ---------------------------------------------------------------------------

_TWO_NODES = """
    nodes:
      srl1: {kind: srl}
      srl2: {kind: srl}
"""


@pytest.mark.parametrize(
    ("text", "loc", "message"),
    [
        pytest.param("topology: [unclosed\n", "line 2, column 1", "not valid YAML", id="not-yaml"),
        pytest.param("\tname: x", "line 1, column 1", "not valid YAML", id="tab-indent"),
        pytest.param("- a\n- b\n", "(document)", "expected a mapping, got a list", id="list"),
        pytest.param("just text", "(document)", "expected a mapping, got a string", id="str"),
        pytest.param("", "(document)", "got nothing", id="empty"),
        pytest.param("name: x\n", "topology", "needs a 'topology' section", id="no-topology"),
        pytest.param("topology: [a]\n", "topology", "expected a mapping", id="topology-list"),
        pytest.param("topology: {}\n", "topology.nodes", "no 'nodes'", id="no-nodes"),
        pytest.param("topology: {nodes: {}}\n", "topology.nodes", "no nodes", id="zero-nodes"),
        pytest.param(
            "topology:\n  nodes:\n    a: {kind: srl}\n    a: {kind: linux}\n",
            "line 4, column 5",
            "duplicate key 'a'",
            id="duplicate-node",
        ),
        pytest.param(
            _topo(
                _TWO_NODES,
                """
                links:
                  - endpoints: ["srl1:e1-1", "srl2:e1-1"]
                  - endpoints: ["srl1:e1-2", "srl3:e1-1"]
                """,
            ),
            "topology.links[1].endpoints[1]",
            "node 'srl3' is not defined",
            id="unknown-node",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - endpoints: ["srl1-e1-1", "srl2:e1-1"]'),
            "topology.links[0].endpoints[0]",
            "not of the form 'node:interface'",
            id="no-colon",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - endpoints: [":e1-1", "srl2:e1-1"]'),
            "topology.links[0].endpoints[0]",
            "not of the form 'node:interface'",
            id="empty-node",
        ),
        pytest.param(
            _topo(
                _TWO_NODES,
                """
                links:
                  - endpoints: ["srl1:e1-1", "srl2:e1-1"]
                  - endpoints: ["srl1:e1-1", "srl2:e1-2"]
                """,
            ),
            "topology.links[1].endpoints[0]",
            "'srl1:e1-1' is already used at topology.links[0].endpoints[0]",
            id="duplicate-endpoint",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - endpoints: ["srl1:e1-1", "srl1:e1-2"]'),
            "topology.links[0].endpoints[1]",
            "joins node 'srl1' to itself",
            id="self-loop",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - endpoints: ["srl1:e1-1", "srl2:e1-1", "srl2:e1-2"]'),
            "topology.links[0].endpoints",
            "exactly two endpoints, got 3",
            id="three-endpoints",
        ),
        pytest.param(
            _topo(_TWO_NODES, "links:\n  - {}"),
            "topology.links[0].endpoints",
            "no 'endpoints'",
            id="no-endpoints",
        ),
        pytest.param(
            _topo(_TWO_NODES, "links: {a: b}"),
            "topology.links",
            "expected a list",
            id="links-mapping",
        ),
        pytest.param(
            _topo(_TWO_NODES, "links:\n  - [srl1:e1-1, srl2:e1-1]"),
            "topology.links[0]",
            "expected a mapping, got a list",
            id="link-list",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - endpoints: ["srl1:e1 1", "srl2:e1-1"]'),
            "topology.links[0].endpoints[0]",
            "interface name 'e1 1' is not valid",
            id="bad-interface",
        ),
        pytest.param(
            _topo(
                _TWO_NODES,
                """
                links:
                  - type: veth
                    endpoints:
                      - {node: srl1, interface: e1-1, mac: "01:00:5e:00:00:01"}
                      - {node: srl2, interface: e1-1}
                """,
            ),
            "topology.links[0].endpoints[0].mac",
            "multicast",
            id="multicast-mac",
        ),
        pytest.param(
            _topo(
                _TWO_NODES,
                """
                links:
                  - type: veth
                    endpoints:
                      - {node: srl1, interface: e1-1, mac: 10:20:30:40:50:51}
                      - {node: srl2, interface: e1-1}
                """,
            ),
            "topology.links[0].endpoints[0].mac",
            "put it in quotes",
            id="sexagesimal-mac",
        ),
        pytest.param(
            _topo(
                _TWO_NODES,
                """
                links:
                  - type: veth
                    endpoints:
                      - {node: srl1, interface: e1-1}
                      - {node: srl2}
                """,
            ),
            "topology.links[0].endpoints[1].interface",
            "no 'interface'",
            id="extended-no-interface",
        ),
        pytest.param(
            _topo(_TWO_NODES, "links:\n  - endpoints: [42, srl2:e1-1]"),
            "topology.links[0].endpoints[0]",
            "got a number",
            id="endpoint-number",
        ),
        pytest.param(
            _topo(_TWO_NODES, 'links:\n  - type: wormhole\n    endpoints: ["srl1:a", "srl2:b"]'),
            "topology.links[0].type",
            "unknown link type 'wormhole'",
            id="unknown-link-type",
        ),
        pytest.param(
            _topo("nodes:\n  bad_name!: {kind: srl}"),
            "topology.nodes.bad_name!",
            "node name 'bad_name!' is not valid",
            id="bad-node-name",
        ),
        pytest.param(
            _topo("nodes:\n  srl1: {image: x}"),
            "topology.nodes.srl1.kind",
            "the node has no kind",
            id="no-kind",
        ),
        pytest.param(
            _topo("nodes:\n  vm1: {kind: generic_vm}"),
            "topology.nodes.vm1.kind",
            "add the label thorn.role",
            id="unknown-kind",
        ),
        pytest.param(
            _topo("nodes:\n  a: {kind: linux, labels: {thorn.role: router}}"),
            "topology.nodes.a.labels.thorn.role",
            "must be 'host' or 'switch'",
            id="bad-role-label",
        ),
        pytest.param(
            _topo("nodes:\n  a: {kind: linux, labels: {x: [1, 2]}}"),
            "topology.nodes.a.labels.x",
            "string or number, got a list",
            id="label-list",
        ),
        pytest.param(
            _topo("defaults: {labels: {x: {y: 1}}}\nnodes:\n  a: {kind: linux}"),
            "topology.defaults.labels.x",
            "got a mapping",
            id="inherited-label-mapping",
        ),
        pytest.param(
            _topo("nodes:\n  a: {kind: linux, mgmt-ipv4: 300.1.1.1}"),
            "topology.nodes.a.mgmt-ipv4",
            "management address '300.1.1.1' is not valid",
            id="bad-mgmt",
        ),
        pytest.param(
            _topo("kinds: [srl]\nnodes:\n  a: {kind: linux}"),
            "topology.kinds",
            "expected a mapping",
            id="kinds-list",
        ),
        pytest.param(
            _topo("nodes:\n  a: {kind: [linux]}"),
            "topology.nodes.a.kind",
            "kind must be a string",
            id="kind-list",
        ),
        pytest.param(
            _topo("nodes:\n  a: linux"),
            "topology.nodes.a",
            "expected a mapping, got a string",
            id="node-string",
        ),
    ],
)
def test_broken_files_name_the_location(text: str, loc: str, message: str) -> None:
    with pytest.raises(ClabError) as caught:
        parse_clab(text)
    assert caught.value.loc == loc, caught.value
    assert message in caught.value.message
    assert str(caught.value) == f"{loc}: {caught.value.message}"


def test_clab_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="topology"):
        parse_clab("name: x")


def test_deeply_nested_yaml_is_rejected_cleanly() -> None:
    with pytest.raises(ClabError) as caught:
        parse_clab("topology: " + "[" * 5000 + "]" * 5000)
    # libyaml stops at its depth limit with a position; the pure-Python parser recurses out.
    assert "nest" in caught.value.message
    assert caught.value.loc.startswith("line 1") or caught.value.loc == "(document)"


# --- property: a generated fabric written as a clab file comes back with the same shape -----


def _as_clab(doc: FabricDocument, brief: bool) -> str:
    nodes = {n.name: {"kind": "linux" if n.role is Role.host else "srl"} for n in doc.nodes}
    links: list[dict[str, object]] = []
    for lk in doc.links:
        if brief:
            links.append({"endpoints": [str(lk.a), str(lk.b)]})
        else:
            links.append(
                {
                    "type": "veth",
                    "endpoints": [
                        {"node": lk.a.node, "interface": lk.a.port},
                        {"node": lk.b.node, "interface": lk.b.port},
                    ],
                }
            )
    return yaml.safe_dump(
        {"name": "gen", "topology": {"nodes": nodes, "links": links}}, sort_keys=False
    )


@settings(max_examples=20, deadline=None)
@given(
    spines=st.integers(1, 3),
    pairs=st.integers(1, 3),
    hosts_per_leaf=st.integers(1, 3),
    dual_homed=st.booleans(),
    brief=st.booleans(),
)
def test_generated_fabric_round_trips_through_clab(
    spines: int, pairs: int, hosts_per_leaf: int, dual_homed: bool, brief: bool
) -> None:
    source = leaf_spine(spines, 2 * pairs, hosts_per_leaf, dual_homed, workloads=False)
    result = parse_clab(_as_clab(source, brief))
    assert result.warnings == []
    doc = result.document
    assert [(n.name, n.role) for n in doc.nodes] == [(n.name, n.role) for n in source.nodes]
    assert _links(doc) == _links(source)
    assert {(n.name, p.name) for n in doc.nodes for p in n.ports} == {
        (n.name, p.name) for n in source.nodes for p in n.ports
    }
    Fabric.from_document(doc)
