"""Every write endpoint leaves its audit entry, and so does every refused authentication.

The write endpoints are read from the live entry point's OpenAPI document (every POST, PUT,
PATCH and DELETE of every service), so a new one fails this test until it has a step here:
a call with valid input, made through the one URL to the real topology, health and pathcomp
services (each under uvicorn, on one SQLite store and a real nats-server)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixed_tokens import fixed_token
from serving import serving, serving_services, upstreams_of

from thorn.config import Settings
from thorn.natsauth import permissions
from thorn.natsauth.files import AuthDir
from thorn_gateway.app import create_app as gateway_app

ADMIN = fixed_token("audit-trail-admin")
WRONG = fixed_token("audit-trail-wrong")
CLIENT = "127.0.0.31"  # this test's own loopback address: every entry must name it
WRITE_METHODS = ("post", "put", "patch", "delete")
AUDIT_WAIT_S = 10.0
CLAB = (Path(__file__).parents[1] / "data" / "clab" / "tiny.clab.yml").read_text()


@dataclass
class Step:
    """One call of one write endpoint with valid input, and the audit action it leaves."""

    method: str
    template: str  # the path as the OpenAPI document declares it
    action: str
    path: str = ""  # the concrete path (default: the template, which has no parameters)
    json: Any = None
    content: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    after: Callable[[httpx.Response, dict[str, Any]], None] | None = None

    def url(self, found: dict[str, Any]) -> str:
        return (self.path or self.template).format(**found)


def _keep_link(response: httpx.Response, found: dict[str, Any]) -> None:
    found["link"] = response.json()["id"]


V1 = "/api/v1"
# In order: each step may rely on what the earlier ones made.
STEPS = [
    Step("POST", f"{V1}/fabric/generate/fat-tree", "fabric.import", json={"k": 4}),
    Step("POST", f"{V1}/fabric/generate/rail-optimized", "fabric.import",
         json={"servers_per_su": 2, "rails": 2, "scalable_units": 1, "spines": 1}),
    Step("POST", f"{V1}/fabric/generate/dual-plane", "fabric.import",
         json={"spines_per_plane": 1, "leaves_per_plane": 1, "hosts_per_leaf": 1}),
    Step("POST", f"{V1}/fabric/import/containerlab", "fabric.import", content=CLAB,
         headers={"content-type": "application/yaml"}),
    Step("POST", f"{V1}/fabric/generate/leaf-spine", "fabric.import",
         json={"spines": 2, "leaves": 2, "hosts_per_leaf": 1}),
    Step("POST", f"{V1}/fabric/import", "fabric.import"),  # the export of the fabric above
    Step("POST", f"{V1}/nodes", "node.create",
         json={"name": "audit-sw", "role": "switch", "ports": [{"name": "swp1"}]}),
    Step("PATCH", f"{V1}/nodes/{{name}}", "node.update", path=f"{V1}/nodes/audit-sw",
         json={"labels": {"rack": "r9"}}),
    Step("POST", f"{V1}/nodes/{{name}}/ports", "port.create", path=f"{V1}/nodes/audit-sw/ports",
         json={"name": "swp2"}),
    Step("PATCH", f"{V1}/nodes/{{name}}/ports/{{port}}", "port.update",
         path=f"{V1}/nodes/audit-sw/ports/swp2", json={"speed_mbps": 100_000}),
    Step("POST", f"{V1}/nodes", "node.create",
         json={"name": "audit-h", "role": "host", "ports": [{"name": "eth0"}]}),
    Step("POST", f"{V1}/nodes/{{name}}/credentials", "node.credentials",
         path=f"{V1}/nodes/audit-h/credentials"),
    Step("POST", f"{V1}/links", "link.create", json={"a": "audit-sw:swp1", "b": "audit-h:eth0"},
         after=_keep_link),
    Step("PATCH", f"{V1}/links/{{link_id}}", "link.update", path=f"{V1}/links/{{link}}",
         json={"srlgs": ["duct-z"]}),
    Step("POST", f"{V1}/links/{{link_id}}/drain", "link.drain", path=f"{V1}/links/{{link}}/drain"),
    Step("POST", f"{V1}/links/{{link_id}}/undrain", "link.undrain",
         path=f"{V1}/links/{{link}}/undrain"),
    Step("POST", f"{V1}/nodes/{{name}}/drain", "node.drain", path=f"{V1}/nodes/audit-sw/drain"),
    Step("POST", f"{V1}/nodes/{{name}}/undrain", "node.undrain",
         path=f"{V1}/nodes/audit-sw/undrain"),
    Step("POST", f"{V1}/tenants", "tenant.create", json={"name": "audit-t"}),
    Step("PATCH", f"{V1}/tenants/{{name}}", "tenant.update", path=f"{V1}/tenants/audit-t",
         json={"description": "walked by the audit test"}),
    Step("POST", f"{V1}/vnis", "vni.create",
         json={"vni": 4242, "name": "audit-net", "tenant": "audit-t"}),
    Step("POST", f"{V1}/teps", "tep.create",
         json={"node": "audit-h", "colour": "red", "address": "10.254.0.1"}),
    Step("POST", f"{V1}/workloads", "workload.create",
         json={"name": "audit-w", "node": "audit-h", "vni": 4242, "mac": "02:00:00:aa:00:01",
               "ip": "10.77.0.1"}),
    Step("DELETE", f"{V1}/workloads/{{name}}", "workload.delete",
         path=f"{V1}/workloads/audit-w"),
    Step("DELETE", f"{V1}/teps/{{node}}/{{colour}}", "tep.delete",
         path=f"{V1}/teps/audit-h/red"),
    Step("DELETE", f"{V1}/vnis/{{vni}}", "vni.delete", path=f"{V1}/vnis/4242"),
    Step("DELETE", f"{V1}/tenants/{{name}}", "tenant.delete", path=f"{V1}/tenants/audit-t"),
    Step("DELETE", f"{V1}/links/{{link_id}}", "link.delete", path=f"{V1}/links/{{link}}"),
    Step("DELETE", f"{V1}/nodes/{{name}}/ports/{{port}}", "port.delete",
         path=f"{V1}/nodes/audit-sw/ports/swp2"),
    Step("DELETE", f"{V1}/nodes/{{name}}", "node.delete", path=f"{V1}/nodes/audit-sw"),
    Step("POST", f"{V1}/plan/recompute", "plan.recompute"),
    Step("POST", f"{V1}/tokens", "token.create",
         json={"name": "audit-tok", "role": "viewer", "ttl_seconds": 3600}),
    Step("POST", f"{V1}/tokens/{{name}}/rotate", "token.rotate",
         path=f"{V1}/tokens/audit-tok/rotate", json={"overlap_seconds": 60}),
    Step("DELETE", f"{V1}/tokens/{{name}}", "token.delete", path=f"{V1}/tokens/audit-tok"),
]  # fmt: skip


@pytest.fixture(scope="module")
def one_url(tmp_path_factory: pytest.TempPathFactory, nats_url: str) -> Iterator[str]:
    data = tmp_path_factory.mktemp("audit-trail")
    # Topology issues agents' NATS credentials (POST /nodes/{name}/credentials) with a signing
    # key of its own trust material; its connection stays the test server's, without auth.
    auth = AuthDir.open(data / "nats-auth")
    own = auth.write_creds(permissions.topology(), now=time.time(), lifetime=3600, name="topo")
    settings = Settings(admin_token=ADMIN, data_dir=data, nats_issuer_seed=auth.issuer_seeds,
                        nats_creds=own)  # fmt: skip
    with serving_services(settings, data / "thorn.db", nats_url) as urls:
        # Failures are what this test makes: no limit gets in its way.
        entry = Settings(upstreams=upstreams_of(urls), auth_failure_limit=10_000)
        with serving("gateway", lambda _s, _b: gateway_app(entry), data / "unused.db",
                     nats_url, ready=lambda _status: True) as url:  # fmt: skip
            yield url


@pytest.fixture(scope="module")
def client(one_url: str) -> Iterator[httpx.Client]:
    transport = httpx.HTTPTransport(local_address=CLIENT)
    with httpx.Client(transport=transport, base_url=one_url, timeout=60.0) as http:
        yield http


def write_operations(client: httpx.Client) -> set[tuple[str, str]]:
    document = client.get("/openapi.json").json()
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in WRITE_METHODS}  # fmt: skip


def newest_id(client: httpx.Client) -> int:
    page = client.get(
        f"{V1}/audit", params={"limit": 1}, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    items = page.json()["items"]
    return int(items[0]["id"]) if items else 0


def entries_after(client: httpx.Client, after: int, want: Callable[[dict[str, Any]], bool]
                  ) -> list[dict[str, Any]]:  # fmt: skip
    """Audit entries newer than `after` that `want`, waiting (bounded) for one to be written:
    entries other than a store write's are written just after the answer."""
    deadline = time.monotonic() + AUDIT_WAIT_S
    while True:
        page = client.get(f"{V1}/audit", params={"limit": 1000},
                          headers={"Authorization": f"Bearer {ADMIN}"})  # fmt: skip
        found = [e for e in page.json()["items"] if e["id"] > after and want(e)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_every_write_endpoint_has_a_step_here(client: httpx.Client) -> None:
    declared = write_operations(client)
    walked = {(step.method, step.template) for step in STEPS}
    assert declared - walked == set(), "write endpoints without a step in STEPS"
    assert walked - declared == set(), "steps for endpoints the API does not declare"


def test_every_write_leaves_an_entry_naming_who_what_where_and_how_it_went(
    client: httpx.Client,
) -> None:
    found: dict[str, Any] = {}
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for step in STEPS:
        body = step.json
        if step.template == f"{V1}/fabric/import":
            body = client.get(f"{V1}/fabric", headers=admin).json()
        before = newest_id(client)
        response = client.request(step.method, step.url(found), json=body, content=step.content,
                                  headers={**admin, **step.headers})  # fmt: skip
        assert response.is_success, (step.method, step.url(found), response.text)
        if step.after is not None:
            step.after(response, found)
        mine = entries_after(client, before, lambda e, s=step: e["action"] == s.action)
        assert len(mine) == 1, (step.method, step.template, mine)
        entry = mine[0]
        assert (entry["actor"], entry["client"], entry["outcome"]) == (
            "bootstrap-admin", CLIENT, "ok",
        ), (step.method, step.template, entry)  # fmt: skip


def test_a_refused_authentication_at_every_write_endpoint_leaves_an_entry(
    client: httpx.Client,
) -> None:
    found = {"link": 1}
    before = newest_id(client)
    for step in STEPS:
        response = client.request(step.method, step.url(found), json=step.json,
                                  headers={"Authorization": f"Bearer {WRONG}"})  # fmt: skip
        assert response.status_code == 401, (step.method, step.url(found), response.text)
    failures = entries_after(client, before, lambda e: e["action"] == "auth.failure")
    deadline = time.monotonic() + AUDIT_WAIT_S
    while len(failures) < len(STEPS) and time.monotonic() < deadline:
        time.sleep(0.1)
        failures = entries_after(client, before, lambda e: e["action"] == "auth.failure")
    assert sorted(e["target"] for e in failures) == sorted(
        f"{s.method} {s.url(found)}" for s in STEPS
    )
    assert {(e["actor"], e["client"], e["outcome"], e["detail"]["reason"]) for e in failures} \
        == {("anonymous", CLIENT, "denied", "unknown")}  # fmt: skip
