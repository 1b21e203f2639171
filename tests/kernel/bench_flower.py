"""The flower half of the datapath benchmark, run inside the kernel lane's guest by
`make bench` (`tests/bench/bench_datapath.py --report`). Not a test: pytest collects it only
when named on the command line. Its result goes out as one marked line of output."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_datapath import MARKER, measure


async def test_flower_install_rate_and_failover_latency() -> None:
    result = await measure("flower", 10_000, 1_000)
    result["kernel"] = platform.release()
    print(MARKER + json.dumps(result))
