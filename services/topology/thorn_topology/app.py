"""The topology service's app factory: settings in, a FastAPI app out (nothing at import)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import structlog
from fastapi import FastAPI

from thorn.audit import AuditTrail
from thorn.auth import BOOTSTRAP_TOKEN_NAME, guarding, hash_token, new_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.model import TokenRole
from thorn.natsauth.jwt import JwtError
from thorn.service import open_store_and_bus
from thorn.store import Store
from thorn.telemetry import instrument
from thorn.watchdog import LoopWatchdog
from thorn.web import BodyLimit, install_error_handlers
from thorn_topology.api import router
from thorn_topology.applied import AppliedReports
from thorn_topology.credentials import AgentCredentials
from thorn_topology.credentials import router as credentials_router
from thorn_topology.events_api import router as events_router
from thorn_topology.observed_api import router as observed_router
from thorn_topology.registrations import Registrations
from thorn_topology.service import TopologyService

log = structlog.get_logger("thorn.topology")
IMPORT_PATHS = "/api/v1/fabric/import"


async def bootstrap_admin(store: Store, settings: Settings) -> str | None:
    """Install the bootstrap admin token; return a newly generated secret, if one was made."""
    if settings.admin_token is not None:
        secret = settings.admin_token.get_secret_value()
        await store.put_token(BOOTSTRAP_TOKEN_NAME, TokenRole.admin, hash_token(secret), "system")
        return None
    if await store.has_token(BOOTSTRAP_TOKEN_NAME):
        return None
    secret = new_token()
    await store.put_token(BOOTSTRAP_TOKEN_NAME, TokenRole.admin, hash_token(secret), "system")
    return secret


def create_app(
    settings: Settings, *, store: Store | None = None, bus: Bus | None = None
) -> FastAPI:
    """Build the app. A given store or bus is used as is (tests); else they are opened here."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(LoopWatchdog("topology").running())
            the_store, the_bus = await open_store_and_bus(stack, settings, "topology", store, bus)
            generated = await bootstrap_admin(the_store, settings)
            if generated is not None:
                # Printed once, on the run that created it; only its hash is stored.
                print(
                    f"\nTHORN bootstrap admin token (shown once, store it now): {generated}\n",
                    flush=True,
                )
            service = TopologyService(the_store, the_bus, await the_store.store_id())
            service.start()
            stack.push_async_callback(service.stop)
            app.state.topology = service
            app.state.bus = the_bus
            registrations = Registrations(service, stale_after=3 * settings.register_seconds)
            subscription = await registrations.start(the_bus.nc)
            stack.push_async_callback(subscription.unsubscribe)
            app.state.registrations = registrations
            applied = AppliedReports()
            stack.push_async_callback((await applied.start(the_bus.nc)).unsubscribe)
            app.state.applied = applied
            # Agents' NATS credentials, when THORN_NATS_ISSUER_SEED gives the signing key.
            try:
                credentials = AgentCredentials.from_settings(settings, service, the_bus)
            except JwtError as exc:
                log.error("credentials_issuer_unusable", error=str(exc))
                raise
            if credentials is not None:
                await credentials.start()
                stack.push_async_callback(credentials.stop)
            app.state.credentials = credentials
            await stack.enter_async_context(guarding(app, the_store))
            log.info(
                "topology_ready", database=the_store.dialect, revision=await the_store.revision()
            )
            yield

    app = FastAPI(
        title="THORN topology",
        version="0.1.0",
        description="Fabric topology store: nodes, ports, links, tenants, workloads, TEPs.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(AuditTrail)
    # Set there, the bootstrap admin is re-keyed at every start: rotating it by API would not last.
    app.state.bootstrap_from_settings = settings.admin_token is not None
    instrument(app, "topology")
    app.include_router(router)
    app.include_router(observed_router)
    app.include_router(events_router)
    app.include_router(credentials_router)
    app.add_middleware(
        BodyLimit,
        default=settings.max_body_bytes,
        large={IMPORT_PATHS: settings.max_import_bytes},
    )
    return app
