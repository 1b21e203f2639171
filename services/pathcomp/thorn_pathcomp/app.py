"""The pathcomp service's app factory: follows topology and health, plans, publishes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import nats.errors
import structlog
from fastapi import FastAPI
from nats.aio.msg import Msg

from thorn.audit import AuditTrail
from thorn.auth import guarding
from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import (
    AGENT_APPLIED_ALL,
    HEALTH_LINK_ALL,
    PATHS_CHANGED,
    STREAM_PATHS,
    TOPOLOGY_CHANGED,
    DatapathApplied,
    LinkHealthChanged,
    PathsChanged,
    TopologyChanged,
)
from thorn.leader import LeaderElection
from thorn.service import open_store_and_bus
from thorn.store import Store
from thorn.telemetry import instrument
from thorn.watchdog import LoopWatchdog
from thorn.web import BodyLimit, install_error_handlers
from thorn_pathcomp.api import (
    RECOMPUTE_SUBJECT,
    RECOMPUTE_WAIT_S,
    LeaderAway,
    recompute_as_leader,
    router,
)
from thorn_pathcomp.service import PathService

log = structlog.get_logger("thorn.pathcomp")


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    bus: Bus | None = None,
    lease_seconds: float | None = None,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(LoopWatchdog("pathcomp").running())
            the_store, the_bus = await open_store_and_bus(stack, settings, "pathcomp", store, bus)
            kv = await the_bus.desired_state()
            election = LeaderElection(
                the_bus, "pathcomp", ttl=lease_seconds or settings.lease_seconds
            )
            await election.start()
            stack.push_async_callback(election.close)
            service = PathService(
                the_store, kv, the_bus, lambda: election.is_leader,
                stage_timeout=settings.stage_ack_seconds, term=lambda: election.term,
            )  # fmt: skip
            app.state.pathcomp = service
            stack.push_async_callback(service.close)
            await stack.enter_async_context(guarding(app, the_store))

            async def topology(event: TopologyChanged) -> None:
                await service.on_topology(event)

            async def health(event: LinkHealthChanged) -> None:
                await service.on_link_health(event)

            # Subscribed before the first plan: an event during it is applied after it.
            await the_bus.subscribe(TOPOLOGY_CHANGED, topology, model=TopologyChanged)
            await the_bus.subscribe(HEALTH_LINK_ALL, health, model=LinkHealthChanged)
            await service.recompute("start")

            async def recompute_asked(msg: Msg) -> None:
                if not service.is_leader():
                    return  # its term ended: no answer, the follower says so
                actor = msg.data.decode(errors="replace")[:100] or "a follower"
                await msg.respond(await recompute_as_leader(service, actor))

            async def ask_leader(actor: str) -> bytes:
                try:
                    answer = await the_bus.nc.request(
                        RECOMPUTE_SUBJECT, actor.encode(), timeout=RECOMPUTE_WAIT_S
                    )
                except nats.errors.NoRespondersError:
                    raise LeaderAway("no pathcomp replica leads now; retry") from None
                except (nats.errors.TimeoutError, TimeoutError):
                    raise LeaderAway("the pathcomp leader did not answer in time") from None
                return bytes(answer.data)

            app.state.ask_leader = ask_leader

            async def lead() -> None:
                # Recomputes asked of the followers come here while this replica leads.
                asked = await the_bus.nc.subscribe(RECOMPUTE_SUBJECT, cb=recompute_asked)
                try:
                    await service.resync()  # the documents first, then the word on reverts
                    last = await the_bus.last(STREAM_PATHS, PATHS_CHANGED, PathsChanged)
                    await service.take_over(last.revision if last is not None else 0)
                    await asyncio.Event().wait()  # until the term ends (cancelled)
                finally:
                    with contextlib.suppress(Exception):  # the connection may be gone
                        await asked.unsubscribe()

            resync = asyncio.create_task(election.run_as_leader(lead), name="pathcomp-resync")
            stack.callback(resync.cancel)
            # Agents' reports pace the staged writes (make-before-break).
            await the_bus.subscribe(
                AGENT_APPLIED_ALL, service.acks.on_applied, model=DatapathApplied
            )
            log.info("pathcomp_ready", candidate=election.candidate_id)
            yield

    app = FastAPI(
        title="THORN pathcomp",
        version="0.1.0",
        description="Disjoint red/blue paths for every host pair, and desired state per node.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(AuditTrail)
    instrument(app, "pathcomp")
    app.include_router(router)
    app.add_middleware(BodyLimit, default=settings.max_body_bytes, large={})
    return app
