"""THORN as a user runs it, for the failover benchmark and the kernel lane's RDMA proof:
`thorn-run` (what `make run` calls) in a subprocess, with its own data directory and lab
prefix. Every service is its own
process over the embedded nats-server, and the programmer serves every lab node, exactly as
on `make run`. The benchmark only seeds the store with its fabric before the start, reads
`run.json` to find NATS and the services, and drives faults and traffic on the lab.

`thorn-run` builds the lab itself and takes it down when it stops (SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import nats.errors

from thorn.auth import new_token
from thorn.bus import Bus, CaughtUp
from thorn.desired import node_key
from thorn.events import AGENT_APPLIED_ALL, DatapathApplied
from thorn.fabric import Fabric
from thorn.model import FabricDocument
from thorn.natsd import free_port
from thorn.store import Store
from thorn.store.store import sqlite_url
from thorn_lab.handle import Lab

START_TIMEOUT_S = 180.0  # the lab build and every service's start, on a loaded 2-core machine
# One answer from a service or NATS: generous, since under emulation (the kernel lane) a
# service busy planning or programming answers in seconds, not ms. A settle keeps polling
# through slow answers until its own deadline.
ASK_TIMEOUT_S = 15.0
SLOW = (httpx.TimeoutException, httpx.TransportError, nats.errors.TimeoutError)
STOP_TIMEOUT_S = 60.0


@dataclass
class RunningThorn:
    lab: Lab
    bus: Bus
    token: str
    services: dict[str, str]  # name -> base URL (topology, health, pathcomp, programmer)
    log: Path
    # Seen on the bus as they happen (wall clock, node, KV revision): pathcomp's writes to
    # the desired-state KV and the agents' applied reports. Re-protection is timed from them
    # without asking any service anything while a failure runs.
    writes: list[tuple[float, str, int]] = field(default_factory=list)
    applied: list[tuple[float, str, int]] = field(default_factory=list)

    async def observe(self) -> None:
        """Record KV writes and applied reports until cancelled."""

        async def applied(event: DatapathApplied) -> None:
            self.applied.append((time.time(), event.node, event.key_revision))

        sub = await self.bus.subscribe(AGENT_APPLIED_ALL, applied, model=DatapathApplied)
        while True:  # until cancelled: NATS may be slow to answer while THORN starts
            try:
                kv = await self.bus.desired_state()
                break
            except nats.errors.TimeoutError:
                await asyncio.sleep(1.0)
        try:
            async with kv.watch() as watch:
                async for item in watch:
                    if not isinstance(item, CaughtUp) and item.node.startswith("node."):
                        self.writes.append((time.time(), item.node[5:], item.revision))
        finally:
            await sub.unsubscribe()

    def reprotected_after(self, start: float, end: float) -> float | None:
        """Seconds from `start` until every node pathcomp wrote in [start, end) had applied
        its last such write: None if nothing was written, infinity if not all before `end`."""
        last: dict[str, int] = {}
        for at, node, revision in self.writes:
            if start <= at < end:
                last[node] = max(revision, last.get(node, 0))
        if not last:
            return None
        done = 0.0
        for node, revision in last.items():
            when = [at for at, n, r in self.applied if n == node and r >= revision and at >= start]
            if not when or min(when) >= end:
                return math.inf
            done = max(done, min(when))
        return done - start

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def settle(self, within: float = 30.0, quiet_s: float = 0.3) -> bool:
        """Every agent has applied the document the KV holds for it, nothing was written for
        `quiet_s`, every BFD session is Up again (as FRR's settle waits for its BFD peers: a
        link restored a moment ago is not protected until its session is Up), no switch
        keeps a port's primaries withdrawn and health has no link out of service (both come
        back once the link has been up for the up hold: until then pathcomp plans without
        it, and a failure then is a double one). False if that did not happen `within` seconds."""
        deadline = time.monotonic() + within
        state: dict[str, Any] = {"last": None, "quiet_since": time.monotonic()}
        async with httpx.AsyncClient(timeout=ASK_TIMEOUT_S) as client:
            while time.monotonic() < deadline:
                try:
                    if await self._settled(client, state, quiet_s):
                        return True
                except SLOW:
                    pass  # a slow answer is not a verdict: ask again
                await asyncio.sleep(0.05)
        return False

    async def _settled(self, client: httpx.AsyncClient, state: dict[str, Any],
                       quiet_s: float) -> bool:  # fmt: skip
        """One look at the agents, the KV, BFD and health (`settle` says what is asked)."""
        kv = await self.bus.desired_state()
        status = (await client.get(f"{self.services['programmer']}/status")).json()
        applied = {a["node"]: a["key_revision"] for a in status}
        entries = {n: await kv.get(node_key(n)) for n in applied}
        held = {n: e.revision for n, e in entries.items() if e is not None}
        if held != state["last"]:
            state["last"], state["quiet_since"] = held, time.monotonic()
        caught_up = all(applied[n] >= r for n, r in held.items())
        caught_up = caught_up and not any(a["withdrawn"] for a in status)
        if not caught_up or time.monotonic() - state["quiet_since"] < quiet_s:
            return False
        bfd = (await client.get(f"{self.services['programmer']}/bfd")).json()
        if not all(session["state"] == "up" for session in bfd["sessions"]):
            return False
        links = f"{self.services['health']}/api/v1/health/links"
        page = (await client.get(links, headers=self.headers(), params={"limit": "1000"})).json()
        out = {"down", "flapping", "drained"}  # out of service
        return not any(link["state"] in out for link in page["items"])

    async def failovers(self, since: str, until: str) -> list[dict[str, Any]]:
        """Health's failover timelines (with their hops) that started in [since, until)."""
        out: list[dict[str, Any]] = []
        health = f"{self.services['health']}/api/v1/failovers"
        async with httpx.AsyncClient(timeout=10, headers=self.headers()) as client:
            for page in range(20):  # bounded: 20 pages of 100
                params = {"since": since, "until": until, "limit": "100",
                          "offset": str(page * 100)}  # fmt: skip
                body = (await client.get(health, params=params)).raise_for_status().json()
                for item in body["items"]:
                    detail = await client.get(f"{health}/{item['id']}")
                    out.append(detail.raise_for_status().json())
                if (page + 1) * 100 >= body["total"]:
                    break
        return sorted(out, key=lambda t: t["started"])


