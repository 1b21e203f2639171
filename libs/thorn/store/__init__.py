"""The SQL topology store (SQLAlchemy 2.0, Alembic migrations)."""

from thorn.store.store import StaleRevision, Store, database_url, sqlite_url

__all__ = ["StaleRevision", "Store", "database_url", "sqlite_url"]
