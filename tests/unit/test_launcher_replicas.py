"""thorn-run's replicas: the children's names and the console script each runs."""

from __future__ import annotations

import pytest

from thorn_run.launcher import replica_names, service_of


def test_the_first_replica_keeps_the_service_s_name_and_the_others_are_numbered() -> None:
    assert replica_names("topology", 1) == ["topology"]
    assert replica_names("health", 3) == ["health", "health-2", "health-3"]


@pytest.mark.parametrize(
    ("child", "service"),
    [("topology", "topology"), ("topology-2", "topology"), ("pathcomp-12", "pathcomp"),
     ("programmer@host1", "programmer"), ("programmer@leaf-2", "programmer"),
     ("gateway", "gateway")],
)  # fmt: skip
def test_each_child_runs_its_service_s_console_script(child: str, service: str) -> None:
    assert service_of(child) == service
