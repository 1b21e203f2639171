"""REST routes of the topology service, under /api/v1. Each route is a thin call into
`TopologyService`; the fabric rules live in `thorn.fabric`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field, WithJsonSchema

from thorn import generators
from thorn.audit import NOT_TOKENS
from thorn.auth import (
    BOOTSTRAP_TOKEN_NAME,
    Admin,
    Operator,
    Principal,
    Viewer,
    forbidden,
    hash_token,
    new_token,
)
from thorn.fabric import Change, Fabric, NotFound
from thorn.model import (
    TOKEN_TTL_MAX_S,
    AdminState,
    AuditEntry,
    AuditOutcome,
    Colour,
    FabricDocument,
    FabricSummary,
    Link,
    LinkSpec,
    LinkUpdate,
    Node,
    NodeSpec,
    NodeUpdate,
    Port,
    PortSpec,
    PortUpdate,
    Role,
    Tenant,
    TenantUpdate,
    Tep,
    TokenCreate,
    TokenCreated,
    TokenExpiry,
    TokenPublic,
    TokenRole,
    TokenRotate,
    Vni,
    Workload,
)
from thorn.rcbudget import RcBudget
from thorn.web import ERROR_RESPONSES, ErrorBody, FieldError, Page, PageQuery, paginate
from thorn_topology.offload import Refused, Source
from thorn_topology.service import TopologyService

T = TypeVar("T")


def get_service(request: Request) -> TopologyService:
    service: TopologyService = request.app.state.topology
    return service


Service = Annotated[TopologyService, Depends(get_service)]
NodeName = Annotated[str, Path(description="node name")]
PortPath = Annotated[str, Path(description="port name (may contain '/')")]


class WriteResult(BaseModel):
    revision: int


class ImportResult(BaseModel):
    dry_run: bool
    summary: FabricSummary
    warnings: list[str] = []


router = APIRouter(prefix="/api/v1", responses=ERROR_RESPONSES)


async def _read(service: TopologyService, fn: Callable[[Fabric], T]) -> T:
    async with service.reading() as fabric:
        return fn(fabric)


def _sorted(items: Sequence[T], key: Callable[[T], Any]) -> list[T]:
    return sorted(items, key=key)


# --- whoami, fabric, import, export, generators -------------------------------------------


class WhoAmI(BaseModel):
    name: str
    role: str


@router.get("/whoami", tags=["auth"], response_model=WhoAmI)
async def whoami(principal: Viewer) -> WhoAmI:
    return WhoAmI(name=principal.name, role=principal.role.value)


@router.get("/fabric/summary", tags=["fabric"], response_model=FabricSummary)
async def fabric_summary(_: Viewer, service: Service) -> FabricSummary:
    return await _read(service, Fabric.summary)


@router.get(
    "/fabric",
    tags=["fabric"],
    response_model=FabricDocument,
    summary="The whole topology (the export document)",
)
async def fabric_export(_: Viewer, service: Service, request: Request) -> Response:
    document = await service.document()
    etag = f'"rev-{document.revision}"'
    headers = {"ETag": etag, "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(document.gzip, media_type="application/json", headers=headers)
    return Response(document.json, media_type="application/json", headers=headers)


DryRun = Annotated[bool, Query(description="validate only; change nothing")]
# A whole-fabric write may also meet a wrong Content-Type or a dead worker process.
REPLACE_RESPONSES: dict[int | str, dict[str, Any]] = {
    415: {"model": ErrorBody, "description": "the body is not JSON"},
    503: {
        **ERROR_RESPONSES[503],
        "description": f"{ERROR_RESPONSES[503]['description']} Or the worker process stopped.",
    },
}


async def _replace(
    principal: Admin, service: TopologyService, source: Source, dry_run: bool, label: str
) -> ImportResult:
    """Hand a whole new fabric to the service's worker; its errors become 4xx/503 here."""
    try:
        outcome = await service.replace(principal, source, dry_run=dry_run, label=label)
    except Refused as exc:
        raise FieldError.many(exc.status, exc.errors) from exc
    except BrokenProcessPool as exc:
        raise FieldError(503, ["body"], "the worker reading big fabrics stopped; try again",
                         "unavailable") from exc  # fmt: skip
    return ImportResult(dry_run=dry_run, summary=outcome.summary, warnings=outcome.warnings)


