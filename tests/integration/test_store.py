"""The topology store, run once on SQLite and once on PostgreSQL (the `store` fixture)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from thorn.fabric import Fabric, FabricError
from thorn.generators import leaf_spine
from thorn.model import AdminState, LinkUpdate, NodeSpec, PortSpec, Role, TokenRole
from thorn.store import StaleRevision, Store
from thorn.store.tokens import TokenRecord


def small_fabric(revision: int = 0) -> Fabric:
    return Fabric.from_document(leaf_spine(spines=2, leaves=2, hosts_per_leaf=2), revision=revision)


async def imported(store: Store) -> Fabric:
    await store.replace(
        small_fabric(), expected_revision=await store.revision(), actor="test", detail={}
    )
    return await store.load()


async def test_a_new_store_is_empty_at_revision_zero(store: Store) -> None:
    assert await store.revision() == 0
    assert (await store.load()).summary().nodes == 0


async def test_a_replaced_fabric_loads_back_identical(store: Store) -> None:
    fabric = small_fabric()
    revision = await store.replace(fabric, expected_revision=0, actor="test", detail={})
    loaded = await store.load()
    assert revision == loaded.revision == 1
    assert loaded.to_document().model_dump(exclude={"revision"}) == fabric.to_document().model_dump(
        exclude={"revision"}
    )


async def test_every_write_bumps_the_revision_by_one(store: Store) -> None:
    fabric = await imported(store)
    link_id = next(iter(fabric.links))
    changes = fabric.update_link(link_id, LinkUpdate(admin_state=AdminState.drained))
    revision = await store.commit(
        changes,
        expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id,
        actor="ops",
        action="link.update",
        target=str(link_id),
        detail={},
    )
    assert revision == fabric.revision + 1
    assert (await store.load()).links[link_id].admin_state is AdminState.drained


async def test_a_write_validated_against_a_stale_revision_is_refused(store: Store) -> None:
    fabric = await imported(store)
    stale = fabric.revision
    changes = fabric.add_node(NodeSpec(name="extra1", role=Role.switch))
    await store.commit(
        changes,
        expected_revision=stale,
        next_link_id=fabric.next_link_id,
        actor="a",
        action="node.create",
        target="extra1",
        detail={},
    )
    again = fabric.add_node(NodeSpec(name="extra2", role=Role.switch))
    with pytest.raises(StaleRevision):
        await store.commit(
            again,
            expected_revision=stale,
            next_link_id=fabric.next_link_id,
            actor="b",
            action="node.create",
            target="extra2",
            detail={},
        )
    loaded = await store.load()
    assert "extra1" in loaded.nodes and "extra2" not in loaded.nodes


async def test_concurrent_writers_on_the_same_revision_commit_exactly_once(store: Store) -> None:
    fabric = await imported(store)

    async def attempt(name: str) -> bool:
        changes = Fabric.add_node(await store.load(), NodeSpec(name=name, role=Role.switch))
        try:
            await store.commit(
                changes,
                expected_revision=fabric.revision,
                next_link_id=99,
                actor=name,
                action="node.create",
                target=name,
                detail={},
            )
        except StaleRevision:
            return False
        return True

    results = await asyncio.gather(*(attempt(f"racer{i}") for i in range(4)))
    assert sum(results) == 1
    assert await store.revision() == fabric.revision + 1


async def test_a_failed_transaction_leaves_no_partial_rows(store: Store) -> None:
    fabric = await imported(store)
    before = (await store.load()).to_document()
    good = fabric.add_node(
        NodeSpec(name="newnode", role=Role.switch, ports=[PortSpec(name="swp1")])
    )
    # A row the database itself refuses (the port's node does not exist) after good rows.
    from thorn.fabric import Change
    from thorn.model import Port

    bad = [*good, Change("port", "create", "ghost:swp1", Port(node="ghost", name="swp1"))]
    with pytest.raises(FabricError):
        await store.commit(
            bad,
            expected_revision=fabric.revision,
            next_link_id=fabric.next_link_id,
            actor="t",
            action="node.create",
            target="newnode",
            detail={},
        )
    after = await store.load()
    assert after.to_document() == before
    assert (await store.audit())[0] == 1  # only the import was audited


async def test_link_ids_are_never_reused(store: Store) -> None:
    fabric = await imported(store)
    highest = max(fabric.links)
    changes = fabric.delete_link(highest)
    await store.commit(
        changes,
        expected_revision=fabric.revision,
        next_link_id=fabric.next_link_id,
        actor="t",
        action="link.delete",
        target=str(highest),
        detail={},
    )
    reloaded = await store.load()
    assert reloaded.next_link_id == highest + 1


async def test_the_audit_log_records_actor_action_and_revision(store: Store) -> None:
    await imported(store)
    total, entries = await store.audit()
    assert total == 1
    assert entries[0].actor == "test"
    assert entries[0].action == "fabric.import"
    assert entries[0].revision == 1
    total, _ = await store.audit(action="node.")
    assert total == 0


async def test_tokens_are_stored_hashed_and_found_by_hash(store: Store) -> None:
    await store.add_token("alice", TokenRole.operator, "ab" * 32, "admin")
    assert await store.token_by_hash("ab" * 32) == TokenRecord("alice", TokenRole.operator)
    assert await store.token_by_hash("cd" * 32) is None
    with pytest.raises(FabricError):
        await store.add_token("alice", TokenRole.viewer, "ef" * 32, "admin")
    assert await store.delete_token("alice", "admin")
    assert await store.token_by_hash("ab" * 32) is None
    assert [e.action for e in (await store.audit())[1]] == ["token.delete", "token.create"]


async def test_migrations_match_the_declared_schema(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from thorn.store.schema import Base

    def diff(sync_conn: object) -> list[object]:
        context = MigrationContext.configure(sync_conn)  # type: ignore[arg-type]
        return list(compare_metadata(context, Base.metadata))

    async with store.engine.connect() as conn:
        assert await conn.run_sync(diff) == []
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    assert version == "0008"


async def test_opening_twice_is_idempotent(store: Store, database_url: str) -> None:
    await imported(store)
    again = await Store.open(database_url)
    try:
        assert await again.revision() == 1
    finally:
        await again.close()


async def test_a_write_that_reads_first_waits_for_another_writer_instead_of_failing(
    store: Store,
) -> None:
    """SQLite refuses to upgrade a read transaction to a write while another writer holds
    the lock ("database is locked" at once, no busy wait): store writes take the write
    lock at BEGIN, so the token write below waits for the other writer and succeeds."""

    async def other_writer() -> None:
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE meta SET value = value WHERE key = 'revision'"))
            await asyncio.sleep(0.5)

    async def reads_then_writes() -> bool:
        await asyncio.sleep(0.1)
        return await store.put_token("waiter", TokenRole.admin, "a" * 64, "test")

    _, changed = await asyncio.gather(other_writer(), reads_then_writes())
    assert changed is True
