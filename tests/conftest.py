"""Fixtures shared by every lane: real NATS, real SQLite and PostgreSQL stores, API clients.

PostgreSQL is the server on 127.0.0.1:5432 (override with THORN_TEST_PG_URL). Each test gets
a database of its own. Under CI=true an unreachable server fails the run instead of skipping.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import signal
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url

from thorn.natsd import EmbeddedNats
from thorn.store import Store

PG_URL = os.environ.get(
    "THORN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _pg_conninfo(database: str | None = None) -> str:
    url = make_url(PG_URL)
    if database:
        url = url.set(database=database)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    try:
        with psycopg.connect(_pg_conninfo(), connect_timeout=3):
            return True
    except psycopg.OperationalError as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL at {PG_URL} is unreachable under CI=true: {exc}")
        return False


@pytest.fixture
def postgres_url(postgres_available: bool) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    if not postgres_available:
        pytest.skip(f"PostgreSQL at {PG_URL} is unreachable (set CI=true to fail instead)")
    name = f"thorn_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_pg_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_pg_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using this runs twice: on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'thorn.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest_asyncio.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real nats-server with JetStream for the whole session."""
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("nats")) as server:
        yield server.url


# A test that has not ended after this long is taken as hung: every unfinished asyncio task's
# stack is printed (what it awaits: a hung test's main thread shows only the loop's select),
# then the run is stopped. Two CI runs hung in in-process services' tests, neither repeated.
HUNG_AFTER_S = float(os.environ.get("THORN_TEST_HUNG_AFTER_S", "900"))


def _dump_tasks_and_stop(name: str, capture: Any) -> None:
    out = io.StringIO()
    out.write(f"\n=== {name} still running after {HUNG_AFTER_S:g} s: its asyncio tasks ===\n")
    for task in [o for o in gc.get_objects() if isinstance(o, asyncio.Task)]:
        if not task.done():
            out.write(f"--- {task.get_name()}\n")
            task.print_stack(file=out)
    # Past pytest's capture (its main thread waits in the loop meanwhile), then a real
    # SIGINT: it wakes the loop's wait, which an interrupt flag alone does not.
    with capture.global_and_fixture_disabled():
        sys.stderr.write(out.getvalue())
        sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGINT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    capture = item.config.pluginmanager.getplugin("capturemanager")
    timer = threading.Timer(HUNG_AFTER_S, _dump_tasks_and_stop, args=(item.nodeid, capture))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
