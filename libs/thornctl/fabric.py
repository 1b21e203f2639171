"""thornctl import, export, generate and generators: replace or read the whole fabric."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TransferSpeedColumn,
)

from thornctl.client import API
from thornctl.context import State, state_of
from thornctl.errors import CliError, ExitCode
from thornctl.files import Document, InputFormat, load_document, write_text
from thornctl.render import Out, OutputFormat, spinner, to_json, to_yaml

UPLOAD_CHUNK = 256 * 1024

commands = typer.Typer()  # its top-level commands, added to thornctl's root by main.py


# --- import, export, generate ----------------------------------------------------------------


def _upload(state: State, doc: Document, path: str, dry_run: bool) -> dict[str, Any]:
    """POST the document; on a terminal, show upload progress and then a spinner on stderr."""
    params = {"dry_run": "true"} if dry_run else {}
    headers = {"Content-Type": doc.content_type}
    if not state.out.stderr_is_terminal:
        result: dict[str, Any] = state.client.request(
            "POST", f"{API}{path}", params=params, content=doc.body, headers=headers
        )
        return result
    size = len(doc.body)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=state.out.err, transient=True) as progress:
        task = progress.add_task(f"uploading {doc.name}", total=size)

        def chunks() -> Iterator[bytes]:
            for start in range(0, size, UPLOAD_CHUNK):
                chunk = doc.body[start : start + UPLOAD_CHUNK]
                yield chunk
                progress.advance(task, len(chunk))
            what = "validating" if dry_run else "validating and storing"
            progress.update(task, description=f"{what} (server side)")

        result = state.client.request(
            "POST",
            f"{API}{path}",
            params=params,
            content=chunks(),
            headers={**headers, "Content-Length": str(size)},
        )
    return result


def _show_import(out: Out, result: dict[str, Any], what: str) -> None:
    if out.data(result):
        return
    summary = result["summary"]
    if result.get("dry_run"):
        title = f"Dry run of {what}: valid; nothing changed (revision {summary['revision']})"
    else:
        title = f"Imported {what}: the fabric is now revision {summary['revision']}"
    out.fields([(k, v) for k, v in summary.items() if k != "revision"], title=title)
    warnings: list[str] = result.get("warnings") or []
    for warning in warnings:
        out.warn(warning)
    if warnings:
        out.note(f"{len(warnings)} warning(s): the items above were skipped")


@commands.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="THORN document (.json/.yaml) or containerlab file (.clab.yml); '-' is stdin.",
            show_default=False,
        ),
    ],
    fmt: Annotated[
        InputFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="auto: containerlab for *.clab.yml/yaml or a top-level 'topology:' key.",
        ),
    ] = InputFormat.auto,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate on the server; change nothing.")
    ] = False,
) -> None:
    """Replace the whole fabric with FILE (all or nothing; admin role)."""
    state = state_of(ctx)
    doc = load_document(file, fmt)
    path = "/fabric/import/containerlab" if doc.kind is InputFormat.clab else "/fabric/import"
    result = _upload(state, doc, path, dry_run)
    _show_import(state.out, result, doc.name)


@commands.command()
def export(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Write here (atomically) instead of stdout."),
    ] = None,
    as_yaml: Annotated[
        bool,
        typer.Option("--yaml", help="YAML instead of JSON (default for a .yaml/.yml --file)."),
    ] = False,
) -> None:
    """Print (or write) the whole fabric as a document `import` accepts."""
    state = state_of(ctx)
    document: dict[str, Any] = state.client.get("/fabric")
    yaml_wanted = (
        as_yaml
        or state.out.fmt is OutputFormat.yaml
        or (file is not None and file.suffix.lower() in (".yaml", ".yml"))
    )
    text = to_yaml(document) if yaml_wanted else to_json(document) + "\n"
    if file is None:
        typer.echo(text, nl=False)
        return
    write_text(file, text)
    nodes, links = len(document.get("nodes", [])), len(document.get("links", []))
    state.out.line(
        f"Exported revision {document.get('revision')} ({nodes} nodes, {links} links) to {file}"
    )


_INT = re.compile(r"[+-]?\d+")


def parse_value(raw: str) -> bool | int | str:
    """A --set value: true/false are booleans, whole numbers integers, the rest strings."""
    text = raw.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    return raw


def parse_sets(items: list[str]) -> dict[str, bool | int | str]:
    params: dict[str, bool | int | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise typer.BadParameter(f"'{item}' is not KEY=VALUE", param_hint="--set")
        if key in params:
            raise typer.BadParameter(f"'{key}' is given twice", param_hint="--set")
        params[key] = parse_value(raw)
    return params


def _generator_list(state: State) -> list[dict[str, Any]]:
    """Generators and their parameters, from the server's OpenAPI document.

    A server that does not publish /openapi.json (404) gets this client's own registry.
    """
    try:
        spec: dict[str, Any] = state.client.request("GET", "/openapi.json")
    except CliError as exc:
        if exc.status != 404:
            raise
        return _local_generators()
    schemas: dict[str, Any] = spec.get("components", {}).get("schemas", {})
    prefix = f"{API}/fabric/generate/"
    found = []
    for path, item in sorted(spec.get("paths", {}).items()):
        if not path.startswith(prefix):
            continue
        body = item.get("post", {}).get("requestBody", {}).get("content", {})
        schema = body.get("application/json", {}).get("schema", {})
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            schema = schemas.get(ref.rsplit("/", 1)[1], {})
        found.append(_generator_info(path[len(prefix) :], schema))
    return found


def _local_generators() -> list[dict[str, Any]]:
    from thorn.generators import GENERATORS

    return [
        _generator_info(name.replace("_", "-"), entry.params.model_json_schema())
        for name, entry in sorted(GENERATORS.items())
    ]


def _generator_info(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    wanted = ("type", "default", "minimum", "maximum", "description")
    parameters = {
        param: {k: _whole(prop[k]) for k in wanted if k in prop}
        for param, prop in schema.get("properties", {}).items()
    }
    return {"name": name, "description": schema.get("description", ""), "parameters": parameters}


def _whole(value: Any) -> Any:
    # OpenAPI renders integer bounds as 256.0.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _show_generators(state: State, only: str | None) -> None:
    generators = _generator_list(state)
    if only is not None:
        wanted = only.replace("_", "-")
        generators = [g for g in generators if g["name"] == wanted]
        if not generators:
            raise CliError(_unknown_generator(only, _generator_list(state)), ExitCode.USAGE)
    if state.out.data(generators):
        return
    rows = []
    for g in generators:
        for i, (param, p) in enumerate(g["parameters"].items()):
            low, high = p.get("minimum"), p.get("maximum")
            bounds = f"{low}..{high}" if low is not None or high is not None else ""
            default = p.get("default")
            rows.append(
                [
                    g["name"] if i == 0 else "",
                    param,
                    p.get("type", ""),
                    str(default).lower() if isinstance(default, bool) else default,
                    bounds.replace("None", ""),
                    p.get("description", ""),
                ]
            )
    state.out.table(
        ["GENERATOR", "PARAMETER", "TYPE", "DEFAULT", "RANGE", "DESCRIPTION"],
        rows,
        caption="thornctl generate NAME --set PARAMETER=VALUE ...",
        no_wrap=2,
    )


def _unknown_generator(name: str, known: list[dict[str, Any]]) -> str:
    names = ", ".join(g["name"] for g in known)
    return f"unknown generator '{name}'; known: {names} (see thornctl generate --list)"


@commands.command()
def generate(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="NAME", help="Generator, e.g. leaf-spine or fat-tree.", show_default=False
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help="A parameter (repeat); true/false and integers are typed.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate on the server; change nothing.")
    ] = False,
    list_: Annotated[
        bool, typer.Option("--list", help="List the generators and their parameters.")
    ] = False,
) -> None:
    """Replace the whole fabric with a generated topology (admin role)."""
    state = state_of(ctx)
    if list_:
        _show_generators(state, name)
        return
    if name is None:
        raise CliError(
            "missing generator NAME (thornctl generate --list shows them)", ExitCode.USAGE
        )
    params = parse_sets(sets or [])
    route = name.replace("_", "-")
    try:
        with spinner(state.out, f"generating {route}"):
            result: dict[str, Any] = state.client.post(
                f"/fabric/generate/{quote(route, safe='')}",
                json_body=params,
                dry_run="true" if dry_run else None,
            )
    except CliError as exc:
        if exc.status != 404:
            raise
        raise CliError(_unknown_generator(name, _generator_list(state)), ExitCode.USAGE) from exc
    _show_import(state.out, result, f"generated {route}")


@commands.command()
def generators(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Only this generator.")] = None,
) -> None:
    """List the generators the server offers and their parameters."""
    _show_generators(state_of(ctx), name)
