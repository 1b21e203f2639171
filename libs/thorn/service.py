"""Running a service process: logging, the HTTP edge and uvicorn, the same for every service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI

from thorn.bus import Bus
from thorn.config import Settings
from thorn.store import Store
from thorn.telemetry import configure_logging
from thorn.watchdog import settle_heap


async def open_store_and_bus(
    stack: AsyncExitStack,
    settings: Settings,
    name: str,
    store: Store | None = None,
    bus: Bus | None = None,
) -> tuple[Store, Bus]:
    """The store and bus a service runs on: the given ones (tests), or opened here and closed
    with `stack`."""
    if store is None:
        store = await Store.open(settings.db_url)
        stack.push_async_callback(store.close)
    if bus is None:
        bus = await Bus.connect(settings.nats_url, name=f"thorn-{name}")
        stack.push_async_callback(bus.close)
        await bus.ensure_streams()
    return store, bus


def serve(app: FastAPI, settings: Settings, *, loop: str = "auto") -> None:
    """Serve until SIGINT/SIGTERM; uvicorn drains requests and runs the lifespan's cleanup.
    `loop="asyncio"` for a service that opens netlink sockets: uvloop refuses them."""
    host, port = settings.host_port
    started = app.router.lifespan_context

    @asynccontextmanager
    async def settled(app: FastAPI) -> AsyncIterator[Any]:
        async with started(app) as state:
            settle_heap()  # once up: no full collection walks the start-up heap again
            yield state

    app.router.lifespan_context = settled
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, loop=loop)


def start_logging(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    if unknown := Settings.unknown_environment():
        structlog.get_logger("thorn").warning("unknown_settings_ignored", variables=unknown)
