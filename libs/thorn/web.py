"""What every service's HTTP edge shares: error mapping, body limits and pagination.

Domain errors become 4xx with a message that names the field; nothing reaches a 500 for bad
input. A database that cannot serve a request now (restarting, unreachable, too slow, out of
connections) is a 503 with Retry-After, counted by reason; nothing was written. The body
limit is enforced while the body streams in, so a liar's Content-Length cannot slip a large
payload past it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Generic, TypeVar

import structlog
from fastapi import FastAPI, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from pydantic import AwareDatetime, BaseModel, BeforeValidator, Field
from pydantic_core import PydanticCustomError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thorn.fabric import FabricError, NotFound
from thorn.store.database import RETRY_AFTER_S, StoreUnavailable, unavailable

T = TypeVar("T")

STORE_UNAVAILABLE = Counter(
    "thorn_api_store_unavailable_total",
    "API requests answered 503 because the database could not serve them now, by reason",
    ["reason"],
)
REFUSED = Counter(
    "thorn_api_refused_total",
    "API requests refused for what they asked (4xx: bad fields, over a bound, too large, "
    "conflicts), by status and route",
    ["status", "route"],
)
log = structlog.get_logger("thorn.web")
# What a client is told, by `thorn.store.unavailable`'s reason.
_UNAVAILABLE = {
    "connection": "the database connection failed (the server may be restarting)",
    "statement_timeout": "the database did not finish within THORN_DB_STATEMENT_TIMEOUT_MS",
    "lock_timeout": "the database did not grant a lock in time",
    "pool_timeout": "no database connection came free within THORN_DB_POOL_TIMEOUT_S",
    "read_only": "the database is read-only (a standby, or failing over)",
    "overloaded": "the database is out of connections, memory or disk",
    "contention": "the database aborted the transaction for a concurrent one",
    "locked": "the database file stayed locked by another writer",
}


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx body: `detail` is one readable line; `errors` lists each broken field."""

    detail: str
    errors: list[ErrorItem] = Field(default_factory=list)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422)
}
ERROR_RESPONSES[429] = {
    "model": ErrorBody,
    "description": "Too many failed authentications from this client's address (the entry "
    "point's limit, THORN_AUTH_FAILURE_LIMIT within THORN_AUTH_FAILURE_WINDOW_S): nothing was "
    "done; retry after Retry-After seconds.",
    "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
}
ERROR_RESPONSES[503] = {
    "model": ErrorBody,
    "description": "The database cannot serve this now (errors[0].type says why); nothing "
    "was written, except after commit_unknown. Retry after Retry-After seconds.",
    "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}},
}


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# The largest integer a database column or OFFSET takes (SQLite's INTEGER, PostgreSQL's
# bigint): a larger one in a query that reaches the store was an OverflowError (a 500).
SQL_INT_MAX = 2**63 - 1


class PageParams(BaseModel):
    limit: int = Field(100, ge=1, le=1000, description="page size")
    offset: int = Field(0, ge=0, le=SQL_INT_MAX, description="items to skip")


PageQuery = Annotated[PageParams, Query()]


