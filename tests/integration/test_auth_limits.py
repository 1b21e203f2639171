"""The entry point's limit on failed authentication, per client address, in front of the real
topology, health and pathcomp services (each under uvicorn, on one SQLite store and a real
nats-server); clients on different loopback addresses (127.0.0.x) over real sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixed_tokens import fixed_token
from prometheus_client import REGISTRY
from serving import serving, serving_services, upstreams_of

from thorn.config import Settings
from thorn_gateway.app import create_app as gateway_app

ADMIN = fixed_token("limits-test-admin")
WRONG = fixed_token("a-wrong-guess")
LIMIT, WINDOW_S = 3, 600.0
# One path of each service: failures anywhere behind the entry point count together.
AT_TOPOLOGY, AT_HEALTH, AT_PATHCOMP = "/api/v1/whoami", "/api/v1/health/links", "/api/v1/plan"
AUDIT_WAIT_S = 10.0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limits")


@pytest.fixture(scope="module")
def upstreams(data: Path, nats_url: str) -> Iterator[str]:
    settings = Settings(admin_token=ADMIN, data_dir=data)
    with serving_services(settings, data / "thorn.db", nats_url) as urls:
        yield upstreams_of(urls)


def _entry_point(upstreams: str, data: Path, nats_url: str, **settings: Any) -> Iterator[str]:
    config = Settings(upstreams=upstreams, auth_failure_limit=LIMIT,
                      auth_failure_window_s=WINDOW_S, **settings)  # fmt: skip
    with serving("gateway", lambda _s, _b: gateway_app(config), data / "unused.db", nats_url,
                 ready=lambda _status: True) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def one_url(upstreams: str, data: Path, nats_url: str) -> Iterator[str]:
    yield from _entry_point(upstreams, data, nats_url)


@pytest.fixture(scope="module")
def behind_a_proxy(upstreams: str, data: Path, nats_url: str) -> Iterator[str]:
    """An entry point that believes X-Forwarded-For from the loopback (as from a load balancer
    in front of it)."""
    yield from _entry_point(upstreams, data, nats_url, gateway_trusted_proxies="127.0.0.0/8")


def client_at(address: str, base_url: str) -> httpx.Client:
    """A client whose connections come from `address` (a loopback address of its own)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(transport=transport, base_url=base_url, timeout=30.0)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def audited_failures(url: str, client: str) -> list[dict[str, Any]]:
    """The audit log's refused authentications from `client`, once as many as asked for are
    written (they are written after each answer, in the background)."""
    with client_at("127.0.0.250", url) as admin:
        page = admin.get("/api/v1/audit", params={"action": "auth.", "limit": 1000},
                         headers=bearer(ADMIN))  # fmt: skip
        assert page.status_code == 200, page.text
        return [e for e in page.json()["items"] if e["client"] == client]


def wait_for_audited(url: str, client: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + AUDIT_WAIT_S
    while len(found := audited_failures(url, client)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} entries for {client}"
        time.sleep(0.1)
    return found


def test_failures_at_any_service_count_toward_one_limit_per_client_address(one_url: str) -> None:
    limited_before = metric("thorn_gateway_auth_rate_limited_total")
    with client_at("127.0.0.11", one_url) as guesser, client_at("127.0.0.12", one_url) as other:
        for path in (AT_TOPOLOGY, AT_HEALTH, AT_PATHCOMP):
            assert guesser.get(path, headers=bearer(WRONG)).status_code == 401
        # At the limit: even its right token is answered 429 (a guess that hit would be too).
        refused = guesser.get(AT_TOPOLOGY, headers=bearer(ADMIN))
        assert refused.status_code == 429, refused.text
        wait = int(refused.headers["retry-after"])
        assert 1 <= wait <= WINDOW_S
        assert refused.json()["detail"] == (
            f"too many failed authentications from 127.0.0.11 ({LIMIT} within 600 s): "
            f"retry in {wait} s"
        )
        assert refused.json()["errors"][0]["type"] == "rate_limited"
        # Another address is not held back by those failures, its own are its own.
        assert other.get(AT_HEALTH, headers=bearer(ADMIN)).status_code == 200
        assert other.get(AT_TOPOLOGY, headers=bearer(WRONG)).status_code == 401
        assert other.get(AT_PATHCOMP, headers=bearer(ADMIN)).status_code in (200, 409)
    assert metric("thorn_gateway_auth_rate_limited_total") == limited_before + 1
    # The three failures reached the services, which wrote them; the 429 reached none.
    entries = wait_for_audited(one_url, "127.0.0.11", LIMIT)
    assert len(entries) == LIMIT
    assert {e["detail"]["reason"] for e in entries} == {"unknown"}


def test_requests_without_credentials_are_refused_but_not_counted(one_url: str) -> None:
    with client_at("127.0.0.13", one_url) as anonymous:
        codes = [anonymous.get(AT_TOPOLOGY).status_code for _ in range(LIMIT + 2)]
        assert codes == [401] * (LIMIT + 2)
        assert anonymous.get(AT_TOPOLOGY, headers=bearer(ADMIN)).status_code == 200


def test_x_forwarded_for_from_a_client_changes_nothing(one_url: str) -> None:
    with client_at("127.0.0.14", one_url) as poser:
        for n in range(LIMIT):
            headers = {**bearer(WRONG), "X-Forwarded-For": f"198.51.100.{n}",
                       "X-Real-IP": "198.51.100.99", "Forwarded": "for=198.51.100.98"}  # fmt: skip
            assert poser.get(AT_TOPOLOGY, headers=headers).status_code == 401
        posing = {**bearer(ADMIN), "X-Forwarded-For": "198.51.100.200"}
        assert poser.get(AT_TOPOLOGY, headers=posing).status_code == 429
    # The services were told the address the entry point saw, not the one the client wrote.
    entries = wait_for_audited(one_url, "127.0.0.14", LIMIT)
    assert len(entries) == LIMIT
    assert audited_failures(one_url, "198.51.100.0") == []


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_client(
    behind_a_proxy: str,
) -> None:
    with client_at("127.0.0.15", behind_a_proxy) as proxy:
        for _ in range(LIMIT):
            headers = {**bearer(WRONG), "X-Forwarded-For": "203.0.113.5"}
            assert proxy.get(AT_TOPOLOGY, headers=headers).status_code == 401
        limited = proxy.get(
            AT_TOPOLOGY, headers={**bearer(ADMIN), "X-Forwarded-For": "203.0.113.5"}
        )
        assert limited.status_code == 429
        assert "from 203.0.113.5" in limited.json()["detail"]
        # Another client behind the same proxy is its own.
        other = proxy.get(AT_TOPOLOGY, headers={**bearer(ADMIN), "X-Forwarded-For": "203.0.113.6"})
        assert other.status_code == 200
    entries = wait_for_audited(behind_a_proxy, "203.0.113.5", LIMIT)
    assert len(entries) == LIMIT
