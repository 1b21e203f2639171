"""Agents' NATS credentials, issued by topology (which owns nodes and VNI membership).

An agent may read the desired-state documents of the VNIs its node's workloads are in, so its
user JWT lists them (thorn.natsauth.permissions.agent). Topology holds the THORN account's
signing key (THORN_NATS_ISSUER_SEED) and:

- issues a node's first credentials to an admin (`POST /api/v1/nodes/{name}/credentials`:
  a new key pair, the .creds file in the answer, nothing kept);
- renews them on request (`agent.renew.<node>`, which only that node's credentials may
  publish on): a new JWT for the key of the one presented, with the node's VNIs as they are
  now; the seed never travels;
- tells an agent when its VNIs change (`agent.creds.<node>`, after a topology change), and
  the agent renews at once. An agent that does not keeps its old permissions until its JWT
  expires (AGENT_LIFETIME); revoke its key to cut it off sooner.

Replicas share the work through a queue group: each renewal and each topology change is
handled by one of them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Request
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter
from pydantic import BaseModel, Field

from thorn.auth import Admin
from thorn.bus import Bus, PublishError
from thorn.config import Settings
from thorn.events import (
    AGENT_RENEW_ALL,
    TOPOLOGY_CHANGED,
    CredentialsChanged,
    CredentialsRenewal,
    CredentialsReply,
    EventDecodeError,
    TopologyChanged,
    decode,
)
from thorn.fabric import Fabric, NotFound
from thorn.natsauth import permissions
from thorn.natsauth.files import read_signer
from thorn.natsauth.issue import AGENT_LIFETIME, Signer, check_issued, user_jwt
from thorn.natsauth.jwt import JwtError, creds, new_key
from thorn.web import ERROR_RESPONSES, FieldError
from thorn_topology.api import NodeName
from thorn_topology.service import TopologyService

log = structlog.get_logger("thorn.topology")
QUEUE_GROUP = "thorn-topology-issuer"

RENEWALS = Counter(
    "thorn_topology_credential_renewals_total", "Agents' NATS credential renewals, by result",
    ["result"],
)  # fmt: skip
ISSUED = Counter("thorn_topology_credentials_issued_total", "Node credentials issued to an admin")
PUSHED = Counter(
    "thorn_topology_credential_changes_total",
    "Agents told their VNIs changed (agent.creds.<node>), so that they renew",
)


def memberships(fabric: Fabric) -> dict[str, frozenset[int]]:
    """Each host's VNIs: those of the workloads on it."""
    found: dict[str, set[int]] = {}
    for workload in fabric.workloads.values():
        found.setdefault(workload.node, set()).add(workload.vni)
    return {node: frozenset(vnis) for node, vnis in found.items()}


def changed_members(
    before: Mapping[str, frozenset[int]], after: Mapping[str, frozenset[int]]
) -> dict[str, frozenset[int]]:
    """The nodes whose VNIs differ, with their new VNIs (empty: none left)."""
    return {
        node: after.get(node, frozenset())
        for node in sorted(set(before) | set(after))
        if before.get(node, frozenset()) != after.get(node, frozenset())
    }