def _time_text(value: object) -> object:
    """A time in a query is RFC 3339 text, as the document's date-time format says;
    pydantic would also read a number as a Unix time (`?until=0.5` was 1970)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
        msg = "Input should be a time such as 2026-12-04T18:00:00Z, not a number"
        raise PydanticCustomError("datetime_type", msg)
    return value


QueryTime = Annotated[AwareDatetime, BeforeValidator(_time_text)]


def paginate(items: Sequence[T], page: PageParams) -> Page[T]:
    return Page(
        items=list(items[page.offset : page.offset + page.limit]),
        total=len(items),
        limit=page.limit,
        offset=page.offset,
    )


def _where(loc: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in loc) or "request"


def _error(code: int, items: list[ErrorItem], request: Request | None = None) -> JSONResponse:
    route = getattr(request.scope.get("route"), "path", "(none)") if request else "(none)"
    REFUSED.labels(str(code), route).inc()
    head = "; ".join(f"{_where(i.loc)}: {i.msg}" for i in items[:3])
    more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
    body = ErrorBody(detail=head + more, errors=items)
    return JSONResponse(body.model_dump(), status_code=code, headers=_retry_after(code))


def _retry_after(code: int) -> dict[str, str] | None:
    """Every 503 says when to come back."""
    return {"Retry-After": str(RETRY_AFTER_S)} if code == 503 else None


class FieldError(Exception):
    """A request value the domain models cannot catch (a query filter, a raw file body)."""

    def __init__(self, status: int, loc: Sequence[str | int], msg: str, kind: str) -> None:
        super().__init__(msg)
        self.status = status
        self.items = [ErrorItem(loc=list(loc), msg=msg, type=kind)]

    @classmethod
    def many(cls, status: int, items: Sequence[Mapping[str, Any]]) -> FieldError:
        """Several broken fields at once (each a mapping of loc, msg and type)."""
        error = cls(status, items[0]["loc"], items[0]["msg"], items[0]["type"])
        error.items = [ErrorItem.model_validate(item) for item in items]
        return error


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")


def allowed_methods(request: Request) -> str:
    """Every method the request's path has, for a 405's Allow header: each method the
    router would take at this path. Starlette's 405 names the methods of the first route
    whose path matched, so a path of a GET and a POST route answered `Allow: GET`."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in HTTP_METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 401/403 and friends: the same body shape as every other error.
        body = ErrorBody(detail=str(exc.detail))
        headers = exc.headers
        if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(FieldError)
    async def _field(request: Request, exc: FieldError) -> JSONResponse:
        return _error(exc.status, exc.items, request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        items = [
            ErrorItem(loc=list(e.get("loc", ())), msg=str(e.get("msg", "")), type=e["type"])
            for e in exc.errors()
        ]
        malformed = any(i.type == "json_invalid" for i in items)
        return _error(400 if malformed else 422, items, request)

    @app.exception_handler(FabricError)
    async def _fabric(request: Request, exc: FabricError) -> JSONResponse:
        items = [ErrorItem(loc=["body", *i.loc], msg=i.msg, type=i.kind) for i in exc.issues]
        conflict = any(i.kind == "conflict" for i in exc.issues)
        return _error(409 if conflict else 422, items, request)

    async def _store(_: Request, exc: Exception) -> JSONResponse:
        reason = unavailable(exc)
        if reason is None:
            raise exc  # not an outage (a bug, data the database refused): a 500, logged
        STORE_UNAVAILABLE.labels(reason).inc()
        log.warning("store_unavailable", reason=reason, error=" ".join(str(exc).split())[:300])
        if isinstance(exc, StoreUnavailable) and reason not in _UNAVAILABLE:
            why = str(exc)
        else:
            why = f"{_UNAVAILABLE.get(reason, 'the database is unavailable')}; nothing was changed"
        body = ErrorBody(
            detail=f"{why}; retry in {RETRY_AFTER_S} s",
            errors=[ErrorItem(loc=["database"], msg=why, type=reason)],
        )
        return JSONResponse(body.model_dump(), status_code=503, headers=_retry_after(503))

    for kind in (DBAPIError, PoolTimeout, StoreUnavailable):
        app.add_exception_handler(kind, _store)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound) -> JSONResponse:
        item = ErrorItem(loc=["path"], msg=str(exc), type="not_found")
        return _error(404, [item], request)


class BodyLimit:
    """ASGI middleware: refuse bodies over a limit (per path prefix) with 413."""

    def __init__(self, app: ASGIApp, default: int, large: dict[str, int]) -> None:
        self.app = app
        self.default = default
        self.large = large

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.large.items():
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            # The server enforces Content-Length framing, so the header is the body's size.
            if declared.isdigit() and int(declared) > limit:
                await _too_large(limit, send)
                return
            await self.app(scope, receive, send)
            return
        # Chunked (or no) body: read it up to the limit before the app sees any of it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _too_large(limit, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], then=receive), send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _too_large(limit: int, send: Send) -> None:
    REFUSED.labels("413", "(body limit)").inc()
    body = ErrorBody(
        detail=f"request body is larger than this endpoint's limit of {limit} bytes",
        errors=[ErrorItem(loc=["body"], msg=f"larger than {limit} bytes", type="too_large")],
    )
    response = JSONResponse(body.model_dump(), status_code=status.HTTP_413_CONTENT_TOO_LARGE)
    await response({"type": "http"}, _empty_receive, send)


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}
