"""REST routes of the pathcomp service, under /api/v1: pair paths and the plan's state."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from thorn.auth import Admin, Viewer
from thorn.events import PATHCOMP_RECOMPUTE
from thorn.fabric import NotFound
from thorn.model import AdminState
from thorn.web import ERROR_RESPONSES, FieldError, Page, PageQuery
from thorn_pathcomp.drains import DrainReport
from thorn_pathcomp.plan import PlanSummary, Route, UnknownHost
from thorn_pathcomp.service import PathService
from thorn_pathcomp.whatif import UnknownElement, what_if


def get_service(request: Request) -> PathService:
    service: PathService = request.app.state.pathcomp
    return service


Service = Annotated[PathService, Depends(get_service)]
router = APIRouter(prefix="/api/v1", tags=["paths"], responses=ERROR_RESPONSES)


class RouteOut(BaseModel):
    nodes: list[str]
    links: list[int]
    hops: int


class RisksOut(BaseModel):
    links: list[int]
    switches: list[str]
    srlgs: list[str]


class PathsOut(BaseModel):
    src: str
    dst: str
    plan_revision: int
    # "protected": nothing shared; "degraded": only what no topology avoids or an SRLG is
    # shared (a single-homed end's host link and switch, a cut switch); "unprotected": a
    # switch-to-switch link is shared; "unreachable": a colour has no path.
    status: str
    red: RouteOut | None
    blue: RouteOut | None
    shortest: int | None
    shared: RisksOut
    egress: dict[str, str | None]


class StretchOut(BaseModel):
    max: int
    mean: float


class PlanOut(BaseModel):
    revision: int
    topology_revision: int
    kind: str
    compute_seconds: float
    recomputed_groups: int
    published_nodes: int
    summary_revision: int | None = Field(
        description="the plan revision the pair counts and stretch below describe: they are "
        "computed after a plan is served (seconds on a large fabric) and lag `revision` "
        "meanwhile; null until the first"
    )
    hosts: int
    groups: int
    pairs: int
    protected_pairs: int = Field(description="pairs whose red and blue share nothing")
    shared_risk_pairs: int = Field(
        description="pairs sharing only what no path choice avoids here (a single-homed "
        "end's host link and switch, a switch, an SRLG)"
    )
    unprotected_pairs: int = Field(description="pairs whose colours share a fabric link, or "
                                   "that have no path")  # fmt: skip
    pairs_sharing_host_links: int
    pairs_sharing_switches: int
    pairs_sharing_srlgs: int
    unreachable_pairs: int
    stretch: dict[str, StretchOut]


def _plan_out(service: PathService) -> PlanOut:
    if service.plan is None or service.status is None:
        raise FieldError(409, ["plan"], "no plan yet: the topology has not been planned", "busy")
    s, st = service.summary or PlanSummary(), service.status
    return PlanOut(
        revision=st.revision, topology_revision=st.topology_revision, kind=st.kind,
        compute_seconds=st.compute_seconds, recomputed_groups=st.recomputed_groups,
        published_nodes=st.published_nodes, summary_revision=service.summary_revision,
        hosts=s.hosts, groups=s.groups, pairs=s.pairs,
        protected_pairs=s.protected_pairs, shared_risk_pairs=s.shared_risk_pairs,
        unprotected_pairs=s.unprotected_pairs, pairs_sharing_host_links=s.pairs_sharing_host_links,
        pairs_sharing_switches=s.pairs_sharing_switches, pairs_sharing_srlgs=s.pairs_sharing_srlgs,
        unreachable_pairs=s.unreachable_pairs,
        stretch={k: StretchOut(max=v.max, mean=v.mean) for k, v in s.stretch.items()},
    )  # fmt: skip


class RoutesThrough(BaseModel):
    red: int
    blue: int
    total: int


class DrainStatus(BaseModel):
    """Whether a link or node still carries traffic, as the pathcomp replica answering sees
    it (its view of the topology can lag a write by the time the event takes to arrive)."""

    kind: Literal["link", "node"]
    element: str = Field(description="the link id, or the node name")
    admin_state: AdminState = Field(description="in the topology the served plan was made from")
    in_service: bool = Field(
        description="the plan may route over it: it and its end nodes are up, and health "
        "does not report it out of service"
    )
    routes_through: RoutesThrough = Field(
        description="host-pair routes of the served plan that cross it, per colour"
    )
    plan_revision: int
    topology_revision: int
    out_of_service_plan: int | None = Field(
        description="the first plan revision served without it (null while in service)"
    )
    since: datetime | None = Field(description="when that plan was adopted (UTC)")
    agents_pending: list[str] = Field(
        description="nodes written since that plan whose (live) agents have not yet "
        "reported the written desired state applied"
    )
    agents_silent: list[str] = Field(
        description="nodes written since that plan whose agents have not reported within "
        "the last minute: not waited for, check them by hand"
    )
    hosts_cut_off: list[str] = Field(
        description="hosts left without any usable link because of it (their workloads "
        "are unreachable, not moved)"
    )
    replanning: bool = Field(description="a plan is being computed or written right now")
    carries_traffic: bool = Field(
        description="false only when it is out of service, no route of the served plan "
        "crosses it and every live agent applied the desired state written since; always "
        "true while it is in service"
    )


def _status_out(report: DrainReport) -> DrainStatus:
    red, blue = report.routes
    return DrainStatus(
        kind="link" if report.kind == "link" else "node", element=report.element,
        admin_state=AdminState(report.admin_state), in_service=report.in_service,
        routes_through=RoutesThrough(red=red, blue=blue, total=red + blue),
        plan_revision=report.plan_revision, topology_revision=report.topology_revision,
        out_of_service_plan=report.out_of_service_plan, since=report.since,
        agents_pending=list(report.agents_pending), agents_silent=list(report.agents_silent),
        hosts_cut_off=list(report.hosts_cut_off), replanning=report.replanning,
        carries_traffic=report.carries_traffic,
    )  # fmt: skip


def _need_plan(service: PathService) -> None:
    if service.plan is None or service.status is None:
        raise FieldError(409, ["plan"], "no plan yet: the topology has not been planned", "busy")


@router.get(
    "/drains", response_model=Page[DrainStatus], tags=["drains"],
    summary="Every drained link and node, and whether each still carries traffic",
)  # fmt: skip
async def list_drains(_: Viewer, service: Service, page: PageQuery) -> Page[DrainStatus]:
    _need_plan(service)
    drained = service.drained()
    shown = drained[page.offset : page.offset + page.limit]
    items = []
    for kind, name in shown:
        try:
            items.append(_status_out(await service.drain_report(kind, name)))
        except NotFound:
            continue  # gone in a plan adopted meanwhile
    return Page(items=items, total=len(drained), limit=page.limit, offset=page.offset)


@router.get(
    "/drains/links/{link_id}", response_model=DrainStatus, tags=["drains"],
    summary="Whether a link still carries traffic",
)  # fmt: skip
async def link_drain(
    _: Viewer, service: Service, link_id: Annotated[int, Path(description="link id")]
) -> DrainStatus:
    _need_plan(service)
    return _status_out(await service.drain_report("link", str(link_id)))


@router.get(
    "/drains/nodes/{name}", response_model=DrainStatus, tags=["drains"],
    summary="Whether a node still carries traffic",
)  # fmt: skip
async def node_drain(
    _: Viewer, service: Service, name: Annotated[str, Path(description="node name")]
) -> DrainStatus:
    _need_plan(service)
    return _status_out(await service.drain_report("node", name))


@router.get("/paths", response_model=PathsOut, summary="The red and blue paths between two hosts")
async def paths(
    _: Viewer,
    service: Service,
    src: Annotated[str, Query(min_length=1, description="source host")],
    dst: Annotated[str, Query(min_length=1, description="destination host")],
) -> PathsOut:
    plan = service.plan
    if plan is None or service.status is None:
        raise FieldError(409, ["plan"], "no plan yet: the topology has not been planned", "busy")
    if src == dst:
        raise FieldError(422, ["query", "dst"], "source and destination are the same host", "value")
    try:
        pair = plan.pair(src, dst)
    except UnknownHost as exc:
        raise NotFound(f"host '{exc.args[0]}' not found in the planned topology") from exc
    host_links = {a.link_id for h in (src, dst) for a in plan.graph.attachments.get(h, [])}
    if pair.red is None or pair.blue is None:
        status = "unreachable"
    elif set(pair.shared.links) - host_links:
        status = "unprotected"
    elif pair.shared:
        status = "degraded"
    else:
        status = "protected"

    def route(r: Route | None) -> RouteOut | None:
        if r is None:
            return None
        return RouteOut(nodes=list(r.nodes), links=list(r.links), hops=r.hops)

    return PathsOut(
        src=src, dst=dst, plan_revision=service.status.revision, status=status,
        red=route(pair.red), blue=route(pair.blue), shortest=pair.shortest,
        shared=RisksOut(links=list(pair.shared.links), switches=list(pair.shared.switches),
                        srlgs=list(pair.shared.srlgs)),
        egress={"red": pair.egress[0], "blue": pair.egress[1]},
    )  # fmt: skip


@router.get("/plan", response_model=PlanOut, summary="The plan's revision, timings and risks")
async def plan(_: Viewer, service: Service) -> PlanOut:
    return _plan_out(service)


# A recompute asked of a follower is the leader's to do (only the leader writes desired
# state): the follower hands it over on this core-NATS subject and answers with the leader's.
RECOMPUTE_SUBJECT = PATHCOMP_RECOMPUTE
RECOMPUTE_WAIT_S = 110.0  # a full plan of a big fabric; within the entry point's 120 s


class LeaderAway(Exception):
    """No pathcomp replica leads now (a lease is changing hands), or it did not answer."""


@router.post("/plan/recompute", response_model=PlanOut, summary="Recompute the whole plan")
async def recompute(principal: Admin, service: Service, request: Request) -> PlanOut:
    """On the leader: a full plan, and the desired state that changed written. On a follower:
    the same, done by the leader (the answer is the leader's plan)."""
    if principal.audit is not None:  # the audit trail writes its entry with the outcome
        principal.audit.action, principal.audit.target = "plan.recompute", "plan"
    if service.is_leader():
        await service.recompute(f"requested by {principal.name}")
        return _plan_out(service)
    try:
        answer: bytes = await request.app.state.ask_leader(principal.name)
    except LeaderAway as exc:
        raise FieldError(503, ["leader"], str(exc), "no_leader") from None
    return PlanOut.model_validate_json(answer)


async def recompute_as_leader(service: PathService, actor: str) -> bytes:
    """What the leader answers a follower's recompute with (the plan as JSON)."""
    await service.recompute(f"requested by {actor} (through a follower)")
    return _plan_out(service).model_dump_json().encode()


class PairImpactOut(BaseModel):
    src: str
    dst: str
    verdict: Literal["flip", "lose_protection", "cut"]
    after: Literal["protected", "degraded", "unprotected", "unreachable"]


class WhatIfOut(BaseModel):
    """What failing the given links and nodes would do; nothing is changed."""

    plan_revision: int
    links: list[int] = Field(description="every link that would fail, those of nodes included")
    nodes: list[str]
    pairs: int = Field(description="host pairs in the plan")
    flip: int = Field(
        description="pairs whose active (red) path crosses it: the source NIC flips to blue "
        "and runs unprotected until re-protection"
    )
    lose_protection: int = Field(description="pairs whose standby (blue) path only crosses it")
    cut: int = Field(description="pairs whose two paths both cross it: no path until re-protection")
    after: dict[str, int] = Field(
        description="the affected pairs by status in the re-protected plan: protected, "
        "degraded (shares only what no topology avoids), unprotected, unreachable"
    )
    examples: list[PairImpactOut] = Field(description="some affected host pairs, by name")
    compute_seconds: float


@router.get(
    "/plan/what-if",
    response_model=WhatIfOut,
    summary="Simulate failing links or nodes on a copy of the plan",
)
async def plan_what_if(
    _: Viewer,
    service: Service,
    link: Annotated[list[int] | None, Query(description="a link id to fail (repeatable)")] = None,
    node: Annotated[
        list[str] | None, Query(description="a switch or host to fail (repeatable)")
    ] = None,
) -> WhatIfOut:
    plan = service.plan
    if plan is None or service.status is None:
        raise FieldError(409, ["plan"], "no plan yet: the topology has not been planned", "busy")
    if not link and not node:
        # A rule across both parameters (no OpenAPI parameter can state it): `value`.
        raise FieldError(422, ["query", "link"], "name at least one link or node to fail", "value")
    revision = service.status.revision
    try:
        # CPU-bound (~0.4 s for a switch at k=16): off the loop. It reads `plan` only.
        result = await asyncio.to_thread(what_if, plan, links=link or (), nodes=node or ())
    except UnknownElement as exc:
        raise FieldError(404, ["query", exc.kind], str(exc), "not_found") from exc
    return WhatIfOut(
        plan_revision=revision, links=result.links, nodes=result.nodes, pairs=result.pairs,
        flip=result.impact["flip"], lose_protection=result.impact["lose_protection"],
        cut=result.impact["cut"], after=dict(result.after),
        examples=[PairImpactOut(src=e.src, dst=e.dst, verdict=e.verdict, after=e.after)
                  for e in result.examples],
        compute_seconds=round(result.seconds, 4),
    )  # fmt: skip
