"""The entry point's route table: which service serves a request path.

Derived, never hand-kept: `openapi/generate.py --write` builds it from the services' own
OpenAPI documents (every path template each service declares) and writes it beside this
module as `routes.json`; `--check` fails when it is stale. The embedded gateway routes with
it and the deployed reverse proxy's configuration is rendered from it (`proxy.py`).

Matching is segment by segment, as Starlette matches the services' own routes: a literal
segment beats a `{parameter}`, and a parameter matches one segment. A template whose last
segment is a parameter also takes a longer tail (`/nodes/{name}/ports/{port}` serves port
names with slashes: the service declares it `{port:path}`), but only when nothing matches
segment for segment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ROUTES_FILE", "RouteConflict", "RouteTable"]

ROUTES_FILE = Path(__file__).with_name("routes.json")


class RouteConflict(ValueError):
    """Two services declare the same path template."""


def _segments(path: str) -> list[str]:
    return [s for s in path.split("/") if s]


def _is_param(segment: str) -> bool:
    return segment.startswith("{") and segment.endswith("}")


@dataclass
class _Node:
    literal: dict[str, _Node] = field(default_factory=dict)
    param: _Node | None = None
    service: str | None = None  # a template ends here
    tail: str | None = None  # a template ends here with a parameter: it may take more


class RouteTable:
    """Path templates by service, matched as the services match them."""

    def __init__(self, templates: Mapping[str, Iterable[str]]) -> None:
        self.templates = {name: sorted(set(paths)) for name, paths in sorted(templates.items())}
        self._root = _Node()
        owner: dict[str, str] = {}
        for name, paths in self.templates.items():
            for path in paths:
                shape = "/".join("{}" if _is_param(s) else s for s in _segments(path))
                if shape in owner and owner[shape] != name:
                    raise RouteConflict(f"{path} is declared by {owner[shape]} and {name}")
                owner[shape] = name
                self._insert(_segments(path), name)

    def _insert(self, segments: list[str], service: str) -> None:
        node = self._root
        for segment in segments:
            if _is_param(segment):
                node.param = node.param or _Node()
                node = node.param
            else:
                node = node.literal.setdefault(segment, _Node())
        node.service = service
        if segments and _is_param(segments[-1]):
            node.tail = service

    @property
    def services(self) -> list[str]:
        """The services that serve paths (the programmer, an agent per node, serves none)."""
        return [name for name, paths in self.templates.items() if paths]

    def service_for(self, path: str) -> str | None:
        """The service that serves `path`, or None when none declares it."""
        segments = _segments(path)
        return self._exact(self._root, segments) or self._tail(self._root, segments)

    def _exact(self, node: _Node, segments: list[str]) -> str | None:
        if not segments:
            return node.service
        head, rest = segments[0], segments[1:]
        if head in node.literal and (found := self._exact(node.literal[head], rest)):
            return found
        return self._exact(node.param, rest) if node.param is not None else None

    def _tail(self, node: _Node, segments: list[str]) -> str | None:
        if not segments:
            return None
        head, rest = segments[0], segments[1:]
        if head in node.literal and (found := self._tail(node.literal[head], rest)):
            return found
        if node.param is None:
            return None
        return self._tail(node.param, rest) or (node.param.tail if rest else None)

    def to_json(self) -> str:
        return json.dumps(self.templates, indent=2) + "\n"

    @classmethod
    def from_openapi(cls, documents: Mapping[str, Mapping[str, Any]]) -> RouteTable:
        """From each service's OpenAPI document (service name -> document)."""
        return cls({name: list(doc.get("paths") or {}) for name, doc in documents.items()})

    @classmethod
    def load(cls, path: Path = ROUTES_FILE) -> RouteTable:
        return cls(json.loads(path.read_text()))
