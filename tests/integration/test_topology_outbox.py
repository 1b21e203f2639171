"""topology.changed through the store's outbox (SQLite and PostgreSQL, a real nats-server):
each write's event is committed with the write, and a replica sends the events another one
left behind (it died between its commit and JetStream's acknowledgement), each once."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import nats.js.errors
import pytest
from waiting import eventually

from thorn.auth import Principal
from thorn.bus import Bus
from thorn.events import STREAM_TOPOLOGY, Change, TopologyChanged, utcnow
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import NodeSpec, Role, TokenRole
from thorn.store import StaleRevision, Store
from thorn_topology.announcer import Announcer
from thorn_topology.service import TopologyService

pytestmark = pytest.mark.nats

WAIT_S = 10.0


def later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=60)


def event(revision: int, actor: str) -> str:
    return TopologyChanged(revision=revision, at=utcnow(), actor=actor,
                           changes=[Change(kind="node", op="create", key=f"n{revision}")],
                           ).model_dump_json()  # fmt: skip


async def add_node(store: Store, name: str, outbox: str | None, expected: int | None = None) -> int:
    """One node written as topology writes it, with `outbox` as its event."""
    fabric = await store.load()
    changes = fabric.add_node(NodeSpec(name=name, role=Role.switch))
    revision = fabric.revision if expected is None else expected
    return await store.commit(
        changes, expected_revision=revision, next_link_id=fabric.next_link_id, actor="test",
        action="node.create", target=name, detail={}, event=outbox,
    )  # fmt: skip


async def test_a_write_s_event_stays_in_the_outbox_until_it_is_announced(store: Store) -> None:
    one, two = event(1, "test"), event(2, "test")
    assert (await add_node(store, "leaf1", one), await add_node(store, "leaf2", two)) == (1, 2)
    assert await store.unannounced(before=later()) == [(1, one), (2, two)]
    assert await store.unannounced(before=datetime.now(UTC) - timedelta(seconds=60)) == []
    await store.announced([1])
    assert await store.unannounced(before=later()) == [(2, two)]


async def test_a_write_that_loses_the_compare_and_set_leaves_no_event(store: Store) -> None:
    await add_node(store, "leaf1", event(1, "test"))
    with pytest.raises(StaleRevision):
        await add_node(store, "leaf2", event(1, "late"), expected=0)
    assert [r for r, _ in await store.unannounced(before=later())] == [1]


async def test_an_import_s_event_is_in_the_outbox_with_it(store: Store) -> None:
    imported = event(1, "import")
    fabric = Fabric.from_document(leaf_spine(2, 2, 1))
    assert await store.replace(fabric, expected_revision=0, actor="test", detail={},
                               event=imported) == 1  # fmt: skip
    assert await store.unannounced(before=later()) == [(1, imported)]


async def last_seq(bus: Bus) -> int:
    await bus.ensure_streams()
    return (await bus.js.stream_info(STREAM_TOPOLOGY.name)).state.last_seq


async def stream_events(bus: Bus, after_seq: int, actor: str) -> list[int]:
    """The revisions of `actor`'s topology.changed events stored after `after_seq`."""
    last = (await bus.js.stream_info(STREAM_TOPOLOGY.name)).state.last_seq
    revisions = []
    for seq in range(after_seq + 1, last + 1):
        try:
            msg = await bus.js.get_msg(STREAM_TOPOLOGY.name, seq)
        except nats.js.errors.NotFoundError:
            continue
        found = TopologyChanged.model_validate_json(msg.data or b"")
        if found.actor == actor:
            revisions.append(found.revision)
    return revisions


async def test_events_a_dead_replica_left_behind_are_sent_once_by_the_replicas_sweeping(
    store: Store, nats_url: str
) -> None:
    actor = f"dead-{uuid.uuid4().hex[:8]}"
    async with await Bus.connect(nats_url, name="test-outbox") as bus:
        start = await last_seq(bus)
        # Committed, never sent: the replica died after its COMMIT.
        for revision in (1, 2, 3):
            await add_node(store, f"leaf{revision}", event(revision, actor))
        store_id = await store.store_id()
        # Two replicas sweep at the same moment: both send, JetStream keeps one of each.
        sweepers = [Announcer(store, bus, store_id, grace_s=0.0) for _ in range(2)]
        swept = await asyncio.gather(*(s.sweep() for s in sweepers))
        assert sorted(swept) in ([0, 3], [3, 3])
        assert await sweepers[0].sweep() == 0  # taken out of the outbox
        assert await store.unannounced(before=later()) == []
        sent = await stream_events(bus, start, actor)
        assert Counter(sent) == {1: 1, 2: 1, 3: 1}


async def test_an_event_younger_than_the_grace_is_left_to_its_writer(
    store: Store, nats_url: str
) -> None:
    async with await Bus.connect(nats_url, name="test-outbox") as bus:
        await add_node(store, "leaf1", event(1, "writer"))
        waiting = Announcer(store, bus, await store.store_id(), grace_s=60.0)
        assert await waiting.sweep() == 0
        assert len(await store.unannounced(before=later())) == 1


async def test_a_write_through_the_service_is_sent_and_taken_out_of_the_outbox(
    store: Store, nats_url: str
) -> None:
    actor = f"writer-{uuid.uuid4().hex[:8]}"
    async with await Bus.connect(nats_url, name="test-outbox") as bus:
        start = await last_seq(bus)
        service = TopologyService(store, bus, await store.store_id())
        service.start()
        try:
            principal = Principal(actor, TokenRole.admin)
            for name in ("leaf1", "leaf2"):
                spec = NodeSpec(name=name, role=Role.switch)
                await service.write(principal, "node.create", name,
                                    lambda f, s=spec: f.add_node(s))  # type: ignore[misc]  # fmt: skip

            async def sent_and_cleared() -> bool:
                sent = await stream_events(bus, start, actor)
                return sent == [1, 2] and not await store.unannounced(before=later())

            await eventually(sent_and_cleared, "both events sent and out of the outbox", WAIT_S)
        finally:
            await service.stop()


async def test_a_started_replica_loads_its_snapshot_before_any_request(store: Store) -> None:
    """A k=32 fabric takes seconds to load: the first write after a start must not pay it."""
    await add_node(store, "leaf1", event(1, "writer"))
    service = TopologyService(store, None, await store.store_id())
    assert service.serving_revision is None
    service.start()
    try:

        async def loaded() -> bool:
            return service.serving_revision == await store.revision()

        await eventually(loaded, "the snapshot loaded with no request", WAIT_S)
    finally:
        await service.stop()
