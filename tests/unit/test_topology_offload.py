"""The topology service's big-fabric work: the sliced export and the worker's answers."""

from __future__ import annotations

import pickle

import pytest

from thorn import generators
from thorn.fabric import Fabric, FabricError
from thorn_topology import export
from thorn_topology.offload import Base, Refused, Source, replace_fabric


def fabric(k: int) -> Fabric:
    return Fabric.from_document(generators.generate("fat_tree", {"k": k}), 3, 1)


@pytest.mark.parametrize("k", [2, 8])
def test_the_sliced_export_is_byte_for_byte_the_documents_own_json(
    k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "SLICE", 7)  # many slices, and a short last one
    f = fabric(k)
    document = f.to_document()
    assert b"".join(export.document_json(document)) == document.model_dump_json().encode()
    assert export.serialise(f).json == document.model_dump_json().encode()


def test_an_empty_fabric_exports_empty_lists() -> None:
    document = Fabric(0, 1).to_document()
    assert b"".join(export.document_json(document)) == document.model_dump_json().encode()


def test_a_dry_run_answers_the_summary_and_writes_nothing() -> None:
    outcome = replace_fabric(Source("generator", generator="fat_tree", params={"k": 4}),
                             Base(5, 1), None)  # fmt: skip
    assert outcome.summary.hosts == 16 and outcome.document is None


def test_a_malformed_body_is_a_400_naming_the_body() -> None:
    with pytest.raises(Refused) as refused:
        replace_fabric(Source("json", body=b'{"nodes": ['), Base(0, 1), None)
    assert refused.value.status == 400
    assert refused.value.errors[0]["type"] == "json_invalid"
    assert refused.value.errors[0]["loc"][0] == "body"


def test_a_body_breaking_the_schema_is_a_422_naming_each_field() -> None:
    body = b'{"nodes": [{"name": "a", "role": "nope"}], "extra": 1}'
    with pytest.raises(Refused) as refused:
        replace_fabric(Source("json", body=body), Base(0, 1), None)
    assert refused.value.status == 422
    locs = {tuple(e["loc"]) for e in refused.value.errors}
    assert ("body", "nodes", 0, "role") in locs and ("body", "extra") in locs


def test_a_fabric_breaking_the_rules_is_a_fabric_error() -> None:
    body = b'{"links": [{"a": {"node": "x", "port": "p"}, "b": {"node": "y", "port": "q"}}]}'
    with pytest.raises(FabricError):
        replace_fabric(Source("json", body=body), Base(0, 1), None)


def test_bad_generator_parameters_and_files_are_refused_by_field() -> None:
    with pytest.raises(Refused) as refused:
        replace_fabric(Source("generator", generator="fat_tree", params={"k": 3}), Base(0, 1), None)
    assert refused.value.status == 422 and "k" in refused.value.errors[0]["msg"]
    with pytest.raises(Refused) as refused:
        replace_fabric(Source("clab", body=b"\xff\xfe"), Base(0, 1), None)
    assert refused.value.status == 400 and refused.value.errors[0]["type"] == "encoding"


def test_refusals_cross_the_process_boundary_intact() -> None:
    error = Refused(422, [{"loc": ["body", "k"], "msg": "too big", "type": "generator"}])
    again = pickle.loads(pickle.dumps(error))
    assert (again.status, again.errors) == (error.status, error.errors)