class AgentCredentials:
    """Topology's issuer of agents' credentials (see the module's doc)."""

    def __init__(
        self,
        signer: Signer,
        service: TopologyService,
        bus: Bus | None,
        *,
        lifetime: float = AGENT_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.signer = signer
        self.service = service
        self.bus = bus
        self.lifetime = lifetime
        self._now = clock
        self._members: dict[str, frozenset[int]] = {}
        self._subscriptions: list[Subscription] = []

    @classmethod
    def from_settings(
        cls, settings: Settings, service: TopologyService, bus: Bus | None
    ) -> AgentCredentials | None:
        """The issuer THORN_NATS_ISSUER_SEED sets up (None: unset); `JwtError` naming the
        setting at fault."""
        if settings.nats_issuer_seed is None:
            return None
        if settings.nats_creds is None:
            raise JwtError("THORN_NATS_ISSUER_SEED needs THORN_NATS_CREDS (topology's own "
                           "identity names the account it issues for)")  # fmt: skip
        return cls(read_signer(settings.nats_issuer_seed, settings.nats_creds), service, bus)

    async def vnis(self, node: str) -> list[int]:
        async with self.service.reading() as fabric:
            return sorted(memberships(fabric).get(node, frozenset()))

    def jwt_for(self, node: str, user: str, vnis: list[int]) -> tuple[str, datetime]:
        now = self._now()
        token = user_jwt(permissions.agent(node, vnis), user, self.signer, now=now,
                         lifetime=self.lifetime)  # fmt: skip
        return token, datetime.fromtimestamp(int(now + self.lifetime), UTC)

    # --- NATS ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Answer renewals and follow topology changes (one replica each, queue group)."""
        assert self.bus is not None
        async with self.service.reading() as fabric:
            self._members = memberships(fabric)
        nc = self.bus.nc
        self._subscriptions = [
            await nc.subscribe(AGENT_RENEW_ALL, queue=QUEUE_GROUP, cb=self.on_renewal),
            await nc.subscribe(TOPOLOGY_CHANGED, queue=QUEUE_GROUP, cb=self.on_topology_msg),
        ]

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            with contextlib.suppress(Exception):  # the connection may be gone already
                await subscription.unsubscribe()
        self._subscriptions = []

    async def renew(self, subject: str, data: bytes) -> CredentialsReply:
        """A renewal request's answer (the subject is the one the asker was allowed on)."""
        try:
            request = decode(subject, data)
            assert isinstance(request, CredentialsRenewal)
            claims = check_issued(request.jwt, self.signer, node=request.node)
        except (EventDecodeError, JwtError) as exc:
            RENEWALS.labels("refused").inc()
            log.warning("credentials_renewal_refused", subject=subject, error=str(exc))
            return CredentialsReply(ok=False, error=str(exc))
        vnis = await self.vnis(request.node)
        token, expires = self.jwt_for(request.node, claims.subject, vnis)
        RENEWALS.labels("renewed").inc()
        log.info("credentials_renewed", node=request.node, vnis=vnis[:20], vni_count=len(vnis),
                 expires_at=expires.isoformat())  # fmt: skip
        return CredentialsReply(ok=True, jwt=token, expires_at=expires, vnis=vnis)

    async def on_renewal(self, msg: Msg) -> None:
        reply = await self.renew(msg.subject, msg.data)
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    async def on_topology_msg(self, msg: Msg) -> None:
        try:
            event = decode(msg.subject, msg.data)
        except EventDecodeError:
            return  # counted and logged by those who act on topology changes
        if isinstance(event, TopologyChanged):
            await self.on_topology(event)

    async def on_topology(self, event: TopologyChanged) -> None:
        """Tell each node whose VNIs changed to renew its credentials."""
        async with self.service.reading() as fabric:
            now = memberships(fabric)
        changed = changed_members(self._members, now)
        self._members = now
        assert self.bus is not None
        for node, vnis in changed.items():
            notice = CredentialsChanged(node=node, vnis=sorted(vnis), at=datetime.now(UTC),
                                        reason=f"topology revision {event.revision}")  # fmt: skip
            try:
                await self.bus.publish(notice)
            except PublishError:
                continue  # the agent renews on its own before its JWT expires
            PUSHED.inc()
            log.info("credentials_changed", node=node, vnis=sorted(vnis)[:20],
                     revision=event.revision)  # fmt: skip


# --- the admin's API ---------------------------------------------------------------------------


class NodeCredentials(BaseModel):
    """A node's new NATS identity: its creds file (the user JWT and its seed: a secret, shown
    once, kept nowhere) for the node's agent (THORN_NATS_CREDS)."""

    node: str
    public_key: str = Field(description="the identity's user public key (to revoke it)")
    expires_at: datetime = Field(description="when the JWT expires; the agent renews before")
    vnis: list[int] = Field(description="the VNIs whose documents it may read now")
    creds: str = Field(description="the .creds file's text; save it 0600 on the node")


def get_issuer(request: Request) -> AgentCredentials:
    issuer: AgentCredentials | None = getattr(request.app.state, "credentials", None)
    if issuer is None:
        raise FieldError(503, ["path", "name"], "this topology issues no NATS credentials: "
                         "THORN_NATS_ISSUER_SEED is unset", "unavailable")  # fmt: skip
    return issuer


Issuer = Annotated[AgentCredentials, Depends(get_issuer)]
router = APIRouter(prefix="/api/v1", responses=ERROR_RESPONSES)


@router.post("/nodes/{name}/credentials", tags=["nodes"], response_model=NodeCredentials,
             status_code=201)  # fmt: skip
async def issue_credentials(principal: Admin, issuer: Issuer, name: NodeName) -> NodeCredentials:
    """A new NATS identity for node `name`'s agent (admin): a key pair made here, its JWT
    allowing that node's subjects and keys and its VNIs' documents. The seed is in the answer
    only: keep it on the node (0600) and give its path as THORN_NATS_CREDS."""
    if principal.audit is not None:  # the audit trail writes its entry with the outcome
        principal.audit.action, principal.audit.target = "node.credentials", name
    async with issuer.service.reading() as fabric:
        if name not in fabric.nodes:
            raise NotFound(f"node {name!r} does not exist")
    user = new_key("user")
    vnis = await issuer.vnis(name)
    token, expires = issuer.jwt_for(name, user.public, vnis)
    ISSUED.inc()
    if principal.audit is not None:  # the key, to revoke it by (never the seed)
        principal.audit.detail = {"public_key": user.public, "vnis": vnis}
    log.info("credentials_issued", node=name, public_key=user.public, by=principal.name,
             expires_at=expires.isoformat())  # fmt: skip
    return NodeCredentials(node=name, public_key=user.public, expires_at=expires, vnis=vnis,
                           creds=creds(token, user))  # fmt: skip
