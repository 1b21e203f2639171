"""`make bench-failover`: the traffic gap random single failures cost, THORN and two baselines.

One list of random single failures (carrier loss at either end of a fabric link, a silent
drop of a link, or a whole spine) is drawn from the seed, then every system is measured
against that same list, one after another, each on a fresh lab of the same fabric (2 spines,
4 leaves, 8 single-homed hosts, `thorn_lab.build.up`), with the same traffic and the same
meter (`--systems` picks which, in which order):

- ``thorn``: the whole system as `make run` runs it: `thorn-run` itself in a subprocess
  (every service its own process, one programmer process for every lab node, the embedded
  nats-server and SQLite store, BFD at 10 ms x 3 on links and toward 2 peers per host), which
  builds the lab too (`thorn_system.py`); flap dampening is off, as the same links fail again
  seconds apart;
- ``frr``: FRR eBGP per RFC 7938 with ECMP and BFD 10 ms x 3 on every session, in every
  switch namespace, over the same VXLAN overlay on the hosts (`baselines.Frr`);
- ``static``: the same overlay over one static path per destination; nothing reacts
  (`baselines.Static`).

For each failure, every host streams to 3 peers at 1 kHz (one of the three RoCE-shaped, UDP
4791; all 24 from one process, `traffic.StreamGroup`); 0.5 s after they started, the
failure is injected (`thorn_lab.faults`, unchanged for every system), restored 1 s later,
and 0.6 s after that every stream is stopped together, so each flow sees the whole failure.
Then the system settles: THORN's agents have applied their latest state and every BFD
session is Up; FRR has every BGP session Established, every BFD peer up and every TEP route
with all its equal-cost next hops (bounded: an error otherwise); static forgets neighbours
that failed to resolve. Per failure the result is the longest silence of
the flows it hit (the meter's longest gap between two arrivals, or, for a flow that had not
recovered when the streams stopped, its lost run: a lower bound, counted as "not
recovered"), and packets a flow lost in a second or later run count as loss outside the gap.

Reported per system and kind: p50/p90/p99/max of that gap over the failures that hit at least
one flow (THORN sends on the red tree, which in a two-spine leaf-spine is the first spine's for
every destination: a failure on the second spine's side hits no flow, while FRR's ECMP has
flows on both; counting those zero gaps would flatter THORN), lost packets, loss outside the
gap, flows not recovered, and THORN/FRR at each percentile. For THORN also, from its own
records: time to re-protection from the first detection (seen on the bus: pathcomp's KV writes
and the agents' applied reports), the tiers its failover timelines name, and the central path
per hop (from health's `GET /api/v1/failovers/{id}`) (markdown table, JSON, CDF PNG with one
subplot per kind). FRR's costs are measured, never tuned away: its daemons' CPU with no traffic
and during the run, and BFD Downs that no failure explains. bfdd runs at SCHED_FIFO, as THORN's
BFD child does (`--frr-bfdd-normal`: as Debian starts it); on this 2-core machine bfdd at 10 ms
on all 8 sessions takes most of a core, and the output says so.

    .venv/bin/python tests/bench/bench_failover.py --failures 100 --write docs/benchmarks.md
    .venv/bin/python tests/bench/bench_failover.py --failures 6 --systems frr,static \\
        --json /tmp/bf.json --png /tmp/bf.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # baselines, thorn_system

import baselines
from rich.console import Console
from rich.progress import Progress
from sections import print_results, write_section
from thorn_system import STEPS, hop_breakdown, thorn_run

from thorn.fabric import Fabric
from thorn.generators import leaf_spine
from thorn.model import FabricDocument
from thorn.telemetry import configure_logging
from thorn_lab import build, faults, traffic
from thorn_lab.handle import Lab

BEGIN, END = "<!-- bench:failover:begin -->", "<!-- bench:failover:end -->"
KINDS = ("carrier", "drop", "switch")
SYSTEMS = ("thorn", "frr", "static")
LABELS = {"thorn": "THORN", "frr": "FRR eBGP + BFD 10 ms x 3", "static": "static single path"}
PERCENTILES = ("p50", "p90", "p99", "max")
RATE = 1000
# Stream before the cut, cut held, after restore. The hold is longer than the re-protection
# target (1 s from detection) plus the injection's own set-up and a drop's detection time
# (up to ~0.2 s): a re-protection still running at the restore cannot be timed.
BEFORE_S, HOLD_S, AFTER_S = 0.5, 1.5, 0.6
START_SLACK_S = 2.0  # the group's start (sockets in 48 namespaces, one fork) and settling
SETTLE_S = 30.0  # bound on waiting for a system to settle between failures
CONVERGE_S = 60.0  # bound on FRR's first convergence (BGP up, BFD up, all routes)
IDLE_S = 5.0  # FRR's CPU is sampled this long with no traffic, before the first failure
STARVE_SHARE = 0.25  # bfdd using this share of all the machine's CPUs is called out
console = Console()


@dataclass
class Outcome:
    kind: str
    target: str
    hit_flows: int
    gap_ms: float  # longest outage among the flows it hit (0: none hit); see outage_ms
    lost: int
    outside_gap: int  # packets lost in a flow's second or later run
    unrecovered: int = 0  # hit flows whose loss lasted to the end of the stream
    tiers: list[str] = field(default_factory=list)  # THORN: the tiers its timelines name
    reprotect_ms: float | None = None  # THORN: detection to the last agent's re-protection
    detected_ms: float | None = None  # THORN: injection to the first detection
    replanned: bool = False  # THORN: pathcomp wrote new documents while the failure lasted
    hops: dict[str, float] = field(default_factory=dict)  # THORN: central path, per step
    injected_at: str = ""  # UTC wall clock of the injection, to find it in the logs
    silence_ms: float = 0.0  # longest silence of those flows (see silence_ms)
    # Runs lost outside the gap: (flow, ms from the injection to the run's first packet's
    # send time on the schedule, packets), to tell a restore's loss from a re-protection's.
    outside_runs: list[tuple[str, float, int]] = field(default_factory=list)


@dataclass
class Running:
    """A system under test on its own lab: how to wait for it to settle after a failure,
    and what to do right after a fault is undone."""

    name: str
    lab: Lab
    settle: Callable[[], Awaitable[None]]
    restored: Callable[[], None]
    # THORN: what its own records say about one failure (injected, restored: wall clock).
    explain: Callable[[float, float], Awaitable[dict[str, Any]]] | None = None


# --- THORN -----------------------------------------------------------------------------------


# As `make run` runs it: `thorn-run` in a subprocess (tests/bench/thorn_system.py), which
# builds the lab itself. Its settings are make run's, but for one: flap dampening is off
# (THORN_HEALTH_FLAP_PENALTY=1), as the same links fail again a few seconds apart here.
THORN_ENV = {"THORN_HEALTH_FLAP_PENALTY": "1.0"}


@asynccontextmanager
async def thorn_running(doc: FabricDocument, prefix: str, data: Path) -> AsyncIterator[Running]:
    async with thorn_run(doc, prefix, data, THORN_ENV) as run:

        async def settle() -> None:
            if not await run.settle(SETTLE_S):
                raise RuntimeError(f"THORN did not settle within {SETTLE_S:.0f} s")

        async def explain(injected: float, restored: float) -> dict[str, Any]:
            iso = "%Y-%m-%dT%H:%M:%SZ"
            since = time.strftime(iso, time.gmtime(injected - 1))
            until = time.strftime(iso, time.gmtime(restored + 1))
            found = await run.failovers(since, until)
            started = [(datetime.fromisoformat(t["started"]).timestamp(), t) for t in found]
            timelines = [t for at, t in started if at < restored]
            again = run.reprotected_after(injected, restored)
            # The target counts from detection: the injection's own set-up (a program load,
            # link tables) comes first, and a silent drop is found a detection time later.
            detected = first_detection(timelines, injected)
            return {"tiers": sorted({t["tier"] for t in timelines}),
                    "reprotect_ms": None if again is None or math.isinf(again)
                    else round((injected + again - detected) * 1000, 1),
                    "detected_ms": round((detected - injected) * 1000, 1),
                    "replanned": again is not None, "hops": hop_breakdown(timelines)}  # fmt: skip

        await settle()
        yield Running("thorn", run.lab, settle, lambda: None, explain)


def first_detection(timelines: list[dict[str, Any]], injected: float) -> float:
    """The earliest `detected` hop among a failure's timelines (wall clock), else the
    injection (a failure nothing detected)."""
    found = [datetime.fromisoformat(h["at"]).timestamp() for t in timelines
             for h in t["hops"] if h["step"] == "detected"]  # fmt: skip
    return min((at for at in found if at >= injected), default=injected)


# --- the baselines (tests/bench/baselines.py) --------------------------------------------------
# Their set-up and checks are synchronous and run on the loop's thread: nothing else runs on
# the loop meanwhile, and an interrupt then lands between steps, never beside a half start.


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _idle_cpu(frr: baselines.Frr, seconds: float) -> dict[str, Any]:
    """FRR's daemons' CPU (% of one core) over `seconds` with no traffic, and the machine's."""
    cores = os.cpu_count() or 1
    before, (busy0, total0), t0 = frr.cpu_seconds(), _machine_jiffies(), time.monotonic()
    time.sleep(seconds)
    after, (busy1, total1), wall = frr.cpu_seconds(), _machine_jiffies(), time.monotonic() - t0
    pct = {d: round(100 * (after[d] - before[d]) / wall, 1) for d in after}
    sessions = frr.bfd_sessions()
    bfdd_share = pct["bfdd"] / 100 / cores
    notes: dict[str, Any] = {
        "idle_cpu_pct_of_core": pct,
        "bfd_sessions": sessions,
        "bfdd_pct_of_core_per_session": round(pct["bfdd"] / sessions, 1),
        "machine_busy_pct": round(100 * (busy1 - busy0) / max(1, total1 - total0), 1),
        "cores": cores,
    }
    if bfdd_share >= STARVE_SHARE:
        notes["warning"] = (
            f"FRR's bfdd at {baselines.BFD_INTERVAL_MS} ms x {baselines.BFD_MULTIPLIER} on all "
            f"{sessions} sessions uses {pct['bfdd']:.0f} % of one core while idle "
            f"({100 * bfdd_share:.0f} % of this {cores}-core machine); the timers were not "
            "changed, so FRR's gaps are measured with that load on the machine"
        )
    return notes