def _shown(line: str) -> str:
    """A log line cut short, but with the end of its exception's traceback if it has one."""
    try:
        record = json.loads(line)
    except ValueError:
        return line[:400]
    if not isinstance(record, dict) or "exception" not in record:
        return line[:400]
    last = str(record.pop("exception")).strip().splitlines()[-4:]
    return json.dumps(record)[:300] + "\n    " + "\n    ".join(last)


def logs_tail(data: Path, lines: int = 12) -> str:
    """For a failure: every warning and error line of thorn-run's log and every service's
    (data/logs), then the last lines of each."""
    out = []
    for path in [data / "thorn-run.log", *sorted((data / "logs").glob("*.log"))]:
        if path.exists():
            text = path.read_text(errors="replace").splitlines()
            flagged = [t for t in text if any(w in t for w in ('"error"', '"warning"', "[ERR]",
                                                               "[WRN]", "Traceback"))]  # fmt: skip
            out.append(f"--- {path.name}: {len(flagged)} warnings/errors, last shown")
            out += [_shown(t) for t in flagged[-40:]]
            out.append(f"--- {path.name}: last {lines} lines")
            out += [t[:400] for t in text[-lines:]]
    return "\n".join(out)


@asynccontextmanager
async def thorn_run(
    doc: FabricDocument,
    prefix: str,
    data: Path,
    env: Mapping[str, str],
    start_timeout_s: float = START_TIMEOUT_S,
) -> AsyncIterator[RunningThorn]:
    """`thorn-run` on fabric `doc`, its lab named `prefix`, its data under `data`; `env`
    adds settings (THORN_*)."""
    store = await Store.open(sqlite_url(data))
    try:
        await store.replace(Fabric.from_document(doc), expected_revision=0, actor="bench",
                            detail={"why": "bench-failover"})  # fmt: skip
    finally:
        await store.close()
    token = new_token()
    log = data / "thorn-run.log"
    script = Path(sys.executable).parent / "thorn-run"
    full_env = {**os.environ, "THORN_DATA_DIR": str(data), "THORN_LAB": prefix,
                "THORN_LISTEN": f"127.0.0.1:{free_port()}", "THORN_ADMIN_TOKEN": token,
                **env}  # fmt: skip

    def spawn() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen([str(script)], env=full_env, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    proc = await asyncio.to_thread(spawn)
    try:
        run_file = data / "run.json"
        deadline = time.monotonic() + start_timeout_s
        while not run_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"thorn-run did not come up (exit {proc.poll()}):\n"
                                   + logs_tail(data))  # fmt: skip
            await asyncio.sleep(0.2)
        run = json.loads(run_file.read_text())
        services = {name.partition("@")[0]: s["url"] for name, s in run["services"].items()}
        creds = Path(run["nats_creds"]) if run.get("nats_creds") else None
        bus = await Bus.connect(run["nats"], name="bench-failover", creds=creds)
        try:
            running = RunningThorn(await asyncio.to_thread(Lab.open, prefix), bus, token,
                                   services, log)  # fmt: skip
            observer = asyncio.create_task(running.observe(), name="bench-observe")
            try:
                yield running
            finally:
                observer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await observer
        finally:
            await bus.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # stops the services and takes the lab down
        try:
            await asyncio.to_thread(proc.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


# The central path as the timeline names its hops, and each step's name in the breakdown.
STEPS = (
    ("detected", "health_received", "detection to health"),
    ("health_received", "pathcomp_decided", "health to pathcomp's decision"),
    ("pathcomp_decided", "agent_received", "pathcomp to the first agent"),
    ("agent_received", "agent_applied", "first agent's receipt to the last flip applied"),
    ("detected", "agent_applied", "detection to the last flip applied"),
)


def hop_breakdown(timelines: list[dict[str, Any]]) -> dict[str, float]:
    """Per step of the central path, its ms in the failure's first central timeline (the
    lab's nodes and services all read this machine's clock, so hops on different "clocks"
    are comparable here, which health rightly does not assume)."""
    central = [t for t in timelines if t["tier"] == "central" and t["hops"]]
    if not central:
        return {}
    hops = central[0]["hops"]

    def at(step: str, last: bool = False) -> float | None:
        times = [datetime.fromisoformat(h["at"]).timestamp() for h in hops if h["step"] == step]
        if not times:
            return None
        return max(times) if last else min(times)

    out: dict[str, float] = {}
    for begin, end, name in STEPS:
        a, b = at(begin), at(end, last=end == "agent_applied")
        if a is not None and b is not None:
            out[name] = round((b - a) * 1000, 2)
    return out
