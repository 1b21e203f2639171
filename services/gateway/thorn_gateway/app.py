"""The entry point: one URL for every service's API, and the merged OpenAPI document.

A thin shell around `RouteTable` (routes.py): a request under /api/ goes, unchanged, to the
service whose OpenAPI document declares its path, and the answer comes back as it is
streamed (server-sent events included: nothing is buffered). Each service still checks the
token itself; the entry point only carries the Authorization header along.

- A path no service declares: 404 naming the path.
- A service that is down, or not configured: 503 naming the service, within the connect
  timeout, never a hang.
- /healthz: the entry point's own health and each service's /healthz; 503 if any is not ok.
- /openapi.json: the running services' documents, merged (`thorn.openapi.merge`).
- /: the dashboard, built by `make dashboard` (Vite) into THORN_DASHBOARD_DIR; /docs: Swagger
  UI from the same build's local copy (no CDN), over /openapi.json.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.background import BackgroundTask

from thorn.config import Settings
from thorn.openapi import MergeConflict, merge
from thorn.telemetry import instrument
from thorn.web import BodyLimit
from thorn_gateway.routes import RouteTable

log = structlog.get_logger("thorn.gateway")

CONNECT_TIMEOUT_S = 2.0  # a service that does not accept within this is down: 503
READ_TIMEOUT_S = 120.0  # a generator on a big fabric may think this long; SSE: no limit
HEALTH_TIMEOUT_S = 2.0
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


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "errors": []}, status_code=status)


def create_app(
    settings: Settings,
    *,
    table: RouteTable | None = None,
) -> FastAPI:
    """The entry point for the services in THORN_UPSTREAMS, routed by `table` (default: the
    generated routes.json)."""
    routes = table or RouteTable.load()
    upstreams = settings.upstream_urls

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        async with httpx.AsyncClient(timeout=timeout) as client:
            app.state.client = client
            log.info("gateway_ready", upstreams=upstreams, unrouted=[
                s for s in routes.services if s not in upstreams])  # fmt: skip
            yield

    app = FastAPI(title="THORN", version="0.1.0", lifespan=lifespan, openapi_url=None,
                  docs_url=None, redoc_url=None)  # fmt: skip

    async def health_of(name: str, url: str) -> dict[str, Any]:
        client: httpx.AsyncClient = app.state.client
        try:
            answer = await client.get(f"{url}/healthz", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as exc:
            return {"status": "unreachable", "url": url, "error": type(exc).__name__}
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        status = body.get("status", "ok" if answer.is_success else "unhealthy")
        return {"status": status, "url": url, **({"problems": body["problems"]}
                                                  if "problems" in body else {})}  # fmt: skip

    def problems() -> list[str]:
        return [f"{s}: not configured" for s in routes.services if s not in upstreams]

    # Each service limits its own bodies; this only bounds what the entry point holds.
    app.add_middleware(BodyLimit, default=settings.max_import_bytes, large={})
    instrument(app, "gateway", healthz=False)  # its /healthz reports every service too

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        names = list(upstreams)
        found = await asyncio.gather(*(health_of(n, upstreams[n]) for n in names))
        services = dict(zip(names, found, strict=True))
        missing = problems()
        ok = not missing and all(s["status"] == "ok" for s in services.values())
        body = {"status": "ok" if ok else "degraded", "service": "gateway",
                "services": services, **({"problems": missing} if missing else {})}  # fmt: skip
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        client: httpx.AsyncClient = app.state.client
        docs: dict[str, Any] = {}
        for name, url in upstreams.items():
            try:
                answer = await client.get(f"{url}/openapi.json")
                answer.raise_for_status()
                docs[name] = answer.json()
            except (httpx.HTTPError, ValueError):
                return _error(503, f"service {name} is unavailable: its OpenAPI document "
                                   "could not be read")  # fmt: skip
        try:
            return JSONResponse(merge(docs))
        except MergeConflict as exc:
            return _error(503, f"the services' documents disagree: {exc}")

    @app.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                   include_in_schema=False)  # fmt: skip
    async def forward(request: Request, rest: str) -> Response:
        path = request.url.path
        service = routes.service_for(path)
        if service is None:
            return _error(404, f"no THORN service serves {path}")
        base = upstreams.get(service)
        if base is None:
            return _error(503, f"service {service} is not configured behind this entry point")
        client: httpx.AsyncClient = app.state.client
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        # A server-sent event stream may be quiet for minutes: no read timeout for it.
        streaming = "text/event-stream" in request.headers.get("accept", "")
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S) if streaming else client.timeout
        query = f"?{request.url.query}" if request.url.query else ""  # as sent, unparsed
        outbound = client.build_request(
            request.method, f"{base}{path}{query}", headers=headers,
            content=await request.body(), timeout=timeout,
        )  # fmt: skip
        try:
            answer = await client.send(outbound, stream=True)
        except httpx.ConnectError:
            return _error(503, f"service {service} is unavailable (no answer at {base})")
        except httpx.TimeoutException:
            return _error(503, f"service {service} did not answer in time")
        except httpx.HTTPError as exc:
            return _error(502, f"service {service} failed: {type(exc).__name__}")
        back = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                 headers=back,
                                 background=BackgroundTask(answer.aclose))  # fmt: skip

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
