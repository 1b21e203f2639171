"""Health benchmark: an agent's report to the `health.link.<id>` event, over a real NATS.

Runs the real `thorn-health` process (SQLite store holding a leaf-spine fabric, an embedded
nats-server with JetStream). This process plays the agents and the consumer: each report
is a NATS request on `agent.report.<node>` that takes one link down or up, sent one at a
time; a subscriber on `health.link.*` timestamps the event it causes. Per report:

- report -> event: the request leaves this process -> the event arrives back in it (two NATS
  hops, health's decision and the JetStream acknowledgement of the event included);
- report -> reply: the request -> health's reply (which goes after the event was stored);
- in health: received -> event acknowledged, from health's own histogram
  (`thorn_health_report_publish_seconds`, scraped from /metrics before and after).

Dampening is set out of the way (a half-life of 1 ms) so that every report is a transition.

    python tests/bench/bench_health.py --write docs/benchmarks.md
    python tests/bench/bench_health.py --reports 200          # quick
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats.errors
from rich.console import Console
from rich.progress import Progress
from sections import print_results, write_section

from thorn.bus import Bus
from thorn.events import (
    HEALTH_LINK_ALL,
    AgentReport,
    AgentReportReply,
    CarrierReport,
    Event,
    LinkHealthChanged,
    agent_report_subject,
    utcnow,
)
from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.natsd import EmbeddedNats, free_port
from thorn.store import Store

console = Console(stderr=True)
MARK_BEGIN = "<!-- bench:health:begin -->"
MARK_END = "<!-- bench:health:end -->"
REPORTS = 1000
WARMUP = 50
TIMEOUT_S = 2.0  # per report: its reply and its event
BUDGET_S = 120.0  # the whole loop
START_TIMEOUT_S = 60.0
TARGET_MS = 1.0
FABRIC = (4, 16, 8)  # leaf_spine(spines, leaves, hosts per leaf)
METRIC = "thorn_health_report_publish_seconds"


@dataclass
class Result:
    links: int
    event_ms: list[float] = field(default_factory=list)
    reply_ms: list[float] = field(default_factory=list)
    in_health: dict[str, float] = field(default_factory=dict)  # bucket le -> count (delta)
    in_health_sum_s: float = 0.0
    in_health_count: float = 0.0
    lost: int = 0
    budget_hit: bool = False
    seconds: float = 0.0


def quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def scrape(url: str) -> tuple[dict[str, float], float, float]:
    buckets: dict[str, float] = {}
    total = count = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{METRIC}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{METRIC}_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{METRIC}_count"):
            count = float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def bucket_quantile(buckets: dict[str, float], count: float, q: float) -> str:
    """The histogram bucket that holds quantile q: '<= 1 ms' and the like."""
    for le, seen in sorted(
        ((k, v) for k, v in buckets.items() if k != "+Inf"), key=lambda kv: float(kv[0])
    ):
        if count and seen / count >= q:
            return f"<= {float(le) * 1000:g} ms"
    return "> largest bucket"


def start_health(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    script = Path(sys.executable).parent / "thorn-health"
    process = subprocess.Popen(
        [str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"thorn-health exited ({process.returncode})")
        time.sleep(0.1)
    process.kill()
    raise SystemExit("thorn-health did not answer /healthz")


async def seed(database_url: str) -> Fabric:
    store = await Store.open(database_url)
    try:
        fabric = Fabric.from_document(leaf_spine(*FABRIC))
        await store.replace(fabric, expected_revision=0, actor="bench", detail={})
        return await store.load()
    finally:
        await store.close()


async def wait_active(bus: Bus, subject: str, payload: bytes) -> None:
    """Probe with a report until health answers ("no responders" before it is active)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            await bus.nc.request(subject, payload, timeout=TIMEOUT_S)
            return
        except nats.errors.NoRespondersError:
            if time.monotonic() > deadline:
                raise SystemExit("health never took a report") from None
            await asyncio.sleep(0.05)


