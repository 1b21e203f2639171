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

MARKER = "@@bench-datapath "  # the guest's result line in the lane's pytest log
LANE_LOG = Path(__file__).resolve().parents[2] / ".cache" / "kernel-lane" / "pytest.log"
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


PER_HOST = 8  # workloads per peer host (8 GPUs, rail-optimised): one tunnel per 8 peers


def intent(peers: int, colour: str, one_host: bool = False) -> Any:
    from thorn_programmer.intent import HostIntent, LocalWorkload, Peer

    def host(n: int) -> int:
        return 0 if one_host else (n - 1) // PER_HOST

    def teps(n: int) -> dict[str, str]:
        return {"red": peer_tep(host(n), "red"), "blue": peer_tep(host(n), "blue")}

    return HostIntent(
        node="bench", revision=1, teps={"red": "10.223.0.1", "blue": "10.239.0.1"}, routes=(),
        local=(LocalWorkload("w0", VNI, REP, "06:00:00:00:00:01", "100.64.0.1"),),
        peers=tuple(Peer(f"w{n}", VNI, peer_mac(n), f"100.65.{n >> 8}.{n & 255}",
                         f"peer{host(n)}", teps(n), colour)  # type: ignore[arg-type]
                    for n in range(1, peers + 1)),
    )  # fmt: skip


def batch_lines(changes: list[Any], index_of: dict[tuple[str, int], int]) -> list[str]:
    """The same kernel objects as iproute2 batch lines (tc -batch / bridge -batch)."""
    from thorn_programmer.kernel import (
        PRIO_DECAP,
        PRIO_ENCAP,
        PRIO_FLOOD,
        DecapRule,
        EncapRule,
        Fdb,
        FloodRule,
        TunnelAction,
    )  # fmt: skip

    lines: list[str] = []
    for change in changes:
        o = change.obj
        if isinstance(o, Fdb):
            verb = "append" if o.mac == "00:00:00:00:00:00" else "replace"
            lines.append(f"fdb {verb} {o.mac} dev {o.dev} dst {o.dst} self permanent")
        elif isinstance(o, TunnelAction):
            index = index_of[(o.peer, o.vni)]
            lines.append(f"actions add action tunnel_key set src_ip {o.src} dst_ip {o.dst} "
                         f"id {o.vni} dst_port 4789 index {index} skip_hw")  # fmt: skip
        elif isinstance(o, EncapRule):
            lines.append(f"filter add dev {o.dev} ingress prio {PRIO_ENCAP} protocol all flower "
                         f"skip_hw dst_mac {o.mac} action tunnel_key index "
                         f"{index_of[(o.peer, o.vni)]} action mirred egress redirect dev "
                         "thorn-vx")  # fmt: skip
        elif isinstance(o, FloodRule):
            copies = " ".join(f"action tunnel_key index {index_of[(p, o.vni)]} action mirred "
                              "egress mirror dev thorn-vx" for p in o.peers)  # fmt: skip
            verdict = "drop" if o.last else "continue"
            lines.append(f"filter add dev {o.dev} ingress prio {PRIO_FLOOD + o.part} protocol "
                         f"all flower skip_hw dst_mac 01:00:00:00:00:00/01:00:00:00:00:00 "
                         f"{copies} action gact {verdict}")  # fmt: skip
        elif isinstance(o, DecapRule):
            mac = ("01:00:00:00:00:00/01:00:00:00:00:00" if o.mac == "ff:ff:ff:ff:ff:ff"
                   else o.mac)  # fmt: skip
            lines.append(f"filter add dev thorn-vx ingress prio {PRIO_DECAP} protocol all "
                         f"flower skip_hw enc_key_id {o.vni} dst_mac {mac} action tunnel_key "
                         f"unset action mirred egress redirect dev {o.reps[-1]}")  # fmt: skip
    return lines


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
            await driver.read()
            changes = diff(red, [o for o in await driver.read()])
            console.print(f"{driver_name}: installing {len(changes):,} kernel objects")
            start = time.perf_counter()
            report = await driver.apply(changes)
            result["install_s"] = time.perf_counter() - start
            result["install_objects"] = len(changes)
            assert not report.errors, report.errors[:3]
            index_of = dict(getattr(driver, "_index", {}))
            # Failover of `flips` peer hosts, one at a time (each its own message(s)).
            each: list[float] = []
            everyone = intent(peers, "red")
            for n in range(flips):
                # Render only this host's peers: the other objects are the same in both.
                one = _only(everyone, f"peer{n}")
                flipped = diff(driver.render(_flip(one, f"peer{n}")), driver.render(one))
                start = time.perf_counter()
                await driver.apply(flipped)
                each.append(time.perf_counter() - start)
            result["flip_each_ms"] = {
                "p50": statistics.median(each) * 1000,
                "max": max(each) * 1000,
                "total_s": sum(each),
            }
    result["baseline"] = baseline(driver_name, changes, index_of)
    result["bulk"] = await bulk_flip(driver_name, flips)
    if driver_name == "flower":
        result["rule_by_rule"] = rule_by_rule_flip(flips)
    return result