async def _json_body(request: Request) -> bytes:
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if kind != "application/json" and not kind.endswith("+json"):
        msg = f"the body must be JSON (Content-Type: application/json), not {kind!r}"
        raise FieldError(415, ["header", "content-type"], msg, "content_type")
    return await request.body()


@router.post(
    "/fabric/import",
    tags=["fabric"],
    response_model=ImportResult,
    responses=REPLACE_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/FabricDocument"}}
            },
        }
    },
)
async def fabric_import(
    principal: Admin, service: Service, request: Request, dry_run: DryRun = False
) -> ImportResult:
    """Replace the whole fabric with a fabric document (`FabricDocument`), all or nothing.

    The body is read and checked off the API's event loop (a big fabric is seconds of work).
    """
    source = Source("json", body=await _json_body(request))
    return await _replace(principal, service, source, dry_run, "import")


@router.post(
    "/fabric/import/containerlab",
    tags=["fabric"],
    response_model=ImportResult,
    responses={503: REPLACE_RESPONSES[503]},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/yaml": {"schema": {"type": "string"}}},
            "description": "a containerlab topology file (.clab.yml)",
        }
    },
)
async def fabric_import_containerlab(
    principal: Admin, service: Service, request: Request, dry_run: DryRun = False
) -> ImportResult:
    """Replace the whole fabric with the nodes and links of a containerlab file."""
    source = Source("clab", body=await request.body())
    return await _replace(principal, service, source, dry_run, "clab")


def _generator_route(name: str, params_model: type[BaseModel]) -> None:
    async def generate(
        principal: Admin, service: Service, params: BaseModel, dry_run: DryRun = False
    ) -> ImportResult:
        source = Source("generator", generator=name, params=params.model_dump())
        return await _replace(principal, service, source, dry_run, name)

    # The body's model differs per generator: give FastAPI the concrete class for OpenAPI.
    generate.__annotations__["params"] = params_model
    generate.__name__ = f"generate_{name}"
    router.post(
        f"/fabric/generate/{name.replace('_', '-')}",
        tags=["fabric"],
        response_model=ImportResult,
        responses={503: REPLACE_RESPONSES[503]},
        summary=f"Replace the fabric with a generated {name} topology",
    )(generate)


for _name, (_fn, _params) in generators.GENERATORS.items():
    _generator_route(_name, _params)


# --- nodes and ports -------------------------------------------------------------------


# key=value, as the document says it; the route refuses others with a message naming them.
LabelFilter = Annotated[str, WithJsonSchema({"type": "string", "pattern": "="})]


