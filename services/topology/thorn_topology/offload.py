"""Work too big for the API's event loop, run in a worker process: a worker thread would
still share the GIL, and one long C call (validating 16,000 hosts) would hold every other
request for most of a second. Light imports only: the worker starts quickly.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from thorn import generators
from thorn.fabric import Fabric
from thorn.model import FabricSummary


def generated_summary(
    name: str, params: dict[str, Any], revision: int, next_link_id: int
) -> FabricSummary:
    """What a generated fabric would be, validated against the current revision's ids:
    a dry run's answer (raises ValueError for the generator, FabricError for the rules)."""
    document = generators.generate(name, params)
    return Fabric.from_document(document, revision, next_link_id).summary()


def worker_pool() -> ProcessPoolExecutor:
    """One worker, started by a forkserver: never a fork of this threaded process."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("forkserver"))
