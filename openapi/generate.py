"""Write (or check) openapi/openapi.json: the merged OpenAPI document of every THORN service.

The admin sees one URL and one API; each service contributes its own routes under /api/v1.
This is the composition root for the document only: it builds each service's app (no
connections are made) and merges paths and schemas, refusing any collision.

    python openapi/generate.py --write   # what `make openapi` runs
    python openapi/generate.py --check   # exit 1 if the committed document is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from thorn.config import Settings
from thorn_health.app import create_app as health_app
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_programmer.app import create_app as programmer_app
from thorn_topology.app import create_app as topology_app

DOCUMENT = Path(__file__).with_name("openapi.json")


def service_apps(settings: Settings) -> list[FastAPI]:
    return [
        topology_app(settings),
        health_app(settings),
        pathcomp_app(settings),
        programmer_app(settings.model_copy(update={"node_name": "openapi"})),
    ]


def merged() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    security: dict[str, Any] = {}
    tags: list[str] = []
    for app in service_apps(Settings()):
        doc = app.openapi()
        for path, item in doc.get("paths", {}).items():
            if path in paths:
                raise SystemExit(f"{app.title}: path {path} is already served by another service")
            paths[path] = item
            for operation in item.values():
                tags.extend(t for t in operation.get("tags", []) if t not in tags)
        components = doc.get("components", {})
        for name, schema in components.get("schemas", {}).items():
            if name in schemas and schemas[name] != schema:
                raise SystemExit(f"{app.title}: schema {name} differs from another service's")
            schemas[name] = schema
        security.update(components.get("securitySchemes", {}))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "THORN controller API",
            "version": "0.1.0",
            "description": "Every THORN service's REST API, as served under one URL.",
        },
        "tags": [{"name": t} for t in tags],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": security,
        },
    }


def render() -> str:
    return json.dumps(merged(), indent=2, sort_keys=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write openapi/openapi.json")
    mode.add_argument("--check", action="store_true", help="fail if it is out of date")
    args = parser.parse_args()
    text = render()
    if args.write:
        DOCUMENT.write_text(text)
        print(f"wrote {DOCUMENT} ({len(merged()['paths'])} paths)")
        return 0
    if not DOCUMENT.exists() or DOCUMENT.read_text() != text:
        print(f"{DOCUMENT} is out of date: run `make openapi` and commit it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
