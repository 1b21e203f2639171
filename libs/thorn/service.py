"""Running a service process: logging, the HTTP edge and uvicorn, the same for every service."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, NoReturn

import structlog
import uvicorn
from fastapi import FastAPI

from thorn.bus import Bus, ReplicasError
from thorn.config import Settings
from thorn.store import DatabaseUnusable, Store
from thorn.telemetry import configure_logging
from thorn.tls import TlsSettingError
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
        try:
            store = await Store.open(settings.db_url, pool=settings.db_pool, name=f"thorn-{name}")
        except DatabaseUnusable as exc:
            raise exc.naming(settings.db_variable) from None
        stack.push_async_callback(store.close)
    if bus is None:
        bus = await Bus.connect(
            settings.nats_url, name=f"thorn-{name}", replicas=settings.nats_replicas,
            tls=settings.nats_tls, creds=settings.nats_creds,
        )  # fmt: skip
        stack.push_async_callback(bus.close)
        await bus.ensure_streams()
    return store, bus


def serve(
    app: FastAPI, settings: Settings, *, loop: str = "auto", trusted_proxies: str | None = None
) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn drains requests and runs the lifespan's cleanup.
    `loop="asyncio"` for a service that opens netlink sockets: uvloop refuses them. HTTPS
    with THORN_TLS_CERT and THORN_TLS_KEY, checked before anything listens. The client's
    address is taken from X-Forwarded-For only when it comes from `trusted_proxies`
    (default THORN_TRUSTED_PROXIES: the entry point); "" trusts no one."""
    host, port = settings.host_port
    trusted = settings.trusted_proxies if trusted_proxies is None else trusted_proxies
    try:
        https = settings.https
    except TlsSettingError as exc:
        refuse_tls(exc)
    started = app.router.lifespan_context

    @asynccontextmanager
    async def settled(app: FastAPI) -> AsyncIterator[Any]:
        try:
            async with started(app) as state:
                settle_heap()  # once up: no full collection walks the start-up heap again
                yield state
        except DatabaseUnusable as exc:
            refuse_to_start(exc)
        except TlsSettingError as exc:  # THORN_NATS_CA and its kin, read when NATS is
            refuse_tls(exc)
        except ReplicasError:
            # Logged where refused (`stream_replicas_refused`, naming THORN_NATS_REPLICAS and
            # the cluster's size): fix the setting, or bring the cluster's servers up.
            _exit(os.EX_CONFIG)

    app.router.lifespan_context = settled
    uvicorn.run(
        app, host=host, port=port, log_config=None, access_log=False, loop=loop,
        ssl_certfile=https.cert if https else None, ssl_keyfile=https.key if https else None,
        proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None,
    )  # fmt: skip


def refuse_tls(exc: TlsSettingError) -> NoReturn:
    """End a process whose TLS setting is unusable (a file missing, unreadable, not PEM, a key
    that is not its certificate's): one log line naming the variable and its file, never its
    content (event `tls_unusable`), then exit 78 (EX_CONFIG)."""
    structlog.get_logger("thorn").error(
        "tls_unusable", variable=exc.variable, path=exc.path, problem=exc.problem,
        error=str(exc), exit_code=os.EX_CONFIG,
    )  # fmt: skip
    _exit(os.EX_CONFIG)


def refuse_to_start(exc: DatabaseUnusable) -> NoReturn:
    """End a process whose database setting is unusable: one log line naming the variable
    (event `database_unusable`, the way to count these: the process is gone before any
    scrape), then exit 78 (EX_CONFIG: fix the setting) or, when the database may come
    later (unreachable, starting up), 69 (EX_UNAVAILABLE: a restart may help).

    Called once the lifespan has closed what it opened; exits at once, because returning
    to uvicorn would print the same failure again as a traceback."""
    code = os.EX_UNAVAILABLE if exc.transient else os.EX_CONFIG
    structlog.get_logger("thorn").error(
        "database_unusable", variable=exc.variable, url=exc.url, problem=exc.problem,
        error=str(exc), exit_code=code,
    )  # fmt: skip
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Exit now: returning to uvicorn would print the logged failure again as a traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start_logging(settings: Settings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    if unknown := Settings.unknown_environment():
        structlog.get_logger("thorn").warning("unknown_settings_ignored", variables=unknown)
