"""Schemathesis hooks of the API fuzz lane (tests/integration/test_api_fuzz.py; docs/api.md,
"Fuzzing the API").

Loaded by both runs of the lane (`hooks` in schemathesis.toml and unauthenticated.toml):

- Generators stay small. Every generator parameter the fuzzer draws within its documented
  range is clamped to a small value before the request is sent (parity kept, so an odd k
  stays odd and is still refused), and a big default is replaced the same way: a fat-tree
  at k=40 is 16,000 hosts and ~13 s of worker time, then pathcomp plans it on the same two
  cores, and a run of a few minutes has no room for that. Values outside the range are sent
  as drawn (refused with a 422 before any work). The 20,000-node and 100,000-link bounds
  are tested in tests/unit/test_generators.py.
- Half of the requests that name a resource in their path name one that exists (admin run):
  drawn names almost never do, and a 404 tests little. The live fabric is read through the
  API (at most every 2 s) and a link, port, node, tenant, VNI, workload or TEP of it goes
  into the path in place of the drawn one; /paths gets two of its hosts. Tokens are never
  picked (rotating the lane's own admin token would lock the run out).
- Two checks of THORN's own, for what schemathesis's checks cannot tell:
  `valid_data_passes_field_validation` and `refused_without_a_valid_token` (below).
"""

from __future__ import annotations

import os
import time
import zlib
from typing import Any

import httpx
import schemathesis
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from schemathesis import Case, CheckContext, HookContext, Response

from thorn import generators
from thorn.model import UsableInterface

# --- interface addresses ------------------------------------------------------------------
# The document names their formats (ipv4interface, ipv6interface) and states in words the one
# rule a pattern cannot (below /31, not the network or broadcast address of the prefix). A
# format's generator is the client's to supply: these draw what the description says.
_INTERFACE: TypeAdapter[object] = TypeAdapter(UsableInterface)


def _usable(text: str) -> bool:
    try:
        _INTERFACE.validate_python(text)
    except ValidationError:
        return False
    return True


def _interfaces(version: int) -> st.SearchStrategy[str]:
    bits = 32 if version == 4 else 128
    return st.builds(
        lambda address, length: str(address) if length is None else f"{address}/{length}",
        st.ip_addresses(v=version),
        st.none() | st.integers(0, bits),
    ).filter(_usable)


schemathesis.openapi.format("ipv4interface", _interfaces(4))
schemathesis.openapi.format("ipv6interface", _interfaces(6))


# Generator path -> {parameter: the largest value the fuzzer sends}. Small fabrics: pathcomp
# plans each in well under a second.
SMALL = {
    "leaf_spine": {"spines": 3, "leaves": 6, "hosts_per_leaf": 3},
    "fat_tree": {"k": 6},
    "rail_optimized": {"servers_per_su": 4, "rails": 3, "scalable_units": 2, "spines": 3},
    "dual_plane": {"spines_per_plane": 2, "leaves_per_plane": 3, "hosts_per_leaf": 3},
}
GENERATOR_PATHS = {f"/api/v1/fabric/generate/{name.replace('_', '-')}": name for name in SMALL}

# Error types of rules a JSON schema cannot state: the fabric rules of thorn.fabric
# (`invalid`, `not_found`, `conflict`: they span entities), rules across fields (`value`: a
# link's ends on one node, src equal to dst, until before since, a what-if with nothing to
# fail), rules against the time of the request (`too_early`, `too_late`: a token's expiry)
# and what a containerlab file says (`containerlab`: the document has that body as text).
RULE_KINDS = frozenset(
    {"invalid", "not_found", "conflict", "value", "too_early", "too_late", "containerlab"}
)


def _bounds(name: str, field: str) -> tuple[int, int]:
    """A generator parameter's documented upper bound and its default."""
    info = generators.GENERATORS[name].params.model_fields[field]
    upper = next(m.le for m in info.metadata if getattr(m, "le", None) is not None)
    return int(upper), int(info.default)


def _small(value: int, cap: int) -> int:
    """`value` brought down to at most `cap`, keeping its parity (an odd k stays odd)."""
    return value if value <= cap else cap - (value - cap) % 2


@schemathesis.hook
def before_call(context: HookContext, case: Case, kwargs: dict[str, Any]) -> None:
    name = GENERATOR_PATHS.get(case.operation.path)
    if name is None or not isinstance(case.body, dict):
        return
    for field, cap in SMALL[name].items():
        upper, default = _bounds(name, field)
        value = case.body.get(field, default)
        # 28.0 is an integer to JSON Schema and to pydantic; `true` is neither: sent as drawn.
        whole = isinstance(value, int | float) and not isinstance(value, bool) and value % 1 == 0
        if whole and cap < value <= upper:
            case.body[field] = _small(int(value), cap)


# --- requests that name resources that exist (admin run) ---------------------------------
FABRIC_EVERY_S = 2.0


# The lane's starting fabric (test_api_fuzz.py), loaded again when the fuzzer's own imports
# have left one without links: most drawn fabric documents have none.
SEED_FABRIC = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}


