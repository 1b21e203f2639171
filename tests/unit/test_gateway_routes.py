"""The entry point's route table: every request path goes to the service that declares it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thorn_gateway.routes import RouteConflict, RouteTable

DOCUMENT = Path(__file__).parents[2] / "openapi" / "openapi.json"


def test_every_path_of_the_merged_document_has_exactly_one_service() -> None:
    table = RouteTable.load()
    declared = {p for paths in table.templates.values() for p in paths}
    assert declared == set(json.loads(DOCUMENT.read_text())["paths"])
    for service, paths in table.templates.items():
        for path in paths:
            concrete = path.replace("{", "x").replace("}", "")  # a value for each parameter
            assert table.service_for(concrete) == service, path


def test_a_literal_segment_beats_a_parameter() -> None:
    table = RouteTable({"topology": ["/api/v1/nodes/{name}"],
                        "pathcomp": ["/api/v1/nodes/{name}/drain", "/api/v1/plan"]})  # fmt: skip
    assert table.service_for("/api/v1/nodes/leaf1") == "topology"
    assert table.service_for("/api/v1/nodes/leaf1/drain") == "pathcomp"
    assert table.service_for("/api/v1/plan") == "pathcomp"


def test_the_real_table_sends_each_path_where_it_is_served() -> None:
    table = RouteTable.load()
    assert table.service_for("/api/v1/nodes/leaf1") == "topology"
    assert table.service_for("/api/v1/nodes/leaf1/drain") == "topology"
    assert table.service_for("/api/v1/drains/nodes/leaf1") == "pathcomp"
    assert table.service_for("/api/v1/health/links/7") == "health"
    assert table.service_for("/api/v1/paths") == "pathcomp"


def test_a_trailing_parameter_takes_a_port_name_with_slashes() -> None:
    table = RouteTable.load()
    assert table.service_for("/api/v1/nodes/host1/ports/eth1/2") == "topology"


def test_a_path_nobody_declares_has_no_service() -> None:
    table = RouteTable.load()
    assert table.service_for("/api/v1/nothing") is None
    assert table.service_for("/api/v1") is None
    assert table.service_for("/api/v1/paths/extra") is None


def test_two_services_declaring_one_template_are_refused() -> None:
    with pytest.raises(RouteConflict, match="health and topology"):
        RouteTable({"topology": ["/api/v1/links/{link_id}"], "health": ["/api/v1/links/{id}"]})
