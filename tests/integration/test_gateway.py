"""The entry point: one URL in front of the real topology, health and pathcomp services (each
under uvicorn, on one SQLite store and a real nats-server)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fixed_tokens import fixed_token
from serving import STARTUP, serving, serving_services

from thorn.bus import Bus
from thorn.config import Settings
from thorn.events import PathsChanged
from thorn.natsd import free_port
from thorn_gateway.app import CONNECT_TIMEOUT_S
from thorn_gateway.app import create_app as gateway_app
from thorn_topology.app import create_app as topology_app

ADMIN = fixed_token("gateway-test-admin")
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
FABRIC = {"spines": 2, "leaves": 2, "hosts_per_leaf": 1}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture(scope="module")
def services(data: Path, nats_url: str) -> Iterator[dict[str, str]]:
    settings = Settings(admin_token=ADMIN, data_dir=data)
    with serving_services(settings, data / "thorn.db", nats_url) as urls:
        yield urls


def _gateway(services: Mapping[str, str | list[str]], db: Path, nats_url: str) -> Iterator[str]:
    upstreams = ",".join(f"{name}={url}" for name, urls in services.items()
                         for url in ([urls] if isinstance(urls, str) else urls))  # fmt: skip
    settings = Settings(upstreams=upstreams)
    # Up once it answers /healthz at all: with a service down it answers 503.
    with serving("gateway", lambda _s, _b: gateway_app(settings), db, nats_url,
                 ready=lambda _status: True) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def one_url(
    services: dict[str, str], tmp_path_factory: pytest.TempPathFactory, nats_url: str
) -> Iterator[str]:
    db = tmp_path_factory.mktemp("gateway-own") / "unused.db"
    yield from _gateway(services, db, nats_url)


def test_every_service_s_api_answers_on_the_one_url(one_url: str) -> None:
    generated = httpx.post(f"{one_url}/api/v1/fabric/generate/leaf-spine", json=FABRIC,
                           headers=AS_ADMIN, timeout=30)  # fmt: skip
    assert generated.status_code == 200, generated.text
    summary = httpx.get(f"{one_url}/api/v1/fabric/summary", headers=AS_ADMIN).json()
    assert (summary["switches"], summary["hosts"]) == (4, 2)
    deadline = time.monotonic() + STARTUP  # pathcomp plans the new fabric
    while (plan := httpx.get(f"{one_url}/api/v1/plan", headers=AS_ADMIN)).status_code != 200 or \
            plan.json()["topology_revision"] != summary["revision"]:  # fmt: skip
        assert time.monotonic() < deadline, plan.text
        time.sleep(0.1)
    pair = {"src": "host1", "dst": "host2"}
    paths = httpx.get(f"{one_url}/api/v1/paths", params=pair, headers=AS_ADMIN)
    assert paths.status_code == 200, paths.text
    links = httpx.get(f"{one_url}/api/v1/health/links", headers=AS_ADMIN)
    assert links.status_code == 200 and "items" in links.json()


def test_each_service_still_checks_the_token_itself(one_url: str) -> None:
    for path in ("/api/v1/fabric/summary", "/api/v1/paths", "/api/v1/health/links"):
        answer = httpx.get(f"{one_url}{path}")
        assert answer.status_code == 401, (path, answer.text)
        bad = httpx.get(f"{one_url}{path}", headers={"Authorization": "Bearer thn_wrong"})
        assert bad.status_code == 401, (path, bad.text)


def test_queries_and_bodies_pass_through_unchanged(one_url: str) -> None:
    refused = httpx.post(f"{one_url}/api/v1/fabric/generate/leaf-spine",
                         json={**FABRIC, "spines": -1}, headers=AS_ADMIN)  # fmt: skip
    assert refused.status_code == 422 and "spines" in refused.text
    page = httpx.get(f"{one_url}/api/v1/nodes", params={"limit": "1"}, headers=AS_ADMIN).json()
    assert page["limit"] == 1 and len(page["items"]) == 1


def test_a_path_no_service_declares_is_a_404_naming_it(one_url: str) -> None:
    answer = httpx.get(f"{one_url}/api/v1/nothing-here", headers=AS_ADMIN)
    assert answer.status_code == 404
    assert "/api/v1/nothing-here" in answer.json()["detail"]


def test_a_name_with_a_character_no_url_may_hold_reaches_the_service_still_encoded(
    one_url: str,
) -> None:
    """Found by the API fuzz lane: the entry point sent the decoded path on, and a name with
    a control character (%08) was a 500 from the entry point itself."""
    answer = httpx.get(f"{one_url}/api/v1/nodes/e%08%C2%80p", headers=AS_ADMIN)
    assert answer.status_code == 404, answer.text
    assert answer.json()["detail"] == "path: node 'e\x08\x80p' not found"


def raw_status(url: str, path: str, header: bytes) -> int:
    """The status of a GET with `header` sent byte for byte (an HTTP library would refuse
    to send some of what a client on the network can)."""
    host, port = url.removeprefix("http://").split(":")
    request = f"GET {path} HTTP/1.1\r\nHost: thorn\r\nConnection: close\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request + header + b"\r\n\r\n")
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def test_a_token_header_the_entry_point_cannot_pass_on_as_text_is_refused_as_a_bad_token(
    one_url: str,
) -> None:
    """Found by the API fuzz lane: an Authorization value with a byte over 0x7f was a 500,
    and one ending in whitespace a 502 that marked the service down for every client."""
    for header in (b"Authorization: Bearer thn_\xff\xfe", b"Authorization: Bearer thn_x \t"):
        assert raw_status(one_url, "/api/v1/nodes", header) == 401, header
    assert httpx.get(f"{one_url}/api/v1/nodes", headers=AS_ADMIN).status_code == 200


def test_a_method_a_path_lacks_is_a_405_naming_every_method_the_path_has(one_url: str) -> None:
    """Found by the API fuzz lane: OPTIONS was answered by the entry point with its own
    methods, and a service's 405 named only the first route of the path (GET of GET and
    POST /nodes)."""
    for method in ("OPTIONS", "PUT"):
        answer = httpx.request(method, f"{one_url}/api/v1/nodes", headers=AS_ADMIN)
        assert answer.status_code == 405, (method, answer.text)
        assert answer.headers["allow"] == "GET, POST", method


def test_the_merged_openapi_document_has_every_service_s_paths(one_url: str) -> None:
    paths = httpx.get(f"{one_url}/openapi.json").json()["paths"]
    for path in ("/api/v1/fabric/summary", "/api/v1/plan", "/api/v1/health/links"):
        assert path in paths


def test_healthz_reports_each_service(one_url: str, services: dict[str, str]) -> None:
    body = httpx.get(f"{one_url}/healthz").json()
    assert body["status"] == "ok"
    assert {n: s["status"] for n, s in body["services"].items()} == dict.fromkeys(services, "ok")


def test_a_service_down_is_a_prompt_503_naming_it(
    services: dict[str, str], tmp_path_factory: pytest.TempPathFactory, nats_url: str
) -> None:
    down = {**services, "health": f"http://127.0.0.1:{free_port()}"}  # nothing listens
    db = tmp_path_factory.mktemp("gateway-down") / "unused.db"
    for url in _gateway(down, db, nats_url):
        started = time.monotonic()
        answer = httpx.get(f"{url}/api/v1/health/links", headers=AS_ADMIN, timeout=30)
        assert answer.status_code == 503 and "health" in answer.json()["detail"]
        assert time.monotonic() - started < CONNECT_TIMEOUT_S + 5
        health = httpx.get(f"{url}/healthz", timeout=30)
        assert health.status_code == 503
        assert health.json()["services"]["health"]["status"] == "unreachable"
        assert health.json()["services"]["topology"]["status"] == "ok"
        # The others still answer.
        assert httpx.get(f"{url}/api/v1/fabric/summary", headers=AS_ADMIN).status_code == 200


def test_server_sent_events_pass_through_as_they_happen(one_url: str, nats_url: str) -> None:
    """An event on the bus reaches a client of the one URL while the stream stays open:
    nothing between the bus and the client buffers it."""

    async def publish_and_read() -> tuple[list[str], float]:
        lines: list[str] = []
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client,
            client.stream("GET", f"{one_url}/api/v1/events", params={"kind": "paths"},
                          headers={**AS_ADMIN, "Accept": "text/event-stream"}) as stream,
            await Bus.connect(nats_url, name="test-sse") as bus,
        ):  # fmt: skip
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            reader = stream.aiter_lines()
            assert (await anext(reader)).startswith(":")  # open before any event
            sent = time.monotonic()
            await bus.publish(
                PathsChanged(revision=4242, topology_revision=1, at=datetime.now(UTC))
            )
            async with asyncio.timeout(5):
                async for line in reader:
                    lines.append(line)
                    if line.startswith("data:"):
                        return lines, time.monotonic() - sent
        return lines, -1.0

    lines, seconds = asyncio.run(publish_and_read())
    assert lines[-2:] == ["event: paths", lines[-1]] and "4242" in lines[-1], lines
    assert 0 <= seconds < 1.0, f"the event took {seconds:.3f} s"


def test_an_unknown_event_kind_is_refused_naming_it(one_url: str) -> None:
    answer = httpx.get(f"{one_url}/api/v1/events", params={"kind": "gossip"}, headers=AS_ADMIN)
    assert answer.status_code == 422 and "gossip" in answer.json()["detail"]
    assert httpx.get(f"{one_url}/api/v1/events").status_code == 401


def test_the_dashboard_and_swagger_ui_are_served_from_local_files(one_url: str) -> None:
    """`make test` builds the dashboard first; /docs needs no CDN."""
    page = httpx.get(f"{one_url}/")
    assert page.status_code == 200, page.text
    assert "<title>THORN</title>" in page.text
    script = re.search(r'src="(/assets/[^"]+\.js)"', page.text)
    assert script is not None, page.text
    assert httpx.get(f"{one_url}{script.group(1)}").status_code == 200
    docs = httpx.get(f"{one_url}/docs")
    assert docs.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
    assert assets and all(a.startswith("/swagger/") for a in assets), assets
    for asset in assets:
        assert httpx.get(f"{one_url}{asset}").status_code == 200, asset


async def test_a_missing_dashboard_build_says_how_to_build_it(tmp_path: Path) -> None:
    app = gateway_app(Settings(upstreams="", dashboard_dir=tmp_path / "no-build"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        for path in ("/", "/docs"):
            answer = await client.get(path)
            assert answer.status_code == 503 and "make dashboard" in answer.json()["detail"]
        assert (await client.get("/assets/index.js")).status_code == 404


# --- replicas ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def second_topology(data: Path, nats_url: str) -> Iterator[str]:
    """Another topology replica on the same store and bus."""
    settings = Settings(admin_token=ADMIN, data_dir=data)
    with serving("topology-2", lambda s, b: topology_app(settings, store=s, bus=b),
                 data / "thorn.db", nats_url) as url:  # fmt: skip
        yield url


def answered(gateway: str) -> dict[str, float]:
    """The gateway's answered attempts per upstream URL, from its /metrics."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith("thorn_gateway_upstream_requests_total{") and \
                'outcome="answered"' in line:  # fmt: skip
            upstream = re.search(r'upstream="([^"]+)"', line)
            assert upstream is not None
            counts[upstream.group(1)] = float(line.rpartition(" ")[2])
    return counts