@router.get("/nodes", tags=["nodes"], response_model=Page[Node])
async def list_nodes(
    _: Viewer,
    service: Service,
    page: PageQuery,
    role: Role | None = None,
    admin_state: AdminState | None = None,
    label: Annotated[list[LabelFilter], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    name_prefix: str | None = None,
) -> Page[Node]:
    wanted: list[tuple[str, str]] = []
    for item in label:
        key, sep, value = item.partition("=")
        if not sep:
            raise FieldError(422, ["query", "label"], f"'{item}' is not key=value", "value_error")
        wanted.append((key, value))

    def select(f: Fabric) -> list[Node]:
        return [
            n
            for n in f.nodes.values()
            if (role is None or n.role is role)
            and (admin_state is None or n.admin_state is admin_state)
            and (name_prefix is None or n.name.startswith(name_prefix))
            and all(n.labels.get(k) == v for k, v in wanted)
        ]

    return paginate(_sorted(await _read(service, select), lambda n: n.name), page)


@router.post("/nodes", tags=["nodes"], response_model=NodeSpec, status_code=201)
async def create_node(principal: Admin, service: Service, node: NodeSpec) -> NodeSpec:
    await service.write(
        principal,
        "node.create",
        node.name,
        lambda f: f.add_node(node),
        node.model_dump(mode="json"),
    )
    return await _read(service, lambda f: _node_spec(f, node.name))


def _node_spec(f: Fabric, name: str) -> NodeSpec:
    node = f.node(name)
    ports = [
        PortSpec(**f.ports[(name, p)].model_dump(exclude={"node"})) for p in f.node_ports[name]
    ]
    return NodeSpec(**node.model_dump(), ports=ports)


@router.get("/nodes/{name}", tags=["nodes"], response_model=NodeSpec)
async def get_node(_: Viewer, service: Service, name: NodeName) -> NodeSpec:
    return await _read(service, lambda f: _node_spec(f, name))


@router.patch("/nodes/{name}", tags=["nodes"], response_model=Node)
async def update_node(
    principal: Admin, service: Service, name: NodeName, update: NodeUpdate
) -> Node:
    await service.write(
        principal,
        "node.update",
        name,
        lambda f: f.update_node(name, update),
        update.model_dump(mode="json", exclude_unset=True),
    )
    return await _read(service, lambda f: f.node(name))


@router.post("/nodes/{name}/drain", tags=["nodes"], response_model=Node)
async def drain_node(principal: Operator, service: Service, name: NodeName) -> Node:
    """Mark a switch drained: path computation leaves it out of every path (operator role).
    A host is refused (409): its own traffic cannot avoid it."""
    await service.write(principal, "node.drain", name, lambda f: f.drain_node(name))
    return await _read(service, lambda f: f.node(name))


@router.post("/nodes/{name}/undrain", tags=["nodes"], response_model=Node)
async def undrain_node(principal: Operator, service: Service, name: NodeName) -> Node:
    """Return a drained node to service (operator role); a down node is refused (409)."""
    await service.write(principal, "node.undrain", name, lambda f: f.undrain_node(name))
    return await _read(service, lambda f: f.node(name))


@router.delete("/nodes/{name}", tags=["nodes"], response_model=WriteResult)
async def delete_node(
    principal: Admin,
    service: Service,
    name: NodeName,
    cascade: Annotated[bool, Query(description="also delete its links, workloads, TEPs")] = False,
) -> WriteResult:
    revision, _ = await service.write(
        principal, "node.delete", name, lambda f: f.delete_node(name, cascade), {"cascade": cascade}
    )
    return WriteResult(revision=revision)


@router.get("/ports", tags=["ports"], response_model=Page[Port])
async def list_ports(
    _: Viewer,
    service: Service,
    page: PageQuery,
    node: str | None = None,
    linked: Annotated[bool | None, Query(description="only ports in (or not in) a link")] = None,
) -> Page[Port]:
    def select(f: Fabric) -> list[Port]:
        return [
            p
            for key, p in f.ports.items()
            if (node is None or p.node == node)
            and (linked is None or (key in f.link_of_port) == linked)
        ]

    return paginate(_sorted(await _read(service, select), lambda p: (p.node, p.name)), page)


@router.get("/nodes/{name}/ports", tags=["ports"], response_model=Page[Port])
async def list_node_ports(
    _: Viewer, service: Service, name: NodeName, page: PageQuery
) -> Page[Port]:
    def select(f: Fabric) -> list[Port]:
        f.node(name)
        return [f.ports[(name, p)] for p in f.node_ports[name]]

    return paginate(await _read(service, select), page)


@router.post("/nodes/{name}/ports", tags=["ports"], response_model=Port, status_code=201)
async def create_port(principal: Admin, service: Service, name: NodeName, port: PortSpec) -> Port:
    await service.write(
        principal,
        "port.create",
        f"{name}:{port.name}",
        lambda f: f.add_port(name, port),
        port.model_dump(mode="json"),
    )
    return await _read(service, lambda f: f.port(name, port.name))


@router.get("/nodes/{name}/ports/{port:path}", tags=["ports"], response_model=Port)
async def get_port(_: Viewer, service: Service, name: NodeName, port: PortPath) -> Port:
    return await _read(service, lambda f: f.port(name, port))


@router.patch("/nodes/{name}/ports/{port:path}", tags=["ports"], response_model=Port)
async def update_port(
    principal: Admin, service: Service, name: NodeName, port: PortPath, update: PortUpdate
) -> Port:
    await service.write(
        principal,
        "port.update",
        f"{name}:{port}",
        lambda f: f.update_port(name, port, update),
        update.model_dump(mode="json", exclude_unset=True),
    )
    return await _read(service, lambda f: f.port(name, port))


@router.delete("/nodes/{name}/ports/{port:path}", tags=["ports"], response_model=WriteResult)
async def delete_port(
    principal: Admin, service: Service, name: NodeName, port: PortPath
) -> WriteResult:
    revision, _ = await service.write(
        principal, "port.delete", f"{name}:{port}", lambda f: f.delete_port(name, port)
    )
    return WriteResult(revision=revision)


# --- links -------------------------------------------------------------------------------


@router.get("/links", tags=["links"], response_model=Page[Link])
async def list_links(
    _: Viewer,
    service: Service,
    page: PageQuery,
    node: Annotated[str | None, Query(description="links with an end on this node")] = None,
    admin_state: AdminState | None = None,
    srlg: Annotated[str | None, Query(description="links in this SRLG")] = None,
) -> Page[Link]:
    def select(f: Fabric) -> list[Link]:
        return [
            lk
            for lk in f.links.values()
            if (node is None or node in (lk.a.node, lk.b.node))
            and (admin_state is None or lk.admin_state is admin_state)
            and (srlg is None or srlg in lk.srlgs)
        ]

    return paginate(_sorted(await _read(service, select), lambda lk: lk.id), page)


def _created_link(changes: list[Change]) -> int:
    return int(changes[0].key)


@router.post("/links", tags=["links"], response_model=Link, status_code=201)
async def create_link(principal: Admin, service: Service, link: LinkSpec) -> Link:
    _, changes = await service.write(
        principal,
        "link.create",
        f"{link.a}--{link.b}",
        lambda f: f.add_link(link),
        link.model_dump(mode="json"),
    )
    link_id = _created_link(changes)
    return await _read(service, lambda f: f.link(link_id))


@router.get("/links/{link_id}", tags=["links"], response_model=Link)
async def get_link(_: Viewer, service: Service, link_id: int) -> Link:
    return await _read(service, lambda f: f.link(link_id))


@router.patch("/links/{link_id}", tags=["links"], response_model=Link)
async def update_link(principal: Admin, service: Service, link_id: int, update: LinkUpdate) -> Link:
    await service.write(
        principal,
        "link.update",
        str(link_id),
        lambda f: f.update_link(link_id, update),
        update.model_dump(mode="json", exclude_unset=True),
    )
    return await _read(service, lambda f: f.link(link_id))


@router.post("/links/{link_id}/drain", tags=["links"], response_model=Link)
async def drain_link(principal: Operator, service: Service, link_id: int) -> Link:
    """Mark a link drained: path computation moves traffic off it (operator role)."""
    await service.write(principal, "link.drain", str(link_id), lambda f: f.drain_link(link_id))
    return await _read(service, lambda f: f.link(link_id))


@router.post("/links/{link_id}/undrain", tags=["links"], response_model=Link)
async def undrain_link(principal: Operator, service: Service, link_id: int) -> Link:
    """Return a drained link to service (operator role); a down link is refused (409)."""
    await service.write(principal, "link.undrain", str(link_id), lambda f: f.undrain_link(link_id))
    return await _read(service, lambda f: f.link(link_id))


@router.delete("/links/{link_id}", tags=["links"], response_model=WriteResult)
async def delete_link(principal: Admin, service: Service, link_id: int) -> WriteResult:
    revision, _ = await service.write(
        principal, "link.delete", str(link_id), lambda f: f.delete_link(link_id)
    )
    return WriteResult(revision=revision)


# --- tenants, VNIs, workloads, TEPs ------------------------------------------------------


class TenantOut(Tenant):
    """A tenant as declared, with the RC budget in effect for its jobs."""

    rc_budget: RcBudget = Field(
        description="the NCCL values in effect (declared, or NCCL's defaults: the `*_declared`"
        " flags say which) and what they allow a failover"
    )

    @classmethod
    def of(cls, tenant: Tenant) -> TenantOut:
        budget = RcBudget.of(tenant.nccl_ib_timeout, tenant.nccl_ib_retry_cnt)
        return cls(**tenant.model_dump(), rc_budget=budget)


@router.get("/tenants", tags=["tenants"], response_model=Page[TenantOut])
async def list_tenants(_: Viewer, service: Service, page: PageQuery) -> Page[TenantOut]:
    items = await _read(service, lambda f: list(f.tenants.values()))
    chosen = paginate(_sorted(items, lambda t: t.name), page)
    return Page(
        items=[TenantOut.of(t) for t in chosen.items], total=chosen.total, limit=chosen.limit,
        offset=chosen.offset,
    )  # fmt: skip


@router.post("/tenants", tags=["tenants"], response_model=TenantOut, status_code=201)
async def create_tenant(principal: Admin, service: Service, tenant: Tenant) -> TenantOut:
    await service.write(
        principal,
        "tenant.create",
        tenant.name,
        lambda f: f.add_tenant(tenant),
        tenant.model_dump(mode="json"),
    )
    return TenantOut.of(tenant)


@router.get("/tenants/{name}", tags=["tenants"], response_model=TenantOut)
async def get_tenant(_: Viewer, service: Service, name: str) -> TenantOut:
    return TenantOut.of(await _read(service, lambda f: f.tenant(name)))


@router.patch("/tenants/{name}", tags=["tenants"], response_model=TenantOut)
async def update_tenant(
    principal: Admin, service: Service, name: str, update: TenantUpdate
) -> TenantOut:
    """Change the given fields; `null` returns `nccl_ib_timeout` or `nccl_ib_retry_cnt` to
    undeclared (NCCL's default). Out-of-range values are a 422 naming the field."""
    await service.write(
        principal,
        "tenant.update",
        name,
        lambda f: f.update_tenant(name, update),
        update.model_dump(mode="json", exclude_unset=True),
    )
    return TenantOut.of(await _read(service, lambda f: f.tenant(name)))


@router.delete("/tenants/{name}", tags=["tenants"], response_model=WriteResult)
async def delete_tenant(principal: Admin, service: Service, name: str) -> WriteResult:
    revision, _ = await service.write(
        principal, "tenant.delete", name, lambda f: f.delete_tenant(name)
    )
    return WriteResult(revision=revision)


@router.get("/vnis", tags=["vnis"], response_model=Page[Vni])
async def list_vnis(
    _: Viewer, service: Service, page: PageQuery, tenant: str | None = None
) -> Page[Vni]:
    items = await _read(
        service, lambda f: [v for v in f.vnis.values() if tenant is None or v.tenant == tenant]
    )
    return paginate(_sorted(items, lambda v: v.vni), page)


@router.post("/vnis", tags=["vnis"], response_model=Vni, status_code=201)
async def create_vni(principal: Admin, service: Service, vni: Vni) -> Vni:
    await service.write(
        principal, "vni.create", str(vni.vni), lambda f: f.add_vni(vni), vni.model_dump(mode="json")
    )
    return vni


@router.get("/vnis/{vni}", tags=["vnis"], response_model=Vni)
async def get_vni(_: Viewer, service: Service, vni: int) -> Vni:
    return await _read(service, lambda f: f.vni(vni))


@router.delete("/vnis/{vni}", tags=["vnis"], response_model=WriteResult)
async def delete_vni(principal: Admin, service: Service, vni: int) -> WriteResult:
    revision, _ = await service.write(
        principal, "vni.delete", str(vni), lambda f: f.delete_vni(vni)
    )
    return WriteResult(revision=revision)


@router.get("/workloads", tags=["workloads"], response_model=Page[Workload])
async def list_workloads(
    _: Viewer, service: Service, page: PageQuery, node: str | None = None, vni: int | None = None
) -> Page[Workload]:
    items = await _read(
        service,
        lambda f: [
            w
            for w in f.workloads.values()
            if (node is None or w.node == node) and (vni is None or w.vni == vni)
        ],
    )
    return paginate(_sorted(items, lambda w: w.name), page)


@router.post("/workloads", tags=["workloads"], response_model=Workload, status_code=201)
async def create_workload(principal: Admin, service: Service, workload: Workload) -> Workload:
    await service.write(
        principal,
        "workload.create",
        workload.name,
        lambda f: f.add_workload(workload),
        workload.model_dump(mode="json"),
    )
    return workload


@router.get("/workloads/{name}", tags=["workloads"], response_model=Workload)
async def get_workload(_: Viewer, service: Service, name: str) -> Workload:
    return await _read(service, lambda f: f.workload(name))


@router.delete("/workloads/{name}", tags=["workloads"], response_model=WriteResult)
async def delete_workload(principal: Admin, service: Service, name: str) -> WriteResult:
    revision, _ = await service.write(
        principal, "workload.delete", name, lambda f: f.delete_workload(name)
    )
    return WriteResult(revision=revision)


@router.get("/teps", tags=["teps"], response_model=Page[Tep])
async def list_teps(
    _: Viewer,
    service: Service,
    page: PageQuery,
    node: str | None = None,
    colour: Colour | None = None,
) -> Page[Tep]:
    items = await _read(
        service,
        lambda f: [
            t
            for t in f.teps.values()
            if (node is None or t.node == node) and (colour is None or t.colour is colour)
        ],
    )
    return paginate(_sorted(items, lambda t: (t.node, t.colour.value)), page)


@router.post("/teps", tags=["teps"], response_model=Tep, status_code=201)
async def create_tep(principal: Admin, service: Service, tep: Tep) -> Tep:
    await service.write(
        principal,
        "tep.create",
        f"{tep.node}/{tep.colour.value}",
        lambda f: f.add_tep(tep),
        tep.model_dump(mode="json"),
    )
    return tep


@router.get("/teps/{node}/{colour}", tags=["teps"], response_model=Tep)
async def get_tep(_: Viewer, service: Service, node: str, colour: Colour) -> Tep:
    return await _read(service, lambda f: f.tep(node, colour))


@router.delete("/teps/{node}/{colour}", tags=["teps"], response_model=WriteResult)
async def delete_tep(principal: Admin, service: Service, node: str, colour: Colour) -> WriteResult:
    revision, _ = await service.write(
        principal, "tep.delete", f"{node}/{colour.value}", lambda f: f.delete_tep(node, colour)
    )
    return WriteResult(revision=revision)


# --- tokens and audit --------------------------------------------------------------------


@router.get("/tokens", tags=["auth"], response_model=Page[TokenPublic])
async def list_tokens(_: Admin, service: Service, page: PageQuery) -> Page[TokenPublic]:
    """Every token, never a secret: its expiry, last use (to within a minute) and, while a
    rotation's overlap lasts, until when its old secret works."""
    return paginate(await service.store.tokens(), page)


def _expiry(body: TokenExpiry, now: datetime, keep: datetime | None = None) -> datetime | None:
    """When a token made or rotated `now` expires: from `ttl_seconds` or `expires_at`, else
    `keep`. Values the schema cannot refuse are a 422 naming the field."""
    if {"expires_at", "ttl_seconds"} <= body.model_fields_set:
        msg = "give expires_at or ttl_seconds, not both"
        raise FieldError(422, ["body", "ttl_seconds"], msg, "conflicting_fields")
    if body.ttl_seconds is not None:
        return now + timedelta(seconds=body.ttl_seconds)
    if body.expires_at is None:
        return keep
    try:
        at = body.expires_at.astimezone(UTC)
    except OverflowError:
        at = None
    if at is None or at <= now:
        raise FieldError(422, ["body", "expires_at"], "must be in the future", "too_early")
    if at > now + timedelta(seconds=TOKEN_TTL_MAX_S):
        raise FieldError(422, ["body", "expires_at"], "must be at most 10 years ahead", "too_late")
    return at


@router.post("/tokens", tags=["auth"], response_model=TokenCreated, status_code=201)
async def create_token(principal: Admin, service: Service, request: TokenCreate) -> TokenCreated:
    """Create a token, for ever or until `expires_at` (or `ttl_seconds` from now); the secret
    is in this response only."""
    _naming(principal, "token.create", request.name)
    if request.name in NOT_TOKENS:
        msg = f"'{request.name}' names entries of the audit log that no token made"
        raise FieldError(422, ["body", "name"], msg, "reserved")
    expires_at = _expiry(request, datetime.now(UTC))
    secret = new_token()
    public = await service.store.add_token(
        request.name, request.role, hash_token(secret), principal.name,
        expires_at=expires_at, client=principal.client,
    )  # fmt: skip
    _recorded(principal)
    return TokenCreated(**public.model_dump(), token=secret)


@router.post("/tokens/{name}/rotate", tags=["auth"], response_model=TokenCreated)
async def rotate_token(
    principal: Viewer,
    service: Service,
    http: Request,
    name: Annotated[str, Path(description="token name")],
    request: Annotated[TokenRotate, Body()] = TokenRotate(),
) -> TokenCreated:
    """A new secret for the token `name` (admin, or the token itself): the new secret is in
    this response only; the old one keeps working for `overlap_seconds` (default an hour),
    then stops. The token keeps its expiry unless `expires_at` or `ttl_seconds` is given."""
    _naming(principal, "token.rotate", name)
    if principal.name != name and not principal.role.allows(TokenRole.admin):
        raise forbidden(
            http, principal, f"token '{principal.name}' may rotate only itself; an admin may "
            "rotate any token",
        )  # fmt: skip
    if name == BOOTSTRAP_TOKEN_NAME and http.app.state.bootstrap_from_settings:
        raise FieldError(
            409, ["path", "name"], "bootstrap-admin is set from THORN_ADMIN_TOKEN at every start: "
            "rotate it by changing that variable", "conflict",
        )  # fmt: skip
    now = datetime.now(UTC)
    current = {t.name: t for t in await service.store.tokens(now)}.get(name)
    if current is None:
        raise NotFound(f"token '{name}' not found")
    keep = datetime.fromisoformat(current.expires_at) if current.expires_at else None
    expires_at = _expiry(request, now, keep)
    secret = new_token()
    public = await service.store.rotate_token(
        name, hash_token(secret), old_until=now + timedelta(seconds=request.overlap_seconds),
        expires_at=expires_at, actor=principal.name, client=principal.client,
    )  # fmt: skip
    if public is None:  # revoked meanwhile
        raise NotFound(f"token '{name}' not found")
    _recorded(principal)
    return TokenCreated(**public.model_dump(), token=secret)


@router.delete("/tokens/{name}", tags=["auth"], status_code=204)
async def delete_token(principal: Admin, service: Service, name: str) -> Response:
    """Revoke a token at once (both secrets, during a rotation's overlap); its next request
    gets 401."""
    _naming(principal, "token.delete", name)
    if name == principal.name:
        raise FieldError(409, ["path", "name"], "a token cannot revoke itself", "conflict")
    if not await service.store.delete_token(name, principal.name, client=principal.client):
        raise NotFound(f"token '{name}' not found")
    _recorded(principal)
    return Response(status_code=204)


def _naming(principal: Principal, action: str, target: str) -> None:
    """Name this request's audit entry (a refusal's too, written by the audit trail)."""
    if principal.audit is not None:
        principal.audit.action, principal.audit.target = action, target


def _recorded(principal: Principal) -> None:
    """The store wrote this request's audit entry with the write."""
    if principal.audit is not None:
        principal.audit.recorded = True


@router.get("/audit", tags=["auth"], response_model=Page[AuditEntry])
async def list_audit(
    _: Operator,
    service: Service,
    page: PageQuery,
    actor: str | None = None,
    action: Annotated[
        str | None, Query(description="prefix, e.g. 'link.', 'node.create' or 'auth.'")
    ] = None,
    outcome: AuditOutcome | None = None,
) -> Page[AuditEntry]:
    """The audit log, newest first: every write (its outcome: ok, refused, denied, failed)
    and every refused authentication, with who, what, from where and when."""
    total, items = await service.store.audit(
        limit=page.limit, offset=page.offset, actor=actor, action=action, outcome=outcome
    )
    return Page(items=items, total=total, limit=page.limit, offset=page.offset)