async def drive(nats_url: str, fabric: Fabric, reports: int, progress: Progress) -> Result:
    links = sorted(fabric.links.values(), key=lambda lk: lk.id)
    result = Result(links=len(links))
    waiting: dict[tuple[int, str], asyncio.Future[float]] = {}

    async def on_event(event: Event) -> None:
        assert isinstance(event, LinkHealthChanged)
        future = waiting.pop((event.link_id, event.state), None)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    async with await Bus.connect(nats_url, name="bench-agent") as bus:
        await bus.subscribe(HEALTH_LINK_ALL, on_event)
        await bus.flush()
        state = {lk.id: True for lk in links}
        seq: dict[str, int] = {}
        task = progress.add_task("reports", total=WARMUP + reports)
        start = time.monotonic()
        for n in range(WARMUP + reports):
            if time.monotonic() - start > BUDGET_S:
                result.budget_hit = True
                break
            link = links[n % len(links)]
            up = not state[link.id]
            state[link.id] = up
            node, port = link.a.node, link.a.port
            report = AgentReport(
                node=node, seq=seq.get(node, 0), sent_at=utcnow(),
                items=[CarrierReport(port=port, admin_up=True, carrier=up,
                                     oper_state="up" if up else "down", detected_at=utcnow())],
            )  # fmt: skip
            seq[node] = seq.get(node, 0) + 1
            expected = "up" if up else "down"
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            waiting[(link.id, expected)] = future  # the first of a link: None -> down
            payload = report.model_dump_json().encode()
            if n == 0:  # health takes reports once it is the active replica
                probe = report.model_copy(
                    update={"items": [report.items[0].model_copy(update={"port": "probe"})]}
                )  # a port in no link: applies nothing
                await wait_active(bus, agent_report_subject(node), probe.model_dump_json().encode())
            sent = time.perf_counter()
            msg = await bus.nc.request(agent_report_subject(node), payload, timeout=TIMEOUT_S)
            replied = time.perf_counter()
            reply = AgentReportReply.model_validate_json(msg.data)
            if not reply.ok:
                raise SystemExit(f"health refused a report: {reply.error}")
            try:
                got = await asyncio.wait_for(future, TIMEOUT_S)
            except TimeoutError:
                result.lost += 1
                waiting.pop((link.id, expected), None)
                continue
            if n >= WARMUP:
                result.event_ms.append((got - sent) * 1000)
            if n >= WARMUP:
                result.reply_ms.append((replied - sent) * 1000)
            progress.advance(task)
        result.seconds = time.monotonic() - start
    return result


def tables(r: Result) -> list[tuple[str, list[str], list[list[str]]]]:
    rows = [
        [name, str(len(v)), f"{quantile(v, 0.5):.3f}", f"{quantile(v, 0.9):.3f}",
         f"{quantile(v, 0.99):.3f}", f"{max(v, default=math.nan):.3f}"]
        for name, v in (("report -> event (consumer)", r.event_ms),
                        ("report -> reply (agent)", r.reply_ms))
    ]  # fmt: skip
    mean_ms = r.in_health_sum_s / r.in_health_count * 1000 if r.in_health_count else math.nan
    rows.append(
        [
            "in health: received -> events acked", f"{r.in_health_count:.0f}",
            bucket_quantile(r.in_health, r.in_health_count, 0.5),
            bucket_quantile(r.in_health, r.in_health_count, 0.9),
            bucket_quantile(r.in_health, r.in_health_count, 0.99), f"mean {mean_ms:.3f}",
        ]
    )  # fmt: skip
    return [
        (
            "Agent report to health.link event, one report in flight (ms)",
            ["measure", "n", "p50", "p90", "p99", "max"],
            rows,
        )
    ]


