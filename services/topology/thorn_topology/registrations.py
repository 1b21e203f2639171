"""Agents' registrations: topology's shell around `thorn.registration`.

Agents send `AgentRegistration` as a core-NATS request on `agent.register.<node>`; one
topology replica (a queue group) answers each with a `RegistrationReply`:

- bad input (a node not in the topology, a VF naming no device, an RDMA device on a netdev
  the topology does not know) is refused: logged, counted, the reply names the field, and
  the node's last good registration stays. A known node's refusal is kept beside it, so
  the API shows it; an unknown node's is stored nowhere.
- a good one becomes the node's latest (the latest per node wins), and the cabling check
  runs over every node's latest: a link newly heard contradicting the declaration is
  marked miscabled, one heard as declared is cleared, through the topology write path (one
  revision and audit row for all of a check's changes, `topology.changed`), which is how
  pathcomp learns of it, as of a drain.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from thorn.auth import Principal
from thorn.events import (
    AGENT_REGISTER_ALL,
    AgentRegistration,
    EventDecodeError,
    RegistrationReply,
    decode,
    utcnow,
)
from thorn.fabric import Change, Fabric
from thorn.model import TokenRole
from thorn.observed import NodeObservation
from thorn.registration import (
    CablingVerdict,
    Mismatch,
    cabling,
    mismatches,
    next_miscabled,
    refusal,
)
from thorn.store.observed import ObservedRecord
from thorn_topology.service import TopologyService

log = structlog.get_logger("thorn.topology.registrations")

REGISTRATIONS = Counter(
    "thorn_topology_registrations_total", "Agent registrations, by outcome", ["outcome"]
)
REGISTRATION_SECONDS = Histogram(
    "thorn_topology_registration_seconds", "Registration request to reply",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)  # fmt: skip
QUEUE_GROUP = "thorn-topology"
# The cabling check writes as this principal (the audit log's actor).
CABLING_PRINCIPAL = Principal(name="cabling-check", role=TokenRole.operator)


@dataclass(frozen=True)
class NodeRegistration:
    """A node's stored registration, decoded: what the API shows beside the declaration."""

    node: str
    observed: NodeObservation | None
    run: str | None
    seq: int | None
    received_at: datetime | None
    refused_at: datetime | None
    refused_error: str | None


def _decoded(record: ObservedRecord) -> NodeRegistration:
    observed = None
    if record.observed is not None:
        try:
            observed = NodeObservation.model_validate(record.observed)
        except ValidationError as exc:  # stored by an older version: shown as unregistered
            log.warning("stored_registration_unreadable", node=record.node, error=str(exc))
    return NodeRegistration(record.node, observed, record.run, record.seq, record.received_at,
                            record.refused_at, record.refused_error)  # fmt: skip


