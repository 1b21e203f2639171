"""The OpenAPI document says what the validators enforce: for names, MACs, addresses and
labels, a value the model's JSON schema accepts is one the model accepts, and the other way
round (found by the API fuzz lane, tests/integration/test_api_fuzz.py). Each schema is checked
with jsonschema and its format checker, as a client of the document would."""

from __future__ import annotations

import ipaddress
import json
import re
from functools import cache
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import BaseModel, TypeAdapter, ValidationError

from thorn.config import Settings
from thorn.generators import FatTreeParams, LeafSpineParams
from thorn.model import (
    IPV4_INTERFACE_PATTERN,
    MAC_PATTERN,
    FabricDocument,
    LinkSpec,
    LinkUpdate,
    MacAddress,
    NodeSpec,
    NodeUpdate,
    PortSpec,
    Tenant,
    TenantUpdate,
    TokenCreate,
    TokenRotate,
    UsableAddress,
    UsableInterface,
    Vni,
)
from thorn_topology.app import create_app
from thorn_topology.events_api import KINDS

FORMATS = FormatChecker()


@cache
def schema_of(kind: Any) -> Draft202012Validator:
    return Draft202012Validator(TypeAdapter(kind).json_schema(), format_checker=FORMATS)


def accepted(kind: Any, value: object) -> bool:
    try:
        TypeAdapter(kind).validate_json(json.dumps(value))
    except ValidationError:
        return False
    return True


# Text near a MAC: hex digits in both cases, the separators, whitespace, zeros.
near_mac = st.text(alphabet="0123456789abcdefABCDEF:-. \t\n0000\u00a0", min_size=10, max_size=19)
mac_forms = st.from_regex(MAC_PATTERN)


@settings(max_examples=300, deadline=None)
@given(st.one_of(near_mac, mac_forms, st.text(max_size=20)))
@example("02:00:5e:10:00:01")
@example("  02-00-5E-10-00-01 ")
@example("01:00:5e:00:00:01")  # multicast
@example("00-00-00-00-00-00")  # all-zero
@example("02:00-5e:10:00:01")  # mixed separators
def test_the_documented_mac_pattern_accepts_exactly_what_the_validator_accepts(
    text: str,
) -> None:
    assert schema_of(MacAddress).is_valid(text) == accepted(MacAddress, text)


addresses = st.ip_addresses().map(str)
spellings = st.sampled_from(["::", "::1", "0::1", "0:0:0:0:0:0:0:1", "::0001", "0.0.0.0",
                             "127.0.0.1", "224.0.0.5", "239.255.255.255", "ff02::1", "FF05::2",
                             "ff::1", "::ffff:127.0.0.1", "fe80::1%eth0", "10.0.0.1"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.one_of(addresses, spellings, st.integers(0, 2**32), st.text(max_size=12)))
def test_the_documented_address_schema_accepts_exactly_what_the_validator_accepts(
    value: object,
) -> None:
    assert schema_of(UsableAddress).is_valid(value) == accepted(UsableAddress, value)


v4_interfaces = st.builds(
    lambda address, length: f"{address}/{length}" if length is not None else str(address),
    st.ip_addresses(v=4),
    st.none() | st.integers(0, 33),
)


def ipv4_interface_shape(text: str) -> bool:
    """A dotted quad ipaddress reads, then optionally /0 to /32 without padding."""
    address, slash, length = text.partition("/")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return not slash or (re.fullmatch(r"0|[1-9][0-9]?", length) is not None and int(length) <= 32)


def network_or_broadcast(text: str) -> bool:
    interface = ipaddress.IPv4Interface(text)
    net = interface.network
    return net.num_addresses > 2 and interface.ip in (net.network_address, net.broadcast_address)


@settings(max_examples=300, deadline=None)
@given(v4_interfaces | st.sampled_from(["10.0.0.1/024", "10.0.0.1/255.255.255.0", "10.0.0.1/ 24"]))
def test_the_documented_ipv4_interface_schema_accepts_what_the_validator_accepts(
    text: str,
) -> None:
    """Beyond the shape, one rule is in the description only (a pattern cannot state it):
    below /31, not the network or broadcast address of the prefix."""
    assert Draft202012Validator({"pattern": IPV4_INTERFACE_PATTERN}).is_valid(text) == (
        ipv4_interface_shape(text)
    )
    documented = schema_of(UsableInterface).is_valid(text)
    if documented and not network_or_broadcast(text):
        assert accepted(UsableInterface, text)
    if accepted(UsableInterface, text):
        assert documented


v6_interfaces = st.builds(
    lambda address, length: f"{address}/{length}" if length is not None else str(address),
    st.ip_addresses(v=6),
    st.none() | st.integers(0, 129),
)


@settings(max_examples=200, deadline=None)
@given(v6_interfaces)
def test_an_ipv6_interface_the_validator_accepts_is_documented_as_valid(text: str) -> None:
    if accepted(UsableInterface, text):
        assert schema_of(UsableInterface).is_valid(text)


def test_an_address_or_interface_given_as_a_number_is_refused() -> None:
    assert not accepted(UsableAddress, 16909060)
    assert not accepted(UsableInterface, 5)
    assert not schema_of(UsableAddress).is_valid(16909060)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=70) | st.from_regex(r"\A[a-z][a-z0-9./_-]{0,70}\Z"),
                       st.text(max_size=260), max_size=3))  # fmt: skip