def _only(base: Any, host: str) -> Any:
    from dataclasses import replace

    return replace(base, peers=tuple(p for p in base.peers if p.host == host))


def _flip(base: Any, host: str) -> Any:
    from dataclasses import replace

    peers = tuple(replace(p, colour="blue") if p.host == host else p for p in base.peers)
    return replace(base, peers=peers)


async def bulk_flip(driver_name: str, peers: int) -> dict[str, Any]:
    """`peers` workloads behind one peer host, all moved to blue at once: with the flower
    driver every rule binds the host's one shared action (one message); with emulation each
    peer MAC is an FDB entry (one batch of `peers` replaces)."""
    from thorn_programmer.drivers import open_driver
    from thorn_programmer.kernel import diff

    with Namespace() as ns:
        async with open_driver("host", ns.name, driver_name) as driver:  # type: ignore[arg-type]
            await driver.setup()
            red = driver.render(intent(peers, "red", one_host=True))
            await driver.apply(diff(red, []))
            await driver.read()
            blue = driver.render(_flip_all(intent(peers, "red", one_host=True)))
            changes = diff(blue, red)
            start = time.perf_counter()
            report = await driver.apply(changes)
            assert not report.errors, report.errors[:3]
            return {"rules": peers, "messages": len(changes),
                    "ms": (time.perf_counter() - start) * 1000}  # fmt: skip


def rule_by_rule_flip(peers: int) -> dict[str, Any]:
    """The design THORN avoids: each encap rule with its own tunnel_key action, so moving
    `peers` rules is `peers` filter replaces (sent as one batch)."""
    import ipaddress

    from thorn_programmer.kernel import PRIO_ENCAP
    from thorn_programmer.netlink import (
        FlowerFilter,
        FlowerMatch,
        Mirred,
        TcSocket,
        TunnelKeySet,
        filter_add,
        filter_replace,
    )  # fmt: skip

    with Namespace() as ns:
        sh("ip", "-n", ns.name, "link", "add", "name", "thorn-vx", "type", "vxlan", "external",
           "dstport", "4789")  # fmt: skip
        sh("ip", "-n", ns.name, "link", "set", "dev", "thorn-vx", "up")
        for dev in (REP, "thorn-vx"):
            sh("tc", "-n", ns.name, "qdisc", "add", "dev", dev, "clsact")
        index = {d["ifname"]: d["ifindex"] for d in json.loads(sh("ip", "-n", ns.name, "-j",
                                                                  "link", "show"))}  # fmt: skip

        def rule(n: int, colour: str) -> FlowerFilter:
            key = TunnelKeySet(src=ipaddress.ip_address("10.223.0.1"),
                               dst=ipaddress.ip_address(peer_tep(0, colour)), key_id=VNI,
                               dst_port=4789)  # fmt: skip
            return FlowerFilter(ifindex=index[REP], priority=PRIO_ENCAP, handle=n,
                                match=FlowerMatch(eth_dst=peer_mac(n)),
                                actions=(key, Mirred.redirect(index["thorn-vx"])),
                                skip_hw=True)  # fmt: skip

        with TcSocket(ns.name) as tc:
            tc.send_batch([filter_add(rule(n, "red")) for n in range(1, peers + 1)])
            flips = [filter_replace(rule(n, "blue")) for n in range(1, peers + 1)]
            start = time.perf_counter()
            tc.send_batch(flips)
            return {"rules": peers, "messages": peers,
                    "ms": (time.perf_counter() - start) * 1000}  # fmt: skip


def _flip_all(base: Any) -> Any:
    from dataclasses import replace

    return replace(base, peers=tuple(replace(p, colour="blue") for p in base.peers))


def baseline(driver_name: str, changes: list[Any], index_of: dict[Any, int]) -> dict[str, Any]:
    """The same kernel objects through iproute2's batch mode, in a fresh namespace."""
    with Namespace() as ns, tempfile.NamedTemporaryFile("w", suffix=".batch") as batch:
        if driver_name == "emulation":
            sh("ip", "-n", ns.name, "link", "add", "name", f"thv{VNI}", "type", "vxlan", "id",
               str(VNI), "local", "10.223.0.1", "dstport", "4789", "nolearning")  # fmt: skip
            tool = "bridge"
        else:
            sh("ip", "-n", ns.name, "link", "add", "name", "thorn-vx", "type", "vxlan",
               "external", "dstport", "4789")  # fmt: skip
            for dev in (REP, "thorn-vx"):
                sh("tc", "-n", ns.name, "qdisc", "add", "dev", dev, "clsact")
            tool = "tc"
        lines = batch_lines(changes, index_of)
        batch.write("\n".join(lines) + "\n")
        batch.flush()
        start = time.perf_counter()
        subprocess.run(["ip", "netns", "exec", ns.name, tool, "-batch", batch.name], check=True,
                       capture_output=True)  # fmt: skip
        return {"tool": f"{tool} -batch", "lines": len(lines), "s": time.perf_counter() - start}


