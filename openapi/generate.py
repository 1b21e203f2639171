"""Write (or check) openapi/openapi.json, the merged OpenAPI document of every THORN service,
and the entry point's route table derived from the same documents
(services/gateway/thorn_gateway/routes.json).

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
from thorn.openapi import MergeConflict, merge
from thorn_gateway.routes import ROUTES_FILE, RouteTable
from thorn_health.app import create_app as health_app
from thorn_pathcomp.app import create_app as pathcomp_app
from thorn_programmer.app import create_app as programmer_app
from thorn_topology.app import create_app as topology_app

DOCUMENT = Path(__file__).with_name("openapi.json")


def service_apps(settings: Settings) -> dict[str, FastAPI]:
    return {
        "topology": topology_app(settings),
        "health": health_app(settings),
        "pathcomp": pathcomp_app(settings),
        "programmer": programmer_app(settings.model_copy(update={"node_name": "openapi"})),
    }


def documents() -> dict[str, dict[str, Any]]:
    return {name: app.openapi() for name, app in service_apps(Settings()).items()}


def render() -> tuple[str, str]:
    """The merged document and the entry point's route table, as written."""
    docs = documents()
    try:
        document = merge(docs)
    except MergeConflict as exc:
        raise SystemExit(str(exc)) from None
    return json.dumps(document, indent=2) + "\n", RouteTable.from_openapi(docs).to_json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write openapi/openapi.json")
    mode.add_argument("--check", action="store_true", help="fail if it is out of date")
    args = parser.parse_args()
    outputs = dict(zip((DOCUMENT, ROUTES_FILE), render(), strict=True))
    if args.write:
        for path, text in outputs.items():
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    for path in stale:
        print(f"{path} is out of date: run `make openapi` and commit it", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
