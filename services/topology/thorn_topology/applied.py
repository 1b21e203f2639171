"""The latest `DatapathApplied` of every node's agent, as this replica heard it.

Agents send one after every reconcile on core NATS (not stored): each topology replica
listens to all of them (no queue group) and keeps the last per node in memory, for the
node view. A replica started after an agent's last reconcile knows of it at the next one.
"""

from __future__ import annotations

import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter

from thorn.events import AGENT_APPLIED_ALL, DatapathApplied, EventDecodeError, decode

log = structlog.get_logger("thorn.topology")
REFUSED = Counter(
    "thorn_topology_applied_refused_total",
    "Applied reports refused: not a DatapathApplied, or naming another node than their subject "
    "(the one the sender's NATS credentials allow it to publish on)",
)


class AppliedReports:
    def __init__(self) -> None:
        self.latest: dict[str, DatapathApplied] = {}

    async def start(self, nc: NatsClient) -> Subscription:
        return await nc.subscribe(AGENT_APPLIED_ALL, cb=self.on_message)

    async def on_message(self, msg: Msg) -> None:
        try:
            event = decode(msg.subject, msg.data)
        except EventDecodeError as exc:
            REFUSED.inc()
            log.warning("applied_malformed", subject=msg.subject, error=str(exc))
            return
        if isinstance(event, DatapathApplied):
            self.latest[event.node] = event
