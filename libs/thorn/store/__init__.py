"""The SQL topology store (SQLAlchemy 2.0, Alembic migrations)."""

from thorn.store.database import (
    DatabaseUnusable,
    PoolSettings,
    StoreUnavailable,
    database_url,
    unavailable,
)
from thorn.store.store import StaleRevision, Store, sqlite_url

__all__ = [
    "DatabaseUnusable",
    "PoolSettings",
    "StaleRevision",
    "Store",
    "StoreUnavailable",
    "database_url",
    "sqlite_url",
    "unavailable",
]
