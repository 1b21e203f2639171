"""A THORN_DATABASE_URL a service cannot use: the real entry point, started as production
starts it, exits at once with one log line (`database_unusable`, the way to count these)
naming the variable, with the password masked, and a non-zero status: 78 (EX_CONFIG) when
the setting is wrong, 69 (EX_UNAVAILABLE) when the database may come later. Whatever the
URL points at is left as it was, and no SQLite file appears in its stead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from service_process import run_once
from sqlalchemy.engine import make_url

from thorn.model import TokenRole
from thorn.natsd import free_port
from thorn.store import Store

pytestmark = pytest.mark.postgres

SECRET = "s3cret-pw"


def conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_password(url: str) -> str:
    return make_url(url).set(password=SECRET).render_as_string(hide_password=False)


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of the database's public schema and its rows."""
    with psycopg.connect(conninfo(url)) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )]  # fmt: skip
        return {t: sorted(map(tuple, conn.execute(f'SELECT * FROM "{t}"')), key=repr)
                for t in tables}  # fmt: skip


WATCHDOG_EVENTS = ("gc_pause", "event_loop_stalled", "event_loop_resumed")


def refused(service: str, url: str, data_dir: Path) -> tuple[int, dict[str, Any], str]:
    """Start `service` on `url`; (exit status, its one log line, everything it printed)."""
    env = {"THORN_DATABASE_URL": url, "THORN_DATA_DIR": str(data_dir),
           "THORN_NATS_URL": f"nats://127.0.0.1:{free_port()}",
           "THORN_LISTEN": f"127.0.0.1:{free_port()}", "THORN_LOG_FORMAT": "json"}  # fmt: skip
    done = run_once(service, env)
    printed = done.stdout + done.stderr
    # The watchdog's lines (a long collection, a stalled loop) speak of the machine's load.
    lines = [line for line in printed.splitlines()
             if line.strip() and json.loads(line).get("event") not in WATCHDOG_EVENTS]  # fmt: skip
    assert len(lines) == 1, printed
    return done.returncode, json.loads(lines[0]), printed


def assert_refusal(
    status: int, line: dict[str, Any], printed: str, problem: str, exit_code: int
) -> None:
    assert (status, line["event"], line["level"]) == (exit_code, "database_unusable", "error")
    assert line["variable"] == "THORN_DATABASE_URL" and line["problem"] == problem
    assert line["error"].startswith("THORN_DATABASE_URL=")
    assert SECRET not in printed and "Traceback" not in printed


# Each case: (a URL in the test's PostgreSQL database `url`, prepared on it, or ignoring it;
# the problem named; the exit status).
def unparseable(_: str) -> str:
    return f"postgresql://thorn:{SECRET}@db:port/thorn"


def unknown_driver(_: str) -> str:
    return f"mysql://thorn:{SECRET}@127.0.0.1/thorn"


def unreachable(_: str) -> str:
    return f"postgresql://thorn:{SECRET}@127.0.0.1:{free_port()}/thorn"


def wrong_database(url: str) -> str:
    return with_password(make_url(url).set(database=f"thorn_missing_{uuid.uuid4().hex[:8]}")
                         .render_as_string(hide_password=False))  # fmt: skip


def someone_elses(url: str) -> str:
    with psycopg.connect(conninfo(url)) as conn:
        conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, total numeric)")
        conn.execute("INSERT INTO invoices VALUES (1, 99.5)")
    return with_password(url)


def newer_thorn(url: str) -> str:
    with psycopg.connect(conninfo(url)) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0099')")
        conn.execute("CREATE TABLE meta (key varchar(32) PRIMARY KEY, value int NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('revision', 41)")
    return with_password(url)


CASES: dict[str, tuple[Callable[[str], str], str, int]] = {
    "unparseable": (unparseable, "unparseable", os.EX_CONFIG),
    "unknown driver": (unknown_driver, "unsupported_driver", os.EX_CONFIG),
    "unreachable host": (unreachable, "unreachable", os.EX_UNAVAILABLE),
    "wrong database": (wrong_database, "no_such_database", os.EX_CONFIG),
    "someone else's database": (someone_elses, "not_thorn", os.EX_CONFIG),
    "a newer THORN's database": (newer_thorn, "unknown_schema", os.EX_CONFIG),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unusable_database_url_stops_topology_with_one_line_naming_the_variable(
    case: str, postgres_url: str, tmp_path: Path
) -> None:
    make, problem, exit_code = CASES[case]
    bad = make(postgres_url)
    before = snapshot(postgres_url)
    status, line, printed = refused("thorn-topology", bad, tmp_path)
    assert_refusal(status, line, printed, problem, exit_code)
    assert snapshot(postgres_url) == before  # the database it reached is as it was
    assert not (tmp_path / "thorn.db").exists()  # and no SQLite file took its place


def test_a_set_but_empty_database_url_is_refused_not_taken_for_sqlite(tmp_path: Path) -> None:
    status, line, printed = refused("thorn-topology", "", tmp_path)
    assert_refusal(status, line, printed, "unparseable", os.EX_CONFIG)
    assert "set but empty" in line["error"]
    assert not (tmp_path / "thorn.db").exists()


@pytest.mark.parametrize("service", ["thorn-health", "thorn-pathcomp"])
def test_health_and_pathcomp_refuse_an_unusable_database_url_the_same_way(
    service: str, tmp_path: Path
) -> None:
    status, line, printed = refused(service, unreachable(""), tmp_path)
    assert_refusal(status, line, printed, "unreachable", os.EX_UNAVAILABLE)


async def test_a_thorn_store_is_untouched_by_a_start_pointed_at_the_wrong_database(
    postgres_url: str, tmp_path: Path
) -> None:
    """The operator's real store, beside a typo of its name: the failed start leaves it."""
    store = await Store.open(postgres_url)
    await store.put_token("ops", TokenRole.admin, "a" * 64, "test")
    await store.close()
    before = snapshot(postgres_url)
    status, line, printed = refused("thorn-topology", wrong_database(postgres_url), tmp_path)
    assert_refusal(status, line, printed, "no_such_database", os.EX_CONFIG)
    assert snapshot(postgres_url) == before


@pytest.mark.parametrize("program", ["thorn-run", "thorn-topology", "thorn-programmer"])
def test_a_program_takes_no_arguments_and_says_where_its_settings_are(program: str) -> None:
    binary = Path(sys.executable).with_name(program)
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {program}")
    assert "THORN_DATABASE_URL" in helped.stdout and "THORN_NATS_URL" in helped.stdout
    wrong = subprocess.run([binary, "--port", "9"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.strip() == (
        f"{program}: takes no arguments (got '--port 9'); settings are THORN_* environment "
        f"variables: {program} --help lists them"
    )