class LiveFabric:
    """The fabric as the API exports it, read again when older than FABRIC_EVERY_S."""

    def __init__(self) -> None:
        self.read_at = -FABRIC_EVERY_S
        self.document: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        if time.monotonic() - self.read_at >= FABRIC_EVERY_S:
            self.document = self._read()
            if not self.document.get("links"):
                self._call("POST", "/fabric/generate/leaf-spine", json=SEED_FABRIC)
                self.document = self._read()
            self.read_at = time.monotonic()
        return self.document

    def _read(self) -> dict[str, Any]:
        answer = self._call("GET", "/fabric")
        return answer.json() if answer.status_code == 200 else {}  # type: ignore[no-any-return]

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        url, token = os.environ["THORN_FUZZ_URL"], os.environ["THORN_FUZZ_TOKEN"]
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.request(method, f"{url}/api/v1{path}", headers=headers, timeout=60, **kw)


LIVE = LiveFabric()


def _existing(path: str, fabric: dict[str, Any], pick: int) -> dict[str, Any] | None:
    """Path parameters naming something of `fabric` for an operation's path template (`pick`
    chooses which), or None when the path names nothing this picks from."""

    def one(items: list[Any]) -> Any:
        return items[pick % len(items)] if items else None

    if "{link_id}" in path:
        link = one(fabric.get("links", []))
        return link and {"link_id": link["id"]}
    if "{port}" in path:
        node = one([n for n in fabric.get("nodes", []) if n.get("ports")])
        return node and {"name": node["name"], "port": one(node["ports"])["name"]}
    if "{colour}" in path:
        tep = one(fabric.get("teps", []))
        return tep and {"node": tep["node"], "colour": tep["colour"]}
    if "{vni}" in path:
        vni = one(fabric.get("vnis", []))
        return vni and {"vni": vni["vni"]}
    kinds = {"/workloads/": "workloads", "/tenants/": "tenants", "/budget/": "tenants",
             "/nodes/": "nodes"}  # fmt: skip
    for marker, kind in kinds.items():
        if marker in path:
            item = one(fabric.get(kind, []))
            key = "tenant" if "{tenant}" in path else "name"
            return item and {key: item["name"]}
    return None


@schemathesis.hook("before_call")
def existing_resources(context: HookContext, case: Case, kwargs: dict[str, Any]) -> None:
    if "THORN_FUZZ_URL" not in os.environ or case.operation.path.startswith("/api/v1/tokens"):
        return
    drawn = f"{case.operation.label} {case.path_parameters} {case.query} {case.body}"
    pick = zlib.crc32(drawn.encode())
    if pick % 2:
        return  # the other half keeps what was drawn
    path = case.operation.path
    if path == "/api/v1/paths":
        hosts = [n["name"] for n in LIVE.get().get("nodes", []) if n.get("role") == "host"]
        if len(hosts) > 1:
            src = hosts[pick // 2 % len(hosts)]
            dst = hosts[(pick // 2 + 1) % len(hosts)]
            case.query = {**(case.query or {}), "src": src, "dst": dst}
        return
    if case.path_parameters:
        chosen = _existing(path, LIVE.get(), pick // 2)
        if chosen:
            case.path_parameters = {**case.path_parameters, **chosen}


def _error_types(response: Response) -> list[str]:
    try:
        body = response.json()
    except ValueError:
        return ["(not JSON)"]
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list) or not errors:
        return ["(no errors listed)"]
    return [str(e.get("type")) if isinstance(e, dict) else "(malformed)" for e in errors]


@schemathesis.check
def valid_data_passes_field_validation(
    ctx: CheckContext, response: Response, case: Case
) -> bool | None:
    """Data the document calls valid passes the API's field validation.

    Stands in for schemathesis's positive_data_acceptance, which counts every 4xx but 401,
    403, 404 and 409 against a valid request: THORN answers a valid request that breaks a
    fabric rule (a link to a node that does not exist, two networks) with a 422 too. Such a
    refusal names its rule's type (RULE_KINDS); any other 400/422 to valid data means the
    document promises something the validators refuse.
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 422):
        return None
    unexpected = [t for t in _error_types(response) if t not in RULE_KINDS]
    if unexpected:
        raise AssertionError(
            f"valid data (by the document) was refused with {response.status_code} "
            f"({', '.join(unexpected)}): the document and the validators disagree"
        )
    return None


@schemathesis.check
def refused_without_a_valid_token(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Without a valid token every operation answers 401 and asks for a bearer token (the
    lane raises the entry point's limit on failed authentications, so none is a 429)."""
    status = response.status_code
    if status != 401:
        raise AssertionError(f"a request without a valid token was answered {status}, not 401")
    if "bearer" not in " ".join(response.headers.get("www-authenticate", [])).lower():
        raise AssertionError("401 without `WWW-Authenticate: Bearer`")
    return None


# --- the unauthenticated run: which credential each request carries --------------------
# Missing and malformed Authorization headers are drawn by schemathesis itself (the
# security scheme's header is generated). The hook below replaces some with the
# well-formed kinds a drawn string never is: a token that was never issued and one that
# was revoked (the lane makes it and passes it in THORN_FUZZ_REVOKED_TOKEN).
UNKNOWN_TOKEN = "thn_" + "A" * 43


@schemathesis.hook("before_call")
def wrong_tokens(context: HookContext, case: Case, kwargs: dict[str, Any]) -> None:
    if os.environ.get("THORN_FUZZ_RUN") != "unauthenticated":
        return
    revoked = os.environ.get("THORN_FUZZ_REVOKED_TOKEN")
    # A stable pick (not hash(): salted per process), so a seed reproduces a run.
    drawn = f"{case.operation.label} {case.path_parameters} {case.query} {case.body}"
    choice = zlib.crc32(drawn.encode()) % 4
    if choice == 1:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {UNKNOWN_TOKEN}"}
    elif choice == 2 and revoked:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {revoked}"}
