"""GET /api/v1/events: the bus's fabric events as server-sent events, for the dashboard.

Each client gets its own core-NATS subscriptions (nothing is stored for it) and a bounded
queue: a client too slow to read gets one `overflow` event and the stream goes on, so it
knows to re-read state instead of trusting what it missed. Every event is the bus message's
JSON as published, named by its kind; a comment line every KEEPALIVE_S keeps proxies and
the browser from closing a quiet stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import WithJsonSchema

from thorn.auth import Viewer
from thorn.bus import Bus
from thorn.events import (
    AGENT_APPLIED_ALL,
    FAILOVER_ALL,
    HEALTH_LINK_ALL,
    PATHS_CHANGED,
    TOPOLOGY_CHANGED,
)
from thorn.web import ERROR_RESPONSES, FieldError

router = APIRouter(prefix="/api/v1", responses=ERROR_RESPONSES, tags=["events"])

# Event name -> the subject it is read from.
KINDS: dict[str, str] = {
    "topology": TOPOLOGY_CHANGED,
    "paths": PATHS_CHANGED,
    "health": HEALTH_LINK_ALL,
    "failover": FAILOVER_ALL,
    "applied": AGENT_APPLIED_ALL,  # one per node after each reconcile: the node view's feed
}
# A kind as the document states it; the route refuses others with a message naming them.
EventKind = Annotated[str, WithJsonSchema({"type": "string", "enum": list(KINDS)})]
QUEUE_LIMIT = 4096  # a k=16 rollout's applied burst (~1,300 nodes) fits
KEEPALIVE_S = 15.0


def get_bus(request: Request) -> Bus:
    bus: Bus = request.app.state.bus
    return bus


def sse(kind: str, data: bytes) -> bytes:
    """One server-sent event; bus JSON has no raw newlines, so one data line carries it."""
    return b"event: " + kind.encode() + b"\ndata: " + data.replace(b"\n", b" ") + b"\n\n"


@router.get(
    "/events",
    summary="Fabric events as they happen (server-sent events)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                     "description": "`event: <kind>` then `data: <the bus event's JSON>`"}},
)  # fmt: skip
async def events(
    _: Viewer,
    request: Request,
    bus: Annotated[Bus, Depends(get_bus)],
    kind: Annotated[
        list[EventKind] | None,
        Query(description=f"only these kinds (repeatable): {', '.join(KINDS)}; default all"),
    ] = None,
) -> StreamingResponse:
    wanted = kind or list(KINDS)
    unknown = [k for k in wanted if k not in KINDS]
    if unknown:
        raise FieldError(422, ["query", "kind"], f"unknown event kind '{unknown[0]}': "
                         f"expected one of {', '.join(KINDS)}", "enum")  # fmt: skip
    queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_LIMIT)
    overflowed = False

    def on(name: str) -> Callable[[Msg], Awaitable[None]]:
        async def deliver(msg: Msg) -> None:
            nonlocal overflowed
            try:
                queue.put_nowait(sse(name, msg.data))
            except asyncio.QueueFull:
                overflowed = True

        return deliver

    subscriptions: list[Subscription] = [
        await bus.nc.subscribe(KINDS[name], cb=on(name)) for name in dict.fromkeys(wanted)
    ]
    await bus.flush()  # subscribed at the server before the client sees the stream open

    async def stream() -> AsyncIterator[bytes]:
        nonlocal overflowed
        try:
            yield b": THORN events\n\n"  # opens the stream at once
            while not await request.is_disconnected():
                if overflowed:
                    overflowed = False
                    yield sse("overflow", b'{"detail":"events were dropped: re-read state"}')
                with contextlib.suppress(TimeoutError):
                    yield await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                    continue
                yield b": keepalive\n\n"
        finally:
            for sub in subscriptions:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