@asynccontextmanager
async def frr_running(lab: Lab, notes: dict[str, Any], bfdd_realtime: bool,
                      ) -> AsyncIterator[Running]:  # fmt: skip
    """FRR converged, with what it costs noted in `notes` (CPU, BFD Downs per round)."""
    frr = baselines.Frr(lab, bfdd_realtime=bfdd_realtime)
    try:
        frr.start()
        seconds = frr.wait_converged(CONVERGE_S)
        console.print(f"FRR converged in {seconds:.1f} s "
                      f"({frr.bfd_sessions()} BGP sessions, each with BFD)")  # fmt: skip
        notes.update({
            "converge_s": round(seconds, 2),
            "bfdd_scheduling": f"SCHED_FIFO {baselines.BFD_RT_PRIORITY}" if bfdd_realtime
            else "normal",
            **_idle_cpu(frr, IDLE_S),
        })  # fmt: skip
        console.print(f"FRR idle CPU, % of one core: {notes['idle_cpu_pct_of_core']}; "
                      f"machine busy {notes['machine_busy_pct']} %")  # fmt: skip
        if "warning" in notes:
            console.print(f"[yellow]warning: {notes['warning']}[/]")
        downs = [frr.bfd_downs()]  # BFD Down transitions (both ends) after each round
        cpu, started = frr.cpu_seconds(), time.monotonic()

        async def settle_frr() -> None:
            frr.wait_converged(SETTLE_S)
            downs.append(frr.bfd_downs())

        yield Running("frr", lab, settle_frr, frr.restored)
        wall, spent = time.monotonic() - started, frr.cpu_seconds()
        notes["run_cpu_pct_of_core"] = {d: round(100 * (spent[d] - cpu[d]) / wall, 1)
                                        for d in spent}  # fmt: skip
        per_round = [b - a for a, b in itertools.pairwise(downs)]
        notes["bfd_downs_warm_up"] = per_round[0] if per_round else 0  # no failure: spurious
        notes["bfd_downs_per_failure"] = per_round[1:]
    finally:
        frr.stop()


