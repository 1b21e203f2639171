"""One OpenAPI document from every service's own: the API an admin sees under one URL.

Pure: documents in, one document out. `openapi/generate.py` merges the services' apps'
documents into the committed openapi/openapi.json (the dashboard's client is generated from
it); the entry point merges the running services' documents for its /openapi.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MergeConflict", "merge"]

INFO = {
    "title": "THORN controller API",
    "version": "0.1.0",
    "description": "Every THORN service's REST API, as served under one URL.",
}


class MergeConflict(ValueError):
    """Two services declare the same path, or one schema name differently."""


def merge(documents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Paths, schemas and security schemes of `documents` (service name -> document)."""
    paths: dict[str, Any] = {}
    owner: dict[str, str] = {}
    schemas: dict[str, Any] = {}
    security: dict[str, Any] = {}
    tags: list[str] = []
    for service, doc in documents.items():
        for path, item in (doc.get("paths") or {}).items():
            if path in paths:
                raise MergeConflict(f"{service}: path {path} is already served by {owner[path]}")
            paths[path], owner[path] = item, service
            for operation in item.values():
                tags.extend(t for t in operation.get("tags", []) if t not in tags)
        components = doc.get("components") or {}
        for name, schema in (components.get("schemas") or {}).items():
            if name in schemas and schemas[name] != schema:
                raise MergeConflict(f"{service}: schema {name} differs from another service's")
            schemas[name] = schema
        security.update(components.get("securitySchemes") or {})
    return {
        "openapi": "3.1.0",
        "info": dict(INFO),
        "tags": [{"name": t} for t in tags],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": security,
        },
    }
