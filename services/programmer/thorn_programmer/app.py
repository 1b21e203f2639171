"""The programmer process: one agent per node it serves, plus /healthz, /metrics, /status.

In production one process runs on each node, in the node's own namespace
(`THORN_NODE_NAME`). For an emulated fabric one process serves every node of a lab
(`THORN_LAB=<prefix>`), each agent working in its node's namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import asdict
from typing import Any

import structlog
from fastapi import FastAPI, Request
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import OffloadReport
from thorn.telemetry import instrument
from thorn.watchdog import LoopWatchdog
from thorn_programmer.agent import AgentStatus, DriverFactory, NodeAgent
from thorn_programmer.bfd import EventQueue
from thorn_programmer.bfd.events import SessionStatus
from thorn_programmer.bfd.policy import AuthFile, AuthPolicyError, readable_by_others
from thorn_programmer.bfd.supervised import SupervisedBfd
from thorn_programmer.connect import connect_nodes, keep_credentials
from thorn_programmer.detect import BfdSessions, Discriminators
from thorn_programmer.drivers import NetlinkDatapath, open_driver
from thorn_programmer.overrides import Overrides
from thorn_programmer.register import Registrar
from thorn_programmer.repair import LocalRepair
from thorn_programmer.reports import Reporter

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
    withdrawn: list[str] = Field(
        description="a switch's ports whose primaries are withdrawn (their BFD session Down)"
    )
    restore_held: list[str] = Field(
        description="... of those, the ports whose session is Up again, waiting for the up hold"
    )
    offload: OffloadReport | None = Field(
        None, description="hosts on the flower driver: offload mode, fallback reason, read-back"
    )


class ConfigurationError(SystemExit):
    pass


def nodes_to_serve(settings: Settings) -> list[tuple[str, str | None]]:
    """(node, namespace) pairs: the lab's nodes (or, with THORN_NODE_NAME too, that one lab
    node: one process per node, as in production), or this machine's node."""
    if settings.lab:
        try:  # the lab is a development tool: production images do not ship it
            from thorn_lab.handle import Lab, LabNotFound
        except ImportError:
            raise ConfigurationError(
                f"programmer: THORN_LAB={settings.lab!r} needs the fabric lab (thorn_lab), "
                "which this installation does not have: set THORN_NODE_NAME instead"
            ) from None

        try:
            lab = Lab.open(settings.lab)
        except (LabNotFound, ValueError) as exc:  # no such lab, or not a lab prefix
            raise ConfigurationError(f"programmer: THORN_LAB={settings.lab!r}: {exc}") from None
        nodes: list[tuple[str, str | None]] = sorted(lab.namespaces().items())
        if settings.node_name:
            nodes = [(n, ns) for n, ns in nodes if n == settings.node_name]
            if not nodes:
                raise ConfigurationError(
                    f"programmer: lab {settings.lab!r} has no node {settings.node_name!r}"
                )
        return nodes
    if settings.node_name:
        return [(settings.node_name, None)]
    raise ConfigurationError("programmer: set THORN_NODE_NAME (this node) or THORN_LAB (a lab)")


RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)


async def supervised(
    node: str, run: Callable[[], Awaitable[None]], on_failure: Callable[[str], None] | None = None
) -> None:
    """Run one of a node's loops (its agent, its reporter); if it fails, say why and start it
    again (backing off), so one node's trouble neither stops the others nor goes unnoticed."""
    failures = 0
    while True:
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]
            failures += 1
            AGENT_RESTARTS.labels(node).inc()
            log.exception("agent_failed", node=node, loop=getattr(run, "__qualname__", "?"),
                          restart_in_s=delay)  # fmt: skip
            if on_failure is not None:
                on_failure(f"agent failed; restarting in {delay:.0f} s")
            await asyncio.sleep(delay)


