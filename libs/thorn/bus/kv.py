"""The desired-state KV: one key per node, written by pathcomp with compare-and-set
(revision fencing) and watched by each node's agent.

A watch's consumer is created with a name, so its create request names its filter in the
subject (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`): an agent's NATS permissions
allow that subject for its own keys only (`thorn.natsauth.permissions`), and the server
refuses a request whose body filters on anything else. nats-py's ordered consumer, which a
watch is, creates its consumer again after a gap or a lost heartbeat; it is given a new
name each time (the old one may still exist until its inactivity threshold passes).
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext, api
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import BaseModel

from thorn.bus.errors import _ERR_WRONG_LAST_SEQUENCE, DesiredStateConflict

log = structlog.get_logger("thorn.bus")

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class DesiredStateEntry:
    """One node's desired state at `revision` (the KV stream sequence).

    `value` is None for a delete/purge. `initial` is True for entries a watch delivered as part
    of its starting snapshot, False for live updates and plain `get`s.
    """

    node: str
    value: bytes | None
    revision: int
    operation: Literal["put", "delete", "purge"] = "put"
    initial: bool = False

    @property
    def deleted(self) -> bool:
        return self.operation != "put"

    def decode(self, model: type[M]) -> M:
        """The value parsed as a pydantic model (JSON)."""
        if self.value is None:
            raise ValueError(f"desired state of {self.node!r} was deleted at {self.revision}")
        return model.model_validate_json(self.value)


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Watch marker: every entry of the starting snapshot has been delivered before this."""


CAUGHT_UP = CaughtUp()


def _as_bytes(value: bytes | BaseModel) -> bytes:
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    return bytes(value)


def _operation(op: str | None) -> Literal["put", "delete", "purge"]:
    if op == KV_DEL:
        return "delete"
    if op == KV_PURGE:
        return "purge"
    return "put"


def consumer_name() -> str:
    """A fresh name for a watch's consumer (letters and digits: valid in a subject token)."""
    return f"w{secrets.token_hex(8)}"


class _NamedConsumers:
    """A JetStream context whose push subscriptions create named consumers, and name them
    anew when nats-py's ordered consumer creates them again (stands in for the context in
    nats-py's KeyValue, which offers no way to pass a consumer config to a watch)."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def subscribe(self, subject: str, **options: Any) -> Any:
        config = options.pop("config", None) or api.ConsumerConfig()
        config.name = consumer_name()
        sub: Any = await self._js.subscribe(subject, config=config, **options)
        jsi = sub._sub._jsi  # nats-py's ordered-consumer state (pinned version: pyproject)
        recreate = jsi.recreate_consumer

        async def recreate_renamed() -> None:
            jsi._ccreq.name = consumer_name()
            await recreate()

        jsi.recreate_consumer = recreate_renamed
        return sub


class DesiredStateStore:
    """Per-node desired datapath state: one key per node, its newest value kept."""

    def __init__(self, kv: KeyValue, bucket: str) -> None:
        self._kv = kv
        self.bucket = bucket
        # The same bucket, for watches: their consumers are named (see the module's doc).
        self._watch_kv = KeyValue(
            name=kv._name, stream=kv._stream, pre=kv._pre,
            js=_NamedConsumers(kv._js), direct=kv._direct,  # type: ignore[arg-type]
        )  # fmt: skip

    @property
    def kv(self) -> KeyValue:
        return self._kv

    async def put(self, node: str, value: bytes | BaseModel) -> int:
        """Store the node's desired state unconditionally; returns the new revision."""
        revision: int = await self._kv.put(node, _as_bytes(value))
        return revision

    async def get(self, node: str) -> DesiredStateEntry | None:
        """The node's current desired state, or None if it has none (never set or deleted)."""
        try:
            entry = await self._kv.get(node)
        except nats.js.errors.KeyNotFoundError:
            return None
        assert entry.revision is not None
        return DesiredStateEntry(node=node, value=entry.value, revision=entry.revision)

    async def update(self, node: str, value: bytes | BaseModel, *, last: int) -> int:
        """Compare-and-set: write only if the node's current revision is `last`.

        `last=0` means "only if the node has no desired state yet". Returns the new revision;
        raises `DesiredStateConflict` when someone else wrote in between.
        """
        try:
            if last == 0:
                revision: int = await self._kv.create(node, _as_bytes(value))
            else:
                revision = await self._kv.update(node, _as_bytes(value), last=last)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise DesiredStateConflict(node, last, exc.description or "") from exc
        return revision

    async def create(self, node: str, value: bytes | BaseModel) -> int:
        """Write only if the node has no desired state yet (`DesiredStateConflict` otherwise)."""
        return await self.update(node, value, last=0)

    async def delete(self, node: str, *, last: int | None = None) -> None:
        """Remove the node's desired state (optionally only if still at revision `last`)."""
        try:
            await self._kv.delete(node, last=last)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _ERR_WRONG_LAST_SEQUENCE:
                raise DesiredStateConflict(node, last or 0, exc.description or "") from exc
            raise

    async def nodes(self) -> list[str]:
        """Nodes that currently have a desired state (read from the keys' headers only)."""
        found: list[str] = []
        async with DesiredStateWatch(self._kv, None, meta_only=True) as watch:
            async for item in watch:
                if isinstance(item, CaughtUp):
                    break
                found.append(item.node)
        return sorted(found)

    def watch(self, node: str | None = None) -> DesiredStateWatch:
        """Watch one node's key (or all): current values, then `CAUGHT_UP`, then live updates.

        ::

            async with store.watch("leaf1") as watch:
                async for item in watch:
                    if isinstance(item, CaughtUp): ...   # snapshot complete (maybe empty)
                    else: apply(item)                     # a DesiredStateEntry
        """
        return DesiredStateWatch(self._watch_kv, node)


