"""The fabric's domain model: what every service, the API and the import format agree on.

Each model validates one entity on its own (formats, ranges, normalisation). Rules that span
entities (unique names, a link joins two existing ports, addresses do not overlap) live in
`thorn.fabric`, which checks a whole fabric.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializeAsAny,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

FABRIC_FORMAT: Literal["thorn.fabric/v1"] = "thorn.fabric/v1"

# A DNS-label-like name: safe in URLs, CLI arguments, Linux netns names and log lines.
NAME_MAX = 63
Name = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"),
    Field(description="1-63 characters: letters, digits, '.', '_', '-'; starts alphanumeric"),
]
# Switch port names carry '/' (Ethernet1/1, ethernet-1/1); ':' is reserved for "node:port".
PortName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,63}$"),
    Field(description="interface name: letters, digits, '.', '_', '/', '-'; no ':'"),
]
# Linux netdev names: at most 15 bytes, no '/', ':' or whitespace.
IfName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$"),
    Field(description="Linux interface name, at most 15 characters"),
]
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=253)]
# pydantic documents dict keys as patternProperties, which lets any other key through; the
# validator refuses them, and propertyNames says so.
Labels = Annotated[
    dict[LabelKey, LabelValue],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": LABEL_KEY_PATTERN},
            "additionalProperties": {"type": "string", "maxLength": 253},
            "description": "key: 1-63 characters (letters, digits, '.', '_', '/', '-'; starts "
            "alphanumeric); value: at most 253 characters",
        }
    ),
]
SrlgName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,62}$")]


def _json_integer(value: object) -> object:
    """An integer as JSON Schema reads one: 3 or 3.0, not true or "3", which pydantic's lax
    int would also read (as 1 and 3)."""
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


JsonInt = BeforeValidator(_json_integer)
# (JsonInt after the constraints: before them, pydantic documents ge/le, not minimum/maximum.)
VniNumber = Annotated[
    int, Field(ge=1, le=16_777_215, description="VXLAN network identifier"), JsonInt
]
SpeedMbps = Annotated[int, Field(ge=1, le=1_600_000, description="port speed in Mb/s"), JsonInt]

_MAC_RE = re.compile(r"^[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}$")


def _mac(value: object) -> object:
    """Normalise a MAC address to lower-case colon form; reject multicast and all-zero."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if not _MAC_RE.match(text):
        raise ValueError(f"'{value}' is not a MAC address (expected aa:bb:cc:dd:ee:ff)")
    digits = re.sub(r"[:-]", "", text)
    if int(digits[0:2], 16) & 1:
        raise ValueError(f"'{value}' is a multicast MAC; a port or VF needs a unicast MAC")
    if int(digits, 16) == 0:
        raise ValueError("the all-zero MAC is not a valid port or VF address")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


# What _mac accepts, for the OpenAPI document (tests/unit/test_model_schemas.py holds the two
# together): six octets with ':', '-' or nothing between them, either case, surrounding
# whitespace stripped; unicast (the first octet's lowest bit clear) and not all-zero.
_HEX = "[0-9A-Fa-f]"
MAC_PATTERN = (
    r"^(?![\s0:-]*$)\s*"
    rf"{_HEX}[02468ACEace](?:(?::{_HEX}{{2}}){{5}}|(?:-{_HEX}{{2}}){{5}}|{_HEX}{{10}})\s*$"
)
MacAddress = Annotated[
    str,
    BeforeValidator(_mac),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": MAC_PATTERN,
            "description": "unicast MAC (not multicast, not all-zero): aa:bb:cc:dd:ee:ff, "
            "aa-bb-cc-dd-ee-ff or aabbccddeeff in either case; normalised to aa:bb:cc:dd:ee:ff",
        }
    ),
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _address_text(value: object) -> object:
    """An address comes as text. ipaddress would also read a number (16909060 is 1.2.3.4),
    which no JSON client means; a zone index (fe80::1%eth0) names an interface of one host,
    not a fabric address."""
    if isinstance(value, str):
        if "%" in value:
            raise ValueError(f"'{value}' has a zone index ('%'): give the address alone")
        return value
    if isinstance(value, IPAddress | IPInterface):
        return value  # built in Python (generators, tests)
    raise ValueError(f"an address is text such as 10.0.0.1, not {type(value).__name__}")