@asynccontextmanager
async def static_running(lab: Lab) -> AsyncIterator[Running]:
    static = baselines.Static(lab)
    static.start()

    async def settle_static() -> None:
        static.settle()

    yield Running("static", lab, settle_static, static.restored)


# --- one failure -------------------------------------------------------------------------------


def flows(hosts: list[str]) -> list[traffic.StreamSpec]:
    """Each host to the next 3 hosts (ring order), one of the three RoCE-shaped. Sent by one
    stream group (one process: 24 flows of one sender and one receiver thread, which leaves
    the CPU to the systems under test); `one_failure` stops them together."""
    count = int((BEFORE_S + HOLD_S + AFTER_S + START_SLACK_S) * RATE)
    specs = []
    for i, src in enumerate(hosts):
        for k in (1, 2, 3):
            dst = hosts[(i + k * 2) % len(hosts)]
            kind = traffic.Kind.roce if k == 1 else traffic.Kind.udp
            specs.append(traffic.StreamSpec(
                src=f"{src}-vf0", dst=f"{dst}-vf0", kind=kind, rate_pps=RATE, count=count,
                duration_s=count / RATE + 1, port=6000 + i * 3 + k, linger_s=0.3,
            ))  # fmt: skip
    return specs


def pick(rng: random.Random, fabric: Fabric) -> tuple[str, str]:
    """A random failure: (kind, target) in `thornctl lab fail` terms."""
    switches = sorted(n for n, node in fabric.nodes.items() if node.role.value == "switch")
    fabric_links = [lk for lk in fabric.links.values()
                    if lk.a.node in switches and lk.b.node in switches]  # fmt: skip
    kind = rng.choice(KINDS)
    if kind == "switch":
        return kind, rng.choice([s for s in switches if s.startswith("spine")])
    link = rng.choice(fabric_links)
    end = rng.choice((link.a, link.b))
    return kind, f"{end.node}:{end.port}"


def inject(lab: Lab, kind: str, target: str) -> None:
    if kind == "carrier":
        faults.carrier_loss(lab, target)
    elif kind == "drop":
        faults.silent_drop(lab, target)
    else:
        faults.node_down(lab, target)


def restore(run: Running) -> None:
    faults.restore(run.lab)
    run.restored()


def _longest_run_ms(r: traffic.TrafficReport) -> float:
    """The longest run of lost packets at the stream's rate (for a run no arrival ended:
    the flow had not recovered when its stream stopped; a lower bound)."""
    return max((b - a + 1 for a, b in r.lost_ranges), default=0) * 1000 / r.spec.rate_pps


