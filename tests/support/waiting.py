"""Waiting, bounded, for something a service does a moment later."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, within: float = 10.0, every: float = 0.05
) -> None:
    """Await `check` every `every` seconds until it is true; fail naming `what` after
    `within` seconds."""
    for _ in range(max(1, int(within / every))):
        if await check():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
