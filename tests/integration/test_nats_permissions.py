"""THORN's NATS permissions, enforced by a real nats-server in operator mode: one test per rule
(what an agent may not read or publish, anonymous and expired clients), and the services
doing their work under theirs. The permission sets themselves: tests/unit/test_natsauth.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio
from nats_auth import AuthServer, Client

from thorn.bus import CaughtUp, DesiredStateEntry
from thorn.desired import node_key, vni_key
from thorn.events import (
    AgentReport,
    CarrierReport,
    LinkHealthChanged,
    TopologyChanged,
    agent_report_subject,
)
from thorn.leader.lease import LEASES_KV
from thorn.natsauth import permissions
from thorn.natsauth.permissions import DESIRED_STREAM
from thorn.natsd import NatsServerError

pytestmark = pytest.mark.nats

CONSUMER_CREATE = f"$JS.API.CONSUMER.CREATE.{DESIRED_STREAM}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AuthServer]:
    auth = AuthServer(tmp_path_factory.mktemp("nats-auth"))
    await auth.server.astart()
    try:
        async with auth.client(permissions.pathcomp(), requests_within=5.0) as pathcomp:
            await pathcomp.bus.ensure_streams()  # what the services do at start
            kv = await pathcomp.bus.desired_state()
            await kv.put(node_key("leaf1"), b'{"for": "leaf1"}')
            await kv.put(node_key("leaf2"), b'{"for": "leaf2"}')
            await kv.put(vni_key(100, 0), b'{"vni": 100}')
            await kv.put(vni_key(200, 0), b'{"vni": 200}')
        yield auth
    finally:
        await auth.server.astop()


async def first_entry(client: Client, key: str, within: float = 5.0) -> DesiredStateEntry:
    kv = await client.bus.desired_state()
    async with asyncio.timeout(within), kv.watch(key) as watch:
        async for item in watch:
            assert not isinstance(item, CaughtUp), f"{key} has no value"
            return item
    raise AssertionError("unreachable")


# --- who may connect -----------------------------------------------------------------------


async def test_an_anonymous_client_is_refused(server: AuthServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)


async def test_expired_credentials_are_refused_and_the_server_says_why(server: AuthServer) -> None:
    now = time.time()
    creds = server.creds(permissions.agent("stale"), lifetime=60, now=now - 3600)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, user_credentials=str(creds), allow_reconnect=False,
                           connect_timeout=2)  # fmt: skip
    await asyncio.sleep(0.2)  # the log line is written as the connection closes
    refusal = [line for line in server.log().splitlines() if "claim is expired" in line]
    assert refusal, "the server log does not say the JWT had expired"
    assert "User JWT no longer valid" in refusal[-1]


async def test_credentials_signed_by_a_stranger_are_refused(
    server: AuthServer, tmp_path: Path
) -> None:
    from thorn.natsauth.files import AuthDir

    stranger = AuthDir.open(tmp_path / "other")
    creds = stranger.write_creds(permissions.admin(), now=time.time(), lifetime=60, name="x")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, user_credentials=str(creds), allow_reconnect=False,
                           connect_timeout=2)  # fmt: skip


# --- what an agent may read ----------------------------------------------------------------


async def test_an_agent_watches_its_own_key(server: AuthServer) -> None:
    async with server.client(permissions.agent("leaf1")) as agent:
        entry = await first_entry(agent, node_key("leaf1"))
    assert entry.value == b'{"for": "leaf1"}' and not agent.errors


async def test_an_agent_watching_another_node_s_key_is_refused(server: AuthServer) -> None:
    async with server.client(permissions.agent("leaf1")) as agent:
        with pytest.raises(nats.errors.TimeoutError):  # the create request is never answered
            await first_entry(agent, node_key("leaf2"))
        refusal = agent.errors[0].lower() if agent.errors else ""
        assert "permissions violation" in refusal
        assert f"{CONSUMER_CREATE}.".lower() in refusal and "node.leaf2" in refusal


async def test_an_agent_reading_another_node_s_key_by_get_is_refused(server: AuthServer) -> None:
    async with server.client(permissions.agent("leaf1")) as agent:
        kv = await agent.bus.desired_state()
        with pytest.raises(nats.errors.TimeoutError):
            await kv.get(node_key("leaf2"))
        assert await agent.wait_refused(f"$JS.API.STREAM.MSG.GET.{DESIRED_STREAM}")


async def test_an_agent_cannot_widen_its_watch_by_what_the_request_body_says(
    server: AuthServer,
) -> None:
    """The create subject it may use names its own key; the body asks for another: the
    server refuses it (the filter in the subject and in the body must agree)."""
    mine = f"$KV.thorn-desired-state.{node_key('leaf1')}"
    config = {"name": "sneak", "filter_subject": "$KV.thorn-desired-state.>",
              "deliver_subject": "_I.agent.leaf1.sneak", "ack_policy": "none"}  # fmt: skip
    body = {"stream_name": DESIRED_STREAM, "config": config}
    async with server.client(permissions.agent("leaf1")) as agent:
        answer = await agent.nc.request(f"{CONSUMER_CREATE}.sneak.{mine}",
                                        json.dumps(body).encode(), timeout=2)  # fmt: skip
    error = json.loads(answer.data).get("error")
    assert error is not None, "the server created a consumer wider than the subject said"
    assert "filter" in error["description"].lower()


async def test_an_agent_reads_the_vnis_it_is_a_member_of_and_no_other(
    server: AuthServer,
) -> None:
    async with server.client(permissions.agent("host1", [100])) as agent:
        entry = await first_entry(agent, "vni.100.*")
        assert entry.value == b'{"vni": 100}'
        with pytest.raises(nats.errors.TimeoutError):
            await first_entry(agent, "vni.200.*")
        assert any("vni.200" in e for e in agent.errors)


async def test_an_agent_may_not_listen_to_another_node_s_commands_or_inbox(
    server: AuthServer,
) -> None:
    async with server.client(permissions.agent("host1")) as agent:
        for subject in ("agent.flip.host2", "_INBOX.>", "_I.agent.host2.>", ">"):
            await agent.nc.subscribe(subject)
            assert await agent.wait_refused(subject), subject


# --- what an agent may publish ---------------------------------------------------------------


def report(node: str) -> AgentReport:
    now = datetime.now(UTC)
    item = CarrierReport(port="eth0", admin_up=True, carrier=False, oper_state="down",
                         detected_at=now)  # fmt: skip
    return AgentReport(node=node, seq=0, sent_at=now, items=[item])


async def test_an_agent_publishing_another_node_s_report_is_refused(server: AuthServer) -> None:
    async with (
        server.client(permissions.admin()) as admin,
        server.client(permissions.agent("leaf1")) as agent,
    ):
        heard = await admin.nc.subscribe("agent.report.>")
        await admin.nc.flush()
        await agent.nc.publish(agent_report_subject("leaf2"), report("leaf2").model_dump_json()
                               .encode())  # fmt: skip
        await agent.nc.publish(agent_report_subject("leaf1"), report("leaf1").model_dump_json()
                               .encode())  # fmt: skip
        await agent.nc.flush()
        assert await agent.wait_refused("agent.report.leaf2")
        got = await heard.next_msg(timeout=2)
        assert got.subject == "agent.report.leaf1"  # its own went through; the other did not
        with pytest.raises(nats.errors.TimeoutError):
            await heard.next_msg(timeout=0.3)


async def test_an_agent_publishing_link_health_is_refused(server: AuthServer) -> None:
    event = LinkHealthChanged(link_id=1, state="down", at=datetime.now(UTC), source="fake")
    async with server.client(permissions.agent("leaf1")) as agent:
        await agent.nc.publish("health.link.1", event.model_dump_json().encode())
        assert await agent.wait_refused("health.link.1")


async def test_an_agent_may_not_write_or_delete_a_leader_lease(server: AuthServer) -> None:
    async with server.client(permissions.agent("leaf1")) as agent:
        for key in ("pathcomp", "health"):
            subject = f"$KV.{LEASES_KV.bucket}.{key}"
            await agent.nc.publish(subject, b"mine")
            assert await agent.wait_refused(subject)  # a delete is a publish there too


async def test_an_agent_may_not_write_desired_state(server: AuthServer) -> None:
    async with server.client(permissions.agent("leaf1")) as agent:
        subject = f"$KV.thorn-desired-state.{node_key('leaf1')}"
        await agent.nc.publish(subject, b"{}")
        assert await agent.wait_refused(subject)


# --- services at work ------------------------------------------------------------------------


async def test_pathcomp_writes_desired_state_and_holds_its_lease(server: AuthServer) -> None:
    from thorn.leader import LeaderElection

    async with server.client(permissions.pathcomp(), requests_within=5.0) as pathcomp:
        kv = await pathcomp.bus.desired_state()
        revision = await kv.put(node_key("leaf3"), b"{}")
        assert await kv.update(node_key("leaf3"), b'{"v": 2}', last=revision) > revision
        assert "leaf1" in " ".join(await kv.nodes())
        election = LeaderElection(pathcomp.bus, "pathcomp", ttl=2.0)
        async with election:
            async with asyncio.timeout(10):
                await election.wait_leader()
        assert not pathcomp.errors


async def test_health_answers_an_agent_s_report_and_publishes_link_health(
    server: AuthServer,
) -> None:
    async with (
        server.client(permissions.health(), requests_within=5.0) as health,
        server.client(permissions.agent("leaf1")) as agent,
    ):

        async def answer(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b'{"ok": true, "applied": 1}')

        await health.nc.subscribe("agent.report.>", queue="thorn-health", cb=answer)
        await health.nc.flush()
        raw = await agent.bus.request(report("leaf1"), reply_within=2.0)
        assert json.loads(raw)["ok"] is True
        event = LinkHealthChanged(link_id=1, state="down", at=datetime.now(UTC), source="t")
        assert await health.bus.publish(event) is not None  # stored by THORN_HEALTH
        assert not health.errors and not agent.errors


async def test_topology_announces_a_change(server: AuthServer) -> None:
    event = TopologyChanged(revision=1, at=datetime.now(UTC), actor="test")
    async with server.client(permissions.topology(), requests_within=5.0) as topology:
        assert await topology.bus.publish(event, msg_id="rev-1") is not None
        assert not topology.errors


async def test_an_agent_reports_a_failover_into_the_stream(server: AuthServer) -> None:
    from thorn.events import FailoverEvent

    event = FailoverEvent(node="host1", peers=["host2"], to_colour="blue",
                          at=datetime.now(UTC), reason="bfd", tier="source")  # fmt: skip
    async with server.client(permissions.agent("host1"), requests_within=5.0) as agent:
        assert await agent.bus.publish(event) is not None
        assert not agent.errors


def test_a_server_refusing_everyone_still_starts(tmp_path: Path) -> None:
    """The operator-mode configuration is one nats-server accepts (a bad one exits at once)."""
    auth = AuthServer(tmp_path)
    try:
        auth.server.start()
    except NatsServerError as exc:  # pragma: no cover - the failure's message is the point
        pytest.fail(str(exc))
    finally:
        auth.server.stop()