def outage_ms(r: traffic.TrafficReport) -> float:
    """A flow's outage, the gap this benchmark reports: its longest loss period (from the
    send stamp of the packet before a run of lost packets to that of the packet after it;
    RFC 6412's packet loss period), or a run no arrival ended, as `_longest_run_ms`. What
    the network lost, on the sender's clock: a pause of the lab's meter with nothing lost
    is no outage (it is in `silence_ms`)."""
    return max(r.max_loss_ms or 0.0, _longest_run_ms(r))


def silence_ms(r: traffic.TrafficReport) -> float:
    """A flow's longest silence anywhere in its stream: the meter's longest gap between two
    arrivals, or a run no arrival ended. It includes the meter's own pauses (the warm-up
    round, with no failure, shows how long those are on this machine)."""
    return max(r.max_gap_ms, _longest_run_ms(r))


def outside_runs(r: traffic.TrafficReport, injected: float) -> list[tuple[str, float, int]]:
    """Every lost run of `r` but its longest, placed in time from the injection."""
    started = datetime.fromisoformat(r.started_at).timestamp()
    runs = sorted(r.lost_ranges, key=lambda run: run[1] - run[0])[:-1]
    flow = f"{r.spec.src}->{r.spec.dst}"
    return sorted((flow, round((started + a / r.spec.rate_pps - injected) * 1000, 1), b - a + 1)
                  for a, b in runs)  # fmt: skip


def unrecovered(r: traffic.TrafficReport) -> bool:
    """Whether the flow's loss ran to the end of its stream (every run is listed)."""
    complete = r.lost_ranges_total == len(r.lost_ranges)
    return bool(complete and r.lost_ranges and r.lost_ranges[-1][1] == r.sent - 1)


async def one_failure(run: Running, fabric: Fabric, kind: str, target: str,
                      ) -> tuple[Outcome, list[traffic.TrafficReport]]:  # fmt: skip
    hosts = sorted(n for n, node in fabric.nodes.items() if node.role.value == "host")
    group = await asyncio.to_thread(traffic.start_group, run.lab, flows(hosts))
    await asyncio.sleep(BEFORE_S)
    injected = time.time()
    if kind != "none":
        await asyncio.to_thread(inject, run.lab, kind, target)
    await asyncio.sleep(HOLD_S)
    restored = time.time()
    if kind != "none":
        await asyncio.to_thread(restore, run)
    await asyncio.sleep(AFTER_S)
    group.stop()  # every flow saw the whole failure, and AFTER_S after the restore
    reports = await asyncio.to_thread(group.wait)
    await run.settle()
    hit = [r for r in reports if r.lost]
    outcome = Outcome(kind, target, len(hit), max(map(outage_ms, hit), default=0.0),
                      sum(r.lost for r in hit), 0, sum(map(unrecovered, hit)),
                      silence_ms=max(map(silence_ms, hit), default=0.0),
                      injected_at=datetime.fromtimestamp(injected, UTC).isoformat())  # fmt: skip
    for r in hit:
        if r.lost_ranges_total > 1:  # all but the longest run were lost outside the gap
            outcome.outside_runs += outside_runs(r, injected)
    outcome.outside_gap = sum(packets for _, _, packets in outcome.outside_runs)
    if run.explain is not None and kind != "none":
        found = await run.explain(injected, restored)
        outcome.tiers, outcome.reprotect_ms, outcome.replanned, outcome.hops = (
            found["tiers"], found["reprotect_ms"], found["replanned"], found["hops"])  # fmt: skip
        outcome.detected_ms = found["detected_ms"]
    return outcome, reports


@asynccontextmanager
async def running(
    name: str, doc: FabricDocument, prefix: str, data: Path, notes: dict[str, Any],
    bfdd_realtime: bool,
) -> AsyncIterator[Running]:  # fmt: skip
    """`name` on a fresh lab `prefix` (thorn-run builds its own; the baselines get one)."""
    if name == "thorn":
        async with thorn_running(doc, prefix, data) as run:
            yield run
        return
    await asyncio.to_thread(build.up, doc, prefix)  # pyroute2's sync API: off the loop
    lab = await asyncio.to_thread(Lab.open, prefix)
    context = frr_running(lab, notes, bfdd_realtime) if name == "frr" else static_running(lab)
    async with context as run:
        yield run


