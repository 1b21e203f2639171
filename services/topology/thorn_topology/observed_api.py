"""REST routes for what agents register: observed beside declared, mismatches, cabling."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from thorn.auth import Viewer
from thorn.events import DatapathApplied
from thorn.fabric import Fabric, NotFound
from thorn.model import NodeSpec, PortSpec
from thorn.observed import NodeObservation
from thorn.registration import CablingState, CablingVerdict, Mismatch, cabling, mismatches
from thorn.web import ERROR_RESPONSES
from thorn_topology.applied import AppliedReports
from thorn_topology.registrations import NodeRegistration, Registrations, node_mismatches

router = APIRouter(prefix="/api/v1", responses=ERROR_RESPONSES, tags=["observed"])


def get_applied(request: Request) -> AppliedReports:
    applied: AppliedReports = request.app.state.applied
    return applied


AppliedDep = Annotated[AppliedReports, Depends(get_applied)]


def get_registrations(request: Request) -> Registrations:
    registrations: Registrations = request.app.state.registrations
    return registrations


RegistrationsDep = Annotated[Registrations, Depends(get_registrations)]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Refusal(_Out):
    at: datetime
    error: str


class NodeObserved(_Out):
    """A node as declared and as its agent last registered it."""

    node: str
    revision: int
    declared: NodeSpec
    declared_vfs: list[str] = Field(description="the VFs of the node's workloads")
    registered: bool = Field(description="a registration was taken from the node's agent")
    received_at: datetime | None = Field(None, description="when topology took it (its clock)")
    run: str | None = None
    seq: int | None = None
    observed: NodeObservation | None = None
    refused: Refusal | None = Field(
        None, description="the latest registration, refused (the one shown is the last good)"
    )
    mismatches: list[Mismatch]
    applied: DatapathApplied | None = Field(
        None,
        description="the agent's last reconcile as this replica heard it (driver, "
        "revisions, changes, errors, offload); null: none heard since it started",
    )


class MismatchReport(_Out):
    revision: int
    registered: int = Field(description="nodes with a registration")
    unregistered: list[str] = Field(description="nodes no agent has registered (first 1000)")
    mismatches: list[Mismatch]


class LinkCabling(CablingVerdict):
    out_of_service: bool = Field(
        description="marked miscabled: path computation leaves it out until it is heard "
        "cabled as declared"
    )


class CablingReport(_Out):
    revision: int
    verified: int
    unverified: int
    miscabled: int
    out_of_service: int
    links: list[LinkCabling]


def _declared(fabric: Fabric, name: str) -> NodeSpec:
    node = fabric.node(name)
    ports = [
        PortSpec(**fabric.ports[(name, p)].model_dump(exclude={"node"}))
        for p in fabric.node_ports[name]
    ]
    return NodeSpec(**node.model_dump(), ports=ports)


@router.get("/nodes/{name}/observed", response_model=NodeObserved)
async def node_observed(
    _: Viewer, registrations: RegistrationsDep, applied: AppliedDep,
    name: Annotated[str, Path(description="node name")],
) -> NodeObserved:  # fmt: skip
    """The node as declared beside what its agent last registered, and the differences."""
    reg = (await registrations.latest()).get(name)
    async with registrations.service.reading() as fabric:
        if name not in fabric.nodes:
            raise NotFound(f"node '{name}' not found")
        found = mismatches(fabric, name, reg.observed) if reg and reg.observed else []
        refused = None
        if reg is not None and reg.refused_error is not None and reg.refused_at is not None:
            refused = Refusal(at=reg.refused_at, error=reg.refused_error)
        return NodeObserved(
            node=name, revision=fabric.revision, declared=_declared(fabric, name),
            declared_vfs=sorted(w.vf for w in fabric.workloads.values() if w.node == name),
            registered=reg is not None and reg.observed is not None,
            received_at=reg.received_at if reg else None, run=reg.run if reg else None,
            seq=reg.seq if reg else None, observed=reg.observed if reg else None,
            refused=refused, mismatches=found, applied=applied.latest.get(name),
        )  # fmt: skip


@router.get("/mismatches", response_model=MismatchReport)
async def all_mismatches(_: Viewer, registrations: RegistrationsDep) -> MismatchReport:
    """Every registered node's differences from its declaration across the fabric (a
    missing port, a wrong MAC, a VF absent, a refused registration, ...)."""
    registered: dict[str, NodeRegistration] = await registrations.latest()
    async with registrations.service.reading() as fabric:
        known = {n for n, r in registered.items() if r.observed is not None and n in fabric.nodes}
        return MismatchReport(
            revision=fabric.revision, registered=len(known),
            unregistered=sorted(set(fabric.nodes) - known)[:1000],
            mismatches=node_mismatches(fabric, registered),
        )  # fmt: skip


@router.get("/cabling", response_model=CablingReport)
async def cabling_report(
    _: Viewer, registrations: RegistrationsDep,
    state: Annotated[CablingState | None, Query(description="only links in this state")] = None,
) -> CablingReport:  # fmt: skip
    """Each declared link's cabling as the agents' neighbour probes hear it (registrations
    older than 3 registration periods count as silent), and whether it is kept out of path
    computation (miscabled)."""
    registered = await registrations.latest()
    observations = registrations.heard_now(registered)
    async with registrations.service.reading() as fabric:
        verdicts = cabling(fabric, observations)
        out = [LinkCabling(**v.model_dump(), out_of_service=v.link_id in fabric.miscabled)
               for v in verdicts]  # fmt: skip
        revision = fabric.revision
    count = {
        s: sum(1 for v in out if v.state == s) for s in ("verified", "unverified", "miscabled")
    }
    return CablingReport(
        revision=revision, verified=count["verified"], unverified=count["unverified"],
        miscabled=count["miscabled"], out_of_service=sum(1 for v in out if v.out_of_service),
        links=[v for v in out if state is None or v.state == state],
    )  # fmt: skip