def create_app(settings: Settings, *, bus: Bus | None = None) -> FastAPI:
    served = nodes_to_serve(settings)
    bfd_auth = open_bfd_auth(settings)
    # Per node, for the life of the process: a switch's BFD withdraws outlive its agent.
    up_hold = settings.link_up_hold_ms / 1000
    repairs = {node: LocalRepair(node, up_hold) for node, _ in served}

    def drivers_of(node: str) -> DriverFactory:
        def drivers(kind: str, netns: str | None) -> AbstractAsyncContextManager[NetlinkDatapath]:
            return open_driver(kind, netns, settings.datapath, repairs[node])

        return drivers

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(LoopWatchdog("programmer").running())
            # Each node speaks as itself when THORN_NATS_CREDS gives identities (connect.py).
            links = await connect_nodes(settings, [node for node, _ in served], stack, bus=bus)
            hold_down = settings.failover_hold_down_ms / 1000
            agents = [
                NodeAgent(node, links[node].kv, links[node].bus, drivers_of(node), netns, Overrides(
                    settings.data_dir / "programmer" / f"overrides-{node}.json",
                    revertive=settings.failover_revertive, hold_down=hold_down))
                for node, netns in served
            ]  # fmt: skip
            reporters = [
                Reporter(
                    node,
                    links[node].bus,
                    netns,
                    period=settings.report_seconds,
                    on_link=repairs[node].link,
                )
                for node, netns in served
            ]
            registrars = [
                Registrar(node, links[node].bus, netns, period=settings.register_seconds,
                          probe_interval=settings.neighbour_probe_seconds)
                for node, netns in served
            ]  # fmt: skip
            tasks = [
                asyncio.create_task(supervised(r.node, r.run), name=f"register-{r.node}")
                for r in registrars
            ]
            for agent, reporter in zip(agents, reporters, strict=True):
                repairs[agent.node].on_failover = agent.record_failover  # tier "switch"

                def failed(why: str, status: AgentStatus = agent.status) -> None:
                    status.last_errors = [why]

                if (keeper := keep_credentials(links[agent.node], agent)) is not None:
                    tasks.append(asyncio.create_task(supervised(agent.node, keeper.run),
                                                     name=f"creds-{agent.node}"))  # fmt: skip
                tasks += [
                    asyncio.create_task(supervised(agent.node, agent.run, failed),
                                        name=f"agent-{agent.node}"),
                    asyncio.create_task(supervised(agent.node, reporter.run),
                                        name=f"report-{agent.node}"),
                ]  # fmt: skip
            app.state.agents = agents
            app.state.reporters = reporters
            app.state.registrars = registrars
            app.state.repairs = repairs
            app.state.bfd = None
            if settings.bfd_sessions != "off":
                app.state.bfd = await _start_bfd(
                    settings, stack, agents, reporters, served, repairs, bfd_auth
                )
            log.info("programmer_ready", nodes=len(agents), datapath=settings.datapath,
                     bfd=settings.bfd_sessions)  # fmt: skip
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    app = FastAPI(title="THORN programmer", version="0.1.0", lifespan=lifespan)

    def problems() -> list[str]:
        bfd: SupervisedBfd | None = getattr(app.state, "bfd", None)
        found = bfd.problem() if bfd is not None else None
        return [found] if found else []

    instrument(app, "programmer", problems)

    @app.get("/status", response_model=list[AgentStatusOut], include_in_schema=False)
    async def status(request: Request) -> list[dict[str, Any]]:
        """Each agent in this process: driver, applied revision, last reconcile's outcome,
        a switch's withdrawn ports."""
        return [asdict(a.status) | {"withdrawn": sorted(repairs[a.node].withdrawn),
                                    "restore_held": repairs[a.node].holding()}
                for a in request.app.state.agents]  # fmt: skip

    @app.get("/registration", include_in_schema=False)
    async def registration(request: Request) -> list[dict[str, Any]]:
        """Each agent's last registration with topology, topology's answer, and the ports
        its neighbour probe runs on."""
        return [{"node": r.node, "seq": r.seq, "unanswered": r.unanswered,
                 "reply": r.last_reply.model_dump() if r.last_reply else None,
                 "probe_ports": r.probe_ports(),
                 "observed": r.last_sent.model_dump(mode="json") if r.last_sent else None}
                for r in request.app.state.registrars]  # fmt: skip

    @app.get("/bfd", include_in_schema=False)
    async def bfd(request: Request) -> dict[str, Any]:
        """Every BFD session of this process (state, negotiated timers) and the drop counts."""
        manager: SupervisedBfd | None = request.app.state.bfd
        if manager is None:
            return {"enabled": False, "sessions": [], "counters": None}
        sessions = await asyncio.to_thread(manager.sessions)
        counters = await asyncio.to_thread(manager.counters)
        return {"enabled": True, "scheduling": manager.scheduling,
                "sessions": [_session_out(s) for s in sessions],
                "counters": asdict(counters)}  # fmt: skip

    return app


BFD_AUTH_CHECK_SECONDS = 5.0


