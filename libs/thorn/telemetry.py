"""Structured logs (structlog) and Prometheus metrics, shared by every service."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

HTTP_REQUESTS = Counter(
    "thorn_http_requests_total", "HTTP requests", ["service", "method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "thorn_http_request_seconds",
    "HTTP request latency",
    ["service", "method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write per line (message and newline together): the agent and its BFD child
        # share one log file, and two writes per line let their lines interleave.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def instrument(
    app: FastAPI,
    service: str,
    problems: Callable[[], list[str]] | None = None,
    *,
    healthz: bool = True,
) -> None:
    """Count and time every request by route template; serve /metrics and (unless the app
    serves its own, `healthz=False`) /healthz. `problems`: what is wrong with this process
    now; any makes /healthz answer 503."""

    @app.middleware("http")
    async def _measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        HTTP_LATENCY.labels(service, request.method, template).observe(time.perf_counter() - start)
        HTTP_REQUESTS.labels(service, request.method, template, response.status_code).inc()
        return response

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        # In a thread: some collectors ask another process (the programmer's BFD child),
        # which must not hold the event loop.
        return Response(await asyncio.to_thread(generate_latest), media_type=CONTENT_TYPE_LATEST)

    if not healthz:
        return

    @app.get("/healthz", include_in_schema=False)
    async def own_healthz() -> Response:
        found = problems() if problems is not None else []
        if found:
            body = {"status": "unhealthy", "service": service, "problems": found}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok", "service": service})