def flower_in_guest() -> dict[str, Any] | None:
    """Run the flower half in the kernel lane's guest; its result, or None if it failed."""
    lane = Path(__file__).resolve().parents[1] / "kernel" / "lane.py"
    bench = Path(__file__).resolve().parents[1] / "kernel" / "bench_flower.py"
    run = subprocess.run([sys.executable, str(lane), "-rP", str(bench)], check=False)
    if run.returncode != 0 or not LANE_LOG.exists():
        console.print(f"[red]the kernel lane failed ({run.returncode}); see {LANE_LOG}[/red]")
        return None
    for line in LANE_LOG.read_text(errors="replace").splitlines():
        if line.startswith(MARKER):
            result: dict[str, Any] = json.loads(line[len(MARKER) :])
            return result
    return None


def _rows(r: dict[str, Any], where: str) -> list[list[str]]:
    base = r["baseline"]
    rows = [[
        f"{r['driver']} ({where}, kernel {r['kernel']})",
        f"install {r['install_objects']:,} objects ({r['peers']:,} peers, {PER_HOST} per host)",
        f"{r['install_s'] * 1000:,.0f} ms ({r['install_objects'] / r['install_s']:,.0f}/s)",
        f"{base['tool']}: {base['s'] * 1000:,.0f} ms "
        f"({base['lines'] / base['s']:,.0f}/s) -> "
        f"{'met' if r['install_s'] <= base['s'] else 'MISSED'} "
        f"({base['s'] / r['install_s']:.1f}x)",
    ]]  # fmt: skip
    each = r["flip_each_ms"]
    rows.append([
        "", f"flip one peer host ({PER_HOST} peers), x{r['flips']:,}",
        f"p50 {each['p50']:.2f} ms, max {each['max']:.1f} ms", "",
    ])  # fmt: skip
    bulk = r["bulk"]
    rows.append([
        "", f"flip {bulk['rules']:,} peers of one host"
        + (" (shared action)" if r["driver"] == "flower" else " (FDB replaces, one batch)"),
        f"{bulk['ms']:.2f} ms, {bulk['messages']:,} message(s)", "",
    ])  # fmt: skip
    if "rule_by_rule" in r:
        rr = r["rule_by_rule"]
        rows.append(["", f"flip {rr['rules']:,} rules rule by rule (private actions)",
                     f"{rr['ms']:.1f} ms, {rr['messages']:,} messages", ""])  # fmt: skip
    return rows


def markdown(results: list[tuple[dict[str, Any], str]], elapsed_s: float) -> str:
    lines = [
        MARK_BEGIN,
        "## Datapath: rule install rate and failover latency",
        "",
        f"Command: `make bench` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; "
        f"took {elapsed_s / 60:.1f} min). The emulation driver runs on this machine's kernel; "
        "the flower driver inside the kernel lane's guest (Debian's kernel under qemu TCG, "
        "no KVM: absolute numbers there are an emulated CPU's, the comparison with "
        "`tc -batch` in the same guest is what counts).",
        "",
        "| driver | what | THORN | baseline |",
        "| --- | --- | --- | --- |",
    ]
    for result, where in results:
        lines += ["| " + " | ".join(row) + " |" for row in _rows(result, where)]
    lines += [
        "",
        "Method (`tests/bench/bench_datapath.py`): a throwaway namespace with one representor; "
        f"{PER_HOST} workloads per peer host. *Install*: the driver's `apply` of every object "
        "the intent renders (flower: one shared tunnel_key action per peer host, one encap "
        "rule per peer workload, flood and decap rules; emulation: one FDB entry per peer MAC "
        "and one flood entry per peer host), prebuilt and sent in batches; the baseline is "
        "the same objects as iproute2 batch lines (`tc -batch`, `bridge -batch`) in a fresh "
        "namespace. *Flip one peer host*: the driver's `apply` of the difference between two "
        "renderings (flower: one action replace; emulation: the host's FDB replaces and flood "
        "entry, one batch), each timed alone. *Flip N peers of one host*: flower moves them "
        "all with one message (every rule binds the host's action); *rule by rule* is the "
        "design THORN avoids (a private action per rule: N filter replaces, one batch).",
        MARK_END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", choices=["emulation", "flower"], default="emulation")
    parser.add_argument("--peers", type=int, default=10_000)
    parser.add_argument("--flips", type=int, default=1_000, help="peer hosts to flip")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--report", type=Path, help="both drivers (flower in the kernel "
                        "lane's guest), written into this markdown file")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_datapath needs root (network namespaces)")
    if args.report:
        start = time.monotonic()
        results = [(asyncio.run(measure("emulation", args.peers, args.flips)), "this machine")]
        results[0][0]["kernel"] = platform.release()
        flower = flower_in_guest()
        if flower is not None:
            results.append((flower, "kernel lane guest"))
        sys.path.insert(0, str(Path(__file__).parent))
        from sections import write_section

        write_section(args.report, markdown(results, time.monotonic() - start), MARK_BEGIN,
                      MARK_END)  # fmt: skip
        console.print(f"results written to {args.report}")
        if flower is None:
            raise SystemExit("the flower half did not run: see the kernel lane's log")
        return
    result = asyncio.run(measure(args.driver, args.peers, args.flips))
    result["kernel"] = platform.release()
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