def targets(r: Result) -> list[tuple[str, str, str]]:
    p50 = quantile(r.event_ms, 0.5)
    return [
        (
            f"report -> publish p50 <= {TARGET_MS:g} ms",
            f"{p50:.3f} ms end to end (agent -> health -> consumer), "
            f"in health {bucket_quantile(r.in_health, r.in_health_count, 0.5)}",
            "met" if p50 <= TARGET_MS else "MISSED",
        ),
        ("every report's event arrived", f"{r.lost} lost", "met" if r.lost == 0 else "MISSED"),
    ]


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def markdown(r: Result, command: str, reports: int) -> str:
    lines = [
        MARK_BEGIN,
        "## Health: agent report to link event",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {_cpu()}, "
        f"Python {platform.python_version()}). A `thorn-health` process on SQLite, an embedded "
        f"nats-server with JetStream, `leaf_spine{FABRIC}` ({r.links} links); {reports} "
        f"reports after {WARMUP} warm-up ones, in {r.seconds:.1f} s"
        + (" (the time budget stopped the loop early)" if r.budget_hit else "")
        + ".",
        "",
    ]
    for title, columns, rows in tables(r):
        lines += [f"**{title}**", "", "| " + " | ".join(columns) + " |"]
        lines += ["| " + " | ".join("---" for _ in columns) + " |"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        lines.append("")
    lines += ["**Targets**", "", "| target | measured | verdict |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(r)]
    lines += [
        "",
        "Method: this process is the agents and the consumer. Each report is one carrier item "
        "that takes a link down or brings it up (links in turn, so every report is a "
        "transition; dampening's half-life is 1 ms so that none is suppressed), sent as a NATS "
        "request on `agent.report.<node>`, one at a time. *report -> event* runs from just "
        "before the request to the `health.link.<id>` event's arrival at a core-NATS "
        "subscriber in this process: two NATS hops, health's decoding and decision, and the "
        "JetStream acknowledgement of the event (health publishes through JetStream and waits "
        "for the stream's ack). *report -> reply* ends at health's reply, sent after that ack. "
        "*in health* is health's own histogram (`thorn_health_report_publish_seconds`, from "
        "receiving the request to the ack), as histogram buckets. Quantiles are nearest-rank.",
        MARK_END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="update this markdown file")
    parser.add_argument("--reports", type=int, default=REPORTS, help="measured reports")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thorn-bench-health-") as tmp, EmbeddedNats(
        store_dir=Path(tmp) / "nats"
    ) as nats:  # fmt: skip
        database_url = f"sqlite:///{tmp}/thorn.db"
        fabric = asyncio.run(seed(database_url))
        port = free_port()
        env = {
            **os.environ,
            "THORN_DATABASE_URL": database_url,
            "THORN_NATS_URL": nats.url,
            "THORN_LISTEN": f"127.0.0.1:{port}",
            "THORN_LOG_LEVEL": "warning",
            "THORN_HEALTH_HALF_LIFE_SECONDS": "0.001",
        }
        process = start_health(env, port)
        try:
            url = f"http://127.0.0.1:{port}"
            before, sum_before, count_before = scrape(url)
            with Progress(console=console) as progress:
                result = asyncio.run(drive(nats.url, fabric, args.reports, progress))
            after, sum_after, count_after = scrape(url)
        finally:
            process.terminate()
            process.wait(10)
    # the warm-up is in the histogram too: it is a few percent of the count
    result.in_health = {k: v - before.get(k, 0.0) for k, v in after.items()}
    result.in_health_sum_s = sum_after - sum_before
    result.in_health_count = count_after - count_before
    print_results(console, tables(result), targets(result), width=160)
    if args.write:
        command = "python tests/bench/bench_health.py" + (
            f" --reports {args.reports}" if args.reports != REPORTS else ""
        )
        write_section(args.write, markdown(result, command, args.reports), MARK_BEGIN, MARK_END)
        console.print(f"results written to {args.write}")


if __name__ == "__main__":
    main()
