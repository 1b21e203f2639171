"""A report speaks for the node whose credentials sent it: the server lets an agent publish
on its own `agent.report.<node>` only, and health, running under its own identity on an
operator-mode server, refuses (and counts) a report whose payload names another node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from nats_auth import AuthServer
from prometheus_client import REGISTRY

from thorn.config import Settings
from thorn.events import AgentReport, AgentReportReply, CarrierReport, agent_report_subject
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.natsauth import permissions
from thorn.store import Store, sqlite_url
from thorn_health.app import create_app

pytestmark = pytest.mark.nats


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[AuthServer]:
    auth = AuthServer(tmp_path / "nats")
    await auth.server.astart()
    try:
        yield auth
    finally:
        await auth.server.astop()


def report(node: str, port: str = "swp3") -> bytes:
    now = datetime.now(UTC)
    item = CarrierReport(port=port, admin_up=True, carrier=False, oper_state="down",
                         detected_at=now)  # fmt: skip
    return AgentReport(node=node, seq=0, sent_at=now, items=[item]).model_dump_json().encode()


def wrong_node_count() -> float:
    return REGISTRY.get_sample_value("thorn_health_reports_wrong_node_total") or 0.0


async def test_a_report_naming_another_node_is_refused_and_counted(
    server: AuthServer, tmp_path: Path
) -> None:
    store = await Store.open(sqlite_url(tmp_path))
    await store.replace(Fabric.from_document(leaf_spine(2, 2, 2)), expected_revision=0,
                        actor="test", detail={})  # fmt: skip
    async with (
        server.client(permissions.health(), requests_within=5.0) as health,
        server.client(permissions.pathcomp(), requests_within=5.0) as pathcomp,
        server.client(permissions.agent("leaf1"), requests_within=5.0) as leaf1,
        AsyncExitStack() as stack,  # closed first: the app before its connection
    ):
        stack.push_async_callback(store.close)
        await pathcomp.bus.ensure_streams()
        app = create_app(Settings(data_dir=tmp_path, nats_url="unused"), store=store,
                         bus=health.bus, lease_seconds=1.0)  # fmt: skip
        await stack.enter_async_context(app.router.lifespan_context(app))
        async with asyncio.timeout(10):
            await app.state.health.active.wait()
        before = wrong_node_count()

        # On its own subject, as itself: applied.
        own = await leaf1.nc.request(agent_report_subject("leaf1"), report("leaf1"), timeout=5)
        assert AgentReportReply.model_validate_json(own.data).ok
        # On its own subject, naming leaf2: refused, counted.
        lie = await leaf1.nc.request(agent_report_subject("leaf1"), report("leaf2"), timeout=5)
        answer = AgentReportReply.model_validate_json(lie.data)
        assert not answer.ok and "does not match the subject's node 'leaf1'" in str(answer.error)
        assert wrong_node_count() == before + 1
        # On leaf2's subject: the server refuses it before health ever sees it.
        await leaf1.nc.publish(agent_report_subject("leaf2"), report("leaf2"))
        assert await leaf1.wait_refused(agent_report_subject("leaf2"))
        assert not health.errors