class Registrations:
    def __init__(self, service: TopologyService, stale_after: float = 90.0) -> None:
        self.service = service
        # A registration older than this is an agent gone quiet: what it heard is not
        # held for or against a link (3 registration periods by default).
        self.stale_after = timedelta(seconds=stale_after)
        self.store = service.store
        self._lock = asyncio.Lock()  # one cabling check at a time in this replica
        self._decoded: dict[str, tuple[tuple[object, ...], NodeRegistration]] = {}

    async def start(self, nc: NatsClient) -> Subscription:
        """Answer registrations (one replica per request); returns the subscription."""
        return await nc.subscribe(AGENT_REGISTER_ALL, queue=QUEUE_GROUP, cb=self.on_message)

    async def on_message(self, msg: Msg) -> None:
        start = time.perf_counter()
        reply = await self.register_raw(msg.subject, msg.data)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())
        REGISTRATION_SECONDS.observe(time.perf_counter() - start)

    async def register_raw(self, subject: str, data: bytes) -> RegistrationReply:
        try:
            event = decode(subject, data)
        except EventDecodeError as exc:
            REGISTRATIONS.labels("malformed").inc()
            log.warning("registration_malformed", subject=subject, error=str(exc))
            return RegistrationReply(ok=False, error=str(exc))
        assert isinstance(event, AgentRegistration)
        try:
            return await self.register(event)
        except Exception as exc:  # a bug here, not the agent's fault: say so, keep serving
            REGISTRATIONS.labels("failed").inc()
            log.exception("registration_failed", node=event.node)
            return RegistrationReply(ok=False, error=f"topology failed: {type(exc).__name__}")

    async def register(self, event: AgentRegistration) -> RegistrationReply:
        """Check, store and run the cabling check; the reply says what became of it."""
        node = event.node
        async with self.service.reading() as fabric:
            why = refusal(fabric, node, event.observed)
            known = node in fabric.nodes
            found = [] if why else mismatches(fabric, node, event.observed)
        if why is not None:
            REGISTRATIONS.labels("refused").inc()
            log.error("registration_refused", node=node, seq=event.seq, error=why)
            if known:  # an unknown node gets nothing stored, not even its refusal
                await self.store.put_refused(node, why, utcnow())
            return RegistrationReply(ok=False, error=why)
        await self.store.put_observed(ObservedRecord(
            node=node, run=event.run, seq=event.seq, received_at=utcnow(),
            observed=event.observed.model_dump(mode="json"),
        ))  # fmt: skip
        REGISTRATIONS.labels("stored").inc()
        if found:
            log.info("registration_mismatches", node=node, count=len(found),
                     first=[m.message for m in found[:3]])  # fmt: skip
        await self.check_cabling()
        return RegistrationReply(ok=True, mismatches=len(found))

    async def latest(self) -> dict[str, NodeRegistration]:
        """Every node's stored registration (any replica may have taken it), decoded once
        per version: the cabling check reads them all after each registration."""
        out: dict[str, NodeRegistration] = {}
        for record in await self.store.observed_nodes():
            version = (record.run, record.seq, record.received_at, record.refused_at)
            cached = self._decoded.get(record.node)
            if cached is None or cached[0] != version:
                cached = self._decoded[record.node] = (version, _decoded(record))
            out[record.node] = cached[1]
        for gone in set(self._decoded) - set(out):
            del self._decoded[gone]
        return out

    def heard_now(self, registered: dict[str, NodeRegistration]) -> dict[str, NodeObservation]:
        """The observations the cabling check goes by: registrations not gone stale."""
        since = utcnow() - self.stale_after
        return {
            n: r.observed for n, r in registered.items()
            if r.observed is not None and r.received_at is not None and r.received_at >= since
        }  # fmt: skip

    async def check_cabling(self) -> list[CablingVerdict]:
        """Verdicts from every node's latest registration; mark and clear miscabled links."""
        async with self._lock:
            registered = await self.latest()
            observations = self.heard_now(registered)
            async with self.service.reading() as fabric:
                verdicts = cabling(fabric, observations)
                current = {i: m.reason for i, m in fabric.miscabled.items()}
            changes = next_miscabled(current, verdicts)
            for link_id, reason in changes.items():
                level = log.error if reason else log.info
                level("link_miscabled" if reason else "link_cabled_as_declared",
                      link_id=link_id, reason=reason)  # fmt: skip
            if changes:  # one write, one revision, one replan for all of them
                target = ",".join(str(i) for i in sorted(changes))
                await self.service.write(
                    CABLING_PRINCIPAL, "link.cabling", target,
                    functools.partial(_set_miscabled, changes=changes),
                    {str(i): {"miscabled": r is not None, "reason": r} for i, r in changes.items()},
                )  # fmt: skip
            return verdicts


def _set_miscabled(fabric: Fabric, *, changes: dict[int, str | None]) -> list[Change]:
    """Mark and clear links; a link deleted since the verdicts has nothing left to mark."""
    return [c for i, r in sorted(changes.items()) if i in fabric.links
            for c in fabric.set_miscabled(i, r)]  # fmt: skip


def node_mismatches(fabric: Fabric, registered: dict[str, NodeRegistration]) -> list[Mismatch]:
    """Every registered node's mismatches, and each refusal newer than its last good one."""
    out: list[Mismatch] = []
    for name in sorted(registered):
        reg = registered[name]
        if name not in fabric.nodes:
            continue
        if reg.observed is not None:
            out += mismatches(fabric, name, reg.observed)
        if reg.refused_error is not None:
            out.append(Mismatch(node=name, kind="registration_refused", subject=name,
                                message=reg.refused_error))  # fmt: skip
    return out