class DesiredStateWatch:
    """Async iterator of `DesiredStateEntry | CaughtUp`; also an async context manager.

    The snapshot holds each matching key's latest value (keys whose latest operation is a
    delete are left out); `CAUGHT_UP` follows it exactly once, even when it is empty; then
    every change arrives live, deletes included. The watch starts on first use.

    The snapshot's end is the entry the server sent with nothing left pending. nats-py's own
    end marker can come too early (nats.py#842): right after creating the consumer it asks
    how much is pending, and when the server has already sent every entry but none has been
    read yet, it reports an empty snapshot ahead of them. A marker before any entry is
    therefore believed only when the consumer says it has delivered nothing.
    """

    def __init__(self, kv: KeyValue, node: str | None, *, meta_only: bool = False) -> None:
        self._kv = kv
        self._keys = node if node is not None else ">"
        self._meta_only = meta_only
        self._watcher: KeyValue.KeyWatcher | None = None
        self._seen = 0  # entries read so far, deletes included
        self._snapshot_ended = False  # the last entry read was the snapshot's last
        self._caught_up = False
        self._stopped = False

    async def start(self) -> Self:
        if self._watcher is None:
            self._watcher = await self._kv.watch(self._keys, meta_only=self._meta_only)
        return self

    async def stop(self) -> None:
        self._stopped = True
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            with contextlib.suppress(nats.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]  # untyped upstream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> DesiredStateEntry | CaughtUp:
        if self._stopped:
            raise StopAsyncIteration
        await self.start()
        assert self._watcher is not None
        while True:
            if self._snapshot_ended and not self._caught_up:
                self._caught_up = True
                return CAUGHT_UP
            entry = await self._watcher.__anext__()  # type: ignore[no-untyped-call]
            if entry is None:
                if self._caught_up or self._seen or not await self._nothing_delivered():
                    continue  # the snapshot ends with its last entry (see the class's doc)
                self._caught_up = True
                return CAUGHT_UP
            self._seen += 1
            self._snapshot_ended = entry.delta == 0
            operation = _operation(entry.operation)
            if not self._caught_up and operation != "put":
                continue  # a deleted key is not part of the current state
            assert entry.revision is not None
            return DesiredStateEntry(
                node=entry.key,
                value=entry.value if operation == "put" else None,
                revision=entry.revision,
                operation=operation,
                initial=not self._caught_up,
            )

    async def _nothing_delivered(self) -> bool:
        """True when the watch's consumer has sent nothing and has nothing pending."""
        assert self._watcher is not None and self._watcher._sub is not None
        info = await self._watcher._sub.consumer_info()
        return not info.num_pending and (info.delivered is None or not info.delivered.consumer_seq)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
