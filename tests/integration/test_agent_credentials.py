"""Agents' NATS credentials issued, renewed and changed by topology, on an operator-mode
nats-server: an admin gets a node's creds from the API; an agent whose node joins another VNI
is told, renews, and reads the new VNI's documents and no longer the old one's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats.errors
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats_auth import AuthServer

from thorn.auth import new_token
from thorn.bus import Bus
from thorn.config import Settings
from thorn.desired import vni_key
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import Vni
from thorn.natsauth import permissions
from thorn.natsauth.issue import vnis_of
from thorn.natsauth.jwt import decode, read_creds
from thorn.store import Store, sqlite_url
from thorn_programmer.credentials import CredentialsKeeper
from thorn_topology.app import create_app

pytestmark = pytest.mark.nats

OLD, NEW = 1000, 2000  # leaf_spine's hosts are all in VNI 1000


@dataclass
class Running:
    server: AuthServer
    app: FastAPI
    api: httpx.AsyncClient


@pytest_asyncio.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    server = AuthServer(tmp_path / "nats")
    await server.server.astart()
    doc = leaf_spine(2, 2, 2)
    doc = doc.model_copy(update={"vnis": [*doc.vnis, Vni(vni=NEW, name="new", tenant="default")]})
    store = await Store.open(sqlite_url(tmp_path))
    await store.replace(Fabric.from_document(doc), expected_revision=0, actor="test",
                        detail={})  # fmt: skip
    token = new_token()
    settings = Settings(
        data_dir=tmp_path, nats_url="unused", admin_token=token,
        nats_creds=server.creds(permissions.topology()),
        nats_issuer_seed=server.auth.issuer_seeds,
    )  # fmt: skip
    try:
        async with (
            server.client(permissions.topology(), requests_within=5.0) as topology,
            server.client(permissions.pathcomp(), requests_within=5.0) as pathcomp,
            AsyncExitStack() as stack,  # closed first: the app before its connection
        ):
            stack.push_async_callback(store.close)
            await pathcomp.bus.ensure_streams()
            kv = await pathcomp.bus.desired_state()
            await kv.put(vni_key(OLD, 0), b'{"vni": 1000}')
            await kv.put(vni_key(NEW, 0), b'{"vni": 2000}')
            app = create_app(settings, store=store, bus=topology.bus)
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport,
                base_url="http://topology",
                headers={"Authorization": f"Bearer {token}"},
            ) as api:
                yield Running(server, app, api)
    finally:
        await server.server.astop()


async def reads(bus: Bus, key: str) -> bool:
    """Whether this connection may watch `key` (a refused watch is never answered)."""
    kv = await bus.desired_state(create=False)
    try:
        async with asyncio.timeout(3), kv.watch(key) as watch:
            async for _ in watch:  # a value or the end of none: the watch was made
                return True
    except (nats.errors.TimeoutError, TimeoutError):
        return False
    return False


async def test_an_admin_gets_a_node_s_credentials_from_the_api(running: Running) -> None:
    answer = await running.api.post("/api/v1/nodes/host1/credentials")
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["node"] == "host1" and body["vnis"] == [OLD]
    token, user = read_creds(body["creds"])
    claims = decode(token)
    assert claims.subject == user.public == body["public_key"]
    assert claims.name == "agent:host1" and vnis_of(claims) == {OLD}
    assert claims.expires is not None and claims.expires > time.time() + 6 * 86_400
    path = running.server.auth.path / "host1-from-api.creds"
    path.write_text(body["creds"])
    async with await Bus.connect(running.server.url, name="host1", creds=path) as bus:
        assert await reads(bus, f"vni.{OLD}.*")


async def test_credentials_for_a_node_that_does_not_exist_are_a_404(running: Running) -> None:
    answer = await running.api.post("/api/v1/nodes/nosuch/credentials")
    assert answer.status_code == 404 and "nosuch" in answer.text


async def test_an_agent_renews_at_start_and_when_its_vnis_change(running: Running) -> None:
    creds = running.server.creds(permissions.agent("host1"))  # no VNI yet: renewal adds it
    async with await Bus.connect(running.server.url, name="host1", creds=creds) as bus:
        keeper = CredentialsKeeper("host1", bus, creds)
        renewed = keeper.renewed
        task = asyncio.create_task(keeper.run())
        try:
            async with asyncio.timeout(10):
                await renewed.wait()
            assert keeper.vnis == {OLD}
            assert await reads(bus, f"vni.{OLD}.*")
            assert not await reads(bus, f"vni.{NEW}.*")

            # host1's workload moves from VNI 1000 to 2000: topology tells the agent.
            renewed = keeper.renewed
            moved = {"name": "host1-vf1", "node": "host1", "vni": NEW, "vf": "vf1",
                     "mac": "06:00:00:00:10:01", "ip": "100.65.0.1"}  # fmt: skip
            assert (await running.api.post("/api/v1/workloads", json=moved)).status_code == 201
            async with asyncio.timeout(10):
                await renewed.wait()
            assert keeper.vnis == {OLD, NEW}
            renewed = keeper.renewed
            gone = await running.api.delete("/api/v1/workloads/host1-vf0")
            assert gone.status_code == 200, gone.text
            async with asyncio.timeout(10):
                await renewed.wait()
            assert keeper.vnis == {NEW}
            assert decode(read_creds(creds.read_text())[0]).subject == keeper.claims.subject
            assert oct(creds.stat().st_mode & 0o777) == "0o600"
            assert await reads(bus, f"vni.{NEW}.*")  # after the reconnect, with the new JWT
            assert not await reads(bus, f"vni.{OLD}.*")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_renewal_presenting_another_node_s_jwt_is_refused(running: Running) -> None:
    """host2's JWT sent on host1's subject (as host1): topology does not renew it."""
    from thorn.events import CredentialsRenewal, CredentialsReply, utcnow

    other = running.server.creds(permissions.agent("host2"))
    token, _ = read_creds(other.read_text())
    mine = running.server.creds(permissions.agent("host1"))
    async with await Bus.connect(running.server.url, name="host1", creds=mine) as bus:
        raw = await bus.request(CredentialsRenewal(node="host1", jwt=token, sent_at=utcnow()),
                                reply_within=5)  # fmt: skip
    reply = CredentialsReply.model_validate_json(raw)
    assert not reply.ok and reply.jwt is None and "host1" in str(reply.error)


async def test_an_agent_stays_connected_past_the_expiry_of_the_jwt_it_started_with(
    running: Running,
) -> None:
    """JWTs of 4 s: the agent renews at half their lifetime and reconnects with the new one
    each time, before the server would end the connection (nats-py does not come back from
    an expired connection)."""
    running.app.state.credentials.lifetime = 4.0
    creds = running.server.creds(permissions.agent("host2", [OLD]), lifetime=4)
    first = decode(read_creds(creds.read_text())[0])
    async with await Bus.connect(running.server.url, name="host2", creds=creds) as bus:
        keeper = CredentialsKeeper("host2", bus, creds)
        task = asyncio.create_task(keeper.run())
        try:
            assert first.expires is not None
            await asyncio.sleep(max(0.0, first.expires - time.time()) + 2.5)
            assert bus.is_connected
            assert keeper.connected.expires is not None and keeper.connected.expires > first.expires
            assert await reads(bus, f"vni.{OLD}.*")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
