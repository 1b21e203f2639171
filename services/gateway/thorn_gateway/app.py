"""The entry point: one URL for every service's API, and the merged OpenAPI document.

A thin shell around `RouteTable` (routes.py): a request under /api/ goes, unchanged, to the
service whose OpenAPI document declares its path, and the answer comes back as it is
streamed (server-sent events included: nothing is buffered). Each service still checks the
token itself; the entry point only carries the Authorization header along.

- Replicas: a service may have several upstream URLs (THORN_UPSTREAMS names it again for
  each). Requests go to the replica with the fewest outstanding, among those up (upstreams.py:
  passive marks from failed requests, active ones from a /healthz every HEALTH_EVERY_S). A
  request that could not connect moves on to the next replica; so does a GET or HEAD whose
  connection broke. A POST, PATCH, PUT or DELETE whose connection broke after it was sent is
  never sent again: it is answered 502 with Retry-After, saying it may or may not have been
  applied (the client knows whether repeating it is safe; the gateway does not).
- A path no service declares: 404 naming the path.
- A service none of whose replicas answers, or not configured: 503 naming the service, with
  Retry-After, within the connect timeout per replica, never a hang.
- /healthz: the entry point's own health and each replica's /healthz; 200 while every service
  has a replica that is ok (a service with some down is `degraded`), else 503.
- /openapi.json: the running services' documents, merged (`thorn.openapi.merge`).
- /: the dashboard, built by `make dashboard` (Vite) into THORN_DASHBOARD_DIR; /docs: Swagger
  UI from the same build's local copy (no CDN), over /openapi.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

import httpx
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import Counter, Gauge
from starlette.background import BackgroundTask

from thorn.config import Settings
from thorn.openapi import MergeConflict, merge
from thorn.telemetry import instrument
from thorn.web import BodyLimit
from thorn_gateway.guard import AuthFailureGuard
from thorn_gateway.limiter import FailureLimiter, parse_networks
from thorn_gateway.routes import RouteTable
from thorn_gateway.upstreams import Replica, Replicas, pools, replayable

log = structlog.get_logger("thorn.gateway")

CONNECT_TIMEOUT_S = 2.0  # a replica that does not accept within this is down: the next one
READ_TIMEOUT_S = 120.0  # a generator on a big fabric may think this long; SSE: no limit
HEALTH_TIMEOUT_S = 2.0
HEALTH_EVERY_S = 2.0  # active health: every replica's /healthz this often
# Below uvicorn's keep-alive (5 s): the gateway drops an idle connection before the service
# does, so a request is not sent on a connection the service is just closing (a broken POST).
KEEPALIVE_S = 2.0
RETRY_AFTER_S = "1"
# What a path may carry as it is (RFC 3986's pchar, '/' and '%' escapes already made).
PATH_SAFE = "/%:@!$&'()*+,;=-._~"
FORWARDED_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
# What became of one attempt of a request at one replica.
ANSWERED, NOT_CONNECTED, BROKEN, TIMED_OUT = "answered", "not_connected", "broken", "timed_out"

UPSTREAM_REQUESTS = Counter(
    "thorn_gateway_upstream_requests_total",
    "Attempts of requests at each replica, by outcome (answered, not_connected: nothing was "
    "sent, broken: the connection broke after sending, timed_out)",
    ["service", "upstream", "outcome"],
)
UPSTREAM_UP = Gauge(
    "thorn_gateway_upstream_up",
    "1 while a replica takes requests (its /healthz is ok and no request failed on it lately)",
    ["service", "upstream"],
)
UPSTREAM_OUTSTANDING = Gauge(
    "thorn_gateway_upstream_outstanding",
    "Requests (and open event streams) at each replica now",
    ["service", "upstream"],
)
RETRIED = Counter(
    "thorn_gateway_retried_total",
    "Requests sent to another replica after an attempt failed where that is safe",
    ["service"],
)
# Hop-by-hop headers (RFC 9110 7.6.1) are the proxy's own; the rest passes through.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})  # fmt: skip


# Where `make dashboard` builds it in a source checkout (make run's editable install).
BUILT_DASHBOARD = Path(__file__).resolve().parent.parent / "dashboard" / "dist"
NOT_BUILT = "the dashboard is not built here: run `make dashboard` (needs Node.js and npm)"
SWAGGER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>THORN API</title>
<link rel="stylesheet" href="/swagger/swagger-ui.css"></head>
<body><div id="swagger-ui"></div><script src="/swagger/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui",
persistAuthorization: true});</script></body></html>"""


def _error(status: int, detail: str, *, retry: bool = False) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if retry else None
    return JSONResponse({"detail": detail, "errors": []}, status_code=status, headers=headers)


