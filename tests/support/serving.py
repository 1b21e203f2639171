"""A real THORN service app under uvicorn in a thread, for tests that talk HTTP to it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from thorn.bus import Bus
from thorn.config import Settings
from thorn.store import Store
from thorn_health.app import create_app as health_app
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_topology.app import create_app as topology_app

STARTUP = 30.0  # seconds for the server to answer /healthz
SHUTDOWN = 15.0


@contextmanager
def serving(
    name: str,
    make_app: Callable[[Store, Bus], FastAPI],
    db: Path,
    nats_url: str,
    ready: Callable[[int], bool] = lambda status: status == 200,
) -> Iterator[str]:
    """A real THORN app under uvicorn, in a thread with its own event loop, on the SQLite
    store `db` and the NATS at `nats_url`; yields its URL once `ready(status of /healthz)`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # bound before the thread starts: no port race
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    servers: list[uvicorn.Server] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        store = await Store.open(f"sqlite:///{db}")
        try:
            bus = await Bus.connect(nats_url, name=f"thornctl-test-{name}")
            try:
                await bus.ensure_streams()
                config = uvicorn.Config(
                    make_app(store, bus), log_level="warning", log_config=None, lifespan="on"
                )
                server = uvicorn.Server(config)
                servers.append(server)
                await server.serve(sockets=[sock])
            finally:
                await bus.close()
        finally:
            await store.close()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"thorn-{name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP
    while True:
        assert not errors, f"the {name} service failed to start: {errors[0]!r}"
        assert thread.is_alive(), f"the {name} service thread exited during startup"
        try:
            if ready(httpx.get(f"{url}/healthz", timeout=5.0).status_code):
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"/healthz did not answer within {STARTUP} s"
        time.sleep(0.05)
    try:
        yield url
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(SHUTDOWN)
        sock.close()
        assert not thread.is_alive(), f"the {name} service did not stop within {SHUTDOWN} s"
        assert not errors, f"the {name} service failed: {errors[0]!r}"


@contextmanager
def serving_services(settings: Settings, db: Path, nats_url: str) -> Iterator[dict[str, str]]:
    """topology, health and pathcomp, each as `serving` runs it with `settings`, on one SQLite
    store and NATS; yields each one's URL by name (THORN_UPSTREAMS' names)."""
    with (
        serving("topology", lambda s, b: topology_app(settings, store=s, bus=b), db,
                nats_url) as topology,
        serving("health", lambda s, b: health_app(settings, store=s, bus=b), db,
                nats_url) as health,
        serving("pathcomp", lambda s, b: pathcomp_app(settings, store=s, bus=b), db,
                nats_url) as pathcomp,
    ):  # fmt: skip
        yield {"topology": topology, "health": health, "pathcomp": pathcomp}


def upstreams_of(services: dict[str, str]) -> str:
    """THORN_UPSTREAMS for the services `serving_services` runs."""
    return ",".join(f"{name}={url}" for name, url in services.items())
