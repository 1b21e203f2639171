"""The health service's app factory: agent reports in, link health out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import structlog
from fastapi import FastAPI

from thorn.audit import AuditTrail
from thorn.auth import guarding
from thorn.bus import Bus
from thorn.config import Settings
from thorn.leader import LeaderElection
from thorn.service import open_store_and_bus
from thorn.store import Store
from thorn.telemetry import instrument
from thorn.watchdog import LoopWatchdog
from thorn.web import BodyLimit, install_error_handlers
from thorn_health.api import failover_router, router
from thorn_health.linkstate import Dampening, HealthConfig
from thorn_health.service import HealthService

log = structlog.get_logger("thorn.health")


def health_config(settings: Settings) -> HealthConfig:
    """The state machine's settings; dampening figures that contradict each other are
    refused naming the settings."""
    try:
        dampening = Dampening(
            penalty=settings.health_flap_penalty,
            half_life=settings.health_half_life_seconds,
            suppress_at=settings.health_suppress_at,
            reuse_at=settings.health_reuse_at,
            max_penalty=settings.health_max_penalty,
        )
    except ValueError as exc:
        raise ValueError(
            "THORN_HEALTH_REUSE_AT < THORN_HEALTH_SUPPRESS_AT <= THORN_HEALTH_MAX_PENALTY "
            f"is required: {exc}"
        ) from exc
    return HealthConfig(dampening=dampening, degraded_loss=settings.health_degraded_loss,
                        up_hold=settings.link_up_hold_ms / 1000)  # fmt: skip


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task], timeout=10.0)


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    bus: Bus | None = None,
    clock: Callable[[], float] = time.time,
    lease_seconds: float | None = None,
) -> FastAPI:
    config = health_config(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(LoopWatchdog("health").running())
            the_store, the_bus = await open_store_and_bus(stack, settings, "health", store, bus)
            service = HealthService(
                the_store, the_bus, config, min_packets=settings.health_min_packets,
                max_items=settings.health_max_items, clock=clock,
            )  # fmt: skip
            app.state.health = service
            await stack.enter_async_context(guarding(app, the_store))
            await service.start()
            stack.push_async_callback(service.stop)
            # One active replica takes the reports (its machines are the truth); the others
            # stand by, serve the API from the store, and take over from it.
            election = LeaderElection(
                the_bus, "health", ttl=lease_seconds or settings.lease_seconds
            )
            await election.start()
            stack.push_async_callback(election.close)
            active = asyncio.create_task(election.run_as_leader(service.lead))
            stack.push_async_callback(_cancel, active)
            app.state.election = election
            yield

    app = FastAPI(
        title="THORN health",
        version="0.1.0",
        description="Link health from agents' reports: states, dampening, failure history;"
        " failover timelines.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(AuditTrail)
    instrument(app, "health")
    app.include_router(router)
    app.include_router(failover_router)
    app.add_middleware(BodyLimit, default=settings.max_body_bytes, large={})
    return app
