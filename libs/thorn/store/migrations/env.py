"""Alembic environment: migrations run on a connection handed in by `thorn.store`."""

from alembic import context

from thorn.store.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only the store drives migrations
    raise RuntimeError("run migrations through thorn.store.Store.migrate()")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
