"""Registration and the cabling check over real NATS and a real store (SQLite and
PostgreSQL): agents' registrations go to topology as requests on `agent.register.<node>`,
topology answers, keeps the latest per node, refuses bad input and shows observed beside
declared; a miscabled link is marked through the write path and pathcomp leaves it out.

The fabric is leaf_spine(2, 2, 2) (pathcomp's: leaf_spine(2, 3, 2)): host<n>:eth1 to a
leaf, leaf<l>:swp3 to spine1:swp<l>, leaf<l>:swp4 to spine2:swp<l>.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from fixed_tokens import fixed_token
from observations import hears, host1, rdma_on
from test_pathcomp_drains import ADMIN as DRAINS_ADMIN
from test_pathcomp_drains import VIEWER, Controller, running
from test_pathcomp_drains import auth as bearer

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import (
    AgentRegistration,
    DatapathApplied,
    LinkHealthChanged,
    RegistrationReply,
    agent_register_subject,
    utcnow,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.observed import HeardNeighbour, NodeObservation, ObservedPort, ObservedVf
from thorn.store import Store
from thorn.store.observed import ObservedRecord
from thorn_topology.app import create_app

ADMIN = fixed_token("test-admin-registration")
WAIT = 10.0


@dataclass
class Topology:
    client: httpx.AsyncClient
    bus: Bus
    store: Store

    async def get(self, path: str) -> Any:
        response = await self.client.get(f"/api/v1{path}", headers=bearer(ADMIN))
        assert response.status_code == 200, response.text
        return response.json()


@pytest_asyncio.fixture
async def topology(store: Store, nats_url: str, tmp_path: Path) -> AsyncIterator[Topology]:
    await store.replace(Fabric.from_document(leaf_spine(2, 2, 2)), expected_revision=0,
                        actor="test", detail={})  # fmt: skip
    bus = await Bus.connect(nats_url, name="test-registration")
    app = create_app(Settings(admin_token=ADMIN, data_dir=tmp_path), store=store, bus=bus)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://thorn") as client:
                yield Topology(client, bus, store)
    finally:
        await bus.close()


async def register(
    bus: Bus, node: str, observed: NodeObservation, seq: int = 0
) -> RegistrationReply:
    event = AgentRegistration(node=node, run="test", seq=seq, sent_at=utcnow(), observed=observed)
    return RegistrationReply.model_validate_json(await bus.request(event, reply_within=5.0))


# --- registration and observed beside declared -------------------------------------------------


async def test_the_node_view_shows_the_agents_last_reconcile(topology: Topology) -> None:
    view = await topology.get("/nodes/leaf1/observed")
    assert view["applied"] is None  # nothing heard yet
    for revision, errors in ((3, []), (4, ["route 10.0.0.0/24: File exists"])):
        await topology.bus.publish(DatapathApplied(
            node="leaf1", driver="netlink", key_revision=revision * 10, plan_revision=revision,
            changes=2, errors=errors, seconds=0.01, at=utcnow()))  # fmt: skip
    deadline = time.monotonic() + WAIT
    while (applied := (await topology.get("/nodes/leaf1/observed"))["applied"]) is None or \
            applied["plan_revision"] != 4:  # fmt: skip
        assert time.monotonic() < deadline, applied
        await asyncio.sleep(0.02)
    assert applied["driver"] == "netlink" and applied["errors"] == [
        "route 10.0.0.0/24: File exists"
    ]
    assert (await topology.get("/nodes/leaf2/observed"))["applied"] is None


async def test_a_registration_is_stored_and_shown_beside_the_declared_node(
    topology: Topology,
) -> None:
    reply = await register(topology.bus, "host1", host1())
    assert reply == RegistrationReply(ok=True, mismatches=0)
    view = await topology.get("/nodes/host1/observed")
    assert view["registered"] is True and view["mismatches"] == [] and view["refused"] is None
    assert [p["name"] for p in view["declared"]["ports"]] == ["eth1"]
    assert view["declared_vfs"] == ["vf0"]
    assert view["observed"]["ports"][0]["speed_mbps"] == 10000
    assert view["observed"]["rdma"]["unavailable"] == "RDMA unavailable: Failed to get devices list"


async def test_the_latest_registration_per_node_wins_and_mismatches_show_in_the_api(
    topology: Topology,
) -> None:
    await register(topology.bus, "host1", host1())
    wrong = host1(ports=[ObservedPort(name="eth1", mac="02:00:00:00:00:99", admin_up=True,
                                      carrier=True, addresses=["10.0.0.0/31"])],  # type: ignore[list-item]
                  vfs=[])  # fmt: skip
    assert await register(topology.bus, "host1", wrong, seq=1) == RegistrationReply(
        ok=True, mismatches=2
    )
    view = await topology.get("/nodes/host1/observed")
    assert view["seq"] == 1
    assert sorted((m["kind"], m["subject"]) for m in view["mismatches"]) == [
        ("vf_absent", "vf0"), ("wrong_mac", "eth1"),
    ]  # fmt: skip
    report = await topology.get("/mismatches")
    assert report["registered"] == 1 and "host2" in report["unregistered"]
    assert {(m["node"], m["kind"]) for m in report["mismatches"]} == {
        ("host1", "vf_absent"), ("host1", "wrong_mac"),
    }  # fmt: skip
    missing = await topology.get("/nodes/host2/observed")
    assert missing["registered"] is False and missing["observed"] is None


async def test_the_observed_view_of_an_unknown_node_is_404_and_needs_a_token(
    topology: Topology,
) -> None:
    response = await topology.client.get("/api/v1/nodes/nope/observed", headers=bearer(ADMIN))
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    assert (await topology.client.get("/api/v1/cabling")).status_code == 401


# --- bad input: a clear, reported error, and the last good state stays ---------------------------


async def test_a_registration_from_a_node_not_in_the_topology_is_refused_and_stores_nothing(
    topology: Topology,
) -> None:
    reply = await register(topology.bus, "host99", host1())
    assert reply.ok is False and reply.error is not None
    assert "'host99' is not in the topology" in reply.error
    assert await topology.store.observed_nodes() == []


async def test_a_vf_naming_no_device_is_refused_and_the_last_good_registration_stays(
    topology: Topology,
) -> None:
    await register(topology.bus, "host1", host1())
    bad = host1(vfs=[ObservedVf(name="vf0", representor="vf7_rep")])
    reply = await register(topology.bus, "host1", bad, seq=1)
    assert reply.ok is False and (reply.error or "").startswith("vfs[0].representor:")
    view = await topology.get("/nodes/host1/observed")
    assert view["seq"] == 0 and view["observed"]["vfs"][0]["representor"] == "vf0_rep"
    assert view["refused"]["error"] == reply.error
    report = await topology.get("/mismatches")
    assert [(m["node"], m["kind"]) for m in report["mismatches"]] == [
        ("host1", "registration_refused")
    ]
    assert await register(topology.bus, "host1", host1(), seq=2) == RegistrationReply(ok=True)
    assert (await topology.get("/nodes/host1/observed"))["refused"] is None


async def test_an_rdma_device_on_a_netdev_the_topology_does_not_know_is_refused(
    topology: Topology,
) -> None:
    assert (await register(topology.bus, "host1", host1(rdma=rdma_on("vf0")))).ok
    reply = await register(topology.bus, "host1", host1(rdma=rdma_on("eth7")), seq=1)
    assert reply.ok is False
    assert (reply.error or "").startswith("rdma.devices[0].netdev: RDMA device 'rxe0'")
    view = await topology.get("/nodes/host1/observed")
    assert view["observed"]["rdma"]["devices"][0]["netdev"] == "vf0"  # the last good one
    assert "'eth7'" in view["refused"]["error"]


async def test_a_malformed_registration_is_answered_with_what_is_wrong(topology: Topology) -> None:
    msg = await topology.bus.nc.request(agent_register_subject("host1"), b'{"node": "host1"}',
                                        timeout=5.0)  # fmt: skip
    reply = RegistrationReply.model_validate_json(msg.data)
    assert reply.ok is False and "not a valid AgentRegistration" in (reply.error or "")
    assert "observed" in (reply.error or "")


# --- the cabling check and path computation -------------------------------------------------------


async def cabling(controller: Controller) -> dict[int, dict[str, Any]]:
    response = await controller.topology.get("/api/v1/cabling", headers=bearer(VIEWER))
    assert response.status_code == 200, response.text
    return {link["link_id"]: link for link in response.json()["links"]}


async def wait_plan(controller: Controller, excluded: bool, link_id: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        plan = controller.service.plan
        if plan is not None and (link_id in plan.graph.excluded) == excluded:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"link {link_id} never {'left' if excluded else 'rejoined'} the plan")


async def test_swapped_cables_are_marked_miscabled_avoided_by_paths_then_fixed(
    nats_url: str, tmp_path: Path
) -> None:
    async with running(nats_url, tmp_path) as controller:
        fabric = controller.fabric
        up1 = fabric.link_of_port[("leaf1", "swp3")]  # leaf1:swp3 - spine1:swp1
        up2 = fabric.link_of_port[("leaf2", "swp3")]  # leaf2:swp3 - spine1:swp2
        assert {v["state"] for v in (await cabling(controller)).values()} == {"unverified"}
        revision = await controller.store.revision()
        # spine1's cables to leaf1 and leaf2 swapped at spine1's end
        assert (await register(controller.bus, "leaf1", hears("swp3", "spine1", "swp2"))).ok
        assert (await register(controller.bus, "leaf2", hears("swp3", "spine1", "swp1"))).ok
        links = await cabling(controller)
        assert links[up1]["state"] == links[up2]["state"] == "miscabled"
        assert links[up1]["out_of_service"] and links[up2]["out_of_service"]
        assert links[up1]["reason"] == "leaf1:swp3 hears spine1:swp2, not spine1:swp1"
        # one write per check: leaf1's registration marks up1, leaf2's marks up2
        assert await controller.store.revision() == revision + 2
        audit = await controller.topology.get("/api/v1/audit", headers=bearer(DRAINS_ADMIN))
        latest = audit.json()["items"][:2]
        assert [(e["actor"], e["action"], e["target"]) for e in latest] == [
            ("cabling-check", "link.cabling", str(up2)),
            ("cabling-check", "link.cabling", str(up1)),
        ]
        await wait_plan(controller, True, up1)
        await wait_plan(controller, True, up2)
        plan = controller.service.plan
        assert plan is not None
        pair = plan.pair("host1", "host3")
        assert pair.red is not None and pair.blue is not None
        assert {up1, up2}.isdisjoint(pair.red.links + pair.blue.links)
        # Health seeing the link go down and come up again does not put it back in service
        for state in ("down", "up"):
            await controller.service.on_link_health(LinkHealthChanged(
                link_id=up2, state=state, at=utcnow(), source="test"))  # fmt: skip
        await controller.service.replanned(WAIT)
        assert controller.service.link_states[up2] is True
        assert up2 in controller.service.plan.graph.excluded  # type: ignore[union-attr]
        # Fixed: leaf1 hears spine1:swp1 again; leaf2 goes quiet (still out: sticky)
        assert (await register(controller.bus, "leaf1", hears("swp3", "spine1", "swp1"), 1)).ok
        assert (await register(controller.bus, "leaf2", NodeObservation(), 1)).ok
        links = await cabling(controller)
        assert links[up1]["state"] == "verified" and not links[up1]["out_of_service"]
        assert links[up2]["state"] == "unverified" and links[up2]["out_of_service"]
        await wait_plan(controller, False, up1)
        assert (await register(controller.bus, "leaf2", hears("swp3", "spine1", "swp2"), 2)).ok
        assert not (await cabling(controller))[up2]["out_of_service"]
        await wait_plan(controller, False, up2)


async def test_what_a_quiet_agent_heard_long_ago_counts_as_silence(topology: Topology) -> None:
    heard = hears("swp3", "spine1", "swp1").model_dump(mode="json")  # link 5, as declared
    long_ago = utcnow() - timedelta(hours=1)
    record = ObservedRecord(node="leaf1", run="old", seq=9, received_at=long_ago, observed=heard)
    await topology.store.put_observed(record)
    links = {lk["link_id"]: lk for lk in (await topology.get("/cabling"))["links"]}
    assert links[5]["state"] == "unverified"
    view = await topology.get("/nodes/leaf1/observed")  # still shown, with its age
    assert view["registered"] is True and view["received_at"].startswith(str(long_ago.year))
    assert (await register(topology.bus, "leaf1", hears("swp3", "spine1", "swp1"))).ok
    links = {lk["link_id"]: lk for lk in (await topology.get("/cabling"))["links"]}
    assert links[5]["state"] == "verified"


async def test_one_registration_contradicting_two_links_marks_both_in_one_revision(
    topology: Topology,
) -> None:
    revision = await topology.store.revision()
    swapped = NodeObservation(neighbours=[  # spine1's cables to leaf1 and leaf2 swapped
        HeardNeighbour(port="swp1", chassis="leaf2", port_id="swp3"),
        HeardNeighbour(port="swp2", chassis="leaf1", port_id="swp3"),
    ])  # fmt: skip
    assert (await register(topology.bus, "spine1", swapped)).ok
    assert await topology.store.revision() == revision + 1
    body = await topology.get("/cabling?state=miscabled")
    assert sorted(lk["link_id"] for lk in body["links"]) == [5, 7]
    assert body["out_of_service"] == 2
    audit = (await topology.get("/audit"))["items"][0]
    assert (audit["actor"], audit["target"], audit["revision"]) == (
        "cabling-check", "5,7", revision + 1,
    )  # fmt: skip
