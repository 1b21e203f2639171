"""Topology benchmark: bulk-import a k=16 fat-tree, then GET the whole topology under load.

Runs the real `thorn-topology` process against SQLite and against PostgreSQL, with an
embedded nats-server. Imports are timed from Python; the concurrent GETs are driven by `wrk`
(a C client, so the load generator does not compete with the service for the 2 cores).
Writes a results section into docs/benchmarks.md.

    python tests/bench/bench_topology.py --write docs/benchmarks.md   # what `make bench` runs
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sections import write_section
from sqlalchemy.engine import make_url

from thorn.generators import fat_tree
from thorn.natsd import EmbeddedNats, free_port

console = Console(stderr=True)
TOKEN = "thn_" + "bench-admin".ljust(43, "0")  # the shape THORN accepts
K = 16
CLIENTS = 16
GET_SECONDS = 10
ENCODINGS = ("identity", "gzip")
IMPORTS = 3
IMPORT_TARGET_S = 5.0
P99_TARGET_MS = 200.0
PG_URL = os.environ.get(
    "THORN_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
START_TIMEOUT = 60.0
MARK_BEGIN = "<!-- bench:topology:begin -->"
MARK_END = "<!-- bench:topology:end -->"


@dataclass
class Result:
    database: str
    import_s: list[float]
    cold_get_ms: float
    gets: dict[str, dict[str, float]]  # by Accept-Encoding: p50/p90/p99 in ms, rps

    @property
    def met(self) -> bool:
        worst = max(g["p99"] for g in self.gets.values())
        return max(self.import_s) < IMPORT_TARGET_S and worst < P99_TARGET_MS


def start_service(
    database_url: str, nats_url: str, data_dir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "THORN_DATABASE_URL": database_url,
        "THORN_NATS_URL": nats_url,
        "THORN_ADMIN_TOKEN": TOKEN,
        "THORN_LISTEN": f"127.0.0.1:{port}",
        "THORN_DATA_DIR": str(data_dir),
        "THORN_LOG_LEVEL": "warning",
    }
    script = Path(sys.executable).parent / "thorn-topology"
    process = subprocess.Popen(
        [str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"thorn-topology did not start for {database_url}")


def measure(url: str, body: bytes, database: str, progress: Progress) -> Result:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    task = progress.add_task(f"{database}: import x{IMPORTS}", total=IMPORTS)
    imports: list[float] = []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        for _ in range(IMPORTS):
            start = time.perf_counter()
            response = client.post(
                "/api/v1/fabric/import", content=body, headers={"content-type": "application/json"}
            )
            imports.append(time.perf_counter() - start)
            response.raise_for_status()
            progress.advance(task)
        start = time.perf_counter()
        client.get("/api/v1/fabric").raise_for_status()
        cold_ms = (time.perf_counter() - start) * 1000
    gets = {encoding: wrk(url, encoding, database, progress) for encoding in ENCODINGS}
    return Result(database, imports, cold_ms, gets)


def wrk(url: str, encoding: str, database: str, progress: Progress) -> dict[str, float]:
    """GET /api/v1/fabric from CLIENTS connections for GET_SECONDS; return latency quantiles."""
    task = progress.add_task(f"{database}: GET, {CLIENTS} clients, {encoding}", total=None)
    command = [
        "wrk", "-t2", f"-c{CLIENTS}", f"-d{GET_SECONDS}s", "--latency",
        "-H", f"Authorization: Bearer {TOKEN}", "-H", f"Accept-Encoding: {encoding}",
        f"{url}/api/v1/fabric",
    ]  # fmt: skip
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=GET_SECONDS + 30
    ).stdout
    progress.remove_task(task)
    found = {q: _ms(v) for q, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)$", out, re.M)}
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if len(found) != 3 or rate is None or "Non-2xx" in out:
        raise SystemExit(f"wrk failed or saw errors:\n{out}")
    return {"p50": found["50"], "p90": found["90"], "p99": found["99"], "rps": float(rate[1])}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise SystemExit(f"unexpected wrk duration {text!r}")
    return float(match[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[match[2]]


def _pg_admin_url() -> str:
    return make_url(PG_URL).set(drivername="postgresql").render_as_string(hide_password=False)


def run() -> tuple[list[Result], dict[str, float]]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `apt-get install -y wrk` (make bench does this)")
    start = time.perf_counter()
    body = fat_tree(K).model_dump_json().encode()
    generation = {"generate_s": time.perf_counter() - start, "document_mb": len(body) / 1e6}
    pg_name = f"thorn_bench_{uuid.uuid4().hex[:8]}"
    pg_url = make_url(PG_URL).set(database=pg_name).render_as_string(hide_password=False)
    results = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedNats() as nats,
        Progress(console=console) as progress,
        psycopg.connect(_pg_admin_url(), autocommit=True) as admin,
    ):
        admin.execute(f'CREATE DATABASE "{pg_name}"')
        try:
            for database, url in (("SQLite", f"sqlite:///{tmp}/bench.db"), ("PostgreSQL", pg_url)):
                process, api = start_service(url, nats.url, Path(tmp))
                try:
                    results.append(measure(api, body, database, progress))
                finally:
                    process.terminate()
                    process.wait(10)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
    return results, generation


def markdown(results: list[Result], generation: dict[str, float], command: str) -> str:
    lines = [
        MARK_BEGIN,
        "## Topology store: k=16 fat-tree import and full GET",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}).",
        "",
        f"- Fabric: k={K} fat-tree: 1,024 hosts, 320 switches, 6,144 ports, 3,072 links, "
        f"2,048 TEPs, 1,024 workloads. Document {generation['document_mb']:.1f} MB, generated "
        f"in {generation['generate_s'] * 1000:.0f} ms.",
        f"- Import: POST /api/v1/fabric/import of the whole document to the real "
        f"`thorn-topology` process, {IMPORTS} times; each is a full validated replace in one "
        "transaction, then a `topology.changed` event.",
        f"- GET: `wrk -t2 -c{CLIENTS} -d{GET_SECONDS}s` on GET /api/v1/fabric (the whole "
        "topology), with and without gzip; the load generator runs on the same 2 cores.",
        "",
        "| store | import median (s) | import max (s) | cold GET (ms) | encoding "
        "| GET p50 (ms) | GET p90 (ms) | GET p99 (ms) | req/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        for encoding, g in r.gets.items():
            lines.append(
                f"| {r.database} | {statistics.median(r.import_s):.2f} | {max(r.import_s):.2f} "
                f"| {r.cold_get_ms:.0f} | {encoding} | {g['p50']:.1f} | {g['p90']:.1f} "
                f"| {g['p99']:.1f} | {g['rps']:.0f} |"
            )
    verdict = ", ".join(f"{r.database}: {'met' if r.met else 'MISSED'}" for r in results)
    lines += [
        "",
        f"Targets (import < {IMPORT_TARGET_S:.0f} s, GET p99 < {P99_TARGET_MS:.0f} ms with "
        f"{CLIENTS} concurrent clients): {verdict}.",
        "",
        "The full GET is served from the service's in-memory snapshot, serialised and gzipped "
        "once per revision (the cold GET pays that). Every request still checks its token and "
        "the store's revision, so a write by another replica shows on the next request; "
        '`ETag: "rev-N"` lets a poller skip unchanged documents.',
        MARK_END,
    ]
    return "\n".join(lines) + "\n"


def write(path: Path, section: str) -> None:
    write_section(path, section, MARK_BEGIN, MARK_END)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="update this markdown file")
    args = parser.parse_args()
    results, generation = run()
    table = Table(title=f"k={K} fat-tree: import and full GET ({CLIENTS} clients)")
    for column in ("store", "import median s", "cold GET ms", "encoding", "p50 ms", "p99 ms"):
        table.add_column(column)
    for r in results:
        for encoding, g in r.gets.items():
            table.add_row(
                r.database, f"{statistics.median(r.import_s):.2f}", f"{r.cold_get_ms:.0f}",
                encoding, f"{g['p50']:.1f}", f"{g['p99']:.1f}",
            )  # fmt: skip
    console.print(table)
    console.print(
        "targets: " + ", ".join(f"{r.database} {'met' if r.met else 'MISSED'}" for r in results)
    )
    if args.write:
        write(args.write, markdown(results, generation, "make bench"))
        console.print(f"results written to {args.write}")


if __name__ == "__main__":
    main()
