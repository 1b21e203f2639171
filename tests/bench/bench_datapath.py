"""Datapath benchmark: rule install rate and failover latency of a host driver.

    python tests/bench/bench_datapath.py --driver emulation --json out.json   # this kernel
    python tests/bench/bench_datapath.py --driver flower --json out.json      # needs flower

In a throwaway namespace with one representor and the driver's tunnel device, measures:
- install: N peers (default 10,000) through the project's netlink path (the driver's
  `apply` of the rendered objects: flower rules + one shared tunnel_key action per peer, or
  static FDB entries in emulation), against the same kernel objects through iproute2's
  batch mode (`tc -batch` / `bridge -batch`) as the baseline;
- failover: moving F peers (default 1,000) to their other colour: with a shared action per
  peer (flower: one action replace per peer; emulation: one FDB replace per peer), and, for
  flower, all F peers bound to a single shared action (one message for all).

Prints a JSON result; `make bench` merges host (emulation) and guest (flower) results into
docs/benchmarks.md with `--report`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)

MARK_BEGIN = "<!-- bench:datapath:begin -->"
MARK_END = "<!-- bench:datapath:end -->"
VNI = 1000
REP = "vf0_rep"


def sh(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, input=stdin).stdout


def peer_mac(n: int) -> str:
    return "06:01:" + ":".join(f"{(n >> shift) & 255:02x}" for shift in (24, 16, 8, 0))


def peer_tep(n: int, colour: str) -> str:
    base = 224 if colour == "red" else 240
    return f"10.{base + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"


class Namespace:
    def __init__(self) -> None:
        self.name = f"bench-dp-{uuid.uuid4().hex[:6]}"

    def __enter__(self) -> Namespace:
        sh("ip", "netns", "add", self.name)
        sh("ip", "-n", self.name, "link", "set", "dev", "lo", "up")
        sh("ip", "-n", self.name, "link", "add", "name", REP, "type", "veth", "peer", "name",
           "vf0")  # fmt: skip
        sh("ip", "-n", self.name, "link", "set", "dev", REP, "up")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def intent(peers: int, colour: str, one_host: bool = False) -> Any:
    from thorn_programmer.intent import HostIntent, LocalWorkload, Peer

    def host(n: int) -> str:
        return "peer" if one_host else f"peer{n}"

    def teps(n: int) -> dict[str, str]:
        m = 0 if one_host else n
        return {"red": peer_tep(m, "red"), "blue": peer_tep(m, "blue")}

    return HostIntent(
        node="bench", revision=1, teps={"red": "10.223.0.1", "blue": "10.239.0.1"}, routes=(),
        local=(LocalWorkload("w0", VNI, REP, "06:00:00:00:00:01", "100.64.0.1"),),
        peers=tuple(Peer(f"w{n}", VNI, peer_mac(n), f"100.65.{n >> 8}.{n & 255}", host(n),
                         teps(n), colour) for n in range(1, peers + 1)),  # type: ignore[arg-type]
    )  # fmt: skip


async def measure(driver_name: str, peers: int, flips: int) -> dict[str, Any]:
    from thorn_programmer.drivers import open_driver
    from thorn_programmer.kernel import diff

    result: dict[str, Any] = {"driver": driver_name, "peers": peers, "flips": flips}
    with Namespace() as ns:
        async with open_driver("host", ns.name, driver_name) as driver:  # type: ignore[arg-type]
            await driver.setup()
            base = driver.render(intent(0, "red"))
            await driver.apply(diff(base, []))  # the tunnel device, clsact: not timed
            red = driver.render(intent(peers, "red"))
            changes = diff(red, base)
            console.print(f"{driver_name}: installing {len(changes):,} kernel objects")
            start = time.perf_counter()
            report = await driver.apply(changes)
            result["install_s"] = time.perf_counter() - start
            result["install_objects"] = len(changes)
            assert not report.errors, report.errors[:3]
            # Failover of `flips` peers, one at a time (each its own message(s)).
            blue_one: list[float] = []
            for n in range(1, flips + 1):
                flipped = diff(driver.render(_flip(intent(peers, "red"), n)), red)
                start = time.perf_counter()
                await driver.apply(flipped)
                blue_one.append(time.perf_counter() - start)
            result["flip_each_ms"] = {
                "p50": statistics.median(blue_one) * 1000,
                "max": max(blue_one) * 1000,
                "total_s": sum(blue_one),
            }
    result["baseline"] = baseline(driver_name, peers)
    if driver_name == "flower":
        result["shared"] = await shared_flip(flips)
    return result


def _flip(base: Any, n: int) -> Any:
    from dataclasses import replace

    peers = tuple(replace(p, colour="blue") if p.name == f"w{n}" else p for p in base.peers)
    return replace(base, peers=peers)


async def shared_flip(peers: int) -> dict[str, float]:
    """`peers` workloads behind one peer host: every rule binds one action; flip it."""
    from thorn_programmer.drivers import open_driver
    from thorn_programmer.kernel import diff

    with Namespace() as ns:
        async with open_driver("host", ns.name, "flower") as driver:
            await driver.setup()
            red = driver.render(intent(peers, "red", one_host=True))
            await driver.apply(diff(red, []))
            blue = driver.render(_flip_all(intent(peers, "red", one_host=True)))
            changes = [c for c in diff(blue, red) if type(c.obj).__name__ == "TunnelAction"]
            start = time.perf_counter()
            await driver.apply(changes)
            return {"rules": peers, "messages": len(changes),
                    "ms": (time.perf_counter() - start) * 1000}  # fmt: skip


def _flip_all(base: Any) -> Any:
    from dataclasses import replace

    return replace(base, peers=tuple(replace(p, colour="blue") for p in base.peers))


def baseline(driver_name: str, peers: int) -> dict[str, Any]:
    """The same kernel objects through iproute2's batch mode, in a fresh namespace."""
    with Namespace() as ns, tempfile.NamedTemporaryFile("w", suffix=".batch") as batch:
        if driver_name == "emulation":
            sh("ip", "-n", ns.name, "link", "add", "name", "thv1000", "type", "vxlan", "id",
               str(VNI), "local", "10.223.0.1", "dstport", "4789", "nolearning")  # fmt: skip
            for n in range(1, peers + 1):
                batch.write(f"fdb add {peer_mac(n)} dev thv1000 dst {peer_tep(n, 'red')}\n")
            batch.flush()
            command = ["ip", "netns", "exec", ns.name, "bridge", "-batch", batch.name]
        else:
            sh("ip", "-n", ns.name, "link", "add", "name", "thorn-vx", "type", "vxlan",
               "external", "dstport", "4789")  # fmt: skip
            sh("tc", "-n", ns.name, "qdisc", "add", "dev", REP, "clsact")
            for n in range(1, peers + 1):
                index = 0x54480000 + n
                batch.write(
                    f"actions add action tunnel_key set src_ip 10.223.0.1 dst_ip "
                    f"{peer_tep(n, 'red')} id {VNI} dst_port 4789 index {index}\n"
                    f"filter add dev {REP} ingress prio 49663 protocol all flower skip_hw "
                    f"dst_mac {peer_mac(n)} action tunnel_key index {index} action mirred "
                    f"egress redirect dev thorn-vx\n"
                )
            batch.flush()
            command = ["ip", "netns", "exec", ns.name, "tc", "-batch", batch.name]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return {"tool": command[4], "s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["emulation", "flower"], default="emulation")
    parser.add_argument("--peers", type=int, default=10_000)
    parser.add_argument("--flips", type=int, default=1_000)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_datapath needs root (network namespaces)")
    result = asyncio.run(measure(args.driver, args.peers, args.flips))
    result["kernel"] = platform.release()
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
