"""The programmer's NATS connections: each node it serves speaks as itself.

With THORN_NATS_CREDS unset (a server without auth) the process has one connection that
every node's agent shares, and it makes THORN's streams as the services do. With it, each
node connects with its own identity, whose permissions allow that node's subjects and keys
only: a file for the one node of a production process, a directory of `<node>.creds` for a
lab's nodes. An agent's identity may not make streams or buckets: it waits for the services
to make the desired-state bucket. Each identity's creds file is kept current by a
`CredentialsKeeper` (thorn_programmer.credentials).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import nats.js.errors
import structlog

from thorn.bus import Bus, DesiredStateStore
from thorn.config import Settings
from thorn_programmer.agent import NodeAgent
from thorn_programmer.credentials import CredentialsKeeper

log = structlog.get_logger("thorn.programmer")

BUCKET_WAIT_SECONDS = 2.0


class CredentialsSettingError(SystemExit):
    """THORN_NATS_CREDS does not fit the nodes this process serves."""


@dataclass(frozen=True, slots=True)
class NodeBus:
    """One node's connection, its desired-state bucket and its creds file (None: shared,
    unauthenticated)."""

    node: str
    bus: Bus
    kv: DesiredStateStore
    creds: Path | None


def creds_of(settings: Settings, nodes: list[str]) -> dict[str, Path] | None:
    """Each node's creds file from THORN_NATS_CREDS (None: unset), checked to exist."""
    given = settings.nats_creds
    if given is None:
        return None
    if given.is_dir():
        found = {node: given / f"{node}.creds" for node in nodes}
        missing = [node for node, path in found.items() if not path.is_file()]
        if missing:
            raise CredentialsSettingError(
                f"programmer: THORN_NATS_CREDS={given} has no {missing[0]}.creds"
                + (f" (nor for {len(missing) - 1} more nodes)" if len(missing) > 1 else "")
            )
        return found
    if len(nodes) != 1:
        raise CredentialsSettingError(
            f"programmer: THORN_NATS_CREDS={given} is one identity, but this process serves "
            f"{len(nodes)} nodes: give a directory of <node>.creds"
        )
    if not given.is_file():
        raise CredentialsSettingError(f"programmer: THORN_NATS_CREDS={given} does not exist")
    return {nodes[0]: given}


async def connect_nodes(
    settings: Settings, nodes: list[str], stack: AsyncExitStack, *, bus: Bus | None = None
) -> dict[str, NodeBus]:
    """Each node's connection and bucket (the given `bus` for all: tests), closed with
    `stack`."""
    creds = creds_of(settings, nodes) if bus is None else None
    if creds is None:
        shared = bus
        if shared is None:
            shared = await Bus.connect(
                settings.nats_url, name="thorn-programmer", replicas=settings.nats_replicas,
                tls=settings.nats_tls,
            )  # fmt: skip
            stack.push_async_callback(shared.close)
            await shared.ensure_streams()
        kv = await shared.desired_state()
        return {node: NodeBus(node, shared, kv, None) for node in nodes}
    out: dict[str, NodeBus] = {}
    for node in nodes:
        own = await Bus.connect(
            settings.nats_url, name=f"thorn-programmer@{node}", replicas=settings.nats_replicas,
            tls=settings.nats_tls, creds=creds[node],
        )  # fmt: skip
        stack.push_async_callback(own.close)
        out[node] = NodeBus(node, own, await bucket_when_made(own, node), creds[node])
    return out


async def bucket_when_made(bus: Bus, node: str) -> DesiredStateStore:
    """The desired-state bucket, once the services have made it (an agent may not)."""
    waited = False
    while True:
        try:
            return await bus.desired_state(create=False)
        except (nats.js.errors.BucketNotFoundError, nats.errors.TimeoutError):
            if not waited:
                log.warning("desired_state_bucket_awaited", node=node,
                            hint="the controller's services make it when they start")  # fmt: skip
                waited = True
            await asyncio.sleep(BUCKET_WAIT_SECONDS)


def keep_credentials(link: NodeBus, agent: NodeAgent) -> CredentialsKeeper | None:
    """The keeper of a node's creds file (None: no credentials), wired to its agent: the
    agent watches only the VNIs they allow and asks for a renewal for the others."""
    if link.creds is None:
        return None
    keeper = CredentialsKeeper(link.node, link.bus, link.creds)
    agent.permits_vni = keeper.permits_vni
    agent.vnis_refused = keeper.vnis_refused
    keeper.on_renewed.append(agent.permissions_changed)
    return keeper
