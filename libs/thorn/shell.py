"""A service process before its core lands: connected to the bus, following its inputs.

health, pathcomp and programmer start as this shell (issues 3-5 give them their cores): the
process, its settings, its bus subscriptions, /healthz and /metrics are real, so deployment,
compose and `make run` exercise them from day one. Each input event is decoded and counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from prometheus_client import Counter

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import Event
from thorn.telemetry import instrument

EVENTS_SEEN = Counter(
    "thorn_service_events_total", "Input events a service received", ["service", "subject"]
)


def shell_app(service: str, settings: Settings, inputs: list[str]) -> FastAPI:
    log = structlog.get_logger(f"thorn.{service}")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bus = await Bus.connect(settings.nats_url, name=f"thorn-{service}")
        try:
            await bus.ensure_streams()

            async def seen(event: Event) -> None:
                EVENTS_SEEN.labels(service, event.subject).inc()
                log.info(
                    "input_event", subject=event.subject, payload=event.model_dump(mode="json")
                )

            for subject in inputs:
                await bus.subscribe(subject, seen)
            log.info("service_ready", inputs=inputs)
            yield
        finally:
            await bus.close()

    app = FastAPI(title=f"THORN {service}", lifespan=lifespan)
    instrument(app, service)
    return app
