"""Import a containerlab topology (``*.clab.yml``) as a THORN `FabricDocument`.

`parse_clab(text)` reads the YAML (safe loading; duplicate mapping keys are an error, since
YAML would otherwise keep the last silently) and `import_clab(data)` converts already
parsed data. Both return a `ClabImport`: the document and a list of `ClabWarning`s for
what was skipped. Anything that cannot be imported raises `ClabError(message, loc)`, where
`loc` is a path into the file such as ``topology.links[3].endpoints[0]`` (or
``line 4, column 7`` for YAML syntax errors, ``(document)`` for the whole file).

What is read
    - ``topology.nodes.<name>``: ``kind``, ``image``, ``group``, ``mgmt-ipv4`` /
      ``mgmt-ipv6`` (also the old ``mgmt_ipv4`` / ``mgmt_ipv6`` spelling) and ``labels``.
      Other node settings (binds, startup-config, ...) do not concern the fabric and are
      ignored, as are top-level keys other than ``topology``.
    - Inheritance as containerlab does it: a node's settings override its group's
      (``topology.groups.<group>``), which override its kind's (``topology.kinds.<kind>``),
      which override ``topology.defaults``; ``labels`` are merged in the same order. The
      kind itself comes from the node, else its group, else the defaults. Kind aliases
      (``srl``/``nokia_srlinux``, ``ceos``/``arista_ceos``, ...) find each other's
      ``kinds`` entry.
    - ``topology.links``, both syntaxes: brief ``endpoints: ["srl1:e1-1", "srl2:e1-1"]``
      and extended ``type: veth`` with ``endpoints: [{node, interface, mac}, ...]``. Each
      endpoint becomes a port (named as the interface, validated by the model; an
      endpoint ``mac`` becomes the port's MAC) and each link a THORN link. Interface names
      are kept as written (SR Linux ``e1-1`` is not rewritten to ``ethernet-1/1``).

Roles
    The node label ``thorn.role`` (``host`` or ``switch``) wins. Otherwise kind ``linux``
    is a host and network operating systems (SR Linux, SR OS, cEOS/vEOS, cRPD and the other
    ``juniper_*``, ``cisco_*``, ``vr-*`` kinds, SONiC, Cumulus VX, OcNOS, RouterOS, ...) are
    switches. Any other kind (``ext-container``, ``generic_vm``, ``keysight_ixia-c-one``,
    ...) is rejected with a ClabError asking for a ``thorn.role`` label.

What is skipped, with a warning
    - Nodes of kind ``bridge``, ``ovs-bridge`` and ``host`` (without a ``thorn.role``
      label): they are shared L2 segments or the lab's host, not fabric nodes, and THORN
      links are point-to-point. Links to them are skipped too.
    - Links leaving the lab: ``type`` ``host``, ``mgmt-net``, ``macvlan``, ``vxlan``,
      ``vxlan-stitch`` and ``dummy``, and brief endpoints ``host:<if>``,
      ``mgmt-net:<if>`` and ``macvlan:<if>``.
    - Labels whose key or value THORN does not accept.

Every imported node gets the labels ``clab.kind`` (and ``clab.image`` / ``clab.group`` when
set) unless the file sets them. The result carries no addresses on ports, TEPs, tenants or
workloads; whole-fabric rules (unique MACs, ...) are checked by `thorn.fabric.Fabric`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

from thorn import strictyaml
from thorn.model import (
    FabricDocument,
    LabelKey,
    LabelValue,
    LinkSpec,
    MacAddress,
    Name,
    NodeSpec,
    PortName,
    PortRef,
    PortSpec,
    Role,
    UsableAddress,
)

__all__ = ["ClabError", "ClabImport", "ClabWarning", "import_clab", "parse_clab"]

MAX_TEXT_BYTES = 16 * 1024 * 1024
ROLE_LABEL = "thorn.role"

# Kind aliases: each name maps to its canonical (current) containerlab kind.
_KIND_ALIASES: dict[str, str] = {
    "srl": "nokia_srlinux",
    "ceos": "arista_ceos",
    "crpd": "juniper_crpd",
    "cvx": "cumulus_cvx",
    "xrd": "cisco_xrd",
    "c8000": "cisco_c8000",
    "sonic-vs": "sonic-vs",
    "vr-sros": "nokia_sros",
    "vr-nokia_sros": "nokia_sros",
    "vr-vmx": "juniper_vmx",
    "vr-juniper_vmx": "juniper_vmx",
    "vr-vqfx": "juniper_vqfx",
    "vr-juniper_vqfx": "juniper_vqfx",
    "vr-vsrx": "juniper_vsrx",
    "vr-juniper_vsrx": "juniper_vsrx",
    "vr-xrv": "cisco_xrv",
    "vr-cisco_xrv": "cisco_xrv",
    "vr-xrv9k": "cisco_xrv9k",
    "vr-cisco_xrv9k": "cisco_xrv9k",
    "vr-nxos": "cisco_nxos",
    "vr-cisco_nxos": "cisco_nxos",
    "vr-n9kv": "cisco_n9kv",
    "vr-cisco_n9kv": "cisco_n9kv",
    "vr-csr": "cisco_csr1000v",
    "vr-cisco_csr": "cisco_csr1000v",
    "vr-veos": "arista_veos",
    "vr-arista_veos": "arista_veos",
    "vr-ros": "mikrotik_ros",
    "vr-mikrotik_ros": "mikrotik_ros",
    "vr-pan": "paloalto_panos",
    "vr-paloalto_panos": "paloalto_panos",
    "vr-ftosv": "dell_ftosv",
    "vr-dell_ftosv": "dell_ftosv",
    "vr-aoscx": "aruba_aoscx",
    "vr-aruba_aoscx": "aruba_aoscx",
}
_HOST_KINDS = frozenset({"linux"})
_SKIP_KINDS = frozenset({"bridge", "ovs-bridge", "host"})
_SWITCH_KINDS = frozenset(
    {
        "sonic-vs",
        "sonic-vm",
        "rare",
        "fdio_vpp",
        "openwrt",
        "vyosnetworks_vyos",
        "6wind_vsr",
        "fortinet_fortigate",
        "checkpoint_cloudguard",
    }
)
_SWITCH_PREFIXES = (
    "nokia_",
    "arista_",
    "juniper_",
    "cisco_",
    "vr-",
    "sonic",
    "cumulus_",
    "dell_",
    "mikrotik_",
    "huawei_",
    "aruba_",
    "ipinfusion_",
    "paloalto_",
)
# Link types and brief-syntax pseudo nodes that leave the lab: skipped with a warning.
_EXTERNAL_LINK_TYPES = frozenset({"host", "mgmt-net", "macvlan", "vxlan", "vxlan-stitch", "dummy"})
_EXTERNAL_ENDPOINTS = frozenset({"host", "mgmt-net", "macvlan"})
_ENDPOINT_KEYS = frozenset({"node", "interface", "mac"})


class ClabError(ValueError):
    """The containerlab file cannot be imported; `loc` says where (a path into the file)."""

    def __init__(self, message: str, loc: str) -> None:
        super().__init__(f"{loc}: {message}")
        self.message = message
        self.loc = loc


@dataclass(frozen=True)
class ClabWarning:
    """Something in the file that was skipped rather than imported."""

    loc: str
    message: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}"


@dataclass(frozen=True)
class ClabImport:
    document: FabricDocument
    warnings: list[ClabWarning] = field(default_factory=list)


# --- YAML --------------------------------------------------------------------------------


def parse_clab(text: str | bytes) -> ClabImport:
    """Parse containerlab topology YAML and convert it (see the module docstring)."""
    if len(text) > MAX_TEXT_BYTES:
        raise ClabError(f"the file is larger than {MAX_TEXT_BYTES} bytes", "(document)")
    try:
        data = strictyaml.load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        loc = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = err.problem or err.context or "syntax error"
        raise ClabError(f"not valid YAML: {problem}", loc) from None
    except yaml.YAMLError as err:
        raise ClabError(f"not valid YAML: {err}", "(document)") from None
    except RecursionError:
        raise ClabError("not accepted: the YAML is nested too deeply", "(document)") from None
    return import_clab(data)


# --- conversion ----------------------------------------------------------------------------

_T = TypeVar("_T")
_NAME: TypeAdapter[str] = TypeAdapter(Name)
_PORT_NAME: TypeAdapter[str] = TypeAdapter(PortName)
_LABEL_KEY: TypeAdapter[str] = TypeAdapter(LabelKey)
_LABEL_VALUE: TypeAdapter[str] = TypeAdapter(LabelValue)
_MAC: TypeAdapter[str] = TypeAdapter(MacAddress)
_ADDRESS: TypeAdapter[Any] = TypeAdapter(UsableAddress)


def _check(adapter: TypeAdapter[_T], value: object, loc: str, what: str) -> _T:
    try:
        return adapter.validate_python(value)
    except ValidationError as err:
        detail = err.errors()[0]["msg"]
        raise ClabError(f"{what} {value!r} is not valid: {detail}", loc) from None


def _mapping(value: object, loc: str, *, optional: bool = False) -> Mapping[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise ClabError(f"expected a mapping, got {_type_name(value)}", loc)
    for key in value:
        if not isinstance(key, str):
            raise ClabError(f"keys must be strings, got {_type_name(key)} {key!r}", loc)
    return value


def _type_name(value: object) -> str:
    if value is None:
        return "nothing (null)"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
    }.get(type(value), type(value).__name__)


def _canonical_kind(kind: str) -> str:
    return _KIND_ALIASES.get(kind, kind)


def _kind_role(kind: str) -> Role | None:
    """The role of a kind, or None when the kind says nothing (the caller decides)."""
    canonical = _canonical_kind(kind)
    if canonical in _HOST_KINDS:
        return Role.host
    if canonical in _SWITCH_KINDS or canonical.startswith(_SWITCH_PREFIXES):
        return Role.switch
    return None


def _scalar_label(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


class _Importer:
    def __init__(self) -> None:
        self.warnings: list[ClabWarning] = []
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> node data (ports added later)
        self.skipped_nodes: dict[str, str] = {}  # name -> kind
        self.ports: dict[str, dict[str, dict[str, Any]]] = {}  # node -> port -> data
        self.port_loc: dict[tuple[str, str], str] = {}
        self.links: list[LinkSpec] = []

    def warn(self, loc: str, message: str) -> None:
        self.warnings.append(ClabWarning(loc, message))

    # --- nodes ---------------------------------------------------------------------------

    def run(self, data: object) -> ClabImport:
        root = _mapping(data, "(document)")
        if "topology" not in root:
            raise ClabError("missing: a containerlab file needs a 'topology' section", "topology")
        topo = _mapping(root["topology"], "topology")
        defaults = _mapping(topo.get("defaults"), "topology.defaults", optional=True)
        kinds = _mapping(topo.get("kinds"), "topology.kinds", optional=True)
        groups = _mapping(topo.get("groups"), "topology.groups", optional=True)
        if "nodes" not in topo:
            raise ClabError("missing: the topology has no 'nodes'", "topology.nodes")
        nodes = _mapping(topo["nodes"], "topology.nodes")
        if not nodes:
            raise ClabError("the topology has no nodes", "topology.nodes")
        kind_settings: dict[str, tuple[Mapping[str, Any], str]] = {}
        for key, value in kinds.items():
            where = f"topology.kinds.{key}"
            kind_settings[_canonical_kind(key)] = (_mapping(value, where, optional=True), where)
        for name, raw in nodes.items():
            self.node(name, raw, defaults, kind_settings, groups)
        links = topo.get("links")
        if links is not None:
            if not isinstance(links, list):
                raise ClabError(f"expected a list, got {_type_name(links)}", "topology.links")
            for i, link in enumerate(links):
                self.link(link, f"topology.links[{i}]")
        return ClabImport(self.document(), self.warnings)

    def node(
        self,
        name: str,
        raw: object,
        defaults: Mapping[str, Any],
        kinds: Mapping[str, tuple[Mapping[str, Any], str]],
        groups: Mapping[str, Any],
    ) -> None:
        loc = f"topology.nodes.{name}"
        _check(_NAME, name, loc, "node name")
        spec = _mapping(raw, loc, optional=True)
        group_name = spec.get("group")
        group: Mapping[str, Any] = {}
        if group_name is not None:
            if not isinstance(group_name, str):
                raise ClabError(
                    f"group must be a string, got {_type_name(group_name)}", f"{loc}.group"
                )
            if group_name in groups:
                group = _mapping(groups[group_name], f"topology.groups.{group_name}", optional=True)
        kind = spec.get("kind", group.get("kind", defaults.get("kind")))
        if kind is None:
            raise ClabError(
                "the node has no kind (set it on the node, its group or topology.defaults)",
                f"{loc}.kind",
            )
        if not isinstance(kind, str):
            raise ClabError(f"kind must be a string, got {_type_name(kind)}", f"{loc}.kind")
        kind_spec, kind_loc = kinds.get(_canonical_kind(kind), ({}, ""))
        # Later layers win: defaults < kind < group < node.
        layers = [
            (defaults, "topology.defaults"),
            (kind_spec, kind_loc),
            (group, f"topology.groups.{group_name}"),
            (spec, loc),
        ]

        labels: dict[str, str] = {}
        for layer, layer_loc in layers:
            if layer.get("labels") is None:
                continue
            where = f"{layer_loc}.labels"
            for key, value in _mapping(layer["labels"], where).items():
                text = _scalar_label(value)
                if text is None:
                    raise ClabError(
                        f"a label value must be a string or number, got {_type_name(value)}",
                        f"{where}.{key}",
                    )
                labels[key] = text
        labels = self._valid_labels(labels, f"{loc}.labels")

        role = self._role(name, kind, labels, loc)
        if role is None:
            self.skipped_nodes[name] = kind
            self.warn(
                loc,
                f"skipped node of kind '{kind}' (a bridge or the lab host is not a fabric node;"
                " links to it are skipped too)",
            )
            return

        image = next((lay["image"] for lay, _ in reversed(layers) if "image" in lay), None)
        extra = {"clab.kind": kind, "clab.image": image, "clab.group": group_name}
        for key, value in extra.items():
            text = _scalar_label(value)
            if text is not None and key not in labels and len(text) <= 253:
                labels[key] = text

        mgmt: Any = None
        for key in ("mgmt-ipv4", "mgmt_ipv4", "mgmt-ipv6", "mgmt_ipv6"):
            if spec.get(key) is not None:
                mgmt = _check(_ADDRESS, spec[key], f"{loc}.{key}", "management address")
                break
        self.nodes[name] = {"name": name, "role": role, "mgmt_address": mgmt, "labels": labels}
        self.ports[name] = {}

    def _valid_labels(self, labels: dict[str, str], loc: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in labels.items():
            try:
                _LABEL_KEY.validate_python(key)
                _LABEL_VALUE.validate_python(value)
            except ValidationError as err:
                self.warn(f"{loc}.{key}", f"label skipped: {err.errors()[0]['msg']}")
                continue
            out[key] = value
        return out

    @staticmethod
    def _role(name: str, kind: str, labels: Mapping[str, str], loc: str) -> Role | None:
        if ROLE_LABEL in labels:
            value = labels[ROLE_LABEL]
            try:
                return Role(value)
            except ValueError:
                raise ClabError(
                    f"label {ROLE_LABEL} must be 'host' or 'switch', got {value!r}",
                    f"{loc}.labels.{ROLE_LABEL}",
                ) from None
        if _canonical_kind(kind) in _SKIP_KINDS:
            return None
        role = _kind_role(kind)
        if role is None:
            raise ClabError(
                f"cannot tell whether kind '{kind}' is a host or a switch; "
                f"add the label {ROLE_LABEL}: host (or switch) to node '{name}'",
                f"{loc}.kind",
            )
        return role

    # --- links ---------------------------------------------------------------------------

    def link(self, raw: object, loc: str) -> None:
        link = _mapping(raw, loc)
        link_type = link.get("type")
        if link_type is not None:
            if not isinstance(link_type, str):
                raise ClabError(
                    f"type must be a string, got {_type_name(link_type)}", f"{loc}.type"
                )
            if link_type in _EXTERNAL_LINK_TYPES:
                self.warn(loc, f"skipped link of type '{link_type}' (it leaves the lab)")
                return
            if link_type != "veth":
                raise ClabError(
                    f"unknown link type '{link_type}' (known: veth, "
                    f"{', '.join(sorted(_EXTERNAL_LINK_TYPES))})",
                    f"{loc}.type",
                )
        if "endpoints" not in link:
            raise ClabError("the link has no 'endpoints'", f"{loc}.endpoints")
        endpoints = link["endpoints"]
        if not isinstance(endpoints, list):
            raise ClabError(
                f"expected a list of two endpoints, got {_type_name(endpoints)}",
                f"{loc}.endpoints",
            )
        if len(endpoints) != 2:
            raise ClabError(
                f"a link has exactly two endpoints, got {len(endpoints)}", f"{loc}.endpoints"
            )
        ends = [self.endpoint(ep, f"{loc}.endpoints[{i}]") for i, ep in enumerate(endpoints)]
        for i, (node, _, _) in enumerate(ends):
            if node in _EXTERNAL_ENDPOINTS and node not in self.nodes:
                self.warn(loc, f"skipped link to '{node}' (it leaves the lab)")
                return
            if node in self.skipped_nodes:
                kind = self.skipped_nodes[node]
                self.warn(loc, f"skipped link to node '{node}' of kind '{kind}'")
                return
            if node not in self.nodes:
                raise ClabError(
                    f"node '{node}' is not defined in topology.nodes", f"{loc}.endpoints[{i}]"
                )
        (a_node, a_port, _), (b_node, b_port, _) = ends
        if a_node == b_node:
            raise ClabError(
                f"the link joins node '{a_node}' to itself ({a_port} and {b_port}); "
                f"THORN links join two different nodes",
                f"{loc}.endpoints[1]",
            )
        for i, (node, port, mac) in enumerate(ends):
            end_loc = f"{loc}.endpoints[{i}]"
            used = self.port_loc.get((node, port))
            if used is not None:
                raise ClabError(f"endpoint '{node}:{port}' is already used at {used}", end_loc)
            self.port_loc[(node, port)] = end_loc
            self.ports[node][port] = {"name": port, "mac": mac}
        self.links.append(
            LinkSpec(a=PortRef(node=a_node, port=a_port), b=PortRef(node=b_node, port=b_port))
        )

    def endpoint(self, raw: object, loc: str) -> tuple[str, str, str | None]:
        """(node, interface, mac) of one endpoint, in either syntax; interface validated."""
        mac: str | None = None
        if isinstance(raw, str):
            node, sep, interface = raw.partition(":")
            if not sep or not node or not interface:
                raise ClabError(f"endpoint {raw!r} is not of the form 'node:interface'", loc)
        elif isinstance(raw, Mapping):
            for key in ("node", "interface"):
                if key not in raw:
                    raise ClabError(f"the endpoint has no '{key}'", f"{loc}.{key}")
                if not isinstance(raw[key], str) or not raw[key]:
                    raise ClabError(
                        f"'{key}' must be a non-empty string, got {_type_name(raw[key])}",
                        f"{loc}.{key}",
                    )
            node, interface = raw["node"], raw["interface"]
            if isinstance(raw.get("mac"), int):
                # YAML 1.1 reads an unquoted all-digit MAC such as 10:20:30:40:50:51 as a
                # base-60 integer; the original text is gone by now.
                raise ClabError("the MAC was read as a number; put it in quotes", f"{loc}.mac")
            if raw.get("mac") is not None:
                mac = _check(_MAC, raw["mac"], f"{loc}.mac", "MAC")
            for key in raw:
                if key not in _ENDPOINT_KEYS:
                    self.warn(f"{loc}.{key}", "ignored endpoint setting")
        else:
            raise ClabError(
                f"an endpoint is 'node:interface' or a mapping with node and interface, "
                f"got {_type_name(raw)}",
                loc,
            )
        if node in self.nodes:
            _check(_PORT_NAME, interface, loc, "interface name")
        return node, interface, mac

    # --- result --------------------------------------------------------------------------

    def document(self) -> FabricDocument:
        nodes = [
            NodeSpec(
                **data,
                ports=[PortSpec(**port) for port in self.ports[name].values()],
            )
            for name, data in self.nodes.items()
        ]
        return FabricDocument(nodes=nodes, links=self.links)


def import_clab(data: object) -> ClabImport:
    """Convert a parsed containerlab topology (the mapping `yaml.safe_load` returns)."""
    return _Importer().run(data)
