"""The entry point's guard on /api/: the client's address, and its failed authentications.

Every service behind the entry point checks tokens itself; this is the one place that sees
every request of a client, whichever service or replica answers it, so the limit on failed
authentication lives here (limiter.py has the rules):

- The request goes on with X-Forwarded-For set to the client's address as determined here
  (any X-Forwarded-For, Forwarded or X-Real-IP the client sent is dropped): the services
  believe X-Forwarded-For only from their trusted proxies (THORN_TRUSTED_PROXIES: the entry
  point), and write that address into the audit log.
- A 401 answer to a request that carried an Authorization header is a failure of that
  client. A client at the limit gets 429 with Retry-After (whole seconds) for every /api/
  request until the oldest counted failure leaves the window; nothing reaches a service.

The counts are this process's: with N entry points behind a load balancer a client may make
up to N times the limit (docs/operations.md, "Tokens and audit").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thorn_gateway.limiter import FailureLimiter, IPNetwork, client_address, client_key

log = structlog.get_logger("thorn.gateway")

AUTH_FAILURES = Counter(
    "thorn_gateway_auth_failures_total",
    "Requests that carried an Authorization header and were answered 401 (counted against "
    "their client's limit)",
)
RATE_LIMITED = Counter(
    "thorn_gateway_auth_rate_limited_total",
    "Requests answered 429: their client had too many failed authentications",
)
BLOCKS = Counter(
    "thorn_gateway_auth_blocks_total",
    "Times a client reached the limit of failed authentications",
)
# What a client may say about where a request came from; replaced by what the guard knows.
_FORWARDING_HEADERS = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})


class AuthFailureGuard:
    """ASGI middleware for the entry point (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: FailureLimiter,
        trusted_proxies: Sequence[IPNetwork] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.trusted_proxies = list(trusted_proxies)
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        peer = scope["client"][0] if scope.get("client") else None
        forwarded = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for"]
        client = client_address(peer, forwarded, self.trusted_proxies)
        kept = [(k, v) for k, v in headers if k not in _FORWARDING_HEADERS]
        if client is not None:
            kept.append((b"x-forwarded-for", client.encode("latin-1")))
        scope = {**scope, "headers": kept}
        key = client_key(client)
        wait = self.limiter.retry_after(key, self.clock())
        if wait is not None:
            RATE_LIMITED.inc()
            await self._too_many(client, wait)(scope, receive, send)
            return
        presented = any(k == b"authorization" for k, _ in headers)

        async def watched(message: Message) -> None:
            # Counted before the client hears the 401: its next request sees the count.
            if presented and message["type"] == "http.response.start" and \
                    message["status"] == 401:  # fmt: skip
                self._failed(client, key)
            await send(message)

        await self.app(scope, receive, watched)

    def _failed(self, client: str | None, key: str) -> None:
        AUTH_FAILURES.inc()
        if self.limiter.failed(key, self.clock()):
            BLOCKS.inc()
            log.warning("auth_rate_limited", client=client, key=key, limit=self.limiter.limit,
                        window_s=self.limiter.window_s)  # fmt: skip

    def _too_many(self, client: str | None, wait: int) -> JSONResponse:
        limit, window = self.limiter.limit, self.limiter.window_s
        why = f"too many failed authentications from {client} ({limit} within {window:g} s)"
        body = {
            "detail": f"{why}: retry in {wait} s",
            "errors": [{"loc": ["header", "authorization"], "msg": why, "type": "rate_limited"}],
        }
        return JSONResponse(body, status_code=429, headers={"Retry-After": str(wait)})