def _interface_text(value: object) -> object:
    """An interface address is an address with an optional prefix length (10.0.0.0/31); the
    netmask forms ipaddress also reads (/255.255.255.0) are refused, as is a padded length."""
    value = _address_text(value)
    if isinstance(value, str) and "/" in value:
        length = value.rpartition("/")[2]
        if not re.fullmatch(r"0|[1-9][0-9]{0,2}", length):
            raise ValueError(f"'{value}': give the prefix as a length in bits, e.g. /31")
    return value


def _usable_address(value: IPAddress) -> IPAddress:
    if value.is_multicast or value.is_unspecified or value.is_loopback:
        raise ValueError(f"{value} is a multicast, unspecified or loopback address")
    return value


def _usable_interface(value: IPInterface) -> IPInterface:
    _usable_address(value.ip)
    net = value.network
    point_to_point = net.num_addresses <= 2  # /31, /32, /127, /128 have no network/broadcast
    if not point_to_point and value.ip in (net.network_address, net.broadcast_address):
        raise ValueError(f"{value} is the network or broadcast address of {net}")
    return value


# What _usable_address refuses, as the OpenAPI document says it (tests/unit/
# test_model_schemas.py holds the two together): loopback, multicast and unspecified
# addresses, an IPv6 one however it is written.
_UNUSABLE = {
    "anyOf": [
        {"pattern": r"^(127|22[4-9]|23[0-9])\."},  # 127.0.0.0/8, 224.0.0.0/4
        {"pattern": r"^0\.0\.0\.0(/|$)"},
        {"pattern": r"^[fF]{2}[0-9A-Fa-f]{2}:"},  # ff00::/8
        {"pattern": r"^[0:]*1?(/|$)"},  # :: and ::1
    ]
}
_V4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4_INTERFACE_PATTERN = rf"^{_V4_OCTET}(\.{_V4_OCTET}){{3}}(/(3[0-2]|[12][0-9]|[0-9]))?$"
# The shape of an IPv6 one (its address: the ipv6interface format, as ipaddress reads it).
IPV6_INTERFACE_PATTERN = r"^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?$"
UsableAddress = Annotated[
    IPAddress,
    BeforeValidator(_address_text),
    AfterValidator(_usable_address),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "format": "ipv4"}, {"type": "string", "format": "ipv6"}],
            "not": _UNUSABLE,
            "description": "an IPv4 or IPv6 address; not loopback, multicast or unspecified",
        }
    ),
]
UsableInterface = Annotated[
    IPInterface,
    BeforeValidator(_interface_text),
    AfterValidator(_usable_interface),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "ipv4interface", "pattern": IPV4_INTERFACE_PATTERN},
                {"type": "string", "format": "ipv6interface", "pattern": IPV6_INTERFACE_PATTERN},
            ],
            "not": _UNUSABLE,
            "description": "an address with an optional prefix length, e.g. 10.0.0.0/31 (none: "
            "/32 or /128); not loopback, multicast or unspecified; below /31 (/127) not the "
            "network or broadcast address of its prefix",
        }
    ),
]


class Role(StrEnum):
    host = "host"
    switch = "switch"


class OffloadPolicy(StrEnum):
    """A host's TC offload: `auto` puts rules in the NIC (skip_sw) where it is a switchdev
    eswitch that accepts them, else in software (skip_hw); `hardware` always asks for the
    NIC (refused where it cannot); `software` never does. Ignored on switches."""

    auto = "auto"
    hardware = "hardware"
    software = "software"


class AdminState(StrEnum):
    """up carries traffic; drained is avoided by path computation; down is out of service."""

    up = "up"
    down = "down"
    drained = "drained"


class Colour(StrEnum):
    """The two disjoint path colours every host pair is pinned to: the one colour type of
    THORN. As text ("red", "blue") in documents and APIs; `position` (0, 1) where per-colour
    data sits in pairs (path computation's trees)."""

    red = "red"
    blue = "blue"

    position: int

    def __init__(self, value: str) -> None:
        self.position = 0 if value == "red" else 1  # a plain attribute: read in hot loops

    @property
    def other(self) -> Colour:
        return Colour.blue if self is Colour.red else Colour.red


