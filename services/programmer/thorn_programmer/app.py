"""The programmer process: one agent per node it serves, plus /healthz, /metrics, /status.

In production one process runs on each node, in the node's own namespace
(`THORN_NODE_NAME`). For an emulated fabric one process serves every node of a lab
(`THORN_LAB=<prefix>`), each agent working in its node's namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import asdict
from typing import Any

import structlog
from fastapi import FastAPI, Request
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict

from thorn.bus import Bus
from thorn.config import Settings
from thorn.telemetry import instrument
from thorn_programmer.agent import NodeAgent
from thorn_programmer.drivers import NetlinkDatapath, open_driver

log = structlog.get_logger("thorn.programmer")
AGENT_RESTARTS = Counter("thorn_programmer_agent_restarts_total", "Agents restarted", ["node"])


class AgentStatusOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str
    netns: str | None
    driver: str | None
    key_revision: int
    plan_revision: int | None
    reconciles: int
    last_changes: int
    last_errors: list[str]
    last_seconds: float
    overrides: dict[str, str]


class ConfigurationError(SystemExit):
    pass


def nodes_to_serve(settings: Settings) -> list[tuple[str, str | None]]:
    """(node, namespace) pairs: the lab's nodes, or this machine's node."""
    if settings.lab:
        from thorn.lab.handle import Lab, LabNotFound

        try:
            lab = Lab.open(settings.lab)
        except (LabNotFound, ValueError) as exc:  # no such lab, or not a lab prefix
            raise ConfigurationError(f"programmer: THORN_LAB={settings.lab!r}: {exc}") from None
        return sorted(lab.namespaces().items())
    if settings.node_name:
        return [(settings.node_name, None)]
    raise ConfigurationError("programmer: set THORN_NODE_NAME (this node) or THORN_LAB (a lab)")


RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)


async def supervised(agent: NodeAgent) -> None:
    """Run an agent; if it fails, say why and start it again (backing off), so one node's
    trouble neither stops the others nor goes unnoticed."""
    failures = 0
    while True:
        try:
            await agent.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]
            failures += 1
            AGENT_RESTARTS.labels(agent.node).inc()
            log.exception("agent_failed", node=agent.node, restart_in_s=delay)
            agent.status.last_errors = [f"agent failed; restarting in {delay:.0f} s"]
            await asyncio.sleep(delay)


def create_app(settings: Settings, *, bus: Bus | None = None) -> FastAPI:
    served = nodes_to_serve(settings)

    def drivers(kind: str, netns: str | None) -> AbstractAsyncContextManager[NetlinkDatapath]:
        return open_driver(kind, netns, settings.datapath)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            the_bus = bus
            if the_bus is None:
                the_bus = await Bus.connect(settings.nats_url, name="thorn-programmer")
                stack.push_async_callback(the_bus.close)
                await the_bus.ensure_streams()
            kv = await the_bus.desired_state()
            agents = [NodeAgent(node, kv, the_bus, drivers, netns) for node, netns in served]
            tasks = [asyncio.create_task(supervised(a), name=f"agent-{a.node}") for a in agents]
            app.state.agents = agents
            log.info("programmer_ready", nodes=len(agents), datapath=settings.datapath)
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(title="THORN programmer", version="0.1.0", lifespan=lifespan)
    instrument(app, "programmer")

    @app.get("/status", response_model=list[AgentStatusOut], include_in_schema=False)
    async def status(request: Request) -> list[dict[str, Any]]:
        """Each agent in this process: driver, applied revision, last reconcile's outcome."""
        return [asdict(a.status) for a in request.app.state.agents]

    return app
