"""Where a desired-state watch's snapshot ends.

nats-py marks the end of a watch's snapshot with a None. Right after creating the consumer it
asks how much is pending; when the server has already sent every entry and none has been read
yet, that None comes ahead of them (nats.py#842: an agent would take a partial or empty
snapshot as complete). These tests replay the order in which nats-py hands over items, with
its own `KeyValue.Entry` and `ConsumerInfo`, and check what the watch makes of it. The
integration lane runs the same watch against a real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from nats.js.api import ConsumerInfo
from nats.js.kv import KV_DEL, KeyValue

from thorn.bus import CAUGHT_UP, DesiredStateEntry
from thorn.bus.kv import CaughtUp, DesiredStateWatch


def _entry(key: str, revision: int, pending: int, op: str | None = None) -> KeyValue.Entry:
    return KeyValue.Entry(
        bucket="b", key=key, value=None if op else b"v", revision=revision, delta=pending,
        created=None, operation=op,
    )  # fmt: skip


class _Consumer:
    def __init__(self, delivered: int, pending: int) -> None:
        # the fields of the server's CONSUMER.INFO answer that the watch reads
        self.info: ConsumerInfo = ConsumerInfo.from_response({
            "name": "w", "stream_name": "KV_b", "config": {}, "num_pending": pending,
            "created": "2026-12-06T00:00:00Z",
            "delivered": {"consumer_seq": delivered, "stream_seq": delivered},
        })  # fmt: skip

    async def consumer_info(self) -> ConsumerInfo:
        return self.info


class _Watcher:
    """nats-py's KeyWatcher as its iterator hands items over: entries and None markers."""

    def __init__(self, items: Sequence[KeyValue.Entry | None], consumer: _Consumer) -> None:
        self._items = list(items)
        self._sub = consumer

    async def __anext__(self) -> KeyValue.Entry | None:
        if not self._items:
            await asyncio.Event().wait()  # a live watch waits for the next change
        return self._items.pop(0)

    async def stop(self) -> None:
        pass


class _Bucket:
    def __init__(self, watcher: _Watcher) -> None:
        self.watcher = watcher

    async def watch(self, keys: str, **_: Any) -> _Watcher:
        return self.watcher


async def _until_caught_up(watcher: _Watcher) -> list[str]:
    """The nodes a watch delivered before CAUGHT_UP."""
    nodes: list[str] = []
    async with asyncio.timeout(1):
        async for item in DesiredStateWatch(_Bucket(watcher), None):  # type: ignore[arg-type]
            if isinstance(item, CaughtUp):
                return nodes
            assert isinstance(item, DesiredStateEntry)
            nodes.append(item.node)
    raise AssertionError("the watch ended without CAUGHT_UP")


async def test_an_end_marker_ahead_of_entries_the_server_already_sent_is_not_believed() -> None:
    # The server had sent three entries (pending 0) before any was read: nats-py's None first.
    sent = _Consumer(delivered=3, pending=0)
    items = [None, _entry("a", 1, 2), _entry("b", 2, 1), _entry("c", 3, 0)]
    assert await _until_caught_up(_Watcher(items, sent)) == ["a", "b", "c"]


async def test_an_end_marker_of_a_consumer_that_sent_nothing_is_an_empty_snapshot() -> None:
    assert await _until_caught_up(_Watcher([None], _Consumer(delivered=0, pending=0))) == []


async def test_the_snapshot_ends_with_the_entry_that_left_nothing_pending() -> None:
    # The usual order: entries, nats-py's None after the last one, then a live change.
    items = [_entry("a", 1, 1), _entry("b", 2, 0), None, _entry("c", 3, 0)]
    watch = DesiredStateWatch(_Bucket(_Watcher(items, _Consumer(2, 0))), None)  # type: ignore[arg-type]
    seen = []
    async with asyncio.timeout(1):
        for _ in range(4):
            item = await anext(watch)
            seen.append(item if isinstance(item, CaughtUp) else (item.node, item.initial))
    assert seen == [("a", True), ("b", True), CAUGHT_UP, ("c", False)]


async def test_a_snapshot_ending_in_a_deleted_key_still_ends() -> None:
    # nats-py's early None, then a snapshot whose last entry is a delete (left out of it).
    items = [None, _entry("a", 1, 1), _entry("gone", 2, 0, KV_DEL)]
    assert await _until_caught_up(_Watcher(items, _Consumer(2, 0))) == ["a"]