def open_bfd_auth(settings: Settings) -> AuthFile | None:
    """THORN_BFD_AUTH_FILE read at start: a file that cannot be used stops the agent with
    the reason (its rule and field, never a secret)."""
    path = settings.bfd_auth_file
    if path is None:
        return None
    try:
        auth = AuthFile(path)
    except AuthPolicyError as exc:
        raise ConfigurationError(f"programmer: THORN_BFD_AUTH_FILE={path}: {exc}") from None
    if readable_by_others(path):
        log.warning("bfd_auth_file_readable_by_others", path=str(path),
                    hint="its keys should be readable by the agent only: chmod 600")  # fmt: skip
    log.info("bfd_auth_rules", path=str(path), rules=auth.policy.describe())
    return auth


async def _follow_bfd_auth(auth: AuthFile, nodes: list[BfdSessions]) -> None:
    """Until cancelled: a changed file's rules and keys go to the running sessions (a key
    rotation without a restart, docs/bfd.md); an invalid one is logged and ignored."""
    while True:
        await asyncio.sleep(BFD_AUTH_CHECK_SECONDS)
        try:
            policy = await asyncio.to_thread(auth.changed)
        except AuthPolicyError as exc:
            log.error("bfd_auth_file_invalid", path=str(auth.path), error=str(exc),
                      kept="the rules read before")  # fmt: skip
            continue
        if policy is None:
            continue
        changed = 0
        for sessions in nodes:
            changed += await sessions.set_auth_policy(policy)
        log.info("bfd_auth_reloaded", path=str(auth.path), sessions_changed=changed,
                 rules=policy.describe())  # fmt: skip


def _session_out(status: SessionStatus) -> dict[str, Any]:
    out = asdict(status)
    for key in ("state", "remote_state", "diag"):
        out[key] = out[key].name.lower()
    return out


async def _start_bfd(
    settings: Settings,
    stack: AsyncExitStack,
    agents: list[NodeAgent],
    reporters: list[Reporter],
    served: list[tuple[str, str | None]],
    repairs: dict[str, LocalRepair],
    auth: AuthFile | None = None,
) -> SupervisedBfd:
    """One BFD process for every node of this process (started again if it dies); each
    agent's sessions follow what it applied, report to health and may flip a peer or, on a
    switch, withdraw a failed link's primaries (thorn_programmer.detect, .repair)."""
    events = EventQueue()
    # In a child process: a BFD thread here would wait for the GIL behind the agents' work,
    # and 10 ms timers then run late (docs/bfd.md).
    manager = SupervisedBfd(events.put, name="programmer", start_timeout_s=settings.start_timeout_s)
    manager.start()  # blocks this loop until the child is up (at most start_timeout_s)
    stack.callback(manager.close)  # AdminDown to every peer: a stop is not a failure
    discriminators = Discriminators()
    nodes = []
    for agent, reporter, (_, netns) in zip(agents, reporters, served, strict=True):
        sessions = BfdSessions(
            agent.node, netns, manager, discriminators, mode=settings.bfd_sessions,
            interval_ms=settings.bfd_interval_ms, multiplier=settings.bfd_multiplier,
            peer_limit=None if settings.bfd_peers == "all" else settings.bfd_peers,
            report=reporter.bfd, colour_of=agent.colour_of,
            flip=agent.flip_soon,
            withdraw=repairs[agent.node].withdraw, restore=repairs[agent.node].restore,
            restore_after_hold=repairs[agent.node].restore_after_hold,
            path=agent.on_path, withdrawn=repairs[agent.node].withdrawn_by_runtime,
            auth_policy=auth.policy if auth is not None else None,
        )  # fmt: skip
        agent.on_applied.append(sessions.update)

        async def arm(_: object, sessions: BfdSessions = sessions,
                      repair: LocalRepair = repairs[agent.node]) -> None:  # fmt: skip
            await sessions.arm(repair.armed())  # after every apply: what its links fire

        agent.on_applied.append(arm)
        agent.path_state = sessions.path_state
        nodes.append(sessions)

        async def readd(sessions: BfdSessions = sessions, agent: NodeAgent = agent) -> None:
            await sessions.restart(agent.applied)  # the old child took every session with it

        manager.on_restart.append(readd)

    async def dispatch() -> None:
        async for event in events:
            for sessions in nodes:
                if sessions.owns(event.local_discriminator):
                    sessions.event(event)
                    break

    task = asyncio.create_task(dispatch(), name="bfd-events")
    watchdog = asyncio.create_task(manager.watch(), name="bfd-watchdog")
    tasks = [task, watchdog]
    if auth is not None:
        tasks.append(asyncio.create_task(_follow_bfd_auth(auth, nodes), name="bfd-auth-file"))

    async def stop() -> None:
        for each in tasks:
            each.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    stack.push_async_callback(stop)
    return manager