class TokenRole(StrEnum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"

    def allows(self, needed: TokenRole) -> bool:
        order = [TokenRole.viewer, TokenRole.operator, TokenRole.admin]
        return order.index(self) >= order.index(needed)


class Strict(BaseModel):
    """Every boundary model rejects unknown fields, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- ports and nodes ---------------------------------------------------------------------


class PortSpec(Strict):
    name: PortName
    mac: MacAddress | None = None
    address: UsableInterface | None = None
    speed_mbps: SpeedMbps | None = None


class PortUpdate(Strict):
    """PATCH body: only the fields given change; null clears a field."""

    mac: MacAddress | None = None
    address: UsableInterface | None = None
    speed_mbps: SpeedMbps | None = None


class Port(PortSpec):
    node: Name


class NodeBase(Strict):
    name: Name
    role: Role
    mgmt_address: UsableAddress | None = None
    labels: Labels = Field(default_factory=dict)
    admin_state: AdminState = AdminState.up
    offload: OffloadPolicy = Field(
        OffloadPolicy.auto,
        description="hosts: where the datapath's TC rules run (auto, "
        "hardware, software); see docs/datapath.md",
    )


class NodeSpec(NodeBase):
    """A node as it appears in a fabric document and in a create request: with its ports."""

    ports: list[PortSpec] = Field(default_factory=list)


class Node(NodeBase):
    """A stored node; its ports are their own resource."""


def _not_null(value: object) -> object:
    if value is None:
        raise ValueError("may be left out, but not set to null")
    return value


def _no_null_in_schema(schema: dict[str, Any]) -> None:
    """The document of a field that may be left out but not set to null (_not_null): its
    type without the null branch pydantic gives an optional field."""
    branches = [b for b in schema.pop("anyOf") if b != {"type": "null"}]
    (kept,) = branches
    schema.update(kept)
    schema.pop("default", None)  # null, which the field refuses


def _not_null_field() -> Any:
    return Field(None, json_schema_extra=_no_null_in_schema)


class NodeUpdate(Strict):
    """PATCH body: only the fields given change; null clears mgmt_address and labels."""

    mgmt_address: UsableAddress | None = None
    labels: Labels | None = None
    admin_state: Annotated[AdminState | None, BeforeValidator(_not_null)] = _not_null_field()
    offload: Annotated[OffloadPolicy | None, BeforeValidator(_not_null)] = _not_null_field()


# --- links -------------------------------------------------------------------------------


class PortRef(Strict):
    node: Name
    port: PortName

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        # "leaf1:eth1" is accepted wherever a port reference is expected.
        if isinstance(data, str):
            node, sep, port = data.partition(":")
            if not sep or not node or not port:
                raise ValueError(f"'{data}' is not a port reference (expected 'node:port')")
            return {"node": node, "port": port}
        return data

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


def _unique_sorted(values: list[str]) -> list[str]:
    return sorted(set(values))


# What PortRef reads from text, for the OpenAPI document: a Name, ':', a PortName.
PORT_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}:[A-Za-z0-9][A-Za-z0-9._/-]{0,63}$"


def _or_node_colon_port(schema: dict[str, Any]) -> None:
    """A link end is a port reference or its text form, 'leaf1:swp1'."""
    as_object = dict(schema)
    schema.clear()
    text = {"type": "string", "pattern": PORT_REF_PATTERN, "description": "node:port"}
    schema["anyOf"] = [as_object, text]


LinkEnd = Annotated[PortRef, Field(json_schema_extra=_or_node_colon_port)]


class LinkSpec(Strict):
    a: LinkEnd
    b: LinkEnd
    srlgs: Annotated[list[SrlgName], AfterValidator(_unique_sorted)] = Field(
        default_factory=list, description="shared-risk link groups this link belongs to"
    )
    admin_state: AdminState = AdminState.up

    @model_validator(mode="after")
    def _not_a_self_loop(self) -> LinkSpec:
        if self.a.node == self.b.node:
            # A rule across fields, which no JSON schema can state: its own error type
            # (`value`, as the routes' cross-field checks), not a field's value_error.
            msg = "link joins node '{node}' to itself (self-loop)"
            raise PydanticCustomError("value", msg, {"node": self.a.node})
        return self


class Link(LinkSpec):
    # A stored link's ends are always objects: only a request may give "node:port" text.
    a: PortRef
    b: PortRef
    id: int


class Miscabled(Strict):
    """The cabling check heard a link's ends contradict the declaration (`reason`)."""

    link_id: int
    reason: Annotated[str, StringConstraints(max_length=500)]


class LinkUpdate(Strict):
    """PATCH body: only the fields given change; null clears srlgs."""

    srlgs: Annotated[list[SrlgName], AfterValidator(_unique_sorted)] | None = None
    admin_state: Annotated[AdminState | None, BeforeValidator(_not_null)] = _not_null_field()


# --- tenants, VNIs, workloads, TEPs ------------------------------------------------------


# NCCL's own defaults (src/transport/net_ib.cc: IB_TIMEOUT 20 since NCCL 2.23, 18 before
# that; IB_RETRY_CNT 7): what a tenant's jobs run with unless the admin declares otherwise.
NCCL_DEFAULT_IB_TIMEOUT = 20
NCCL_DEFAULT_IB_RETRY_CNT = 7
IbTimeout = Annotated[
    int,
    Field(
        ge=1,
        le=31,
        description="NCCL_IB_TIMEOUT of the tenant's jobs: one RC timeout is 4.096 us x 2^value;"
        " 1-31 (0, the IB spec's infinite timeout, leaves no budget to judge); null: not"
        f" declared, NCCL's default {NCCL_DEFAULT_IB_TIMEOUT} applies",
    ),
    JsonInt,
]
IbRetryCnt = Annotated[
    int,
    Field(
        ge=0,
        le=7,
        description="NCCL_IB_RETRY_CNT of the tenant's jobs: retransmissions before a queue"
        f" pair fails, 0-7; null: not declared, NCCL's default {NCCL_DEFAULT_IB_RETRY_CNT}"
        " applies",
    ),
    JsonInt,
]
Description = Annotated[str, StringConstraints(max_length=1000)]


class Tenant(Strict):
    name: Name
    description: Description = ""
    nccl_ib_timeout: IbTimeout | None = None
    nccl_ib_retry_cnt: IbRetryCnt | None = None


class TenantUpdate(Strict):
    """PATCH body: only the fields given change; null returns an NCCL value to undeclared
    (NCCL's default)."""

    description: Annotated[Description | None, BeforeValidator(_not_null)] = _not_null_field()
    nccl_ib_timeout: IbTimeout | None = None
    nccl_ib_retry_cnt: IbRetryCnt | None = None


class Vni(Strict):
    vni: VniNumber
    name: Name
    tenant: Name


class Workload(Strict):
    """One RDMA VF of a tenant: the netdev `vf` on host `node`, in the overlay `vni`."""

    name: Name
    node: Name
    vni: VniNumber
    vf: IfName = "vf0"
    mac: MacAddress
    ip: UsableAddress


class Tep(Strict):
    """A host's tunnel endpoint address for one path colour."""

    node: Name
    colour: Colour
    address: UsableAddress


# --- the whole fabric --------------------------------------------------------------------


class DocumentLink(LinkSpec):
    """A link as a fabric document has it: an export gives each link's id, an import
    ignores it (FabricDocument drops it before the link is read), so an exported document
    is valid input as it stands."""

    id: int | None = Field(None, description="set on export; ignored on import",
                           json_schema_extra=_no_null_in_schema)  # fmt: skip


class DocumentedAs:
    """Marks a field whose OpenAPI document is another model's: one the validator reads
    after a before-validator has removed what the field's own model does not have."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def __get_pydantic_json_schema__(
        self, _: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(self.model.__pydantic_core_schema__)


class FabricDocument(Strict):
    """The import/export format: a whole fabric in one document (JSON; thornctl also reads YAML)."""

    format: Literal["thorn.fabric/v1"] = FABRIC_FORMAT
    revision: Annotated[int, Field(ge=0), JsonInt] | None = Field(
        default=None, description="set on export; ignored on import"
    )
    nodes: list[NodeSpec] = Field(default_factory=list)
    links: list[Annotated[SerializeAsAny[LinkSpec], DocumentedAs(DocumentLink)]] = Field(
        default_factory=list, description="on export each link also carries its `id`"
    )
    tenants: list[Tenant] = Field(default_factory=list)
    vnis: list[Vni] = Field(default_factory=list)
    workloads: list[Workload] = Field(default_factory=list)
    teps: list[Tep] = Field(default_factory=list)

    @field_validator("links", mode="before")
    @classmethod
    def _drop_export_ids(cls, value: Any) -> Any:
        # An exported document carries link ids; on import they are reassigned. An id that
        # is not an integer is left in place, to be refused as the document says.
        if isinstance(value, list):
            return [_without_id(item) for item in value]
        return value


def _without_id(item: object) -> object:
    if isinstance(item, dict) and type(item.get("id")) is int:
        return {k: v for k, v in item.items() if k != "id"}
    return item


class FabricSummary(Strict):
    revision: int
    nodes: int
    hosts: int
    switches: int
    ports: int
    links: int
    tenants: int
    vnis: int
    workloads: int
    teps: int


# --- tokens and audit ----------------------------------------------------------------------


# A token's lifetime, when it has one: at least a minute, at most ten years.
TOKEN_TTL_MIN_S = 60
TOKEN_TTL_MAX_S = 3650 * 86_400
# How long a rotated token's old secret keeps working beside the new one: up to a week.
TOKEN_OVERLAP_DEFAULT_S = 3600
TOKEN_OVERLAP_MAX_S = 7 * 86_400

TtlSeconds = Annotated[
    int,
    Field(
        ge=TOKEN_TTL_MIN_S,
        le=TOKEN_TTL_MAX_S,
        description="the token expires this many seconds after it is made (60 s to 10 years);"
        " give this or expires_at, not both",
    ),
    JsonInt,
]
ExpiresAt = Annotated[
    AwareDatetime,
    Field(
        description="the token expires at this time (with a time zone; in the future, at most"
        " 10 years ahead); give this or ttl_seconds, not both"
    ),
]


class TokenExpiry(Strict):
    """When a token's secret stops working: never (neither field), at a time, or after a TTL."""

    model_config = ConfigDict(
        json_schema_extra={"not": {"required": ["expires_at", "ttl_seconds"]}}
    )

    expires_at: ExpiresAt | None = None
    ttl_seconds: TtlSeconds | None = None


class TokenCreate(TokenExpiry):
    name: Name
    role: TokenRole


class TokenRotate(TokenExpiry):
    """A new secret for a token; the old one keeps working for `overlap_seconds`. Without
    expires_at or ttl_seconds the token keeps the expiry it has."""

    overlap_seconds: Annotated[int, JsonInt] = Field(
        TOKEN_OVERLAP_DEFAULT_S,
        ge=0,
        le=TOKEN_OVERLAP_MAX_S,
        description="how long the old secret keeps working beside the new one (0: it stops at "
        "once; at most a week)",
    )


class TokenPublic(Strict):
    name: str
    role: TokenRole
    created_at: str
    created_by: str
    expires_at: str | None = Field(None, description="when it stops working; null: never")
    expired: bool = False
    last_used_at: str | None = Field(
        None, description="its last authenticated request, to within a minute; null: never seen"
    )
    rotated_at: str | None = None
    old_secret_until: str | None = Field(
        None, description="after a rotation: until when the old secret still works"
    )


class TokenCreated(TokenPublic):
    token: str = Field(description="the secret; shown once, store it now")


AuditOutcome = Literal["ok", "refused", "denied", "failed"]


class AuditEntry(Strict):
    id: int
    at: str
    actor: str = Field(description="the token's name; 'anonymous' when none was recognised")
    action: str
    target: str
    outcome: AuditOutcome = Field(
        description="ok: done; refused: a 4xx for what was asked; denied: authentication or "
        "role refused (401/403); failed: the server could not do it (5xx, 503)"
    )
    client: str | None = Field(description="the client's address, as the entry point saw it")
    revision: int | None
    detail: dict[str, Any]