class _Held:
    """A replica's outstanding count for one attempt, released exactly once (at the end of
    the answer's stream, or when the attempt fails)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._held = True
        replica.outstanding += 1
        UPSTREAM_OUTSTANDING.labels(replica.service, replica.url).inc()

    def release(self) -> None:
        if self._held:
            self._held = False
            self.replica.outstanding -= 1
            UPSTREAM_OUTSTANDING.labels(self.replica.service, self.replica.url).dec()


def create_app(
    settings: Settings,
    *,
    table: RouteTable | None = None,
) -> FastAPI:
    """The entry point for the services in THORN_UPSTREAMS, routed by `table` (default: the
    generated routes.json)."""
    routes = table or RouteTable.load()
    services = pools(settings.upstream_urls)
    clock = time.monotonic

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
        # https:// upstreams are verified with THORN_TLS_CA (checked at start, in main).
        verify = settings.upstream_tls
        async with httpx.AsyncClient(timeout=timeout, limits=limits, verify=verify) as client:
            app.state.client = client
            for replica in _all(services):
                UPSTREAM_UP.labels(replica.service, replica.url).set(1)
            checker = asyncio.create_task(_check_forever(), name="gateway-health-checks")
            log.info("gateway_ready", unrouted=[s for s in routes.services if s not in services],
                     upstreams={n: len(p) for n, p in services.items()})  # fmt: skip
            try:
                yield
            finally:
                checker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checker

    app = FastAPI(title="THORN", version="0.1.0", lifespan=lifespan, openapi_url=None,
                  docs_url=None, redoc_url=None)  # fmt: skip

    async def health_of(replica: Replica) -> dict[str, Any]:
        """One replica's /healthz, which also sets it up or down for the spreading."""
        client: httpx.AsyncClient = app.state.client
        try:
            answer = await client.get(f"{replica.url}/healthz", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as exc:
            _mark(replica, ok=False)
            return {"status": "unreachable", "url": replica.url, "error": type(exc).__name__}
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        status = body.get("status", "ok" if answer.is_success else "unhealthy")
        _mark(replica, ok=answer.is_success and status == "ok")
        found = {"status": status, "url": replica.url}
        return {**found, "problems": body["problems"]} if "problems" in body else found

    def _mark(replica: Replica, *, ok: bool) -> None:
        was = replica.up(clock())
        Replicas.checked(replica, ok)
        now_up = replica.up(clock())
        UPSTREAM_UP.labels(replica.service, replica.url).set(int(now_up))
        if was != now_up:
            log.info("upstream_up" if now_up else "upstream_down", service=replica.service,
                     upstream=replica.url, reason="healthz")  # fmt: skip

    async def _check_forever() -> None:
        while True:
            await asyncio.gather(*(health_of(r) for r in _all(services)))
            await asyncio.sleep(HEALTH_EVERY_S)

    def problems() -> list[str]:
        return [f"{s}: not configured" for s in routes.services if s not in services]

    # Each service limits its own bodies; this only bounds what the entry point holds.
    app.add_middleware(BodyLimit, default=settings.max_import_bytes, large={})
    # Outermost: a client over its limit of failed authentications is answered before anything.
    limiter = FailureLimiter(settings.auth_failure_limit, settings.auth_failure_window_s)
    proxies = parse_networks(settings.gateway_trusted_proxies, "THORN_GATEWAY_TRUSTED_PROXIES")
    app.add_middleware(AuthFailureGuard, limiter=limiter, trusted_proxies=proxies)
    instrument(app, "gateway", healthz=False)  # its /healthz reports every service too

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        found = await asyncio.gather(*(health_of(r) for r in _all(services)))
        by_url = {(r.service, r.url): f for r, f in zip(_all(services), found, strict=True)}
        report: dict[str, Any] = {}
        for name, pool in services.items():
            replicas = [by_url[(name, r.url)] for r in pool.replicas]
            ok = sum(r["status"] == "ok" for r in replicas)
            status = ("ok" if ok == len(replicas) else "degraded" if ok else
                      replicas[0]["status"] if len(replicas) == 1 else "down")  # fmt: skip
            report[name] = {"status": status, "replicas": replicas}
        missing = problems()
        serving = not missing and all(s["status"] in ("ok", "degraded") for s in report.values())
        everything = serving and all(s["status"] == "ok" for s in report.values())
        body = {"status": "ok" if everything else "degraded", "service": "gateway",
                "services": report, **({"problems": missing} if missing else {})}  # fmt: skip
        return JSONResponse(body, status_code=200 if serving else 503)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        docs: dict[str, Any] = {}
        for name, pool in services.items():
            sent = await _send(pool, "GET", "/openapi.json", [], b"", None)
            if isinstance(sent, JSONResponse):
                return sent
            answer, held = sent
            try:
                await answer.aread()
                answer.raise_for_status()
                docs[name] = answer.json()
            except (httpx.HTTPError, ValueError):
                return _error(503, f"service {name} is unavailable: its OpenAPI document "
                                   "could not be read", retry=True)  # fmt: skip
            finally:
                held.release()
                await answer.aclose()
        try:
            return JSONResponse(merge(docs))
        except MergeConflict as exc:
            return _error(503, f"the services' documents disagree: {exc}")

    async def _send(
        pool: Replicas,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        limits: httpx.Timeout | None,
    ) -> tuple[httpx.Response, _Held] | JSONResponse:
        """`target` at one replica of `pool` after another, while that is safe: the answer,
        its body still to be read, with the hold on its replica to release once it is; or
        the error to give."""
        client: httpx.AsyncClient = app.state.client
        service, tried = pool.service, list[Replica]()
        while (replica := pool.pick(clock(), tried)) is not None:
            if tried:
                RETRIED.labels(service).inc()
            tried.append(replica)
            outbound = client.build_request(
                method, f"{replica.url}{target}", headers=headers, content=body,
                timeout=limits or client.timeout,
            )  # fmt: skip
            held = _Held(replica)
            error: httpx.TransportError
            try:
                answer = await client.send(outbound, stream=True)
            except httpx.LocalProtocolError as exc:
                # The request itself cannot be written (a header HTTP/1.1 does not allow):
                # the client's doing; the replica is fine.
                held.release()
                return _error(400, f"the request cannot be passed on: {exc}")
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                outcome, sent, error = NOT_CONNECTED, False, exc
            except httpx.TimeoutException as exc:  # read or write: the replica is slow, not gone
                outcome, sent, error = TIMED_OUT, True, exc
            except httpx.TransportError as exc:  # reset, closed mid-answer: it may have died
                outcome, sent, error = BROKEN, True, exc
            else:
                UPSTREAM_REQUESTS.labels(service, replica.url, ANSWERED).inc()
                return answer, held
            held.release()
            UPSTREAM_REQUESTS.labels(service, replica.url, outcome).inc()
            if outcome != TIMED_OUT:
                Replicas.failed(replica, clock())
                UPSTREAM_UP.labels(service, replica.url).set(0)
                log.warning("upstream_failed", service=service, upstream=replica.url,
                            outcome=outcome, method=method, error=type(error).__name__)  # fmt: skip
            if not replayable(method, sent):
                if outcome == TIMED_OUT:
                    return _error(503, f"service {service} did not answer in time; the "
                                       "request may or may not have been applied")  # fmt: skip
                return _error(502, f"service {service} failed: the connection to {replica.url} "
                                   f"broke after the request was sent ({type(error).__name__});"
                                   " it may or may not have been applied", retry=True)  # fmt: skip
        urls = ", ".join(r.url for r in tried)
        return _error(503, f"service {service} is unavailable (no answer at {urls})", retry=True)

    # Every method goes to the service, which answers a method the path lacks with a 405
    # and the path's own Allow (the entry point's would list these).
    @app.api_route("/api/{rest:path}", methods=FORWARDED_METHODS, include_in_schema=False)
    async def forward(request: Request, rest: str) -> Response:
        path = request.url.path
        service = routes.service_for(path)
        if service is None:
            return _error(404, f"no THORN service serves {path}")
        pool = services.get(service)
        if pool is None:
            return _error(503, f"service {service} is not configured behind this entry point")
        # As received (bytes, repeats kept), each value without the surrounding whitespace
        # that is not part of it (RFC 9110, 5.5): as text, a value with a byte over 0x7f could
        # not be sent on (a 500), and one with a trailing space was refused by the HTTP
        # library as if the replica had failed (a 502, then the service marked down).
        headers = [(k, v.strip(b" \t")) for k, v in request.scope["headers"]
                   if k.decode("latin-1").lower() not in HOP_BY_HOP]  # fmt: skip
        # A server-sent event stream may be quiet for minutes: no read timeout for it.
        streaming = "text/event-stream" in request.headers.get("accept", "")
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S) if streaming else None
        query = f"?{request.url.query}" if request.url.query else ""  # as sent, unparsed
        # The path as sent too (percent-encoded): decoded, it may hold a character no URL
        # may (a control character: the request was a 500) or a '/' that was in a name.
        raw = request.scope.get("raw_path") or path.encode()
        sent_path = quote_from_bytes(raw, safe=PATH_SAFE)
        sent = await _send(pool, request.method, f"{sent_path}{query}", headers,
                           await request.body(), timeout)  # fmt: skip
        if isinstance(sent, JSONResponse):
            return sent
        answer, held = sent

        async def done() -> None:
            held.release()
            await answer.aclose()

        async def relay() -> AsyncIterator[bytes]:
            # The replica is held until the answer is over, however it ends: a client that
            # goes away mid-stream cancels this generator, and the background task is not run.
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await done()

        back = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(relay(), status_code=answer.status_code, headers=back,
                                 background=BackgroundTask(done))  # fmt: skip

    dashboard = settings.dashboard_dir or BUILT_DASHBOARD
    for sub in ("assets", "swagger"):
        # Not built: its files are 404s and / says how to build it (make run builds first).
        if (dashboard / sub).is_dir():
            app.mount(f"/{sub}", StaticFiles(directory=dashboard / sub), name=sub)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        page = dashboard / "index.html"
        if not page.is_file():
            return _error(503, NOT_BUILT)
        return FileResponse(page, headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        if not (dashboard / "swagger" / "swagger-ui-bundle.js").is_file():
            return _error(503, NOT_BUILT)
        return HTMLResponse(SWAGGER_PAGE)

    return app


def _all(services: dict[str, Replicas]) -> list[Replica]:
    return [replica for pool in services.values() for replica in pool.replicas]
