"""Big fabric work, run in a worker process so the API's event loop keeps serving.

Reading a 16,000-host import, generating a k=40 fat-tree, checking it against the fabric
rules and writing its 200,000 rows is seconds of CPU, much of it single calls into
pydantic-core that hold the GIL throughout: in a worker thread one such call held every other
request for most of a second. The worker process does the whole job, including the store
write through its own engine, and hands back only what is small or flat: the summary, the new
revision and the serialised export document (bytes). Light imports only: the worker starts
quickly.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from thorn import clab, generators
from thorn.fabric import Fabric
from thorn.model import FabricDocument, FabricSummary
from thorn.store import PoolSettings, Store
from thorn_topology.export import SerialisedDocument, serialise

WORKER_NICENESS = 10


@dataclass(frozen=True)
class Source:
    """Where a new fabric comes from: an import body, a containerlab file or a generator."""

    kind: Literal["json", "clab", "generator"]
    body: bytes = b""
    generator: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Base:
    """The revision the new fabric replaces, as the API's snapshot saw it."""

    revision: int
    next_link_id: int


@dataclass(frozen=True)
class Commit:
    """Write the new fabric to the store at `url` (None: a dry run, write nothing), with the
    service's pool and timeouts, and its topology.changed (JSON) in the outbox."""

    url: str
    actor: str
    source: str
    pool: PoolSettings = field(default_factory=PoolSettings)
    event: str | None = None
    client: str | None = None  # the caller's address, for the audit entry


@dataclass(frozen=True)
class Outcome:
    summary: FabricSummary
    warnings: list[str] = field(default_factory=list)
    document: SerialisedDocument | None = None  # set when committed


class Refused(Exception):
    """The request's content is wrong before any fabric rule runs (a 4xx naming `loc`).

    Plain arguments only, so it crosses the process boundary as it was raised.
    """

    def __init__(self, status: int, errors: list[dict[str, Any]]) -> None:
        super().__init__(status, errors)
        self.status = status
        self.errors = errors


def replace_fabric(source: Source, base: Base, commit: Commit | None) -> Outcome:
    """Read, validate and (with `commit`) store a whole new fabric. Runs in the worker.

    Raises Refused (bad body, file or parameters), FabricError (the fabric rules) or
    StaleRevision (another writer moved the store past `base`).
    """
    document, warnings = _document(source)
    fabric = Fabric.from_document(document, base.revision, base.next_link_id)
    if commit is None:
        return Outcome(fabric.summary(), warnings)
    detail = {"source": commit.source, **fabric.summary().model_dump(exclude={"revision"})}
    fabric.revision = asyncio.run(_write(commit, fabric, base, detail))
    return Outcome(fabric.summary(), warnings, serialise(fabric))


def _document(source: Source) -> tuple[FabricDocument, list[str]]:
    if source.kind == "generator":
        try:
            return generators.generate(source.generator, source.params), []
        except ValueError as exc:
            raise Refused(422, [_error(["body"], str(exc), "generator")]) from None
    if source.kind == "clab":
        try:
            parsed = clab.parse_clab(source.body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            msg = f"the containerlab file is not UTF-8 ({exc.reason})"
            raise Refused(400, [_error(["body"], msg, "encoding")]) from None
        except clab.ClabError as exc:
            loc = ["body", exc.loc] if exc.loc else ["body"]
            raise Refused(422, [_error(loc, exc.message, "containerlab")]) from None
        return parsed.document, [str(w) for w in parsed.warnings]
    try:
        return FabricDocument.model_validate_json(source.body), []
    except ValidationError as exc:
        errors = [
            _error(["body", *e["loc"]], e["msg"], e["type"])
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
        malformed = any(e["type"] == "json_invalid" for e in errors)
        raise Refused(400 if malformed else 422, errors) from None


def _error(loc: list[Any], msg: str, kind: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": kind}


async def _write(commit: Commit, fabric: Fabric, base: Base, detail: dict[str, Any]) -> int:
    store = await Store.open(
        commit.url, migrate=False, pool=commit.pool, name="thorn-topology-worker"
    )
    try:
        return await store.replace(fabric, expected_revision=base.revision, actor=commit.actor,
                                   detail=detail, event=commit.event,
                                   client=commit.client)  # fmt: skip
    finally:
        await store.close()


def worker_pool() -> ProcessPoolExecutor:
    """One worker, started by a forkserver (never a fork of this threaded process), at a
    lower CPU priority: on a busy machine the API's own requests go first."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("forkserver"),
        initializer=os.nice,
        initargs=(WORKER_NICENESS,),
    )


__all__ = ["Base", "Commit", "Outcome", "Refused", "Source", "replace_fabric"]
