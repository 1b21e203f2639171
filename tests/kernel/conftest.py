"""Guest-side fixtures of the kernel lane (docs/kernel-lane.md).

`tests/kernel/lane.py` boots Debian's kernel under qemu and runs these tests there with
THORN_KERNEL_LANE=1. Anywhere else every test in this folder is skipped: the host kernel has
no cls_flower, act_tunnel_key or RDMA. Inside the lane a missing kernel feature is a failure,
never a skip.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from netlab import LANE_MODULES, NetnsFactory, ip, sysctl

IN_LANE = os.environ.get("THORN_KERNEL_LANE") == "1"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_LANE:
        return
    skip = pytest.mark.skip(
        reason="kernel lane only: run `.venv/bin/python tests/kernel/lane.py` "
        "(Debian's kernel under qemu, THORN_KERNEL_LANE=1)"
    )
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def lane_modules() -> tuple[str, ...]:
    """The kernel modules every lane test relies on, loaded once per session."""
    if not IN_LANE:
        pytest.skip("kernel lane only")
    result = subprocess.run(
        ["modprobe", "-a", *LANE_MODULES], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"modprobe {' '.join(LANE_MODULES)} failed: {result.stderr.strip()} "
            "(THORN_KERNEL_LANE=1 outside the lane's guest? run tests/kernel/lane.py)"
        )
    return LANE_MODULES


@pytest.fixture(scope="session")
def lane_log(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Write a line to the lane's log past pytest's output capture (a benchmark reads the
    measurement lines of a default run, which is not `-s`)."""
    terminal = request.config.pluginmanager.getplugin("terminalreporter")
    if terminal is None:
        return print
    return lambda line: terminal.write_line(line)


@pytest.fixture
def netns() -> Iterator[NetnsFactory]:
    """Make uniquely named network namespaces (lo up, IPv6 off); all deleted after the test.

    IPv6 is off so VXLAN and veth devices send no ND/MLD of their own into the counters.
    """
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        ip(None, f"netns add {name}")
        made.append(name)
        for key in ("all", "default"):
            sysctl(name, f"net.ipv6.conf.{key}.disable_ipv6", 1)
        ip(name, "link set dev lo up")
        return name

    yield make
    for name in reversed(made):
        ip(None, f"netns delete {name}", check=False)
