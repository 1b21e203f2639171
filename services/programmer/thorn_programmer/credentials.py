"""Keeping a node's NATS credentials current (the agent's side of thorn_topology.credentials).

The agent renews its user JWT with topology (`agent.renew.<node>`, presenting the JWT it
holds; the answer is a JWT for the same key, its seed never sent): at start (its VNIs may
have changed while it was down), when topology says its VNIs changed (`agent.creds.<node>`),
when its desired state names a VNI its JWT does not allow, and once half of the JWT's
lifetime has passed. A renewed JWT is checked (its own key, its own node) and written to the
creds file atomically with the seed; when its VNIs differ, the connection is made again at
once, which reads it (else the next reconnect does: at the latest the server's own, when the
JWT of the connection expires).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from prometheus_client import Counter
from pydantic import ValidationError

from thorn.bus import Bus, PublishError
from thorn.events import (
    CredentialsChanged,
    CredentialsRenewal,
    CredentialsReply,
    agent_creds_subject,
    utcnow,
)
from thorn.natsauth.files import write_secret
from thorn.natsauth.issue import renew_at, vnis_of
from thorn.natsauth.jwt import Claims, JwtError, creds, decode, read_creds

log = structlog.get_logger("thorn.programmer")

RENEWALS = Counter(
    "thorn_programmer_credential_renewals_total",
    "NATS credential renewals asked of topology, by result (renewed, refused, unanswered, "
    "unwritten: the creds file's directory is not writable)",
    ["node", "result"],
)
RETRY_SECONDS = 30.0  # after a renewal that failed
MISSING_VNI_SECONDS = 5.0  # at most this often for a VNI the JWT does not allow yet
REPLY_WITHIN = 10.0


class CredentialsKeeper:
    """One node's creds file and connection (see the module's doc)."""

    def __init__(
        self, node: str, bus: Bus, path: Path, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.node = node
        self.bus = bus
        self.path = path
        self.clock = clock
        self.claims = self._read()[0]  # the file's JWT
        self.connected = self.claims  # the JWT the connection was made with
        self.renewed = asyncio.Event()  # set after each renewal (tests and the agent wait)
        self.on_renewed: list[Callable[[], Awaitable[None]]] = []
        self._wake = asyncio.Event()
        self._asked_for_vnis = 0.0

    def _read(self) -> tuple[Claims, str]:
        token, user = read_creds(self.path.read_text())
        return decode(token), user.seed

    @property
    def vnis(self) -> set[int]:
        """The VNIs the current JWT lets this node read."""
        return vnis_of(self.claims)

    def permits_vni(self, vni: int) -> bool:
        return vni in self.vnis

    def vnis_refused(self, vnis: set[int]) -> None:
        """The desired state names VNIs the JWT does not allow: renew soon (bounded)."""
        now = self.clock()
        if now - self._asked_for_vnis >= MISSING_VNI_SECONDS:
            self._asked_for_vnis = now
            log.info("credentials_lack_vnis", node=self.node, vnis=sorted(vnis)[:20])
            self._wake.set()

    async def renew(self, reason: str, *, reconnect: bool = False) -> bool:
        """Ask topology for a renewed JWT and write it; reconnect with it when its VNIs differ
        from the current one's, or when asked to."""
        token, user = read_creds(self.path.read_text())
        request = CredentialsRenewal(node=self.node, jwt=token, sent_at=utcnow())
        try:
            raw = await self.bus.request(request, reply_within=REPLY_WITHIN)
            reply = CredentialsReply.model_validate_json(raw)
        except (PublishError, ValidationError) as exc:
            RENEWALS.labels(self.node, "unanswered").inc()
            log.warning("credentials_not_renewed", node=self.node, reason=reason,
                        error=str(exc))  # fmt: skip
            return False
        try:
            if not reply.ok or reply.jwt is None:
                raise JwtError(reply.error or "refused without a reason")
            claims = decode(reply.jwt)
            if claims.subject != user.public or claims.name != f"agent:{self.node}":
                raise JwtError("the JWT topology sent is not for this node's key")
        except JwtError as exc:
            RENEWALS.labels(self.node, "refused").inc()
            log.error("credentials_renewal_refused", node=self.node, reason=reason,
                      error=str(exc))  # fmt: skip
            return False
        try:
            write_secret(self.path, creds(reply.jwt, user))
        except OSError as exc:  # a read-only mount: the file's directory must be writable
            RENEWALS.labels(self.node, "unwritten").inc()
            log.error("credentials_not_written", node=self.node, path=str(self.path),
                      error=exc.strerror)  # fmt: skip
            return False
        reconnect = reconnect or vnis_of(claims) != self.vnis
        self.claims = claims
        RENEWALS.labels(self.node, "renewed").inc()
        log.info("credentials_renewed", node=self.node, reason=reason, reconnect=reconnect,
                 vnis=sorted(self.vnis)[:20], expires=claims.expires)  # fmt: skip
        if reconnect:  # the new JWT is the connection's from the next connection on
            await self.bus.reconnect()
            self.connected = claims
        self.renewed.set()
        self.renewed = asyncio.Event()
        for follower in self.on_renewed:
            await follower()
        return True

    async def on_changed(self, event: CredentialsChanged) -> None:
        if set(event.vnis) != self.vnis:
            self._wake.set()

    async def run(self) -> None:
        """Renew at start, when told or lacking a VNI, and once half the lifetime of the
        connection's JWT has passed (then reconnecting: the server would end the connection
        when that JWT expires, and nats-py does not come back from that); until cancelled."""
        subscription = await self.bus.subscribe(
            agent_creds_subject(self.node), self.on_changed, model=CredentialsChanged
        )
        try:
            reason, reconnect = "start", False
            while True:
                self._wake.clear()  # what is asked while this renewal runs wakes the next
                ok = await self.renew(reason, reconnect=reconnect)
                reconnect = reconnect and not ok
                due = renew_at(self.connected)
                wait = RETRY_SECONDS if not ok else (
                    max(1.0, due - self.clock()) if due is not None else None
                )  # fmt: skip
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                    reason = "told or lacking a VNI"
                except TimeoutError:
                    if ok:
                        reason, reconnect = "half its lifetime passed", True
                    else:
                        reason = "retry"
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