@example({"0\n": ""})  # found by hypothesis in CI: a key with a newline at its end
def test_documented_label_keys_and_values_are_exactly_the_accepted_ones(
    labels: dict[str, str],
) -> None:
    node = {"name": "leaf1", "role": "switch", "labels": labels}
    # The document's patterns are ECMA-262 regular expressions, where '$' ends the text (a
    # browser's reading). Python's re, in the jsonschema package, also lets '$' match before
    # a last newline: it would take 'a\n' for a key the API refuses.
    document = jsonschema_rs.validator_for(NodeSpec.model_json_schema())
    try:
        NodeSpec.model_validate_json(json.dumps(node))
        ok = True
    except ValidationError:
        ok = False
    assert document.is_valid(node) == ok


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (NodeUpdate, "admin_state"),
        (NodeUpdate, "offload"),
        (LinkUpdate, "admin_state"),
        (TenantUpdate, "description"),
    ],
)
def test_a_field_that_may_be_left_out_but_not_null_is_documented_without_null(
    model: type[BaseModel], field: str
) -> None:
    document = Draft202012Validator(model.model_json_schema())
    assert not document.is_valid({field: None})
    with pytest.raises(ValidationError, match="not set to null"):
        model.model_validate({field: None})
    assert document.is_valid({})


@settings(deadline=None)
@given(st.integers(-2, 44))
def test_the_document_says_a_fat_tree_k_is_even_and_in_range(k: int) -> None:
    params = {"k": k}
    documented = Draft202012Validator(FatTreeParams.model_json_schema()).is_valid(params)
    assert documented == accepted(FatTreeParams, params)


@settings(deadline=None)
@given(st.integers(1, 12), st.booleans() | st.none())
def test_the_document_says_a_dual_homed_leaf_spine_has_an_even_leaf_count(
    leaves: int, dual_homed: bool | None
) -> None:
    params: dict[str, object] = {"leaves": leaves, "hosts_per_leaf": 1}
    if dual_homed is not None:
        params["dual_homed"] = dual_homed
    documented = Draft202012Validator(LeafSpineParams.model_json_schema()).is_valid(params)
    assert documented == accepted(LeafSpineParams, params)


@settings(max_examples=300, deadline=None)
@given(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._/:-]{0,12}:[A-Za-z0-9._/:-]{0,12}\Z")
    | st.text(max_size=20)
)
def test_a_link_end_written_as_text_is_documented_as_the_validator_reads_it(text: str) -> None:
    link = {"a": text, "b": {"node": "spine1", "port": "swp1"}}
    document = Draft202012Validator(LinkSpec.model_json_schema())
    try:
        LinkSpec.model_validate_json(json.dumps(link))
        ok = True
    except ValidationError as exc:
        # a link from spine1 to itself is a rule across both ends, not the text form's
        ok = "self-loop" in str(exc)
    assert document.is_valid(link) == ok


def test_an_exported_document_with_link_ids_is_valid_by_the_document_and_on_import() -> None:
    exported = {"links": [{"id": 7, "a": "leaf1:swp1", "b": "spine1:swp1"}]}
    assert Draft202012Validator(FabricDocument.model_json_schema()).is_valid(exported)
    assert FabricDocument.model_validate(exported).links[0] == LinkSpec.model_validate(
        {"a": "leaf1:swp1", "b": "spine1:swp1"}
    )
    wrong = {"links": [{"id": "seven", "a": "leaf1:swp1", "b": "spine1:swp1"}]}
    assert not Draft202012Validator(FabricDocument.model_json_schema()).is_valid(wrong)
    with pytest.raises(ValidationError, match="id"):
        FabricDocument.model_validate(wrong)


@cache
def topology_document() -> dict[str, Any]:
    document: dict[str, Any] = create_app(Settings()).openapi()
    return document


def query_schema(path: str, name: str) -> dict[str, Any]:
    parameters = topology_document()["paths"][path]["get"]["parameters"]
    schema: dict[str, Any] = next(p["schema"] for p in parameters if p["name"] == name)
    return schema


def test_the_document_says_a_label_filter_is_key_equals_value() -> None:
    document = Draft202012Validator(query_schema("/api/v1/nodes", "label"))
    assert document.is_valid(["rack=r1", "tier="])
    assert not document.is_valid(["rack"])


def test_the_document_names_every_event_kind_and_only_those() -> None:
    document = Draft202012Validator(query_schema("/api/v1/events", "kind"))
    assert document.is_valid(list(KINDS))
    assert not document.is_valid(["gossip"])


@pytest.mark.parametrize(
    ("model", "valid", "field", "low"),
    [
        (Tenant, {"name": "t"}, "nccl_ib_timeout", 1),
        (TenantUpdate, {}, "nccl_ib_retry_cnt", 0),
        (PortSpec, {"name": "eth1"}, "speed_mbps", 1),
        (Vni, {"name": "v", "tenant": "t"}, "vni", 1),
        (FabricDocument, {}, "revision", 0),
        (TokenRotate, {}, "overlap_seconds", 0),
        (TokenCreate, {"name": "ci", "role": "viewer"}, "ttl_seconds", 60),
    ],
)
def test_an_integer_field_takes_what_json_schema_calls_an_integer(
    model: type[BaseModel], valid: dict[str, Any], field: str, low: int
) -> None:
    """3.0 is an integer to JSON Schema; true and "3" are not, though pydantic's lax int
    reads them (found by the API fuzz lane: `"nccl_ib_retry_cnt": false` was stored as 0)."""
    schema = Draft202012Validator(model.model_json_schema())
    for ok in (low, float(low)):
        assert schema.is_valid({**valid, field: ok})
        model.model_validate_json(json.dumps({**valid, field: ok}))
    for wrong in (True, False, str(low), low - 1):  # and the range still documented
        assert not schema.is_valid({**valid, field: wrong})
        with pytest.raises(ValidationError):
            model.model_validate_json(json.dumps({**valid, field: wrong}))
