"""The deployment: docker-compose.yml and deploy/Dockerfile, as a specification.

No container runs here (there is no Docker engine on the build machines): these
tests check the files themselves.

- docker-compose.yml conforms to the Compose Specification JSON schema, vendored in
  tests/data/compose-spec.schema.json (see tests/data/README.md), and the same
  validator rejects broken compose files.
- Every THORN service container runs a console script declared in pyproject.toml
  [project.scripts], and that script's `module:function` exists in the source tree.
- The wiring is consistent: database and NATS URLs, depends_on targets, named
  volumes, Dockerfiles and build targets, health checks and listen ports.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import importlib.util
import json
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dockerfile import container_command as image_command
from dockerfile import effective, parse_dockerfile, stage_chain
from jsonschema import Draft7Validator

from thorn.config import Settings
from thorn_gateway.routes import RouteTable

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_FILE = ROOT / "tests" / "data" / "compose-spec.schema.json"
PYPROJECT_FILE = ROOT / "pyproject.toml"
DOCKERIGNORE_FILE = ROOT / ".dockerignore"

# compose service -> the console script it must run
THORN_SERVICES = {
    "topology": "thorn-topology",
    "health": "thorn-health",
    "pathcomp": "thorn-pathcomp",
    "programmer": "thorn-programmer",
}
# services of the central controller: they share the database and the NATS bus
CONTROLLER_SERVICES = ("topology", "health", "pathcomp")
# variables the operator must set: compose must refuse to start without them
REQUIRED_VARIABLES = ("THORN_ADMIN_TOKEN", "THORN_NODE_NAME")
EXPECTED_DATABASE_URL = "postgresql+psycopg://thorn:thorn@postgres:5432/thorn"


# --------------------------------------------------------------------------- helpers


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict), f"{path.name} is not a mapping"
    return document


_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariableError(LookupError):
    """A `${VAR:?message}` or `${VAR?message}` whose variable is not set."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose-style variable interpolation of every string in a document.

    Supports `$$`, `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
    `${VAR:?message}` and `${VAR?message}` (no nesting, which this project's
    compose file does not use).
    """
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["name"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        is_set = name in env
        is_empty = not env.get(name)
        if op in (":-", "-"):
            use_default = is_empty if op == ":-" else not is_set
            return arg if use_default else env[name]
        if op in (":?", "?"):
            if is_empty if op == ":?" else not is_set:
                raise MissingVariableError(f"{name}: {arg}")
            return env[name]
        return env.get(name, "")

    return _INTERPOLATION.sub(substitute, value)


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """The `environment:` of a service as a dict, whether written as a map or a list."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in environment)
    return {key: "" if value is None else str(value) for key, value in environment.items()}


def depends_on_of(service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        return {name: {"condition": "service_started"} for name in depends_on}
    return dict(depends_on)


def command_words(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def listen_port(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def schema_errors(validator: Draft7Validator, document: Any) -> list[str]:
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.path))
    return ["/".join(map(str, error.path)) + f": {error.message}" for error in errors]


def package_roots() -> list[Path]:
    pyproject = tomllib.loads(PYPROJECT_FILE.read_text(encoding="utf-8"))
    wheres = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    return [ROOT / where for where in wheres]


def module_source(module: str) -> Path | None:
    """The source file of a dotted module under the package roots in pyproject.toml."""
    parts = module.split(".")
    for root in package_roots():
        for candidate in (
            root.joinpath(*parts).with_suffix(".py"),
            root.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file():
                return candidate
    return None


def top_level_names(source: Path) -> set[str]:
    """Names a module defines at top level: functions, classes, assignments, imports."""
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE_FILE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; `!` re-includes."""
    ignored = False
    prefixes = [str(Path(*Path(path).parts[: i + 1])) for i in range(len(Path(path).parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        globs = [glob, glob.removeprefix("**/")] if glob.startswith("**/") else [glob]
        if any(fnmatch.fnmatch(prefix, g) for prefix in prefixes for g in globs):
            ignored = not negated
    return ignored


# -------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return document


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> Draft7Validator:
    return Draft7Validator(schema)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


@pytest.fixture(scope="module")
def interpolated(compose: dict[str, Any]) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it with only the
    required variables set and every optional one left to its default."""
    document: dict[str, Any] = interpolate(
        compose, {name: f"<{name}>" for name in REQUIRED_VARIABLES}
    )
    return document


@pytest.fixture(scope="module")
def scripts() -> dict[str, str]:
    pyproject = tomllib.loads(PYPROJECT_FILE.read_text(encoding="utf-8"))
    scripts: dict[str, str] = pyproject["project"]["scripts"]
    return scripts


def build_of(service: Mapping[str, Any]) -> tuple[Path, Path, str | None]:
    """(context, Dockerfile, target) of a service built from source."""
    build = service["build"]
    if isinstance(build, str):
        build = {"context": build}
    context = (ROOT / build.get("context", ".")).resolve()
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    return context, dockerfile, build.get("target")


def container_command(service: Mapping[str, Any]) -> list[str]:
    """What the container runs: compose entrypoint/command over the image's ones."""
    _, dockerfile, target = build_of(service)
    entrypoint = command_words(service["entrypoint"]) if "entrypoint" in service else None
    command = command_words(service["command"]) if "command" in service else None
    return image_command(dockerfile, target, entrypoint, command)


# ------------------------------------------------ (a) the Compose Specification schema


def test_vendored_schema_is_the_draft07_compose_specification(schema: dict[str, Any]) -> None:
    assert schema["title"] == "Compose Specification"
    assert "draft-07" in schema["$schema"]
    Draft7Validator.check_schema(schema)
    # the properties the tests below rely on are closed: unknown keys are errors
    assert schema["additionalProperties"] is False
    assert schema["definitions"]["service"]["additionalProperties"] is False


def test_compose_file_conforms_to_the_compose_specification(
    validator: Draft7Validator, compose: dict[str, Any]
) -> None:
    # The raw file, before interpolation: `${VAR:?message}` stays a string, and the
    # schema accepts strings wherever the file uses interpolation.
    assert schema_errors(validator, compose) == []


def test_compose_file_still_conforms_once_variables_are_interpolated(
    validator: Draft7Validator, interpolated: dict[str, Any]
) -> None:
    assert schema_errors(validator, interpolated) == []


@pytest.mark.parametrize("variable", REQUIRED_VARIABLES)
def test_compose_refuses_to_start_without_a_required_variable(
    compose: dict[str, Any], variable: str
) -> None:
    env = {name: "set" for name in REQUIRED_VARIABLES if name != variable}
    with pytest.raises(MissingVariableError, match=variable):
        interpolate(compose, env)


def test_only_topology_gets_the_admin_token_and_it_has_no_default(
    services: dict[str, dict[str, Any]],
) -> None:
    token = environment_of(services["topology"])["THORN_ADMIN_TOKEN"]
    assert token.startswith("${THORN_ADMIN_TOKEN:?"), token
    for name in THORN_SERVICES:
        if name != "topology":
            assert "THORN_ADMIN_TOKEN" not in environment_of(services[name]), name


def _unknown_service_key(document: dict[str, Any]) -> None:
    document["services"]["topology"]["restart_policy"] = "always"


def _ports_not_a_list(document: dict[str, Any]) -> None:
    document["services"]["topology"]["ports"] = "8080:8080"


def _port_of_wrong_type(document: dict[str, Any]) -> None:
    document["services"]["topology"]["ports"] = [{"target": 8080, "published": [8080]}]


def _unknown_depends_on_condition(document: dict[str, Any]) -> None:
    document["services"]["health"]["depends_on"]["postgres"]["condition"] = "service_ready"


def _healthcheck_interval_as_number(document: dict[str, Any]) -> None:
    document["services"]["postgres"]["healthcheck"]["interval"] = 5


def _unknown_top_level_key(document: dict[str, Any]) -> None:
    document["service"] = document.pop("services")


def _environment_not_a_list_or_map(document: dict[str, Any]) -> None:
    document["services"]["pathcomp"]["environment"] = "THORN_LOG_LEVEL=debug"


def _cap_add_not_a_list(document: dict[str, Any]) -> None:
    document["services"]["programmer"]["cap_add"] = "NET_ADMIN"


def _invalid_service_name(document: dict[str, Any]) -> None:
    document["services"]["path comp"] = document["services"].pop("pathcomp")


def _unknown_volume_key(document: dict[str, Any]) -> None:
    document["volumes"]["pg-data"] = {"driver": "local", "size": "10G"}


@pytest.mark.parametrize(
    "breakage",
    [
        _unknown_service_key,
        _ports_not_a_list,
        _port_of_wrong_type,
        _unknown_depends_on_condition,
        _healthcheck_interval_as_number,
        _unknown_top_level_key,
        _environment_not_a_list_or_map,
        _cap_add_not_a_list,
        _invalid_service_name,
        _unknown_volume_key,
    ],
    ids=lambda breakage: breakage.__name__.strip("_"),
)
def test_a_broken_compose_file_is_rejected(
    validator: Draft7Validator,
    compose: dict[str, Any],
    breakage: Callable[[dict[str, Any]], None],
) -> None:
    assert schema_errors(validator, compose) == [], "the unbroken file must be valid"
    broken = copy.deepcopy(compose)
    breakage(broken)
    assert schema_errors(validator, broken) != []


def test_a_broken_file_on_disk_is_rejected(validator: Draft7Validator, tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        "services:\n"
        "  topology:\n"
        "    image: thorn-topology\n"
        "    ports: 8080\n"
        "    helthcheck:\n"
        "      test: [CMD, 'true']\n",
        encoding="utf-8",
    )
    errors = schema_errors(validator, load_compose(broken))
    assert any(error.startswith("services/topology/ports") for error in errors), errors
    assert any("helthcheck" in error for error in errors), errors


# ----------------------------------------- (b) each service runs a declared console script


@pytest.mark.parametrize(("service", "script"), THORN_SERVICES.items())
def test_each_thorn_service_runs_its_console_script(
    services: dict[str, dict[str, Any]], scripts: dict[str, str], service: str, script: str
) -> None:
    command = container_command(services[service])
    assert command, f"{service}: neither compose nor its Dockerfile target sets a command"
    assert command[0] in scripts, f"{service} runs {command[0]!r}, not a [project.scripts] entry"
    assert command[0] == script


def _script_params() -> Iterator[Any]:
    pyproject = tomllib.loads(PYPROJECT_FILE.read_text(encoding="utf-8"))
    for name, target in pyproject["project"]["scripts"].items():
        yield pytest.param(name, target, id=name)


@pytest.mark.parametrize(("script", "target"), list(_script_params()))
def test_console_script_target_resolves(script: str, target: str) -> None:
    match = re.fullmatch(r"(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)", target)
    assert match, f"{script} = {target!r} is not 'package.module:function'"
    module, attr = match["module"], match["attr"]

    source = module_source(module)
    assert source is not None, f"{script}: no source file for module {module} under {ROOT}"
    assert attr in top_level_names(source), f"{script}: {source} defines no {attr!r}"

    # and the interpreter finds that same module (the project is installed)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{script}: {module} is not importable"
    depth = len(module.split(".")) + (source.name == "__init__.py")
    assert Path(spec.origin).parts[-depth:] == source.parts[-depth:]


# --------------------------------------------------------------- (c) consistent wiring


@pytest.mark.parametrize("service", CONTROLLER_SERVICES)
def test_controller_services_reach_the_database_and_nats(
    interpolated: dict[str, Any], service: str
) -> None:
    environment = environment_of(interpolated["services"][service])
    assert environment["THORN_DATABASE_URL"] == EXPECTED_DATABASE_URL
    assert environment["THORN_NATS_URL"] == "nats://nats:4222"


def test_database_url_matches_the_postgres_service(interpolated: dict[str, Any]) -> None:
    postgres = environment_of(interpolated["services"]["postgres"])
    for service in CONTROLLER_SERVICES:
        url = urlsplit(environment_of(interpolated["services"][service])["THORN_DATABASE_URL"])
        assert url.scheme == "postgresql+psycopg"
        assert (url.hostname, url.port) == ("postgres", 5432)
        assert url.username == postgres["POSTGRES_USER"]
        assert url.password == postgres["POSTGRES_PASSWORD"]
        assert url.path == "/" + postgres["POSTGRES_DB"] == "/thorn"


@pytest.mark.parametrize("service", THORN_SERVICES)
def test_every_thorn_service_is_configured_through_thorn_variables(
    services: dict[str, dict[str, Any]], service: str
) -> None:
    environment = environment_of(services[service])
    for variable in ("THORN_NATS_URL", "THORN_LISTEN", "THORN_LOG_LEVEL"):
        assert environment.get(variable), f"{service} does not set {variable}"


@pytest.mark.parametrize("service", THORN_SERVICES)
def test_every_thorn_service_is_health_checked_on_its_listen_port(
    services: dict[str, dict[str, Any]], service: str
) -> None:
    port = listen_port(environment_of(services[service])["THORN_LISTEN"])
    probe = command_words(services[service]["healthcheck"]["test"])
    assert probe[0] == "CMD"
    # slim images have no curl: the probe is the image's own python
    assert probe[1] == "python", probe
    assert f"http://127.0.0.1:{port}/healthz" in " ".join(probe)


def test_the_entry_point_alone_publishes_the_api_on_8080(
    services: dict[str, dict[str, Any]],
) -> None:
    gateway = services["gateway"]
    assert container_command(gateway) == ["thorn-gateway"]
    assert listen_port(environment_of(gateway)["THORN_LISTEN"]) == 8080
    assert any(str(port).endswith(":8080") for port in gateway["ports"])
    for name in CONTROLLER_SERVICES:
        assert "ports" not in services[name], f"{name} publishes a port beside the entry point"


def test_the_entry_point_reaches_every_service_of_its_route_table(
    interpolated: dict[str, Any],
) -> None:
    services = interpolated["services"]
    upstreams = Settings(upstreams=environment_of(services["gateway"])["THORN_UPSTREAMS"])
    for name in RouteTable.load().services:
        port = listen_port(environment_of(services[name])["THORN_LISTEN"])
        assert upstreams.upstream_urls.get(name) == (f"http://{name}:{port}",), name


def test_programmer_agent_programs_the_host_datapath(interpolated: dict[str, Any]) -> None:
    programmer = interpolated["services"]["programmer"]
    environment = environment_of(programmer)
    assert programmer["network_mode"] == "host"
    assert {"NET_ADMIN", "NET_RAW"} <= set(programmer["cap_add"])
    assert environment["THORN_NODE_NAME"] == "<THORN_NODE_NAME>"
    # in the host network namespace compose DNS names do not resolve: NATS is
    # reached through the port it publishes on the loopback interface
    assert environment["THORN_NATS_URL"] == "nats://127.0.0.1:4222"
    assert "127.0.0.1:4222:4222" in interpolated["services"]["nats"]["ports"]
    assert "ports" not in programmer, "host networking publishes nothing"


def nats_server_arguments(service: Mapping[str, Any], tmp_path: Path) -> list[str]:
    """The arguments a NATS service starts nats-server with: its command run by a real
    /bin/sh in its environment (interpolated), with a `nats-server` on PATH that prints
    them instead of serving."""
    shim = tmp_path / "nats-server"
    shim.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    shim.chmod(0o755)
    environment = {**environment_of(service), "PATH": f"{tmp_path}:/usr/bin:/bin"}
    done = subprocess.run(
        command_words(service["command"]), env=environment, capture_output=True, text=True,
        check=True, timeout=10,
    )  # fmt: skip
    return done.stdout.splitlines()


def option(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


def test_nats_runs_jetstream_alone_with_a_persistent_store_and_monitoring(
    interpolated: dict[str, Any], tmp_path: Path
) -> None:
    nats = interpolated["services"]["nats"]
    assert nats["image"].startswith("nats:")
    arguments = nats_server_arguments(nats, tmp_path)
    assert "-js" in arguments and option(arguments, "--name") == "nats"
    assert option(arguments, "-m") == "8222"
    assert any(volume.endswith(f":{option(arguments, '-sd')}") for volume in nats["volumes"])
    assert "8222/healthz" in " ".join(command_words(nats["healthcheck"]["test"]))
    # One server: no cluster block, which without peers would keep JetStream from starting.
    assert not {"--cluster", "--cluster_name", "--routes"} & set(arguments), arguments


def test_postgres_is_16_with_a_persistent_volume_and_pg_isready(
    services: dict[str, dict[str, Any]],
) -> None:
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:16")
    assert any(volume.endswith(":/var/lib/postgresql/data") for volume in postgres["volumes"])
    assert "pg_isready" in " ".join(command_words(postgres["healthcheck"]["test"]))


def test_depends_on_targets_exist_and_health_conditions_have_healthchecks(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for dependency, options in depends_on_of(service).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            assert dependency != name
            if options.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


def test_thorn_services_wait_for_healthy_infrastructure(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in THORN_SERVICES:
        depends_on = depends_on_of(services[name])
        assert depends_on["nats"]["condition"] == "service_healthy", name
        if name in CONTROLLER_SERVICES:
            assert depends_on["postgres"]["condition"] == "service_healthy", name


def test_named_volumes_are_declared_and_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used: set[str] = set()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            if isinstance(volume, dict):
                source = volume.get("source") if volume.get("type") == "volume" else None
            else:
                source = volume.split(":", 1)[0] if ":" in volume else None
            if source and not source.startswith((".", "/", "~", "$")):
                assert source in declared, f"{name} uses undeclared volume {source}"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {declared - used}"


@pytest.mark.parametrize("service", THORN_SERVICES)
def test_thorn_services_are_built_from_an_existing_dockerfile_target(
    services: dict[str, dict[str, Any]], service: str
) -> None:
    context, dockerfile, target = build_of(services[service])
    assert context == ROOT, "the build context is the repository root (pip install .)"
    assert dockerfile.is_file(), f"{service}: {dockerfile} does not exist"
    assert dockerfile.is_relative_to(ROOT / "deploy")
    stage_names = [stage.name for stage in parse_dockerfile(dockerfile)]
    assert target in stage_names, f"{service}: no stage {target!r} in {dockerfile}"


def test_every_referenced_dockerfile_exists(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert "build" in service or "image" in service, name
        if "build" in service:
            assert build_of(service)[1].is_file(), name


# ------------------------------------------------------------------- the Dockerfile


@pytest.mark.parametrize("service", THORN_SERVICES)
def test_images_run_unprivileged_except_the_programmer(
    services: dict[str, dict[str, Any]], service: str
) -> None:
    _, dockerfile, target = build_of(services[service])
    stages = parse_dockerfile(dockerfile)
    user = effective(stages, target, "USER")
    if service == "programmer":
        assert user in (None, "root", "0", "0:0"), "netlink programming needs root"
    else:
        assert user not in (None, "root", "0", "0:0"), f"{service} must not run as root"
    assert stage_chain(stages, target)[-1].base == "python:3.11-slim"


def test_the_image_installs_the_project_from_the_repository_root() -> None:
    stages = parse_dockerfile(ROOT / "deploy" / "Dockerfile")
    runs = [arguments for stage in stages for _, arguments in stage.instructions]
    assert any(re.search(r"pip install (\S+ )*\.$", run) for run in runs)
    copied = {
        arguments.split()[0]
        for stage in stages
        for keyword, arguments in stage.instructions
        if keyword == "COPY" and not arguments.startswith("--from")
    }
    assert {"pyproject.toml", "libs/", "services/"} <= copied


def test_dockerignore_keeps_local_state_out_and_build_inputs_in() -> None:
    patterns = dockerignore_patterns()
    for excluded in (".venv", ".git", ".env", "libs/thorn/__pycache__", "thorn.egg-info",
                     "services/gateway/dashboard/node_modules",
                     "services/gateway/dashboard/dist"):  # fmt: skip
        assert is_dockerignored(excluded, patterns), f"{excluded} reaches the build context"
    for needed in ("pyproject.toml", "libs/thorn/__init__.py", "services/topology",
                   "openapi/openapi.json", "services/gateway/dashboard/src/main.ts",
                   "services/gateway/dashboard/package-lock.json"):  # fmt: skip
        assert not is_dockerignored(needed, patterns), f"{needed} is excluded from the build"


def test_the_images_do_not_ship_the_lab_or_the_launcher() -> None:
    """Production images: the services and thornctl, not the development tools."""
    patterns = dockerignore_patterns()
    for tool in ("libs/thorn_lab/build.py", "libs/thorn_run/launcher.py"):
        assert is_dockerignored(tool, patterns), f"{tool} would be installed in the images"
    for shipped in ("libs/thorn/bus.py", "libs/thornctl/main.py"):
        assert not is_dockerignored(shipped, patterns), shipped


def test_no_service_needs_the_lab_or_the_launcher_to_import() -> None:
    """Only the programmer's lab mode reaches for the lab, inside a function that says what
    is missing when it is not installed."""
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "libs" / "thorn").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: what importing the service runs
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
            assert not any(n.split(".")[0] in ("thorn_lab", "thorn_run") for n in names), path


def test_the_gateway_image_serves_the_dashboard_built_from_its_sources() -> None:
    stages = {s.name: s for s in parse_dockerfile(ROOT / "deploy" / "Dockerfile")}
    built = stages["dashboard"]
    assert built.base.startswith("node:"), built.base  # the official Node.js image
    runs = [a for k, a in built.instructions if k == "RUN"]
    assert "npm ci --no-audit --no-fund" in runs and "npm run build" in runs
    gateway = dict(stages["gateway"].instructions)
    copied = [a for k, a in stages["gateway"].instructions if k == "COPY"]
    assert any(a.startswith("--from=dashboard ") and a.endswith(" /opt/thorn/dashboard")
               for a in copied), copied  # fmt: skip
    assert "THORN_DASHBOARD_DIR=/opt/thorn/dashboard" in gateway["ENV"]
    # The build script generates the client from the API document before building.
    package = json.loads((ROOT / "services/gateway/dashboard/package.json").read_text())
    assert "openapi-typescript ../../../openapi/openapi.json" in package["scripts"]["gen"]
    assert package["scripts"]["build"].startswith("npm run gen")


# -------------------------------------------------------------- the cluster profile

CLUSTER_ENV_FILE = ROOT / "deploy" / "cluster.env"
CLUSTER_ONLY = {"nats-2", "nats-3", "pathcomp-2"}


def env_file(path: Path) -> dict[str, str]:
    """A compose env file: KEY=VALUE lines, comments and blank lines ignored."""
    pairs = (line.split("=", 1) for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#"))  # fmt: skip
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="module")
def cluster(compose: dict[str, Any]) -> dict[str, Any]:
    """The compose file as `--profile cluster --env-file deploy/cluster.env` sees it."""
    env = {**{name: f"<{name}>" for name in REQUIRED_VARIABLES}, **env_file(CLUSTER_ENV_FILE)}
    document: dict[str, Any] = interpolate(compose, env)
    return document


def nats_servers(services: Mapping[str, Any]) -> list[str]:
    return [name for name, service in services.items() if service["image"].startswith("nats:")]


def test_the_cluster_profile_adds_two_nats_servers_and_a_pathcomp_replica(
    services: dict[str, dict[str, Any]],
) -> None:
    profiled = {name for name, service in services.items() if "profiles" in service}
    assert profiled == CLUSTER_ONLY
    assert all(services[name]["profiles"] == ["cluster"] for name in profiled)
    assert env_file(CLUSTER_ENV_FILE)["COMPOSE_PROFILES"] == "cluster"
    assert sorted(nats_servers(services)) == ["nats", "nats-2", "nats-3"]
    replicas = [
        name for name, s in services.items() if s.get("build", {}).get("target") == "pathcomp"
    ]
    assert replicas == ["pathcomp", "pathcomp-2"]
    # The replica is the same service: only its profile differs.
    assert {k: v for k, v in services["pathcomp-2"].items() if k != "profiles"} == services[
        "pathcomp"
    ]


def test_the_cluster_profile_conforms_to_the_compose_specification(
    validator: Draft7Validator, cluster: dict[str, Any]
) -> None:
    assert schema_errors(validator, cluster) == []


def test_the_cluster_nats_servers_route_to_each_other_under_names_of_their_own(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    services = cluster["services"]
    names = nats_servers(services)
    routes = {f"nats://{name}:6222" for name in names}
    volumes = set()
    for name in names:
        arguments = nats_server_arguments(services[name], tmp_path)
        assert "-js" in arguments and option(arguments, "--name") == name
        assert option(arguments, "--cluster_name") == "thorn"
        assert option(arguments, "--cluster") == "nats://0.0.0.0:6222"
        # every server is given all three; nats-server skips the route to itself
        assert set(option(arguments, "--routes").split(",")) == routes
        volumes.update(services[name]["volumes"])
    assert len(volumes) == len(names), "each server keeps its own JetStream store"


@pytest.mark.parametrize("service", ["topology", "health", "pathcomp", "pathcomp-2"])
def test_cluster_services_use_the_seed_list_and_three_copies(
    cluster: dict[str, Any], service: str
) -> None:
    services = cluster["services"]
    environment = environment_of(services[service])
    seeds = environment["THORN_NATS_URL"].split(",")
    assert sorted(seeds) == sorted(f"nats://{name}:4222" for name in nats_servers(services))
    settings = Settings(
        nats_url=environment["THORN_NATS_URL"], nats_replicas=environment["THORN_NATS_REPLICAS"]
    )
    assert settings.nats_replicas == 3 == len(nats_servers(services))


def test_the_cluster_agent_reaches_every_nats_server_on_its_loopback_port(
    cluster: dict[str, Any],
) -> None:
    services = cluster["services"]
    environment = environment_of(services["programmer"])
    published = {
        port.rsplit(":", 1)[0]
        for name in nats_servers(services)
        for port in services[name]["ports"]
    }
    assert sorted(published) == ["127.0.0.1:4222", "127.0.0.1:4223", "127.0.0.1:4224"]
    urls = {url.removeprefix("nats://") for url in environment["THORN_NATS_URL"].split(",")}
    assert urls == published
    assert environment["THORN_NATS_REPLICAS"] == "3"


def test_the_cluster_entry_point_spreads_pathcomp_over_both_replicas(
    cluster: dict[str, Any],
) -> None:
    services = cluster["services"]
    upstreams = Settings(upstreams=environment_of(services["gateway"])["THORN_UPSTREAMS"])
    assert upstreams.upstream_urls["pathcomp"] == (
        "http://pathcomp:8082", "http://pathcomp-2:8082")  # fmt: skip
    for name in RouteTable.load().services:
        assert f"http://{name}:" in upstreams.upstream_urls[name][0]


def test_one_nats_server_and_one_copy_without_the_profile(interpolated: dict[str, Any]) -> None:
    services = interpolated["services"]
    for name in [*CONTROLLER_SERVICES, "programmer"]:
        assert environment_of(services[name])["THORN_NATS_REPLICAS"] == "1", name


# ------------------------------------------------ podman, without a registry

PODMAN_OVERRIDE = ROOT / "deploy" / "podman" / "compose.yml"
BASE_IMAGE = "localhost/thorn-base:bookworm"


def merged(base: Any, override: Any) -> Any:
    """Compose's merge of an override file, for what deploy/podman/compose.yml sets:
    mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: merged(base[k], v) if k in base else v for k, v in override.items()} | {
            k: v for k, v in base.items() if k not in override
        }
    return override


@pytest.fixture(scope="module")
def podman_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    document = merged(compose, load_compose(PODMAN_OVERRIDE))
    podman: dict[str, dict[str, Any]] = document["services"]
    return podman


def test_the_podman_override_conforms_alone_and_merged(
    validator: Draft7Validator, compose: dict[str, Any]
) -> None:
    override = load_compose(PODMAN_OVERRIDE)
    assert schema_errors(validator, override) == []
    assert schema_errors(validator, merged(compose, override)) == []
    assert set(override["services"]) == set(compose["services"]), "every service, every profile"


def test_under_podman_every_image_is_built_here_and_never_pulled(
    podman_services: dict[str, dict[str, Any]],
) -> None:
    for name, service in podman_services.items():
        assert service["image"].startswith("localhost/"), name
        assert service["pull_policy"] == "never", name
        _, dockerfile, _ = build_of(service)
        assert dockerfile.is_relative_to(ROOT / "deploy" / "podman"), name
        stages = parse_dockerfile(dockerfile)
        assert {stage.base for stage in stages} - {s.name for s in stages} == {"${BASE}"}, name
        assert f"ARG BASE={BASE_IMAGE}" in dockerfile.read_text(encoding="utf-8"), name
        assert service["build"]["args"]["BASE"] == BASE_IMAGE, name


def env_of_target(dockerfile: Path, target: str) -> dict[str, str]:
    """The ENV a target's image ends up with (its stages' ENV instructions, in order)."""
    stages = parse_dockerfile(dockerfile)
    environment: dict[str, str] = {}
    for stage in reversed(stage_chain(stages, target)):
        for keyword, arguments in stage.instructions:
            if keyword == "ENV":
                environment.update(word.split("=", 1) for word in shlex.split(arguments))
    return environment


@pytest.mark.parametrize("service", [*THORN_SERVICES, "gateway"])
def test_podman_images_are_the_dockerfile_targets_on_another_base(
    services: dict[str, dict[str, Any]], podman_services: dict[str, dict[str, Any]], service: str
) -> None:
    """Same target, command, user, ports and THORN settings: only the base (and where the
    dependencies and the dashboard come from) differs."""
    _, docker, target = build_of(services[service])
    _, podman, podman_target = build_of(podman_services[service])
    assert podman_target == target
    docker_stages, podman_stages = parse_dockerfile(docker), parse_dockerfile(podman)
    for keyword in ("CMD", "ENTRYPOINT", "USER", "EXPOSE", "WORKDIR"):
        assert effective(podman_stages, target, keyword) == effective(
            docker_stages, target, keyword
        ), keyword
    runtime = ("PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")
    docker_env, podman_env = env_of_target(docker, target), env_of_target(podman, target)
    for name in [*runtime, *(n for n in docker_env if n.startswith("THORN_"))]:
        assert podman_env.get(name) == docker_env[name], name


def test_podman_builds_take_their_wheels_and_dashboard_where_the_scripts_put_them(
    podman_services: dict[str, dict[str, Any]],
) -> None:
    wheels = re.search(
        r"OUT=\$\{THORN_WHEELS:-([^}]+)\}", (ROOT / "deploy/podman/wheels.sh").read_text()
    )
    assert wheels is not None
    for name, service in podman_services.items():
        contexts = service["build"].get("additional_contexts", {})
        if name != "postgres":
            assert contexts["wheels"] == wheels[1], name
        if name in THORN_SERVICES or name == "gateway":
            # what `make dashboard` builds; deploy/Dockerfile builds it with node:20 instead
            assert contexts["dashboard"] == "services/gateway/dashboard/dist", name


# ------------------------------------------------ TLS: deploy/compose.tls.yml

TLS_OVERRIDE = ROOT / "deploy" / "compose.tls.yml"
NATS_CLIENTS = (*CONTROLLER_SERVICES, "pathcomp-2", "programmer")
SECRETS_DIR = "/run/secrets/"


@pytest.fixture(scope="module")
def tls_override() -> dict[str, Any]:
    return load_compose(TLS_OVERRIDE)


def as_the_cluster_profile(compose: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml with `override` merged, as the cluster profile sees it."""
    env = {**{name: f"<{name}>" for name in REQUIRED_VARIABLES}, **env_file(CLUSTER_ENV_FILE)}
    document: dict[str, Any] = interpolate(merged(compose, override), env)
    return document


@pytest.fixture(scope="module")
def with_tls(compose: dict[str, Any], tls_override: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml with the TLS override merged, as the cluster profile sees it."""
    return as_the_cluster_profile(compose, tls_override)


def mounted_secrets(service: Mapping[str, Any]) -> dict[str, str]:
    """The secrets a service mounts: their paths in the container -> the secret's name."""
    found = {}
    for entry in service.get("secrets", []):
        name = entry if isinstance(entry, str) else entry["source"]
        target = name if isinstance(entry, str) else entry.get("target", name)
        found[target if target.startswith("/") else SECRETS_DIR + target] = name
    return found


def test_the_tls_override_conforms_alone_and_merged(
    validator: Draft7Validator, compose: dict[str, Any], tls_override: dict[str, Any]
) -> None:
    assert schema_errors(validator, tls_override) == []
    assert schema_errors(validator, merged(compose, tls_override)) == []
    assert set(tls_override["services"]) <= set(compose["services"]), "it adds no service"


def test_the_tls_secrets_are_the_files_local_ca_writes_and_stay_out_of_git(
    with_tls: dict[str, Any],
) -> None:
    from thorn.local_ca import LocalCA

    written = LocalCA(Path("./deploy/tls"), issued=False)
    files = {name: secret["file"] for name, secret in with_tls["secrets"].items()}
    assert files == {"thorn-tls-ca": f"./{written.ca}", "thorn-tls-cert": f"./{written.cert}",
                     "thorn-tls-key": f"./{written.key}"}  # fmt: skip
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/tls/server-key.pem"],
                             cwd=ROOT, check=False)  # fmt: skip
    assert ignored.returncode == 0, "deploy/tls/ (keys) must be in .gitignore"


@pytest.mark.parametrize("service", NATS_CLIENTS)
def test_every_nats_client_verifies_the_servers_with_the_ca_secret(
    with_tls: dict[str, Any], service: str
) -> None:
    container = with_tls["services"][service]
    ca = environment_of(container)["THORN_NATS_CA"]
    assert mounted_secrets(container)[ca] == "thorn-tls-ca"
    assert Settings(nats_ca=ca).nats_ca == Path(ca)
    assert "THORN_TLS_KEY" not in environment_of(container), "only the entry point has a key"


def test_the_entry_point_serves_https_with_the_certificate_secrets_and_checks_it(
    with_tls: dict[str, Any],
) -> None:
    gateway = with_tls["services"]["gateway"]
    environment, mounted = environment_of(gateway), mounted_secrets(gateway)
    assert mounted[environment["THORN_TLS_CERT"]] == "thorn-tls-cert"
    assert mounted[environment["THORN_TLS_KEY"]] == "thorn-tls-key"
    check = " ".join(gateway["healthcheck"]["test"])
    assert "https://127.0.0.1:8080/healthz" in check
    ca_path = next(path for path, name in mounted.items() if name == "thorn-tls-ca")
    assert f"cafile='{ca_path}'" in check
    # the rest of the entry point is the plain file's: same upstreams, same port
    assert environment["THORN_UPSTREAMS"].startswith("topology=http://topology:8080")


@pytest.mark.parametrize("server", ["nats", "nats-2", "nats-3"])
def test_every_nats_server_loads_a_tls_configuration_nats_server_accepts(
    with_tls: dict[str, Any], server: str, tmp_path: Path
) -> None:
    """Its command reads the configuration first and keeps the cluster flags; the
    configuration's files are the secrets it mounts; the real nats-server, given files from
    thorn.local_ca in their place, says the configuration is valid."""
    from thorn import local_ca
    from thorn.natsd import find_nats_server

    service = with_tls["services"][server]
    arguments = nats_server_arguments(service, tmp_path)
    config_path = option(arguments, "-c")
    assert option(arguments, "--cluster") == "nats://0.0.0.0:6222"
    (config,) = [c for c in service["configs"] if c["target"] == config_path]
    text = with_tls["configs"][config["source"]]["content"]
    paths = set(re.findall(r'"(/run/secrets/[^"]+)"', text))
    mounted = mounted_secrets(service)
    assert paths == set(mounted), "every file it names is a secret it mounts"
    assert re.search(r"cluster \{\s*tls \{[^}]*verify: true", text), "routes are verified"
    made = local_ca.ensure(tmp_path / "tls", ["nats", "nats-2", "nats-3"])
    files = {"thorn-tls-ca": made.ca, "thorn-tls-cert": made.cert, "thorn-tls-key": made.key}
    for path, name in mounted.items():
        text = text.replace(f'"{path}"', f'"{files[name]}"')
    local = tmp_path / "tls.conf"
    local.write_text(text)
    checked = subprocess.run([str(find_nats_server()), "-c", str(local), "-t"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ------------------------------------------------ NATS identities: deploy/compose.auth.yml

AUTH_OVERRIDE = ROOT / "deploy" / "compose.auth.yml"
AUTH_CLIENTS = {"topology": "thorn-nats-topology", "health": "thorn-nats-health",
                "pathcomp": "thorn-nats-pathcomp", "pathcomp-2": "thorn-nats-pathcomp"}  # fmt: skip


@pytest.fixture(scope="module")
def auth_override() -> dict[str, Any]:
    return load_compose(AUTH_OVERRIDE)


@pytest.fixture(scope="module")
def with_auth(compose: dict[str, Any], auth_override: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml with the auth override merged, as the cluster profile sees it."""
    return as_the_cluster_profile(compose, auth_override)


def test_the_auth_override_conforms_alone_and_merged(
    validator: Draft7Validator, compose: dict[str, Any], auth_override: dict[str, Any]
) -> None:
    assert schema_errors(validator, auth_override) == []
    assert schema_errors(validator, merged(compose, auth_override)) == []
    assert set(auth_override["services"]) <= set(compose["services"]), "it adds no service"


def test_the_auth_secrets_are_the_files_thornctl_bus_init_writes_and_stay_out_of_git(
    with_auth: dict[str, Any], tmp_path: Path
) -> None:
    from thorn.natsauth import permissions
    from thorn.natsauth.files import AuthDir

    written = AuthDir.open(tmp_path / "nats-auth")
    written.write_server_config(now=1_800_000_000.0)
    for role in permissions.SERVICES:  # as `thornctl bus init` does
        written.write_creds(permissions.service(role), now=1.8e9, lifetime=60, name=role)
    expected = {
        "thorn-nats-auth": written.server_config, "thorn-nats-issuer": written.issuer_seeds,
        **{secret: written.creds_path(service.removesuffix("-2"))
           for service, secret in AUTH_CLIENTS.items()},
    }  # fmt: skip
    files = {name: secret["file"] for name, secret in with_auth["secrets"].items()}
    assert files == {name: "./deploy/nats-auth/" + str(path.relative_to(written.path))
                     for name, path in expected.items()}  # fmt: skip
    assert all(path.exists() for path in expected.values())
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/nats-auth/signing.seed"],
                             cwd=ROOT, check=False)  # fmt: skip
    assert ignored.returncode == 0, "deploy/nats-auth/ (keys) must be in .gitignore"


@pytest.mark.parametrize("service", sorted(AUTH_CLIENTS))
def test_every_controller_connects_with_its_own_creds_secret(
    with_auth: dict[str, Any], service: str
) -> None:
    container = with_auth["services"][service]
    environment = environment_of(container)
    mounted = mounted_secrets(container)
    assert mounted[environment["THORN_NATS_CREDS"]] == AUTH_CLIENTS[service]
    if service == "topology":
        assert mounted[environment["THORN_NATS_ISSUER_SEED"]] == "thorn-nats-issuer"
    else:
        assert "THORN_NATS_ISSUER_SEED" not in environment, "only topology issues credentials"
    assert "thorn-nats-auth" not in mounted.values(), "the servers' file is theirs"
    assert Settings(nats_creds=environment["THORN_NATS_CREDS"]).nats_creds is not None


def test_the_agent_reads_its_node_s_creds_from_a_directory_it_may_write(
    with_auth: dict[str, Any],
) -> None:
    agent = with_auth["services"]["programmer"]
    creds = Path(environment_of(agent)["THORN_NATS_CREDS"])
    assert creds.name == "<THORN_NODE_NAME>.creds"
    (mount,) = [v for v in agent["volumes"] if v.split(":")[1] == str(creds.parent)]
    assert mount == f"./deploy/nats-auth/creds/agents:{creds.parent}", "bind mount, writable"
    assert not agent.get("secrets"), "a secret would be read-only: renewal writes beside it"


@pytest.mark.parametrize("server", ["nats", "nats-2", "nats-3"])
def test_every_nats_server_loads_the_operator_configuration_nats_server_accepts(
    with_auth: dict[str, Any], server: str, tmp_path: Path
) -> None:
    """Its command writes the secret's configuration (and the TLS override's, if given) to
    the file it starts with and keeps the cluster flags; the real nats-server, given what
    `thornctl bus init` wrote, says that configuration is valid."""
    from thorn.natsauth.files import AuthDir
    from thorn.natsd import find_nats_server

    service = with_auth["services"][server]
    arguments = nats_server_arguments(service, tmp_path)
    assert option(arguments, "-c") == "/tmp/nats.conf"
    assert option(arguments, "--cluster") == "nats://0.0.0.0:6222"
    assert "cat /run/secrets/thorn-nats-auth" in " ".join(command_words(service["command"]))
    assert mounted_secrets(service) == {"/run/secrets/thorn-nats-auth": "thorn-nats-auth"}
    written = AuthDir.open(tmp_path / "nats-auth")
    config = written.write_server_config(now=1_800_000_000.0)
    checked = subprocess.run([str(find_nats_server()), "-c", str(config), "-t"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ------------------------------------- BFD authentication: deploy/compose.bfdauth.yml

BFD_AUTH_OVERRIDE = ROOT / "deploy" / "compose.bfdauth.yml"


@pytest.fixture(scope="module")
def bfd_auth_override() -> dict[str, Any]:
    return load_compose(BFD_AUTH_OVERRIDE)


def test_the_bfd_auth_override_conforms_alone_and_merged_with_the_others(
    validator: Draft7Validator, compose: dict[str, Any], bfd_auth_override: dict[str, Any]
) -> None:
    assert schema_errors(validator, bfd_auth_override) == []
    together = merged(merged(merged(compose, load_compose(TLS_OVERRIDE)),
                             load_compose(AUTH_OVERRIDE)), bfd_auth_override)  # fmt: skip
    for document in (merged(compose, bfd_auth_override), together):
        assert schema_errors(validator, document) == []
    assert set(bfd_auth_override["services"]) == {"programmer"}, "the keys stay with the agent"


def test_with_bfd_auth_the_agent_reads_its_rules_from_a_file_kept_out_of_git(
    compose: dict[str, Any], bfd_auth_override: dict[str, Any]
) -> None:
    document = as_the_cluster_profile(compose, bfd_auth_override)
    agent = document["services"]["programmer"]
    path = environment_of(agent)["THORN_BFD_AUTH_FILE"]
    assert mounted_secrets(agent)[path] == "thorn-bfd-auth"
    assert Settings(bfd_auth_file=path).bfd_auth_file == Path(path)
    assert document["secrets"]["thorn-bfd-auth"] == {"file": "./deploy/bfd-auth.toml"}
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/bfd-auth.toml"],
                             cwd=ROOT, check=False)  # fmt: skip
    assert ignored.returncode == 0, "deploy/bfd-auth.toml (keys) must be in .gitignore"
    with_tls = as_the_cluster_profile(merged(compose, load_compose(TLS_OVERRIDE)),
                                      bfd_auth_override)  # fmt: skip
    assert environment_of(with_tls["services"]["programmer"])["THORN_NATS_CA"], "both kept"
