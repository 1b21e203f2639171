"""docker-compose.yml run for real: podman, podman-compose and images built on a debootstrap
base (deploy/podman), with no registry at all. Used by tests/deploy_lane/test_compose_run.py.

The deployment is the compose file's `cluster` profile (deploy/cluster.env) under a project
name of its own, on free ports, so that it never meets another run on the machine. podman
4.3 (Debian 12) has no `podman wait --condition=healthy` and, without systemd, runs no
health checks by itself, so podman-compose cannot honour `depends_on: service_healthy`: the
lane does it, starting the services tier by tier in the order depends_on gives and running
each one's own compose health check (`podman healthcheck run`) until it passes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PODMAN_DIR = ROOT / "deploy" / "podman"
COMPOSE_FILES = ("docker-compose.yml", "deploy/podman/compose.yml")
CLUSTER_ENV = "deploy/cluster.env"
CONTAINERS_CONF = PODMAN_DIR / "containers.conf"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"
DASHBOARD_INDEX = ROOT / "services" / "gateway" / "dashboard" / "dist" / "index.html"
# What podman needs here: runc (crun refuses this kernel's hybrid cgroups), netavark and
# aardvark-dns (the compose network and its DNS names), debootstrap for the base image.
DEBIAN_PACKAGES = ("podman", "runc", "netavark", "aardvark-dns", "iptables", "debootstrap")
AGENT = "programmer"  # the compose service the lane starts in a lab namespace, not on the host


class LaneError(RuntimeError):
    """A step of the deployment failed; the message says which and shows its output."""


def run(
    cmd: Sequence[str | Path],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    args = [str(c) for c in cmd]
    try:
        done = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise LaneError(f"{' '.join(args)}: still running after {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        raise LaneError(f"{' '.join(args)} exited {done.returncode}:\n{output}")
    return done


def ensure_debian_packages(timeout: float = 600) -> list[str]:
    """Install what is missing of DEBIAN_PACKAGES (apt-get, as root); the names installed."""
    query = run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *DEBIAN_PACKAGES],
        timeout=30,
        check=False,
    )
    lines = [line.split() for line in query.stdout.splitlines()]
    installed = {words[0] for words in lines if words[1:] == ["installed"]}
    missing = [name for name in DEBIAN_PACKAGES if name not in installed]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        wait_for_lock = ("-o", f"DPkg::Lock::Timeout={int(timeout / 2)}")  # others use apt too
        run(["apt-get", *wait_for_lock, "update", "-qq"], timeout=timeout, env=env)
        run(["apt-get", *wait_for_lock, "install", "-y", "-qq", "--no-install-recommends",
             *missing], timeout=timeout, env=env)  # fmt: skip
    return missing


@dataclass
class Timings:
    """Seconds per phase of the lane, in the order they ran."""

    phases: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - started

    def summary(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phases.items())
        return f"{total:.0f} s ({parts})"


def podman_env() -> dict[str, str]:
    """The environment podman runs in: this repository's containers.conf and nothing else
    of the caller's (a THORN_* variable of the caller must not reach compose's interpolation)."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], timeout=timeout, env=podman_env(), check=check)


