"""One process of the scale benchmark's simulated agents (started by bench_scale.py).

Runs a `SimulatedAgent` (tests/support/sim_agents.py: the programmer's NodeAgent and Reporter
over a null datapath and scripted ports) for each node of its share, each on a NATS
connection of its own, as every node's agent has in production. The benchmark drives it
over NATS request/reply on `bench.scale.<worker>.<verb>`:

- `carrier` {"changes": [[node, port, up], ...]}: those ports' carrier changes now, as the
  kernel would announce it to the agent; replies {"at_ns": [...]}, each change's time;
- `period` {"seconds": s}: every reporter's snapshot period from now on;
- `stats`: {"agents", "applied" (agents that reconciled at least once), "reports" (per
  outcome, from the agents' own counter), "rss_kib"}.

It stops on SIGTERM (its parent starts it to receive one when the parent dies).

With `--blast SECONDS`, it runs no agents but measures health's capacity beyond what
Reporters in one process can produce: for SECONDS, `--in-flight` requests at a time of each
node's full port snapshot (carrier and counters, what a Reporter sends each period), encoded
once and restamped per send under a run of its own (health keeps that sequence apart from
the agent's), counters far above the agents' own (health takes a counter that went back as
a new baseline, never as loss); nodes in `--exclude` are left out (their carrier changes
meanwhile: a snapshot saying up must not overtake the agent's report of the loss). It
prints {"ok", "refused", "unanswered"}.

    python tests/bench/scale_agents.py --nats URL --nodes nodes.json --worker 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import signal
import sys
from pathlib import Path
from typing import Any

import nats.errors
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # sim_agents

from nats.aio.msg import Msg
from prometheus_client import REGISTRY
from sim_agents import PACKETS_PER_SAMPLE, ScriptedPorts, SimulatedAgent

from thorn.bus import Bus
from thorn.events import agent_report_subject, utcnow
from thorn.telemetry import configure_logging
from thorn.watchdog import LoopWatchdog
from thorn_programmer.reports import ReportQueue

# Agents start in batches, each once the one before has reconciled (or after BATCH_WAIT_S):
# a thousand starting at once keep this one loop busy for tens of seconds, and nats-py then
# misses its ordered consumers' heartbeats, recreates them under that load, and a recreation
# that times out leaves a KV watch without a consumer (see the report in docs/benchmarks.md).
START_BATCH = 50
BATCH_WAIT_S = 30.0
CONTROL = "bench.scale"


def reports_by_outcome() -> dict[str, float]:
    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        if family.name != "thorn_programmer_reports":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                outcome = sample.labels["outcome"]
                out[outcome] = out.get(outcome, 0.0) + sample.value
    return out


BLAST_PACKETS = 10**12  # where the blast's counters start: far above the agents' own
BLAST_CONNECTIONS = 8


class Snapshots:
    """One node's full port snapshot as its Reporter would send it, encoded from a dict
    restamped per send (sequence, times, the ports' counters risen by PACKETS_PER_SAMPLE)."""

    def __init__(self, node: str, ports: list[str], bus: Bus) -> None:
        self.bus = bus
        self.subject = agent_report_subject(node)
        self.ports = ScriptedPorts(ports)
        self.ports.packets = dict.fromkeys(ports, BLAST_PACKETS)
        queue = ReportQueue(node)
        queue.run = f"blast{queue.run[5:]}"
        links, counters = self.ports.sample()
        queue.snapshot(links, counters, utcnow())
        report = queue.next_report()
        assert report is not None
        self.report = report.model_dump(mode="json")
        self.counters = [i for i in self.report["items"] if i["kind"] == "counters"]
        self.carriers = [i for i in self.report["items"] if i["kind"] == "carrier"]

    def next(self) -> bytes:
        now = utcnow().isoformat()
        self.report["seq"] += 1
        self.report["sent_at"] = now
        packets = self.ports.packets
        for item in self.counters:
            packets[item["port"]] += PACKETS_PER_SAMPLE
            item["rx_packets"] = item["tx_packets"] = packets[item["port"]]
            item["at"] = now
        for item in self.carriers:
            item["detected_at"] = now
        return orjson.dumps(self.report)


async def blast(url: str, nodes: dict[str, list[str]], seconds: float, in_flight: int) -> None:
    buses = [await Bus.connect(url, name=f"bench-blast-{n}") for n in range(BLAST_CONNECTIONS)]
    try:
        snapshots = [Snapshots(node, ports, buses[n % len(buses)])
                     for n, (node, ports) in enumerate(sorted(nodes.items()))]  # fmt: skip
        counts = {"ok": 0, "refused": 0, "unanswered": 0}
        turn = itertools.cycle(snapshots)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds

        async def lane() -> None:
            while loop.time() < deadline:
                snapshot = next(turn)
                try:
                    reply = await snapshot.bus.nc.request(snapshot.subject, snapshot.next(),
                                                          timeout=5.0)  # fmt: skip
                except nats.errors.TimeoutError:
                    counts["unanswered"] += 1
                    continue
                except nats.errors.NoRespondersError:
                    # health is reconnecting (an overloaded machine: the server cut it off
                    # as a slow consumer): unanswered, as an agent's report would be
                    counts["unanswered"] += 1
                    await asyncio.sleep(0.1)
                    continue
                counts["ok" if orjson.loads(reply.data)["ok"] else "refused"] += 1

        await asyncio.gather(*(lane() for _ in range(in_flight)))
        print(json.dumps(counts), flush=True)
    finally:
        for bus in buses:
            await bus.close()


def reconciled(sim: SimulatedAgent) -> bool:
    return sim.agent is not None and sim.agent.status.reconciles > 0


async def first_reconcile(sim: SimulatedAgent) -> None:
    assert sim.agent is not None
    while not reconciled(sim):
        await sim.agent.reconciled.wait()


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def run(url: str, nodes: dict[str, list[str]], worker: int, period: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    names = sorted(nodes)
    buses: list[Bus] = []
    sims: dict[str, SimulatedAgent] = {}
    control = await Bus.connect(url, name=f"bench-agents-{worker}")
    try:
        for start in range(0, len(names), START_BATCH):
            batch = names[start : start + START_BATCH]
            connected = await asyncio.gather(
                *(Bus.connect(url, name=f"agent-{n}", connect_timeout=60) for n in batch)
            )
            buses += connected
            for node, bus in zip(batch, connected, strict=True):
                sims[node] = SimulatedAgent(node, nodes[node], bus, report_seconds=period)
                await sims[node].start()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BATCH_WAIT_S):
                    await asyncio.gather(*(first_reconcile(sims[n]) for n in batch))

        async def carrier(msg: Msg) -> None:
            changes = json.loads(msg.data)["changes"]
            at = [sims[node].ports.carrier(port, up) for node, port, up in changes]
            await msg.respond(json.dumps({"at_ns": at}).encode())

        async def set_period(msg: Msg) -> None:
            seconds = float(json.loads(msg.data)["seconds"])
            for sim in sims.values():
                sim.reporter.period = seconds
            await msg.respond(b"{}")

        async def stats(msg: Msg) -> None:
            applied = sum(1 for s in sims.values() if reconciled(s))
            out: dict[str, Any] = {
                "agents": len(sims),
                "applied": applied,
                "reports": reports_by_outcome(),
                "rss_kib": rss_kib(),
            }
            await msg.respond(json.dumps(out).encode())

        handlers = {"carrier": carrier, "period": set_period, "stats": stats}
        for verb, handler in handlers.items():
            await control.nc.subscribe(f"{CONTROL}.{worker}.{verb}", cb=handler)
        await control.flush()
        await stop.wait()
    finally:
        await asyncio.gather(*(sim.stop() for sim in sims.values()))
        for bus in [*buses, control]:
            with contextlib.suppress(Exception):
                await bus.close()


async def watched(url: str, nodes: dict[str, list[str]], worker: int, period: float) -> None:
    """`run`, its loop's stalls over a second logged with what it was doing (a thousand
    agents share this one loop: a stall is every agent's)."""
    async with LoopWatchdog(f"scale-agents-{worker}", threshold_s=1.0).running():
        await run(url, nodes, worker, period)


# Young collections as usual, full ones never: this process holds a thousand agents' heaps
# (millions of objects), and each full collection walked them all for 0.3-2 s with every
# agent stopped, and more often after each gc.freeze(). A real agent's heap is a
# thousandth of this one. What cycles survive into the old generation stay for the run.
GC_THRESHOLDS = (50_000, 20, 1_000_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True, help="NATS URL (or a cluster's seed list)")
    parser.add_argument("--nodes", type=Path, required=True, help="JSON: node -> its ports")
    parser.add_argument("--worker", type=int, default=0, help="this process's number")
    parser.add_argument("--report-seconds", type=float, default=5.0)
    parser.add_argument("--blast", type=float, help="run no agents: blast health this long")
    parser.add_argument("--in-flight", type=int, default=64, help="blast: requests at a time")
    parser.add_argument("--exclude", default="", help="blast: nodes left out, comma-separated")
    args = parser.parse_args()
    configure_logging("warning")
    gc.set_threshold(*GC_THRESHOLDS)
    nodes = json.loads(args.nodes.read_text())
    if args.blast is not None:
        for node in args.exclude.split(","):
            nodes.pop(node, None)
        asyncio.run(blast(args.nats, nodes, args.blast, args.in_flight))
        return
    asyncio.run(watched(args.nats, nodes, args.worker, args.report_seconds))


if __name__ == "__main__":
    main()
