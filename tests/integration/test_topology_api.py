"""The topology service's REST API over a real store (SQLite and PostgreSQL) and real NATS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from fastapi import FastAPI
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import TOPOLOGY_CHANGED, Event, TopologyChanged
from thorn.store import Store
from thorn_topology.app import create_app

ADMIN = fixed_token("test-admin-secret")
EVENT_WAIT = 5.0
QUIET = 0.5  # how long "no event arrives" is watched for


@dataclass
class Api:
    client: httpx.AsyncClient
    store: Store
    events: list[TopologyChanged] = field(default_factory=list)
    app: FastAPI | None = None

    def as_(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def call(
        self, method: str, path: str, token: str | None = ADMIN, **kwargs: Any
    ) -> httpx.Response:
        headers = {**self.as_(token), **kwargs.pop("headers", {})}
        return await self.client.request(method, f"/api/v1{path}", headers=headers, **kwargs)

    async def token(self, name: str, role: str) -> str:
        response = await self.call("POST", "/tokens", json={"name": name, "role": role})
        assert response.status_code == 201, response.text
        secret: str = response.json()["token"]
        return secret

    async def next_event(self, revision: int) -> TopologyChanged:
        async with asyncio.timeout(EVENT_WAIT):
            while True:
                for event in self.events:
                    if event.revision == revision:
                        return event
                await asyncio.sleep(0.01)


@pytest_asyncio.fixture
async def api(store: Store, nats_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    bus = await Bus.connect(nats_url, name="test-topology")
    await bus.ensure_streams()
    settings = Settings(
        admin_token=ADMIN,
        data_dir=tmp_path,
        max_body_bytes=64 * 1024,
        max_import_bytes=8 * 1024 * 1024,
    )
    app = create_app(settings, store=store, bus=bus)
    events: list[TopologyChanged] = []

    async def collect(event: Event) -> None:
        assert isinstance(event, TopologyChanged)
        events.append(event)

    subscription = await bus.subscribe(TOPOLOGY_CHANGED, collect)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://thorn") as client:
                yield Api(client, store, events, app)
    finally:
        await subscription.unsubscribe()
        await bus.close()


def detail(response: httpx.Response) -> str:
    body: dict[str, Any] = response.json()
    return str(body["detail"])


async def leaf_spine(api: Api, **params: Any) -> dict[str, Any]:
    body = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, **params}
    response = await api.call("POST", "/fabric/generate/leaf-spine", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


# --- authentication and roles ------------------------------------------------------------


async def test_a_request_without_a_token_is_refused_with_401(api: Api) -> None:
    response = await api.call("GET", "/nodes", token=None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "missing bearer token" in detail(response)


async def test_a_wrong_token_is_refused_with_401(api: Api) -> None:
    response = await api.call("GET", "/nodes", token=fixed_token("not-a-real-token"))
    assert response.status_code == 401
    assert "invalid or revoked token" in detail(response)


async def test_a_viewer_reads_but_cannot_write(api: Api) -> None:
    viewer = await api.token("dashboard", "viewer")
    assert (await api.call("GET", "/nodes", token=viewer)).status_code == 200
    response = await api.call(
        "POST", "/nodes", token=viewer, json={"name": "leaf9", "role": "switch"}
    )
    assert response.status_code == 403
    assert "has role viewer; this needs admin" in detail(response)


async def test_an_operator_drains_links_but_cannot_change_topology(api: Api) -> None:
    await leaf_spine(api)
    operator = await api.token("oncall", "operator")
    link_id = (await api.call("GET", "/links")).json()["items"][0]["id"]
    drained = await api.call("POST", f"/links/{link_id}/drain", token=operator)
    assert drained.status_code == 200
    assert drained.json()["admin_state"] == "drained"
    undrained = await api.call("POST", f"/links/{link_id}/undrain", token=operator)
    assert undrained.json()["admin_state"] == "up"
    refused = await api.call("DELETE", f"/links/{link_id}", token=operator)
    assert refused.status_code == 403


async def test_tokens_are_shown_once_stored_hashed_and_revocable(api: Api) -> None:
    secret = await api.token("ci-bot", "viewer")
    listed = (await api.call("GET", "/tokens")).json()["items"]
    assert {t["name"] for t in listed} == {"bootstrap-admin", "ci-bot"}
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert secret not in json.dumps(listed)
    assert (await api.call("GET", "/whoami", token=secret)).json() == {
        "name": "ci-bot",
        "role": "viewer",
    }
    assert (await api.call("DELETE", "/tokens/ci-bot")).status_code == 204
    assert (await api.call("GET", "/whoami", token=secret)).status_code == 401


async def test_writes_are_attributed_to_the_token_in_the_audit_log(api: Api) -> None:
    ops = await api.token("netops", "admin")
    await api.call("POST", "/tenants", token=ops, json={"name": "acme"})
    page = (await api.call("GET", "/audit?action=tenant.")).json()
    assert page["total"] == 1
    entry = page["items"][0]
    assert (entry["actor"], entry["action"], entry["target"]) == ("netops", "tenant.create", "acme")


# --- CRUD and the fabric rules -----------------------------------------------------------


async def test_a_node_is_created_with_its_ports_and_read_back(api: Api) -> None:
    body = {
        "name": "leaf1",
        "role": "switch",
        "mgmt_address": "172.16.0.1",
        "labels": {"tier": "leaf"},
        "ports": [
            {
                "name": "swp1",
                "mac": "02-AA-00-00-00-01",
                "address": "10.0.0.0/31",
                "speed_mbps": 400000,
            }
        ],
    }
    created = await api.call("POST", "/nodes", json=body)
    assert created.status_code == 201, created.text
    node = (await api.call("GET", "/nodes/leaf1")).json()
    assert node["ports"][0]["mac"] == "02:aa:00:00:00:01"
    port = (await api.call("GET", "/nodes/leaf1/ports/swp1")).json()
    assert port["address"] == "10.0.0.0/31"


async def test_every_write_publishes_topology_changed_with_its_revision(api: Api) -> None:
    created = await api.call("POST", "/tenants", json={"name": "acme"})
    assert created.status_code == 201
    revision = await api.store.revision()
    event = await api.next_event(revision)
    assert event.actor == "bootstrap-admin"
    assert [(c.kind, c.op, c.key) for c in event.changes] == [("tenant", "create", "acme")]


async def test_a_duplicate_name_is_a_409_naming_the_field(api: Api) -> None:
    await api.call("POST", "/nodes", json={"name": "spine1", "role": "switch"})
    again = await api.call("POST", "/nodes", json={"name": "spine1", "role": "switch"})
    assert again.status_code == 409
    assert detail(again) == "body.name: node 'spine1' already exists"


async def test_a_link_to_a_missing_port_is_refused_naming_the_end(api: Api) -> None:
    await api.call(
        "POST", "/nodes", json={"name": "a1", "role": "switch", "ports": [{"name": "p1"}]}
    )
    response = await api.call("POST", "/links", json={"a": "a1:p1", "b": "ghost:p1"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "b", "node"]
    assert "node 'ghost' not found" in detail(response)


async def test_a_self_loop_is_refused(api: Api) -> None:
    await api.call(
        "POST",
        "/nodes",
        json={"name": "a1", "role": "switch", "ports": [{"name": "p1"}, {"name": "p2"}]},
    )
    response = await api.call("POST", "/links", json={"a": "a1:p1", "b": "a1:p2"})
    assert response.status_code == 422
    assert "self-loop" in detail(response)
    # a rule across both ends (no schema states it), typed so: the API fuzz lane's check
    # tells it from a field the document gets wrong (a field's error is value_error)
    assert response.json()["errors"][0]["type"] == "value"


async def test_a_port_already_in_a_link_cannot_join_another(api: Api) -> None:
    for name in ("a1", "b1", "c1"):
        await api.call(
            "POST",
            "/nodes",
            json={"name": name, "role": "switch", "ports": [{"name": "p1"}, {"name": "p2"}]},
        )
    assert (await api.call("POST", "/links", json={"a": "a1:p1", "b": "b1:p1"})).status_code == 201
    response = await api.call("POST", "/links", json={"a": "c1:p1", "b": "b1:p1"})
    assert response.status_code == 409
    assert "already in link" in detail(response)


async def test_overlapping_addresses_are_refused(api: Api) -> None:
    first = await api.call(
        "POST",
        "/nodes",
        json={"name": "a1", "role": "switch", "ports": [{"name": "p1", "address": "10.0.0.1/30"}]},
    )
    assert first.status_code == 201
    response = await api.call(
        "POST",
        "/nodes",
        json={"name": "b1", "role": "switch", "ports": [{"name": "p1", "address": "10.0.0.2/31"}]},
    )
    assert response.status_code == 409
    assert response.json()["errors"][0]["loc"] == ["body", "ports", 0, "address"]
    assert "overlaps" in detail(response)
    assert (await api.call("GET", "/nodes/b1")).status_code == 404


async def test_a_node_with_links_is_deleted_only_with_cascade(api: Api) -> None:
    await leaf_spine(api)
    refused = await api.call("DELETE", "/nodes/leaf1")
    assert refused.status_code == 409
    assert "cascade=true" in detail(refused)
    deleted = await api.call("DELETE", "/nodes/leaf1?cascade=true")
    assert deleted.status_code == 200
    links = (await api.call("GET", "/links?node=leaf1")).json()
    assert links["total"] == 0


async def test_a_missing_resource_is_a_404(api: Api) -> None:
    for path in (
        "/nodes/nope",
        "/links/999",
        "/tenants/nope",
        "/vnis/7",
        "/workloads/nope",
        "/teps/nope/red",
        "/nodes/nope/ports/x",
    ):
        response = await api.call("GET", path)
        assert response.status_code == 404, path
        assert "not found" in detail(response) or "no red TEP" in detail(response)


async def test_patch_changes_only_the_given_fields(api: Api) -> None:
    await api.call(
        "POST",
        "/nodes",
        json={
            "name": "leaf1",
            "role": "switch",
            "mgmt_address": "172.16.0.1",
            "labels": {"a": "b"},
        },
    )
    patched = await api.call("PATCH", "/nodes/leaf1", json={"admin_state": "drained"})
    assert patched.json()["mgmt_address"] == "172.16.0.1"
    assert patched.json()["labels"] == {"a": "b"}
    assert patched.json()["admin_state"] == "drained"


async def test_lists_are_paginated_and_filtered(api: Api) -> None:
    await leaf_spine(api, hosts_per_leaf=3)
    page = (await api.call("GET", "/nodes?role=host&limit=4&offset=2")).json()
    assert page["total"] == 6
    assert len(page["items"]) == 4
    assert all(n["role"] == "host" for n in page["items"])
    spines = (await api.call("GET", "/nodes?label=tier=spine")).json()
    assert {n["name"] for n in spines["items"]} == {"spine1", "spine2"}
    assert (await api.call("GET", "/nodes?limit=0")).status_code == 422
    assert (await api.call("GET", "/nodes?label=novalue")).status_code == 422


# --- malformed input -----------------------------------------------------------------------


async def test_malformed_json_is_a_400(api: Api) -> None:
    response = await api.call(
        "POST", "/nodes", content=b'{"name": "x", ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "JSON" in detail(response)


async def test_unknown_fields_and_wrong_types_are_422_naming_the_field(api: Api) -> None:
    unknown = await api.call("POST", "/nodes", json={"name": "x", "role": "switch", "colour": 1})
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["loc"] == ["body", "colour"]
    wrong = await api.call("POST", "/vnis", json={"vni": "lots", "name": "v", "tenant": "t"})
    assert wrong.status_code == 422
    assert wrong.json()["errors"][0]["loc"] == ["body", "vni"]
    out_of_range = await api.call(
        "POST", "/vnis", json={"vni": 16777216, "name": "v", "tenant": "t"}
    )
    assert out_of_range.status_code == 422


async def test_an_oversized_body_is_a_413_and_changes_nothing(api: Api) -> None:
    huge = {"name": "t", "description": "x" * 100_000}
    response = await api.call("POST", "/tenants", json=huge)
    assert response.status_code == 413
    assert "limit of 65536 bytes" in detail(response)
    assert await api.store.revision() == 0


# --- bulk import, export, generators, containerlab ------------------------------------------


async def test_import_replaces_the_fabric_and_export_round_trips(api: Api) -> None:
    await leaf_spine(api)
    exported = (await api.call("GET", "/fabric")).json()
    assert exported["format"] == "thorn.fabric/v1"
    response = await api.call("POST", "/fabric/import", json=exported)
    assert response.status_code == 200, response.text
    again = (await api.call("GET", "/fabric")).json()
    assert again["revision"] == exported["revision"] + 1
    strip = ("revision", "links")
    assert {k: v for k, v in again.items() if k not in strip} == {
        k: v for k, v in exported.items() if k not in strip
    }
    assert [{k: v for k, v in lk.items() if k != "id"} for lk in again["links"]] == [
        {k: v for k, v in lk.items() if k != "id"} for lk in exported["links"]
    ]


async def test_a_failed_import_keeps_the_previous_revision_and_publishes_nothing(api: Api) -> None:
    await leaf_spine(api)
    revision = await api.store.revision()
    before = (await api.call("GET", "/fabric")).json()
    await api.next_event(revision)
    broken = json.loads(json.dumps(before))
    broken["links"].append({"a": "leaf1:swp1", "b": "ghost:eth1"})
    broken["nodes"][0]["ports"].append(dict(broken["nodes"][0]["ports"][0]))
    response = await api.call("POST", "/fabric/import", json=broken)
    assert response.status_code in (409, 422)
    locs = [e["loc"] for e in response.json()["errors"]]
    assert ["body", "links", len(before["links"]), "b", "node"] in locs
    assert await api.store.revision() == revision
    assert (await api.call("GET", "/fabric")).json() == before
    seen = len(api.events)
    await asyncio.sleep(QUIET)
    assert len(api.events) == seen
    assert all(e.revision <= revision for e in api.events)


async def test_an_import_that_is_not_json_or_breaks_the_schema_is_refused_by_field(
    api: Api,
) -> None:
    await leaf_spine(api)
    revision = await api.store.revision()
    yaml = await api.call("POST", "/fabric/import", content=b"nodes: []",
                          headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert yaml.status_code == 415 and "Content-Type" in yaml.json()["detail"]
    malformed = await api.call("POST", "/fabric/import", content=b'{"nodes": [',
                               headers={"Content-Type": "application/json"})  # fmt: skip
    assert malformed.status_code == 400, malformed.text
    wrong = await api.call("POST", "/fabric/import", json={"nodes": [{"name": "a"}], "x": 1})
    assert wrong.status_code == 422
    locs = [e["loc"] for e in wrong.json()["errors"]]
    assert ["body", "x"] in locs and ["body", "nodes", 0, "role"] in locs
    assert await api.store.revision() == revision


async def test_a_dry_run_import_validates_without_changing_anything(api: Api) -> None:
    response = await api.call("POST", "/fabric/generate/fat-tree?dry_run=true", json={"k": 4})
    assert response.status_code == 200
    assert response.json()["summary"]["hosts"] == 16
    assert await api.store.revision() == 0


async def test_a_generator_dry_run_answers_what_the_real_run_then_stores(api: Api) -> None:
    """Dry runs are computed in a worker process: the same summary as the real run."""
    body = {"spines": 2, "leaves": 4, "hosts_per_leaf": 2, "dual_homed": True}
    dry = await api.call("POST", "/fabric/generate/leaf-spine?dry_run=true", json=body)
    assert dry.status_code == 200, dry.text
    real = await api.call("POST", "/fabric/generate/leaf-spine", json=body)
    assert real.status_code == 200, real.text
    assert {**dry.json()["summary"], "revision": None} == {**real.json()["summary"],
                                                          "revision": None}  # fmt: skip
    refused = await api.call("POST", "/fabric/generate/rail-optimized?dry_run=true",
                             json={"servers_per_su": 4, "rails": 9, "spines": 0})  # fmt: skip
    assert refused.status_code == 422 and "spines" in refused.text


async def test_a_dead_fabric_worker_is_a_503_that_stores_nothing_and_a_new_one_starts(
    api: Api,
) -> None:
    generate = "/fabric/generate/fat-tree"
    assert (await api.call("POST", f"{generate}?dry_run=true", json={"k": 4})).status_code == 200
    assert api.app is not None
    pool = api.app.state.topology._pool
    for worker in list(pool._processes.values()):
        worker.kill()
        worker.join()
    broken = await api.call("POST", generate, json={"k": 4})
    assert broken.status_code == 503, broken.text
    assert broken.json()["errors"][0]["loc"] == ["body"]
    assert "try again" in broken.json()["detail"]
    assert await api.store.revision() == 0
    again = await api.call("POST", generate, json={"k": 4})
    assert again.status_code == 200 and again.json()["summary"]["hosts"] == 16
    assert await api.store.revision() == 1


async def test_every_generator_produces_a_fabric_the_store_accepts(api: Api) -> None:
    for name, body in (
        ("leaf-spine", {"spines": 2, "leaves": 4, "hosts_per_leaf": 2, "dual_homed": True}),
        ("fat-tree", {"k": 4}),
        ("rail-optimized", {"servers_per_su": 4, "rails": 2, "spines": 2}),
        ("dual-plane", {}),
    ):
        response = await api.call("POST", f"/fabric/generate/{name}", json=body)
        assert response.status_code == 200, (name, response.text)
        summary = (await api.call("GET", "/fabric/summary")).json()
        assert summary == response.json()["summary"]


async def test_bad_generator_parameters_are_422_naming_the_field(api: Api) -> None:
    response = await api.call("POST", "/fabric/generate/fat-tree", json={"k": 5})
    assert response.status_code == 422
    assert "k" in json.dumps(response.json()["errors"])
    response = await api.call("POST", "/fabric/generate/leaf-spine", json={"spines": -1})
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["body", "spines"]


CLAB = (Path(__file__).parents[1] / "data" / "clab" / "tiny.clab.yml").read_text()


async def test_a_containerlab_file_is_imported(api: Api) -> None:
    response = await api.call(
        "POST",
        "/fabric/import/containerlab",
        content=CLAB.encode(),
        headers={"content-type": "application/yaml"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["summary"]["links"] == 2
    gpu = (await api.call("GET", "/nodes/gpu1")).json()
    assert gpu["role"] == "host"


async def test_a_broken_containerlab_file_is_a_422_and_changes_nothing(api: Api) -> None:
    broken = CLAB.replace('"leaf1:e1-1", "gpu1:eth1"', '"leaf1:e1-1", "ghost:eth1"')
    response = await api.call(
        "POST",
        "/fabric/import/containerlab",
        content=broken.encode(),
        headers={"content-type": "application/yaml"},
    )
    assert response.status_code == 422
    assert "links[1]" in detail(response)
    not_yaml = await api.call(
        "POST",
        "/fabric/import/containerlab",
        content=b"topology: [",
        headers={"content-type": "application/yaml"},
    )
    assert not_yaml.status_code == 422
    assert await api.store.revision() == 0


async def test_the_full_topology_is_cached_per_revision_with_etag_and_gzip(api: Api) -> None:
    await leaf_spine(api)
    first = await api.call("GET", "/fabric", headers={"accept-encoding": "gzip"})
    assert first.headers["content-encoding"] == "gzip"
    etag = first.headers["etag"]
    assert etag == f'"rev-{await api.store.revision()}"'
    unchanged = await api.call("GET", "/fabric", headers={"if-none-match": etag})
    assert unchanged.status_code == 304
    await api.call("POST", "/tenants", json={"name": "acme"})
    changed = await api.call("GET", "/fabric", headers={"if-none-match": etag})
    assert changed.status_code == 200
    assert changed.json()["tenants"][-1]["name"] == "acme"
    assert changed.headers["etag"] != etag


async def test_a_write_by_another_replica_is_seen_on_the_next_read(
    api: Api, database_url: str, nats_url: str, tmp_path: Path
) -> None:
    await leaf_spine(api)
    await api.call("GET", "/fabric")  # warm this replica's snapshot and cache
    other_store = await Store.open(database_url)
    settings = Settings(admin_token=ADMIN, data_dir=tmp_path, nats_url=nats_url)
    other = create_app(settings, store=other_store)
    try:
        async with other.router.lifespan_context(other):
            transport = httpx.ASGITransport(app=other)
            async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                response = await client.post(
                    "/api/v1/tenants", json={"name": "from-b"}, headers=api.as_(ADMIN)
                )
                assert response.status_code == 201
    finally:
        await other_store.close()
    names = [t["name"] for t in (await api.call("GET", "/fabric")).json()["tenants"]]
    assert "from-b" in names
    assert (await api.call("GET", "/tenants/from-b")).status_code == 200


async def test_containerlab_warnings_are_reported_and_the_import_succeeds(api: Api) -> None:
    with_bridge = CLAB.replace(
        "    gpu1: {kind: linux, image: alpine}",
        "    gpu1: {kind: linux, image: alpine}\n    br0: {kind: bridge}",
    ).replace(
        '    - endpoints: ["leaf1:e1-1", "gpu1:eth1"]',
        '    - endpoints: ["leaf1:e1-1", "gpu1:eth1"]\n    - endpoints: ["leaf1:e1-2", "br0:p1"]',
    )
    response = await api.call(
        "POST",
        "/fabric/import/containerlab",
        content=with_bridge.encode(),
        headers={"content-type": "application/yaml"},
    )
    assert response.status_code == 200, response.text
    warnings = response.json()["warnings"]
    assert warnings and all(isinstance(w, str) for w in warnings)
    assert any("br0" in w for w in warnings)


async def test_a_chunked_body_over_the_limit_is_a_413(api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "t", "description": "'
        for _ in range(10):
            yield b"x" * 10_000
        yield b'"}'

    response = await api.call(
        "POST", "/tenants", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["errors"][0]["type"] == "too_large"
    assert await api.store.revision() == 0


async def test_auth_errors_have_the_common_error_body(api: Api) -> None:
    body = (await api.call("GET", "/nodes", token=None)).json()
    assert body == {
        "detail": "missing bearer token: send 'Authorization: Bearer <token>'",
        "errors": [],
    }


async def test_a_write_that_changes_nothing_commits_nothing(api: Api) -> None:
    await leaf_spine(api)
    link_id = (await api.call("GET", "/links")).json()["items"][0]["id"]
    await api.call("POST", f"/links/{link_id}/drain")
    revision = await api.store.revision()
    again = await api.call("POST", f"/links/{link_id}/drain")
    assert again.status_code == 200
    same = await api.call("PATCH", "/nodes/leaf1", json={"admin_state": "up"})
    assert same.status_code == 200
    assert await api.store.revision() == revision


async def test_undrain_refuses_a_link_that_is_down(api: Api) -> None:
    await leaf_spine(api)
    link_id = (await api.call("GET", "/links")).json()["items"][0]["id"]
    await api.call("PATCH", f"/links/{link_id}", json={"admin_state": "down"})
    response = await api.call("POST", f"/links/{link_id}/undrain")
    assert response.status_code == 409
    assert "is down, not drained" in detail(response)


async def test_null_is_refused_for_a_state_and_clears_a_list(api: Api) -> None:
    await leaf_spine(api)
    link_id = (await api.call("GET", "/links")).json()["items"][0]["id"]
    refused = await api.call("PATCH", f"/links/{link_id}", json={"admin_state": None})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["loc"] == ["body", "admin_state"]
    await api.call("PATCH", f"/links/{link_id}", json={"srlgs": ["conduit-7"]})
    cleared = await api.call("PATCH", f"/links/{link_id}", json={"srlgs": None})
    assert cleared.json()["srlgs"] == []


async def test_concurrent_writes_are_announced_in_revision_order(api: Api) -> None:
    await asyncio.gather(
        *(api.call("POST", "/tenants", json={"name": f"tenant{i}"}) for i in range(20))
    )
    last = await api.store.revision()
    await api.next_event(last)
    revisions = [e.revision for e in api.events]
    assert revisions == sorted(revisions)
    assert revisions[-20:] == list(range(last - 19, last + 1))


async def test_imports_racing_on_two_replicas_both_land(
    api: Api, database_url: str, nats_url: str, tmp_path: Path
) -> None:
    other_store = await Store.open(database_url)
    settings = Settings(admin_token=ADMIN, data_dir=tmp_path, nats_url=nats_url)
    other = create_app(settings, store=other_store)
    body = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}
    try:
        async with other.router.lifespan_context(other):
            transport = httpx.ASGITransport(app=other)
            async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                results = await asyncio.gather(
                    *(api.call("POST", "/fabric/generate/leaf-spine", json=body) for _ in range(3)),
                    *(
                        client.post(
                            "/api/v1/fabric/generate/leaf-spine", json=body, headers=api.as_(ADMIN)
                        )
                        for _ in range(3)
                    ),
                )
    finally:
        await other_store.close()
    assert [r.status_code for r in results] == [200] * 6
    assert await api.store.revision() == 6


# --- node drains --------------------------------------------------------------------------


async def test_an_operator_drains_and_undrains_a_switch_announced_and_audited(api: Api) -> None:
    await leaf_spine(api)
    operator = await api.token("oncall-nodes", "operator")
    drained = await api.call("POST", "/nodes/spine1/drain", token=operator)
    assert drained.status_code == 200, drained.text
    assert drained.json()["admin_state"] == "drained" and drained.json()["name"] == "spine1"
    revision = await api.store.revision()
    event = await api.next_event(revision)
    assert [(c.kind, c.op, c.key) for c in event.changes] == [("node", "update", "spine1")]
    assert event.actor == "oncall-nodes"
    again = await api.call("POST", "/nodes/spine1/drain", token=operator)
    assert again.status_code == 200 and await api.store.revision() == revision  # a no-op
    undrained = await api.call("POST", "/nodes/spine1/undrain", token=operator)
    assert undrained.json()["admin_state"] == "up"
    assert api.app is not None
    await api.app.state.audit_writer.flush()  # the no-op's entry is written after its answer
    audit = (await api.call("GET", "/audit?action=node.")).json()["items"]
    in_order = sorted(audit, key=lambda e: e["at"])
    assert [(e["action"], e["actor"], e["revision"], e["detail"].get("unchanged", False))
            for e in in_order] == [
        ("node.drain", "oncall-nodes", revision, False),
        ("node.drain", "oncall-nodes", None, True),  # the no-op: in the log, nothing committed
        ("node.undrain", "oncall-nodes", revision + 1, False),
    ]  # fmt: skip


async def test_a_viewer_cannot_drain_a_node(api: Api) -> None:
    await leaf_spine(api)
    viewer = await api.token("wallboard", "viewer")
    for verb in ("drain", "undrain"):
        response = await api.call("POST", f"/nodes/spine1/{verb}", token=viewer)
        assert response.status_code == 403
        assert "needs operator" in detail(response)


async def test_draining_an_unknown_node_is_404(api: Api) -> None:
    await leaf_spine(api)
    for verb in ("drain", "undrain"):
        response = await api.call("POST", f"/nodes/nosuch/{verb}")
        assert response.status_code == 404
        assert "node 'nosuch' not found" in detail(response)


async def test_draining_a_host_is_refused_with_409_naming_the_role(api: Api) -> None:
    await leaf_spine(api)
    revision = await api.store.revision()
    response = await api.call("POST", "/nodes/host1/drain")
    assert response.status_code == 409
    (error,) = response.json()["errors"]
    assert error["loc"] == ["body", "role"] and error["type"] == "conflict"
    assert "is a host" in error["msg"]
    assert await api.store.revision() == revision


async def test_undrain_refuses_a_node_that_is_down_naming_admin_state(api: Api) -> None:
    await leaf_spine(api)
    await api.call("PATCH", "/nodes/spine2", json={"admin_state": "down"})
    response = await api.call("POST", "/nodes/spine2/undrain")
    assert response.status_code == 409
    (error,) = response.json()["errors"]
    assert error["loc"] == ["body", "admin_state"]
    assert "is down, not drained" in error["msg"]


async def test_a_hosts_offload_policy_defaults_to_auto_and_is_patched(api: Api) -> None:
    created = await api.call("POST", "/nodes", json={"name": "h1", "role": "host"})
    assert created.status_code == 201, created.text
    assert created.json()["offload"] == "auto"
    patched = await api.call("PATCH", "/nodes/h1", json={"offload": "software"})
    assert patched.status_code == 200, patched.text
    assert patched.json()["offload"] == "software"
    assert (await api.call("GET", "/nodes/h1")).json()["offload"] == "software"
    exported = (await api.call("GET", "/fabric")).json()
    assert [n["offload"] for n in exported["nodes"] if n["name"] == "h1"] == ["software"]


async def test_a_bad_offload_policy_is_a_422_naming_the_field(api: Api) -> None:
    bad = await api.call("POST", "/nodes", json={"name": "h1", "role": "host", "offload": "nic"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["loc"] == ["body", "offload"]
    await api.call("POST", "/nodes", json={"name": "h1", "role": "host"})
    for value in ("nic", None):
        refused = await api.call("PATCH", "/nodes/h1", json={"offload": value})
        assert refused.status_code == 422, value
        assert refused.json()["errors"][0]["loc"] == ["body", "offload"]
    assert (await api.call("GET", "/nodes/h1")).json()["offload"] == "auto"


async def test_over_bounded_and_oversized_generator_requests_are_refused_counted_and_change_nothing(
    api: Api,
) -> None:
    await leaf_spine(api)
    revision = await api.store.revision()
    before = (await api.call("GET", "/fabric")).json()

    def refused(status: str, route: str) -> float:
        return (
            REGISTRY.get_sample_value("thorn_api_refused_total", {"status": status, "route": route})
            or 0.0
        )

    route = "/api/v1/fabric/generate/leaf-spine"
    counted = refused("422", route)
    too_many = await api.call("POST", "/fabric/generate/fat-tree", json={"k": 42})
    assert too_many.status_code == 422 and too_many.json()["errors"][0]["loc"] == ["body", "k"]
    huge = await api.call("POST", "/fabric/generate/leaf-spine",
                          json={"spines": 256, "leaves": 1024, "hosts_per_leaf": 512})  # fmt: skip
    assert huge.status_code == 422 and "limit" in huge.json()["detail"]
    assert refused("422", route) == counted + 1
    large = await api.call("POST", "/fabric/generate/leaf-spine",
                           content=b'{"spines": 2' + b" " * 70_000 + b"}",
                           headers={"Content-Type": "application/json"})  # fmt: skip
    assert large.status_code == 413
    assert await api.store.revision() == revision
    assert (await api.call("GET", "/fabric")).json() == before