def build_images(timeouts: dict[str, float], timings: Timings) -> None:
    """The base image (debootstrap), the wheelhouse, and every image of the deployment, each
    step skipped or served from podman's layer cache when its inputs have not changed."""
    if not DASHBOARD_INDEX.is_file():
        raise LaneError(f"{DASHBOARD_INDEX} is missing: run `make dashboard` first")
    env = {**podman_env(), "PYTHON": sys.executable}
    nice = ("nice", "-n", "10")  # two cores shared with whatever else runs
    with timings.phase("base image"):
        run([*nice, PODMAN_DIR / "build-base.sh"], timeout=timeouts["base"], env=env)
    with timings.phase("wheels"):
        run([*nice, PODMAN_DIR / "wheels.sh"], timeout=timeouts["wheels"], env=env)
    with timings.phase("images"):
        # Any project name: a build touches no container. PostgreSQL's image (apt, mostly
        # waiting on the mirror) builds beside the others; those one at a time, so that the
        # five THORN targets share their stages through the cache instead of racing.
        variables = {"THORN_ADMIN_TOKEN": "-", "THORN_NODE_NAME": "-"}
        compose = Deployment("thornbuild", variables, ROOT)
        others = [name for name in compose.config()["services"] if name != "postgres"]
        build = ("--parallel", "1", "build", "--pull=never")
        postgres = subprocess.Popen(
            [*nice, *compose.command(*build, "postgres")], cwd=ROOT, env=compose.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            run([*nice, *compose.command(*build, *others)], timeout=timeouts["build"],
                env=compose.env)  # fmt: skip
            output, _ = postgres.communicate(timeout=timeouts["build"])
        finally:
            if postgres.poll() is None:  # podman-compose and the podman it started
                os.killpg(postgres.pid, signal.SIGKILL)
                postgres.wait()
        if postgres.returncode != 0:
            raise LaneError(f"building postgres exited {postgres.returncode}:\n{output[-4000:]}")
        # Layers no image uses any more (earlier sources) go after a day; younger ones stay
        # as the cache of the next run.
        podman("image", "prune", "-f", "--filter", "until=24h", timeout=300)


class Deployment:
    """One podman-compose project of docker-compose.yml + deploy/podman/compose.yml."""

    def __init__(self, project: str, variables: dict[str, str], workdir: Path) -> None:
        self.project = project
        self.workdir = workdir  # the lane's own compose files
        self.env = {**podman_env(), **variables}
        self.files = [str(ROOT / name) for name in COMPOSE_FILES]

    def command(self, *args: str) -> list[str]:
        files = [arg for name in self.files for arg in ("-f", name)]
        return [str(PODMAN_COMPOSE), "-p", self.project, *files, "--profile", "cluster",
                "--env-file", str(ROOT / CLUSTER_ENV), *args]  # fmt: skip

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run(self.command(*args), timeout=timeout, env=self.env)

    def config(self) -> dict[str, Any]:
        """The merged, interpolated configuration, as podman-compose reads it."""
        document: dict[str, Any] = yaml.safe_load(self.compose("config", timeout=60).stdout)
        return document

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def inspect(self, service: str, template: str) -> str:
        return podman("inspect", "--format", template, self.container(service)).stdout.strip()

    def ip(self, service: str) -> str:
        return self.inspect(service, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")

    def pid(self, service: str) -> int:
        return int(self.inspect(service, "{{.State.Pid}}"))

    def restarts(self, service: str) -> int:
        return int(self.inspect(service, "{{.RestartCount}}"))

    def logs(self, service: str, lines: int = 40) -> str:
        done = podman("logs", "--tail", str(lines), self.container(service), check=False)
        return done.stdout + done.stderr

    def healthy(self, service: str) -> bool:
        """The service's compose health check, run now (`podman healthcheck run`)."""
        return podman("healthcheck", "run", self.container(service), check=False).returncode == 0

    def wait_healthy(self, services: Sequence[str], within: float) -> None:
        deadline = time.monotonic() + within
        pending = list(services)
        while pending:
            pending = [service for service in pending if not self.healthy(service)]
            if pending and time.monotonic() > deadline:
                logs = "\n".join(f"--- {s}:\n{self.logs(s)}" for s in pending)
                raise LaneError(f"not healthy within {within:.0f} s: {pending}\n{logs}")
            if pending:
                time.sleep(1)

    def start_in_order(self, services: dict[str, Any], within: float) -> list[list[str]]:
        """`up -d` tier by tier along depends_on, each tier healthy before the next starts.
        Returns the tiers."""
        started: set[str] = set()
        tiers: list[list[str]] = []
        while len(started) < len(services):
            tier = sorted(
                name
                for name, service in services.items()
                if name not in started and set(service.get("depends_on") or {}) <= started
            )
            if not tier:
                raise LaneError(f"depends_on has a cycle among {set(services) - started}")
            self.compose("up", "-d", "--no-deps", *tier, timeout=within)
            self.wait_healthy([n for n in tier if "healthcheck" in services[n]], within)
            started.update(tier)
            tiers.append(tier)
        return tiers

    def network(self) -> dict[str, Any]:
        found = json.loads(podman("network", "inspect", f"{self.project}_default").stdout)
        network: dict[str, Any] = found[0]
        return network

    def attach_namespace(self, namespace: str, ifname: str = "mgmt0") -> str:
        """Give network namespace `namespace` a port on the deployment's network (a veth
        whose other end joins its bridge), as a node's management interface would be;
        returns the address it got: the subnet's last, which podman's sequential IPAM
        hands out last."""
        network = self.network()
        subnet = ipaddress.ip_network(network["subnets"][0]["subnet"])
        address = str(list(subnet.hosts())[-1])
        host_end = f"thm{secrets.token_hex(5)}"
        peer = ["peer", "name", ifname, "netns", namespace]
        for cmd in (
            ["ip", "link", "add", host_end, "type", "veth", *peer],
            ["ip", "link", "set", host_end, "master", network["network_interface"], "up"],
            ["ip", "-n", namespace, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", ifname],
            ["ip", "-n", namespace, "link", "set", ifname, "up"],
        ):
            run(cmd, timeout=10)
        return address

    def run_agent_in(self, namespace: str, nats_url: str, within: float) -> None:
        """Start the compose file's programmer service with the lab namespace `namespace` as
        its network (in place of the host's), the deployment's DNS and NATS seed list."""
        network = self.network()
        override = self.workdir / "agent-in-lab.yml"
        override.write_text(
            yaml.safe_dump(
                {
                    "services": {
                        AGENT: {
                            "network_mode": f"ns:/run/netns/{namespace}",
                            "dns": [network["subnets"][0]["gateway"]],
                            "environment": {"THORN_NATS_URL": nats_url},
                        }
                    }
                }
            )
        )
        self.files.append(str(override))
        self.compose("up", "-d", "--no-deps", AGENT, timeout=within)
        self.wait_healthy([AGENT], within)

    def leftovers(self) -> list[str]:
        """The project's containers that still exist."""
        label = f"label=io.podman.compose.project={self.project}"
        return podman("ps", "-a", "-q", "--filter", label, check=False).stdout.split()

    def down(self, timeout: float = 180) -> list[str]:
        """`down -v`; then whatever of the project is left (a container podman-compose no
        longer lists, a volume, the network) goes by its label. Returns the containers
        `down` left."""
        left: list[str] = []
        try:
            self.compose("down", "-v", "-t", "5", timeout=timeout)
        finally:
            label = f"label=io.podman.compose.project={self.project}"
            if left := self.leftovers():
                podman("rm", "-f", "-v", *left, timeout=timeout, check=False)
            volumes = podman("volume", "ls", "-q", "--filter", label, check=False).stdout.split()
            if volumes:
                podman("volume", "rm", "-f", *volumes, check=False)
            podman("network", "rm", "-f", f"{self.project}_default", check=False)
        return left
