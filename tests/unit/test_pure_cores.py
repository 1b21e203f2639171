"""Each service is a thin shell around a pure core: importing a core loads no database,
bus or web code, so its tests run on plain values and a newcomer reads it without I/O."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE_CORES = [
    "thorn_health.core",
    "thorn_health.linkstate",
    "thorn_health.failovers",
    "thorn_health.budget",
    "thorn_pathcomp.plan",
    "thorn_pathcomp.whatif",
    "thorn_pathcomp.trees",
    "thorn_pathcomp.graph",
    "thorn_gateway.routes",
    "thorn_gateway.upstreams",
    "thorn.fabric",
    "thorn.health_records",
]
IO = ["sqlalchemy", "thorn.store", "nats", "fastapi", "httpx", "pyroute2"]


@pytest.mark.parametrize("module", PURE_CORES)
def test_a_pure_core_imports_no_database_bus_or_web_code(module: str) -> None:
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {IO!r} if m in sys.modules))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    assert loaded == "", f"{module} loads {loaded}"
