"""The fabric lab: a `FabricDocument` emulated in Linux network namespaces on this machine.

Pure parts: `names` (namespace and interface names), `plan` (what a lab consists of),
`bpf` (the fault programs' bytes), `packets` and `meter` (traffic formats and accounting).
I/O parts: `netns` (namespaces, entering them), `rtnl` (the one module that touches
pyroute2), `build` (up/down), `faults`, `traffic`, `status`, `state` (what is persisted
under /run/thorn-lab/<prefix>/).

Agents and tests find a lab's pieces through `Lab` (see `thorn_lab.handle`)::

    from thorn_lab import Lab
    lab = Lab.open("thorn")
    lab.namespace("leaf1")              # 'thorn-leaf1'
    lab.ifname("leaf1", "swp1")         # 'swp1'
    lab.run("leaf1", some_function)     # some_function() inside thorn-leaf1

See docs/lab.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from thorn_lab.names import DEFAULT_PREFIX

if TYPE_CHECKING:
    from thorn.netns import entered, run_in_netns
    from thorn_lab.handle import Lab, LabNotFound

__all__ = ["DEFAULT_PREFIX", "Lab", "LabNotFound", "entered", "run_in_netns"]

# Loaded on first use: pyroute2 takes ~0.2 s to import, and `thornctl` imports this package
# for every command.
_LAZY = {
    "Lab": "thorn_lab.handle",
    "LabNotFound": "thorn_lab.handle",
    "entered": "thorn.netns",
    "run_in_netns": "thorn.netns",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'thorn_lab' has no attribute '{name}'")
