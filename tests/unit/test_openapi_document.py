"""The committed openapi/openapi.json is exactly what the code serves, and so is the entry
point's route table derived from the same documents."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_generate", ROOT / "openapi/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_document_matches_the_code() -> None:
    committed = (ROOT / "openapi/openapi.json").read_text()
    assert committed == generator().render()[0], "run `make openapi` and commit the result"


def test_the_committed_route_table_matches_the_code() -> None:
    committed = (ROOT / "services/gateway/thorn_gateway/routes.json").read_text()
    assert committed == generator().render()[1], "run `make openapi` and commit the result"


def test_every_route_of_every_service_is_in_the_document() -> None:
    module = generator()
    document = json.loads(module.render()[0])
    for app in module.service_apps(module.Settings()).values():
        for path in app.openapi().get("paths", {}):
            assert path in document["paths"]


def test_every_operation_declares_bearer_auth_and_error_bodies() -> None:
    document = json.loads(generator().render()[0])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert operation.get("security") == [{"HTTPBearer": []}], (method, path)
            assert "401" in operation["responses"] or "422" in operation["responses"]