async def measure(name: str, doc: FabricDocument, failures: list[tuple[str, str]], prefix: str,
                  outcomes: list[Outcome], notes: dict[str, Any],
                  bfdd_realtime: bool = True, keep: Path | None = None) -> None:  # fmt: skip
    """`name` on a fresh lab `prefix`: a warm-up round, then every failure, into `outcomes`
    and `notes` (kept if it raises); the lab, and whatever the system started, is gone when
    this returns or raises. With `keep`, the system's data dir (THORN's logs) is left in a
    new directory under it."""
    fabric = Fabric.from_document(doc)
    data_dir = (nullcontext(tempfile.mkdtemp(prefix=f"{name}-", dir=keep))
                if keep is not None else tempfile.TemporaryDirectory())  # fmt: skip
    with data_dir as tmp:
        try:
            async with running(name, doc, prefix, Path(tmp), notes, bfdd_realtime) as run:
                lab = run.lab
                # One round with no failure: neighbours resolved, every path warm.
                warm, reports = await one_failure(run, fabric, "none", "")
                dead = [f"{r.spec.src}->{r.spec.dst}" for r in reports if not r.received]
                if dead:
                    raise RuntimeError(f"{LABELS[name]}: nothing arrived on {', '.join(dead)}")
                notes["warm_up"] = {
                    "lost": warm.lost, "flows_with_loss": warm.hit_flows,
                    "max_outage_ms": max(map(outage_ms, reports)),
                    "max_silence_ms": max(map(silence_ms, reports)),
                }  # fmt: skip
                console.print(f"{LABELS[name]}: warm-up round: {warm.lost} packets lost in "
                              f"{warm.hit_flows} flows, longest outage "
                              f"{notes['warm_up']['max_outage_ms']:.1f} ms, longest silence "
                              f"of any flow {notes['warm_up']['max_silence_ms']:.1f} ms "
                              "(the meter's own pauses)")  # fmt: skip
                started, (busy0, total0) = time.monotonic(), _machine_jiffies()
                with Progress(console=console) as progress:
                    task = progress.add_task(LABELS[name], total=len(failures))
                    for kind, target in failures:
                        outcomes.append((await one_failure(run, fabric, kind, target))[0])
                        progress.advance(task)
                notes["seconds"] = round(time.monotonic() - started, 1)
                busy1, total1 = _machine_jiffies()
                notes["machine_busy_pct_during_run"] = round(
                    100 * (busy1 - busy0) / max(1, total1 - total0), 1
                )
            if name == "frr":  # Downs each failure explains: both ends of each session it cut
                expected = [2 * (len(lab.node_links(t)) if k == "switch" else 1)
                            for k, t in failures]  # fmt: skip
                got = notes["bfd_downs_per_failure"]
                notes["bfd_downs_spurious"] = notes["bfd_downs_warm_up"] + sum(
                    max(0, g - e) for g, e in zip(got, expected, strict=True)
                )
                if notes["bfd_downs_spurious"]:
                    notes["warning_flaps"] = (
                        f"FRR's BFD sessions went Down {notes['bfd_downs_spurious']} times "
                        "(session ends) with no failure to explain it: on this machine, under "
                        "this traffic, bfdd does not keep 10 ms x 3; FRR's gaps include the "
                        "routes those false Downs withdrew")  # fmt: skip
        finally:
            await asyncio.to_thread(build.down, prefix)  # thorn-run took its own down already


# --- results -------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summarise(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        of_kind = [o for o in outcomes if o.kind == kind]
        if not of_kind:
            continue
        # Percentiles of the failures that hit traffic (a failure no flow crossed has no gap).
        gaps = [o.gap_ms for o in of_kind if o.hit_flows] or [0.0]
        silences = [o.silence_ms for o in of_kind if o.hit_flows] or [0.0]
        out[kind] = {
            "failures": len(of_kind),
            "hit": sum(1 for o in of_kind if o.hit_flows),
            "p50": percentile(gaps, 50), "p90": percentile(gaps, 90),
            "p99": percentile(gaps, 99), "max": max(gaps),
            "mean": statistics.fmean(gaps),
            "silence_p99": percentile(silences, 99),
            "lost": sum(o.lost for o in outcomes if o.kind == kind),
            "outside_gap": sum(o.outside_gap for o in outcomes if o.kind == kind),
            "unrecovered": sum(o.unrecovered for o in outcomes if o.kind == kind),
        }  # fmt: skip
        again = [o.reprotect_ms for o in outcomes if o.kind == kind and o.reprotect_ms is not None]
        if any(o.tiers for o in outcomes):  # THORN: its own records explain each failure
            out[kind] |= {
                "reprotect_p50": percentile(again, 50), "reprotect_p99": percentile(again, 99),
                "reprotect_max": max(again, default=0.0),
                "reprotect_late": sum(o.kind == kind and o.replanned and o.reprotect_ms is None
                                      for o in outcomes),
                "not_replanned": sum(o.kind == kind and not o.replanned for o in outcomes),
            }  # fmt: skip
            for _, _, step in STEPS:
                values = [o.hops[step] for o in outcomes if o.kind == kind and step in o.hops]
                if values:
                    out[kind][f"hop {step} p50"] = percentile(values, 50)
                    out[kind][f"hop {step} p90"] = percentile(values, 90)
            for tier in ("switch", "source", "central"):
                out[kind][f"tier {tier}"] = sum(o.kind == kind and tier in o.tiers
                                                for o in outcomes)  # fmt: skip
    return out


