"""REST routes of the health service, under /api/v1/health: links' health, the failure
history and BFD sessions; under /api/v1/failovers: the failover timelines, each with its
verdict against the RC budgets of the tenants it touched, and each tenant's budget against its
recent failovers (/api/v1/failovers/budget). Read-only (viewer)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from thorn.auth import Viewer
from thorn.fabric import NotFound
from thorn.health_records import FailoverQuery, Failure, FailureQuery
from thorn.model import PortRef
from thorn.rcbudget import RcVerdict, Tenancy, TenantBudgetSummary
from thorn.web import (
    ERROR_RESPONSES,
    SQL_INT_MAX,
    FieldError,
    Page,
    PageQuery,
    QueryTime,
    paginate,
)
from thorn_health.budget import failover_verdicts
from thorn_health.failovers import Timeline, timeline
from thorn_health.service import HealthService


def get_service(request: Request) -> HealthService:
    service: HealthService = request.app.state.health
    return service


Service = Annotated[HealthService, Depends(get_service)]
router = APIRouter(prefix="/api/v1/health", tags=["health"], responses=ERROR_RESPONSES)
failover_router = APIRouter(
    prefix="/api/v1/failovers", tags=["failovers"], responses=ERROR_RESPONSES
)


class LinkStateFilter(StrEnum):
    up = "up"
    down = "down"
    degraded = "degraded"
    flapping = "flapping"
    drained = "drained"
    unknown = "unknown"


class FailureState(StrEnum):
    degraded = "degraded"
    down = "down"
    flapping = "flapping"


class SourceKind(StrEnum):
    carrier = "carrier"
    bfd = "bfd"
    counters = "counters"
    dampening = "dampening"
    drain = "drain"
    topology = "topology"


class LinkHealthOut(BaseModel):
    link_id: int
    a: PortRef
    b: PortRef
    state: str = Field(description="up, down, degraded, flapping, drained; unknown: no report")
    since: datetime | None = Field(description="when it entered this state (null: unknown)")
    sources: dict[str, str] = Field(description="each source's last word: up or down")
    loss: float = Field(description="worse end's loss fraction over the last counter reports")
    penalty: float = Field(description="dampening figure of merit now (RFC 2439)")
    suppressed: bool
    reuse_in_s: float | None = Field(description="seconds until a suppressed link is reused")
    drained: bool
    open_failure: str | None = Field(description="the state of its open failure, if any")


class CounterSampleOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # built from the core's `CounterSample`

    port: str = Field(description="node:port whose agent counted it")
    at: datetime = Field(description="the end of the interval (the agent's clock)")
    seconds: float
    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int


class LinkHealthDetailOut(LinkHealthOut):
    counters: list[CounterSampleOut] = Field(
        description="drops and errors over time: each end's counts between two of its "
        "agent's reports, oldest first (the last 120, kept in memory by the active replica)"
    )


class FailureOut(BaseModel):
    id: int
    link_id: int
    a: PortRef
    b: PortRef
    state: str = Field(description="the worst state of the failure: degraded, down, flapping")
    source: str = Field(description="what detected it: carrier:<node>:<port>, bfd:..., ...")
    source_kind: str
    started_at: datetime
    detected_at: datetime | None = Field(description="when the agent detected it")
    received_at: datetime = Field(description="when health received the agent's report")
    detection_latency_ms: float | None = Field(description="received_at - detected_at")
    ended_at: datetime | None
    end_source: str | None
    duration_s: float | None


class SessionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # built from the core's `Session`

    node: str
    local: str
    peer: str
    port: str | None
    multihop: bool
    state: str
    diag: int
    detected_at: datetime
    link_id: int | None = Field(description="the link a single-hop session watches")
    tx_interval_ms: float | None = Field(
        None, description="negotiated transmit interval (RFC 5880 6.8.7), before jitter"
    )
    detect_time_ms: float | None = Field(
        None, description="negotiated detection time (6.8.4): the peer silent this long is Down"
    )


def _link_out(service: HealthService, link_id: int) -> LinkHealthOut:
    core = service.core
    link, ends = core.links[link_id], core.ends[link_id]
    now = service.clock()
    open_failure = core.open_failures.get(link_id)
    return LinkHealthOut(
        link_id=link_id,
        a=PortRef(node=ends.a_node, port=ends.a_port),
        b=PortRef(node=ends.b_node, port=ends.b_port),
        state=link.state.value if link.state else "unknown",
        since=core.changed_at.get(link_id),
        sources={k: "up" if v else "down" for k, v in sorted(link.sources.items())},
        loss=link.loss,
        penalty=round(link.penalty_at(now), 3),
        suppressed=link.suppressed,
        reuse_in_s=link.reuse_in(now),
        drained=link.drained,
        open_failure=open_failure.value if open_failure else None,
    )


@router.get("/links", response_model=Page[LinkHealthOut], summary="Links' health")
async def list_links(
    _: Viewer,
    service: Service,
    page: PageQuery,
    state: Annotated[LinkStateFilter | None, Query(description="links in this state")] = None,
    node: Annotated[str | None, Query(description="links with an end on this node")] = None,
) -> Page[LinkHealthOut]:
    core = service.core
    chosen = [
        link_id
        for link_id in sorted(core.links)
        if (
            state is None
            or (core.links[link_id].state or LinkStateFilter.unknown).value == state.value
        )
        and (node is None or node in (core.ends[link_id].a_node, core.ends[link_id].b_node))
    ]
    ids = paginate(chosen, page)
    return Page(
        items=[_link_out(service, i) for i in ids.items],
        total=ids.total, limit=ids.limit, offset=ids.offset,
    )  # fmt: skip


@router.get(
    "/links/{link_id}",
    response_model=LinkHealthDetailOut,
    summary="One link's health, with its drops and errors over time",
)
async def get_link(
    _: Viewer, service: Service, link_id: Annotated[int, Path(description="link id")]
) -> LinkHealthDetailOut:
    if link_id not in service.core.links:
        raise NotFound(f"link {link_id} not found in the topology health follows")
    samples = service.core.samples.get(link_id, ())
    return LinkHealthDetailOut(
        **_link_out(service, link_id).model_dump(),
        counters=[CounterSampleOut.model_validate(c) for c in samples],
    )


def _failure_out(f: Failure) -> FailureOut:
    return FailureOut(
        id=f.id, link_id=f.link_id,
        a=PortRef(node=f.a_node, port=f.a_port), b=PortRef(node=f.b_node, port=f.b_port),
        state=f.state, source=f.source, source_kind=f.source_kind, started_at=f.started_at,
        detected_at=f.detected_at, received_at=f.received_at,
        detection_latency_ms=f.detection_latency_ms, ended_at=f.ended_at,
        end_source=f.end_source,
        duration_s=(f.ended_at - f.started_at).total_seconds() if f.ended_at else None,
    )  # fmt: skip


@router.get("/events", response_model=Page[FailureOut], summary="Failure history, newest first")
async def list_events(
    _: Viewer,
    service: Service,
    page: PageQuery,
    link_id: Annotated[
        int | None, Query(ge=0, le=SQL_INT_MAX, description="failures of this link")
    ] = None,
    node: Annotated[str | None, Query(description="failures of links with an end here")] = None,
    source: Annotated[SourceKind | None, Query(description="what detected them")] = None,
    state: Annotated[FailureState | None, Query(description="their worst state")] = None,
    open: Annotated[bool | None, Query(description="true: still open; false: ended")] = None,
    since: Annotated[QueryTime | None, Query(description="started at or after")] = None,
    until: Annotated[QueryTime | None, Query(description="started before")] = None,
) -> Page[FailureOut]:
    if since is not None and until is not None and until <= since:
        raise FieldError(422, ["query", "until"], "until must be later than since", "value")
    query = FailureQuery(
        link_id=link_id, node=node, source_kind=source.value if source else None,
        state=state.value if state else None, open=open, since=since, until=until,
        limit=page.limit, offset=page.offset,
    )  # fmt: skip
    total, failures = await service.store.failures(query)
    return Page(
        items=[_failure_out(f) for f in failures], total=total, limit=page.limit,
        offset=page.offset,
    )  # fmt: skip


@router.get("/sessions", response_model=Page[SessionOut], summary="BFD sessions agents report")
async def list_sessions(
    _: Viewer,
    service: Service,
    page: PageQuery,
    node: Annotated[str | None, Query(description="sessions of this node's agent")] = None,
    multihop: Annotated[bool | None, Query(description="true: path (multihop) sessions")] = None,
    state: Annotated[str | None, Query(pattern="^(admin_down|down|init|up)$")] = None,
) -> Page[SessionOut]:
    sessions = sorted(
        (
            s
            for s in service.core.sessions.values()
            if (node is None or s.node == node)
            and (multihop is None or s.multihop == multihop)
            and (state is None or s.state == state)
        ),
        key=lambda s: (s.node, s.local, s.peer, s.port or ""),
    )
    chosen = paginate(sessions, page)
    return Page(
        items=[SessionOut.model_validate(s) for s in chosen.items], total=chosen.total,
        limit=chosen.limit, offset=chosen.offset,
    )  # fmt: skip


# --- failover timelines --------------------------------------------------------------------


class FailoverTierFilter(StrEnum):
    switch = "switch"
    source = "source"
    central = "central"
    reprotection = "reprotection"


class FailoverOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # built from `failovers.Timeline`

    id: str = Field(description="the trace id; an event without a trace: `<node>-<time>`")
    traced: bool = Field(description="false: an event without a trace (one node, no hops)")
    started: datetime = Field(description="the first hop (detection), or an untraced event's at")
    started_clock: str = Field(description="whose clock read `started`")
    tier: str = Field(description="the tier that repaired it: switch, source or central")
    sources: list[str] = Field(description="the nodes that moved traffic")
    pairs_moved: int = Field(description="(source, peer) pairs moved, over every source")
    link_id: int | None = Field(description="the link the flips name, if any")
    reason: str = Field(description="the first source's reason")
    gap_ms_upper_bound: float | None = Field(
        description="first hop to the last agent_applied: every pair moved was on its new"
        " colour by then (the failure-to-detection time is not in it); null when those hops"
        " were read on different clocks (`gap_clocks_differ`) or there are no hops"
    )
    gap_clocks_differ: bool = Field(description="the gap's ends were read on different clocks")
    gap_clocks: list[str] = Field(description="the clocks of the first hop and of each end")
    reprotected_ms: float | None = Field(
        None,
        description="pathcomp's receipt of the failure to the end of its re-protection "
        "(every node it rewrote applied it), both on pathcomp's clock; null: not recorded",
    )
    reprotected_nodes: int = Field(0, description="nodes the re-protection rewrote")
    rc_budget: list[RcVerdict] = Field(
        default_factory=list,
        description="the failover against the RC budget of each tenant whose workloads' pairs"
        " it moved (tenants as the topology is now); empty for a re-protection",
    )


class FailoverHopOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    step: str = Field(description="detected, health_received, ..., agent_applied")
    at: datetime = Field(description="as read on `clock`")
    clock: str = Field(description="whose clock: a node, or a service (health, pathcomp)")
    after: int | None = Field(description="index of the hop it followed (null: the first)")
    ms: float | None = Field(description="since the hop it followed, when one clock read both")
    clocks_differ: bool = Field(description="the hop it followed was read on another clock")


class FailoverMovedOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    node: str
    peers: list[str]
    from_colour: str | None
    to_colour: str
    tier: str
    reason: str
    kernel_ms: float
    at: datetime = Field(description="when the node published it, on its own clock")


class FailoverDetailOut(FailoverOut):
    hops: list[FailoverHopOut] = Field(
        description="every hop once: the shared ones, then each source's own, as stored"
    )
    moved: list[FailoverMovedOut] = Field(description="what each source moved (node -> peers)")


@failover_router.get(
    "", response_model=Page[FailoverOut], summary="Failovers, one per trace, newest first"
)
async def list_failovers(
    _: Viewer,
    service: Service,
    page: PageQuery,
    node: Annotated[
        str | None, Query(min_length=1, max_length=63, description="with this source node")
    ] = None,
    tier: Annotated[
        FailoverTierFilter | None, Query(description="with an event of this tier")
    ] = None,
    link: Annotated[
        int | None, Query(ge=0, le=SQL_INT_MAX, description="whose flips name this link")
    ] = None,
    since: Annotated[QueryTime | None, Query(description="started at or after")] = None,
    until: Annotated[QueryTime | None, Query(description="started before")] = None,
) -> Page[FailoverOut]:
    if since is not None and until is not None and until <= since:
        raise FieldError(422, ["query", "until"], "until must be later than since", "value")
    query = FailoverQuery(
        node=node, tier=tier.value if tier else None, link_id=link, since=since, until=until,
        limit=page.limit, offset=page.offset,
    )  # fmt: skip
    total, traces = await service.store.failover_page(query)
    tenancy = service.tenancy
    items = [_failover_out(FailoverOut, timeline(t), tenancy) for t in traces]
    return Page(items=items, total=total, limit=page.limit, offset=page.offset)


Out = TypeVar("Out", bound=FailoverOut)


def _failover_out(cls: type[Out], t: Timeline, tenancy: Tenancy) -> Out:
    out = cls.model_validate(t)
    out.rc_budget = failover_verdicts(t, tenancy)
    return out


BudgetSince = Annotated[
    QueryTime | None,
    Query(description="failovers started at or after (default: 7 days ago)"),
]
BudgetLimit = Annotated[
    int, Query(ge=1, le=10_000, description="at most this many failovers, the newest")
]


@failover_router.get(
    "/budget",
    response_model=Page[TenantBudgetSummary],
    summary="Each tenant's RC budget against its recent failovers (p50, p99, warning)",
)
async def list_budgets(
    _: Viewer,
    service: Service,
    page: PageQuery,
    since: BudgetSince = None,
    failovers: BudgetLimit = 1000,
) -> Page[TenantBudgetSummary]:
    summaries = await service.budgets.summaries(since, failovers)
    return paginate(summaries, page)


@failover_router.get(
    "/budget/{tenant}",
    response_model=TenantBudgetSummary,
    summary="One tenant's RC budget against its recent failovers",
)
async def get_budget(
    _: Viewer,
    service: Service,
    tenant: Annotated[str, Path(min_length=1, max_length=63, description="a tenant's name")],
    since: BudgetSince = None,
    failovers: BudgetLimit = 1000,
) -> TenantBudgetSummary:
    if tenant not in service.tenancy.budgets:
        raise NotFound(f"tenant {tenant!r} not found in the topology health follows")
    found = await service.budgets.summaries(since, failovers, only=tenant)
    if not found:  # deleted between the check and the read
        raise NotFound(f"tenant {tenant!r} not found in the topology health follows")
    return found[0]


@failover_router.get(
    "/{failover_id}", response_model=FailoverDetailOut, summary="One failover's timeline"
)
async def get_failover(
    _: Viewer,
    service: Service,
    failover_id: Annotated[
        str, Path(min_length=1, max_length=100, description="a failover's id (its trace id)")
    ],
) -> FailoverDetailOut:
    records = await service.store.failover_trace(failover_id)
    if not records:
        raise NotFound(f"failover {failover_id!r} not found")
    return _failover_out(FailoverDetailOut, timeline(records), service.tenancy)