class Breaker:
    """A replica that dies mid-request: it answers /healthz, reads any other request whole,
    and then resets the connection without a word. It counts what it was sent."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                while length and len(body) < int(length.group(1)):
                    body += conn.recv(65536)
                request_line = head.split(b"\r\n")[0].decode()
                if " /healthz " in request_line:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 15\r\nconnection: close\r\n\r\n"
                                 b'{"status":"ok"}')  # fmt: skip
                    continue
                self.received.append(request_line)
                # RST, not FIN: as the kernel answers for a process killed mid-request.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def breaker() -> Iterator[Breaker]:
    made = Breaker()
    yield made
    made.close()


def test_requests_are_spread_over_every_replica_of_a_service(
    services: dict[str, str], second_topology: str, tmp_path: Path, nats_url: str
) -> None:
    replicas = [services["topology"], second_topology]
    for url in _gateway({**services, "topology": replicas}, tmp_path / "unused.db", nats_url):
        before = answered(url)
        for i in range(10):
            made = httpx.post(f"{url}/api/v1/tenants", json={"name": f"spread{i}"},
                              headers=AS_ADMIN)  # fmt: skip
            assert made.status_code == 201, made.text
            assert httpx.get(f"{url}/api/v1/tenants/spread{i}", headers=AS_ADMIN).is_success
        after = answered(url)
        served = {r: after.get(r, 0) - before.get(r, 0) for r in replicas}
        assert sum(served.values()) == 20
        assert min(served.values()) >= 5, served  # idle replicas take turns
        health = httpx.get(f"{url}/healthz").json()["services"]["topology"]
        assert health["status"] == "ok"
        assert [r["url"] for r in health["replicas"]] == replicas


def test_a_replica_that_refuses_connections_is_passed_over_for_reads_and_writes(
    services: dict[str, str], tmp_path: Path, nats_url: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: nothing was ever sent there
    for url in _gateway({**services, "topology": [dead, services["topology"]]},
                        tmp_path / "unused.db", nats_url):  # fmt: skip
        for i in range(3):
            made = httpx.post(f"{url}/api/v1/tenants", json={"name": f"passed{i}"},
                              headers=AS_ADMIN)  # fmt: skip
            assert made.status_code == 201, made.text
            assert httpx.get(f"{url}/api/v1/tenants/passed{i}", headers=AS_ADMIN).is_success
        assert answered(url).get(dead, 0) == 0
        health = httpx.get(f"{url}/healthz")
        assert health.status_code == 200  # the service is served, by the replica left
        topology = health.json()["services"]["topology"]
        assert topology["status"] == "degraded"
        assert [r["status"] for r in topology["replicas"]] == ["unreachable", "ok"]
        metrics = httpx.get(f"{url}/metrics").text
        assert f'thorn_gateway_upstream_up{{service="topology",upstream="{dead}"}} 0.0' in metrics


def test_a_write_whose_connection_broke_after_sending_is_a_502_and_never_sent_again(
    services: dict[str, str], breaker: Breaker, tmp_path: Path, nats_url: str
) -> None:
    # A fresh gateway's first pick is the first replica given: the one that breaks.
    for url in _gateway({**services, "topology": [breaker.url, services["topology"]]},
                        tmp_path / "unused.db", nats_url):  # fmt: skip
        made = httpx.post(f"{url}/api/v1/tenants", json={"name": "unsure"}, headers=AS_ADMIN)
        assert made.status_code == 502, made.text
        assert made.headers["retry-after"] == "1"
        assert "may or may not have been applied" in made.json()["detail"]
        assert breaker.received == ["POST /api/v1/tenants HTTP/1.1"]
        # Not replayed on the other replica: the tenant does not exist.
        assert httpx.get(f"{url}/api/v1/tenants/unsure", headers=AS_ADMIN).status_code == 404


def test_a_read_whose_connection_broke_is_answered_by_another_replica(
    services: dict[str, str], breaker: Breaker, tmp_path: Path, nats_url: str
) -> None:
    for url in _gateway({**services, "topology": [breaker.url, services["topology"]]},
                        tmp_path / "unused.db", nats_url):  # fmt: skip
        started = time.monotonic()
        read = httpx.get(f"{url}/api/v1/fabric/summary", headers=AS_ADMIN)
        assert read.status_code == 200, read.text
        assert time.monotonic() - started < CONNECT_TIMEOUT_S
        assert breaker.received == ["GET /api/v1/fabric/summary HTTP/1.1"]
        assert answered(url).get(services["topology"], 0) >= 1