def ratios(summaries: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float | None]]:
    """kind -> percentile -> THORN's gap / FRR's (None where FRR's is 0)."""
    if "thorn" not in summaries or "frr" not in summaries:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for kind in KINDS:
        ours, theirs = summaries["thorn"].get(kind), summaries["frr"].get(kind)
        if ours and theirs:
            out[kind] = {p: round(ours[p] / theirs[p], 3) if theirs[p] else None
                         for p in PERCENTILES}  # fmt: skip
    return out


def plot(results: dict[str, list[Outcome]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ticks = {0: "0", 1: "1", 3: "3", 10: "10", 30: "30", 100: "100", 300: "300", 1000: "1k",
             3000: "3k", 10000: "10k"}  # fmt: skip
    longest = max((o.gap_ms for outcomes in results.values() for o in outcomes), default=0)
    fig, axes = plt.subplots(1, len(KINDS), figsize=(13, 4), sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        for name, outcomes in results.items():
            gaps = sorted(o.gap_ms for o in outcomes if o.kind == kind and o.hit_flows)
            if gaps:  # from 0 at the shortest gap up to 1 at the longest
                ax.step([gaps[0], *gaps], [0, *((i + 1) / len(gaps) for i in range(len(gaps)))],
                        where="post", label=LABELS[name])  # fmt: skip
        ax.set_title(kind)
        ax.set_xlabel("longest gap of the hit flows (ms)")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(0, max(5000, 1.2 * longest))
        ax.set_ylim(0, 1.02)
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize="small", loc="lower right")
    axes[0].set_ylabel("fraction of the failures that hit a flow")
    fig.suptitle("Failover gap CDF (lab: 2 spines, 4 leaves, 8 hosts; 1 kHz flows)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def markdown(summaries: dict[str, dict[str, dict[str, float]]], notes: dict[str, dict[str, Any]],
             failures: int, seed: int, seconds: float, png: str | None,
             command: str, errors: dict[str, str]) -> str:  # fmt: skip
    lines = [
        BEGIN,
        "## Failover, end to end (`make bench-failover`)",
        "",
        f"`{command}` on {time.strftime('%Y-%m-%d')}, this {os.cpu_count()}-core machine: "
        f"{failures} random single failures (one list, from seed {seed}, for every system), "
        "each under 24 flows at 1 kHz (each host to 3 peers, one RoCE-shaped), every system "
        f"on a fresh lab of the same fabric; {seconds:.0f} s in all. The gap is the longest "
        "outage of the flows a failure hit: a flow's longest packet loss period (RFC 6412), "
        "from the send stamp of the packet before a run of lost packets to that of the packet "
        "after it (a flow still losing when the streams stopped counts its lost run, a lower "
        "bound; 'not recovered' counts such flows). 'Silence p99' is the same percentile of "
        "the longest silence between two arrivals anywhere in those flows' streams: it adds "
        "the lab meter's own pauses, which lose nothing (the warm-up line below says how long "
        "they were with no failure). Percentiles are over "
        "the failures that hit a flow ('hit'): THORN's traffic runs on the red tree, the first "
        "spine's in this fabric, so a failure on the second spine's side hits none of it, "
        "while FRR's ECMP has flows on both spines.",
        "",
        "| system | failure | n | hit | p50 ms | p90 ms | p99 ms | max ms | silence p99 ms "
        "| lost | outside the gap | not recovered |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in SYSTEMS:
        if name not in summaries:
            lines.append(f"| {LABELS[name]} | all | not run (--systems) | | | | | | | | | |")
            continue
        for kind, s in summaries[name].items():
            lines.append(
                f"| {LABELS[name]} | {kind} | {s['failures']:.0f} | {s.get('hit', 0):.0f} | "
                f"{s['p50']:.1f} | "
                f"{s['p90']:.1f} | {s['p99']:.1f} | {s['max']:.1f} | "
                f"{s.get('silence_p99', 0):.1f} | {s['lost']:.0f} | "
                f"{s['outside_gap']:.0f} | {s['unrecovered']:.0f} |"
            )
    for name, error in errors.items():
        done = sum(s["failures"] for s in summaries.get(name, {}).values())
        lines += ["", f"**{LABELS[name]} did not complete** ({done:.0f} failures measured "
                  f"before it stopped): {error}"]  # fmt: skip
    busy = [f"{LABELS[k]} {v['machine_busy_pct_during_run']:.0f} %" for k, v in notes.items()
            if "machine_busy_pct_during_run" in v]  # fmt: skip
    lines += ["", f"Machine busy while the failures ran (all its CPUs): {', '.join(busy)}."]
    warm = [
        f"{LABELS[k]} {v['warm_up']['max_outage_ms']:.1f} / {v['warm_up']['max_silence_ms']:.1f} ms"
        for k, v in notes.items()
        if "warm_up" in v
    ]
    lines += ["", "Warm-up round (the same streams, no failure), longest outage / longest "
              f"silence of any flow: {', '.join(warm)}."]  # fmt: skip
    ratio = ratios(summaries)
    if ratio:
        lines += [
            "",
            "THORN's gap / FRR's, per percentile (below 1: THORN's is shorter):",
            "",
            "| failure | p50 | p90 | p99 | max |",
            "| --- | --- | --- | --- | --- |",
        ]
        for kind, r in ratio.items():
            cells = " | ".join("n/a" if r[p] is None else f"{r[p]:.2f}" for p in PERCENTILES)
            lines.append(f"| {kind} | {cells} |")
    thorn = summaries.get("thorn", {})
    if thorn and any("reprotect_p50" in s for s in thorn.values()):
        lines += [
            "",
            "THORN, from its own records: re-protection (from the failure's first detection, "
            "the earliest `detected` hop of its timelines, until every node pathcomp rewrote "
            "has applied its last document, seen on the bus) and the tiers "
            "whose failovers the timeline stored (a failure may show several):",
            "",
            "| failure | re-protected p50 ms | p99 ms | max ms | not within the hold | "
            "not re-planned | switch | source | central |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for kind, k in thorn.items():
            lines.append(
                f"| {kind} | {k['reprotect_p50']:.0f} | {k['reprotect_p99']:.0f} | "
                f"{k['reprotect_max']:.0f} | {k['reprotect_late']:.0f} | "
                f"{k['not_replanned']:.0f} | "
                f"{k['tier switch']:.0f} | {k['tier source']:.0f} | {k['tier central']:.0f} |"
            )
        lines += [
            "",
            "THORN's central path per hop (the failure's first central timeline, from "
            "`GET /api/v1/failovers/{id}`; every clock in the lab is this machine's), p50 / p90 "
            "ms:",
            "",
            "| step | " + " | ".join(thorn) + " |",
            "| --- |" + " --- |" * len(thorn),
        ]
        for _, _, step in STEPS:
            cells = [
                f"{k[f'hop {step} p50']:.1f} / {k[f'hop {step} p90']:.1f}"
                if f"hop {step} p50" in k else "" for k in thorn.values()
            ]  # fmt: skip
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    if "frr" in notes:
        n = notes["frr"]
        idle, run = n["idle_cpu_pct_of_core"], n.get("run_cpu_pct_of_core", {})
        lines += [
            "",
            f"FRR converged in {n['converge_s']:.1f} s ({n['bfd_sessions']} eBGP sessions with "
            f"BFD). Its CPU in % of one core, idle: bfdd {idle['bfdd']:.0f} "
            f"({n['bfdd_pct_of_core_per_session']:.1f} per session), bgpd {idle['bgpd']:.0f}, "
            f"zebra {idle['zebra']:.0f} (machine {n['machine_busy_pct']:.0f} % busy); over the "
            f"run: bfdd {run.get('bfdd', 0):.0f}, bgpd {run.get('bgpd', 0):.0f}, zebra "
            f"{run.get('zebra', 0):.0f}. bfdd ran at {n['bfdd_scheduling']} priority (THORN's "
            "BFD child runs at SCHED_FIFO). BFD session ends that went Down with no failure to "
            f"explain it: {n['bfd_downs_spurious']} ({n['bfd_downs_warm_up']} in the warm-up "
            "round, which has none).",
        ]
        lines += [f"\n**Warning:** {n[k]}." for k in ("warning", "warning_flaps") if k in n]
    lines += [
        "",
        "Targets: carrier loss p99 <= 10 ms; silent drop p99 <= 3 x 10 ms + 5 ms = 35 ms; "
        "re-protection within 1 s of detection; no packet lost outside the gap.",
    ]
    if png:
        lines += ["", f"![failover gap CDF]({png})"]
    lines.append(END)
    return "\n".join(lines) + "\n"


def report(summaries: dict[str, dict[str, dict[str, float]]], results: dict[str, list[Outcome]],
           notes: dict[str, dict[str, Any]], errors: dict[str, str]) -> None:  # fmt: skip
    """The console's tables, THORN's targets, FRR's warning and any system that failed."""
    columns = ["system", "kind", "n", "hit", *PERCENTILES, "silence p99", "lost", "outside gap",
               "unrecovered"]  # fmt: skip
    rows = [[LABELS[name], k, f"{s['failures']:.0f}", f"{s.get('hit', 0):.0f}",
             *(_ms(s[p]) for p in PERCENTILES), _ms(s.get("silence_p99")),
             f"{s['lost']:.0f}", f"{s['outside_gap']:.0f}", f"{s['unrecovered']:.0f}"]
            for name, summary in summaries.items() for k, s in summary.items()]  # fmt: skip
    tables = [("Failover gaps: outage (loss period) and silence (ms)", columns, rows)]
    ratio = ratios(summaries)
    if ratio:
        tables.append(("THORN / FRR", ["kind", *PERCENTILES],
                       [[k, *("n/a" if r[p] is None else f"{r[p]:.2f}" for p in PERCENTILES)]
                        for k, r in ratio.items()]))  # fmt: skip
    targets = []
    if "thorn" in summaries:
        ours = summaries["thorn"]
        if "carrier" in ours:
            p99 = ours["carrier"]["p99"]
            targets.append(("THORN carrier p99 <= 10 ms", f"{p99:.1f} ms",
                            "met" if p99 <= 10 else "MISSED"))  # fmt: skip
        if "drop" in ours:
            p99 = ours["drop"]["p99"]
            targets.append(("THORN silent drop p99 <= 35 ms", f"{p99:.1f} ms",
                            "met" if p99 <= 35 else "MISSED"))  # fmt: skip
        replanned = [o for o in results["thorn"] if o.replanned]
        slow = [o for o in replanned if o.reprotect_ms is None or o.reprotect_ms > 1000]
        targets.append(("THORN re-protection <= 1 s", f"{len(slow)} of {len(replanned)} later",
                        "met" if not slow else "MISSED"))  # fmt: skip
        outside = sum(o.outside_gap for o in results["thorn"])
        targets.append(("THORN: no loss outside the gap", str(outside),
                        "met" if not outside else "MISSED"))  # fmt: skip
    print_results(console, tables, targets)
    busy = {LABELS[k]: v.get("machine_busy_pct_during_run") for k, v in notes.items()}
    console.print(f"machine busy while the failures ran, % of all CPUs: {busy}")
    if notes.get("frr"):
        n = notes["frr"]
        console.print(f"FRR: bfdd {n.get('bfdd_scheduling')}; CPU % of one core idle "
                      f"{n.get('idle_cpu_pct_of_core')}, over the run "
                      f"{n.get('run_cpu_pct_of_core')}; "
                      f"BFD session ends Down that no failure explains: "
                      f"{n.get('bfd_downs_spurious', '?')} (per failure: "
                      f"{n.get('bfd_downs_per_failure')})")  # fmt: skip
        for key in ("warning", "warning_flaps"):
            if key in n:
                console.print(f"[yellow]warning: {n[key]}[/]")
    for name, error in errors.items():
        console.print(f"[red]{LABELS[name]}: {error}[/]")


def relative(path: Path, start: Path) -> str:
    """`path` as a link from a document in `start` (the PNG from docs/benchmarks.md)."""
    return os.path.relpath(path, start)


def parse_systems(text: str) -> list[str]:
    chosen = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [s for s in chosen if s not in SYSTEMS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: choose from {', '.join(SYSTEMS)}"
        )
    return chosen


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failures", type=int, default=100)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument(
        "--systems",
        type=parse_systems,
        default=list(SYSTEMS),
        help="comma-separated, run in this order (default thorn,frr,static)",
    )
    parser.add_argument("--frr-bfdd-normal", action="store_true",
                        help="FRR's bfdd at normal priority, as Debian starts it (default: "
                        "SCHED_FIFO, as THORN's BFD child runs)")  # fmt: skip
    parser.add_argument("--write", type=Path, help="docs/benchmarks.md")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each system's data dir (THORN's service logs) under DIR",
    )
    parser.add_argument("--json", type=Path, default=Path("docs/images/bench-failover.json"))
    parser.add_argument("--png", type=Path, default=Path("docs/images/bench-failover.png"))
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    if not 1 <= args.failures <= 1000:
        parser.error("--failures: 1..1000")
    if "frr" in args.systems and not (baselines.FRR_BIN / "bgpd").exists():
        parser.error("--systems frr: FRR is not installed (make test-deps: apt-get install frr)")
    configure_logging("warning", "console")  # the services' own logs: only what went wrong
    doc = leaf_spine(2, 4, 2)
    rng = random.Random(args.seed)
    failures = [pick(rng, Fabric.from_document(doc)) for _ in range(args.failures)]
    token = uuid.uuid4().hex[:4]
    start = time.monotonic()
    results: dict[str, list[Outcome]] = {}
    notes: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for name in args.systems:
        console.rule(LABELS[name])
        results[name], notes[name] = [], {}
        try:  # one lab per system; its prefix is this run's alone
            await measure(name, doc, failures, f"bf{token}{name[0]}", results[name], notes[name],
                          not args.frr_bfdd_normal, args.keep)  # fmt: skip
        except (RuntimeError, baselines.NotConverged) as exc:
            errors[name] = str(exc)
            console.print(f"[red]{LABELS[name]} failed: {exc}[/]")
    seconds = time.monotonic() - start
    summaries = {name: summarise(outcomes) for name, outcomes in results.items()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "seed": args.seed, "failure_list": failures, "ratios_thorn_frr": ratios(summaries),
        "systems": {name: {"summary": summaries[name], "notes": notes[name],
                           "complete": name not in errors,
                           "failures": [asdict(o) for o in results[name]]} for name in results},
        "errors": errors,
    }, indent=1))  # fmt: skip
    png = plot(results, args.png)
    report(summaries, results, notes, errors)
    if args.write:  # a system that failed is written as such, with what it measured
        command = " ".join(["tests/bench/bench_failover.py", *sys.argv[1:]])
        rel = relative(args.png, args.write.parent) if png else None
        write_section(args.write, markdown(summaries, notes, len(failures), args.seed, seconds,
                                           rel, command, errors), BEGIN, END)  # fmt: skip
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
