"""The domain model: each entity validated on its own (formats, ranges, normalisation)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from thorn.model import (
    FabricDocument,
    IfName,
    LinkSpec,
    LinkUpdate,
    MacAddress,
    Name,
    NodeSpec,
    NodeUpdate,
    PortName,
    PortRef,
    PortSpec,
    Tenant,
    Tep,
    Vni,
    Workload,
)


def error_types(exc: pytest.ExceptionInfo[ValidationError]) -> set[str]:
    return {e["type"] for e in exc.value.errors()}


def error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> set[tuple[int | str, ...]]:
    return {tuple(e["loc"]) for e in exc.value.errors()}


MAC = TypeAdapter(MacAddress)

# --- MAC addresses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        "02:00:5e:10:00:01",
        "02:00:5E:10:00:01",
        "02-00-5e-10-00-01",
        "02-00-5E-10-00-01",
        "02005e100001",
        "02005E100001",
        "  02:00:5e:10:00:01 ",
    ],
)
def test_a_mac_is_normalised_to_lower_case_colon_form(given: str) -> None:
    assert MAC.validate_python(given) == "02:00:5e:10:00:01"


def test_a_port_mac_is_normalised_on_the_model() -> None:
    assert PortSpec(name="eth1", mac="AA-BB-CC-DD-EE-FF").mac == "aa:bb:cc:dd:ee:ff"


@pytest.mark.parametrize(
    "given",
    [
        "02:00-5e:10:00:01",  # mixed separators
        "02:00:5e:10:00",  # five octets
        "02:00:5e:10:00:01:02",  # seven octets
        "0200.5e10.0001",  # dotted form is not accepted
        "02:00:5e:10:00:0g",
        "2:0:5e:10:0:1",
        "",
    ],
)
def test_a_malformed_mac_is_rejected(given: str) -> None:
    with pytest.raises(ValidationError, match="not a MAC address"):
        MAC.validate_python(given)


@pytest.mark.parametrize("given", ["01:00:5e:00:00:01", "33:33:00:00:00:01", "ff:ff:ff:ff:ff:ff"])
def test_a_multicast_or_broadcast_mac_is_rejected(given: str) -> None:
    with pytest.raises(ValidationError, match="multicast"):
        MAC.validate_python(given)


@pytest.mark.parametrize("given", ["00:00:00:00:00:00", "000000000000", "00-00-00-00-00-00"])
def test_the_all_zero_mac_is_rejected(given: str) -> None:
    with pytest.raises(ValidationError, match="all-zero"):
        MAC.validate_python(given)


def test_a_mac_must_be_a_string() -> None:
    with pytest.raises(ValidationError):
        MAC.validate_python(0x02005E100001)


# --- VNIs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [1, 4096, 16_777_215])
def test_a_vni_between_1_and_16777215_is_accepted(number: int) -> None:
    assert Vni(vni=number, name="v", tenant="t").vni == number


@pytest.mark.parametrize("number", [0, -1, 16_777_216])
def test_a_vni_outside_1_to_16777215_is_rejected(number: int) -> None:
    with pytest.raises(ValidationError) as exc:
        Vni(vni=number, name="v", tenant="t")
    assert error_locs(exc) == {("vni",)}


def test_a_workload_vni_has_the_same_bounds() -> None:
    with pytest.raises(ValidationError):
        Workload(name="w", node="h", vni=0, mac="02:00:00:00:00:01", ip="192.168.0.1")


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "leaf1", "Leaf-1", "host1.rack_2", "9x", "a" * 63])
def test_a_name_is_1_to_63_safe_characters_starting_alphanumeric(name: str) -> None:
    assert TypeAdapter(Name).validate_python(name) == name


@pytest.mark.parametrize("name", ["", "-a", ".a", "_a", "a b", "a/b", "a:b", "a" * 64, "é", "a\n"])
def test_a_name_with_unsafe_characters_or_too_long_is_rejected(name: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(Name).validate_python(name)


@pytest.mark.parametrize("name", ["eth1", "Ethernet1/1", "ethernet-1/1", "swp1s0.100"])
def test_a_port_name_may_contain_a_slash(name: str) -> None:
    assert TypeAdapter(PortName).validate_python(name) == name


@pytest.mark.parametrize("name", ["eth:1", "/eth1", "", "e" * 65])
def test_a_port_name_may_not_contain_a_colon_or_start_with_a_slash(name: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(PortName).validate_python(name)


def test_a_vf_name_is_a_linux_netdev_name_of_at_most_15_characters() -> None:
    assert TypeAdapter(IfName).validate_python("v" * 15) == "v" * 15
    for bad in ["v" * 16, "vf/0", "vf:0", "vf 0"]:
        with pytest.raises(ValidationError):
            TypeAdapter(IfName).validate_python(bad)


def test_a_node_name_is_checked_on_the_node() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeSpec(name="bad name", role="switch")
    assert error_locs(exc) == {("name",)}


# --- interface addresses ---------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1/24",
        "10.0.0.254/24",
        "10.0.0.0/31",
        "10.0.0.1/31",
        "10.0.0.7/32",
        "2001:db8::1/64",
        "2001:db8::/127",
        "2001:db8::1/127",
        "2001:db8::5/128",
    ],
)
def test_a_usable_interface_address_is_accepted(address: str) -> None:
    assert PortSpec(name="eth1", address=address).address == ipaddress.ip_interface(address)


def test_an_address_without_a_prefix_is_a_host_route() -> None:
    assert PortSpec(name="eth1", address="10.0.0.9").address == ipaddress.ip_interface(
        "10.0.0.9/32"
    )


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.0/24",  # network address
        "10.0.0.255/24",  # broadcast address
        "10.0.0.0/30",
        "10.0.0.3/30",
        "2001:db8::/64",
        "2001:db8::/126",
    ],
)
def test_an_interface_address_may_not_be_the_network_or_broadcast_address_below_slash_31(
    address: str,
) -> None:
    with pytest.raises(ValidationError, match="network or broadcast") as exc:
        PortSpec(name="eth1", address=address)
    assert error_locs(exc) == {("address",)}


@pytest.mark.parametrize(
    "address", ["224.0.0.5/24", "127.0.0.2/8", "0.0.0.0/0", "::1/128", "::/128", "ff02::1/64"]
)
def test_a_multicast_loopback_or_unspecified_interface_address_is_refused(address: str) -> None:
    with pytest.raises(ValidationError, match="multicast, unspecified or loopback"):
        PortSpec(name="eth1", address=address)


@pytest.mark.parametrize(
    "address", ["224.0.0.1", "239.1.1.1", "127.0.0.1", "0.0.0.0", "::1", "::", "ff02::1"]
)
def test_a_multicast_loopback_or_unspecified_address_is_refused_everywhere(address: str) -> None:
    with pytest.raises(ValidationError, match="multicast, unspecified or loopback"):
        NodeSpec(name="n", role="host", mgmt_address=address)
    with pytest.raises(ValidationError, match="multicast, unspecified or loopback"):
        NodeUpdate(mgmt_address=address)
    with pytest.raises(ValidationError, match="multicast, unspecified or loopback"):
        Tep(node="h", colour="red", address=address)
    with pytest.raises(ValidationError, match="multicast, unspecified or loopback"):
        Workload(name="w", node="h", vni=1, mac="02:00:00:00:00:01", ip=address)


@pytest.mark.parametrize("address", ["10.0.0.300", "not-an-ip", "10.0.0.1/33", ""])
def test_a_malformed_address_is_rejected(address: str) -> None:
    with pytest.raises(ValidationError):
        PortSpec(name="eth1", address=address)


# --- unknown fields and wrong types ------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (NodeSpec, {"name": "n", "role": "host", "colour": "red"}),
        (PortSpec, {"name": "eth1", "adress": "10.0.0.1/31"}),
        (LinkSpec, {"a": "a:e1", "b": "b:e1", "id": 3}),
        (Tenant, {"name": "t", "owner": "me"}),
        (NodeUpdate, {"role": "switch"}),
        (FabricDocument, {"nodes": [], "switches": []}),
    ],
)
def test_an_unknown_field_is_refused(model: type[BaseModel], data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(data)
    assert error_types(exc) == {"extra_forbidden"}


def test_an_unknown_field_nested_in_a_document_is_refused_with_its_location() -> None:
    data = {"nodes": [{"name": "n", "role": "host", "ports": [{"name": "e1", "vlan": 5}]}]}
    with pytest.raises(ValidationError) as exc:
        FabricDocument.model_validate(data)
    assert error_locs(exc) == {("nodes", 0, "ports", 0, "vlan")}


@pytest.mark.parametrize(
    ("model", "data", "loc"),
    [
        (NodeSpec, {"name": "n", "role": "router"}, ("role",)),
        (NodeSpec, {"name": "n", "role": "host", "admin_state": "sleepy"}, ("admin_state",)),
        (NodeSpec, {"name": "n", "role": "host", "ports": "eth1"}, ("ports",)),
        (NodeSpec, {"name": 7, "role": "host"}, ("name",)),
        (PortSpec, {"name": "e1", "speed_mbps": "fast"}, ("speed_mbps",)),
        (PortSpec, {"name": "e1", "speed_mbps": 0}, ("speed_mbps",)),
        (Vni, {"vni": "ten", "name": "v", "tenant": "t"}, ("vni",)),
        (Tep, {"node": "h", "colour": "green", "address": "10.0.0.1"}, ("colour",)),
        (FabricDocument, {"format": "thorn.fabric/v2"}, ("format",)),
        (FabricDocument, {"revision": -1}, ("revision",)),
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_refused(
    model: type[BaseModel], data: dict[str, Any], loc: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(data)
    assert error_locs(exc) == {loc}


def test_models_are_immutable() -> None:
    port = PortSpec(name="eth1")
    with pytest.raises(ValidationError):
        port.name = "eth2"  # type: ignore[misc]


# --- port references and links -------------------------------------------------------------


def test_a_port_ref_is_parsed_from_node_colon_port() -> None:
    ref = PortRef.model_validate("leaf1:Ethernet1/1")
    assert (ref.node, ref.port) == ("leaf1", "Ethernet1/1")
    assert str(ref) == "leaf1:Ethernet1/1"


def test_a_port_ref_also_accepts_a_mapping() -> None:
    assert PortRef.model_validate({"node": "leaf1", "port": "eth1"}) == PortRef.model_validate(
        "leaf1:eth1"
    )


@pytest.mark.parametrize("text", ["leaf1", "leaf1:", ":eth1", ":", ""])
def test_a_port_ref_string_without_both_node_and_port_is_rejected(text: str) -> None:
    with pytest.raises(ValidationError, match="not a port reference"):
        PortRef.model_validate(text)


@pytest.mark.parametrize("text", ["leaf1:eth:1", "bad node:eth1", "leaf1:eth 1"])
def test_a_port_ref_string_with_invalid_parts_is_rejected(text: str) -> None:
    with pytest.raises(ValidationError):
        PortRef.model_validate(text)


def test_a_link_from_a_node_to_itself_is_rejected() -> None:
    with pytest.raises(ValidationError, match="self-loop"):
        LinkSpec(a="leaf1:eth1", b="leaf1:eth2")


def test_a_link_between_two_nodes_is_accepted() -> None:
    link = LinkSpec(a="leaf1:eth1", b="spine1:eth1")
    assert (str(link.a), str(link.b)) == ("leaf1:eth1", "spine1:eth1")
    assert link.srlgs == []
    assert link.admin_state == "up"


def test_a_links_srlgs_are_deduplicated_and_sorted() -> None:
    link = LinkSpec(a="a:e1", b="b:e1", srlgs=["duct-7", "conduit:3", "duct-7", "bundle/1"])
    assert link.srlgs == ["bundle/1", "conduit:3", "duct-7"]
    assert LinkUpdate(srlgs=["z", "a", "z"]).srlgs == ["a", "z"]


def test_an_srlg_name_is_checked() -> None:
    with pytest.raises(ValidationError):
        LinkSpec(a="a:e1", b="b:e1", srlgs=["bad name"])


# --- the fabric document -----------------------------------------------------------------


def test_a_fabric_document_accepts_an_exported_document_and_ignores_link_ids() -> None:
    exported = {
        "format": "thorn.fabric/v1",
        "revision": 42,
        "nodes": [
            {"name": "a", "role": "switch", "ports": [{"name": "e1", "address": "10.0.0.0/31"}]},
            {"name": "b", "role": "switch", "ports": [{"name": "e1", "address": "10.0.0.1/31"}]},
        ],
        "links": [
            {
                "id": 17,
                "a": {"node": "a", "port": "e1"},
                "b": "b:e1",
                "srlgs": [],
                "admin_state": "up",
            }
        ],
        "tenants": [],
        "vnis": [],
        "workloads": [],
        "teps": [],
    }
    doc = FabricDocument.model_validate(exported)
    assert doc.revision == 42
    assert doc.links == [LinkSpec(a="a:e1", b="b:e1")]
    assert "id" not in doc.links[0].model_dump()


def test_an_empty_fabric_document_is_valid() -> None:
    doc = FabricDocument.model_validate({})
    assert doc.format == "thorn.fabric/v1"
    assert doc.revision is None
    assert (doc.nodes, doc.links, doc.tenants, doc.vnis, doc.workloads, doc.teps) == (
        [],
        [],
        [],
        [],
        [],
        [],
    )


def test_a_fabric_document_round_trips_through_json() -> None:
    doc = FabricDocument.model_validate(
        {
            "nodes": [
                {
                    "name": "h1",
                    "role": "host",
                    "mgmt_address": "172.16.0.1",
                    "labels": {"tier": "host"},
                    "ports": [
                        {"name": "eth1", "mac": "02-00-00-00-00-01", "address": "10.0.0.0/31"}
                    ],
                }
            ],
            "tenants": [{"name": "t"}],
            "vnis": [{"vni": 1000, "name": "v", "tenant": "t"}],
            "workloads": [
                {
                    "name": "w",
                    "node": "h1",
                    "vni": 1000,
                    "mac": "06:00:00:00:00:01",
                    "ip": "100.64.0.1",
                }
            ],
            "teps": [{"node": "h1", "colour": "red", "address": "10.224.0.1"}],
        }
    )
    assert FabricDocument.model_validate_json(doc.model_dump_json()) == doc
