"""Names in a lab: namespaces, interfaces, the state directory. Pure functions, no I/O.

A lab is identified by its prefix (default ``thorn``): lowercase letters and digits, no
``-``, so ``<prefix>-`` never starts another lab's names and two labs (or a test's lab and
a person's) coexist on one machine.

- a fabric node ``N`` lives in the network namespace ``<prefix>-N``;
- a workload ``W`` lives in ``<prefix>-w-W``;
- inside a namespace, interfaces keep the fabric's names (``swp1``, ``eth1``, ``vf0``), so
  the 15-character limit applies to port names only, never to the prefix. A port name
  that is not a valid Linux interface name (``Ethernet1/1``, or longer than 15
  characters) is mapped to one (`port_ifname`);
- a workload's VF netdev is named as the workload's ``vf``; its representor in the host
  namespace is ``<vf>_rep`` (`representor_ifname`).
"""

from __future__ import annotations

import re
from pathlib import Path

from thorn.ifnames import MAX_IFNAME, port_ifname, representor_ifname, valid_ifname
from thorn.netns import NETNS_DIR

__all__ = [
    "DEFAULT_PREFIX",
    "LOOPBACK",
    "MAX_IFNAME",
    "NETNS_DIR",
    "STATE_ROOT",
    "check_prefix",
    "is_lab_namespace",
    "node_namespace",
    "port_ifname",
    "representor_ifname",
    "state_dir",
    "valid_ifname",
    "workload_namespace",
]

DEFAULT_PREFIX = "thorn"
LOOPBACK = "lo"
STATE_ROOT = Path("/run/thorn-lab")  # tmpfs: a lab does not survive a reboot, nor its state

_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def check_prefix(prefix: str) -> str:
    """Return `prefix` if it is a valid lab prefix, else raise ValueError saying why."""
    if not _PREFIX.match(prefix):
        raise ValueError(
            f"lab prefix '{prefix}' must be 1-16 lowercase letters and digits, starting with "
            "a letter (no '-': it separates the prefix from node names)"
        )
    return prefix


def node_namespace(prefix: str, node: str) -> str:
    return f"{prefix}-{node}"


def workload_namespace(prefix: str, workload: str) -> str:
    return f"{prefix}-w-{workload}"


def is_lab_namespace(prefix: str, namespace: str) -> bool:
    """Whether `namespace` belongs to the lab `prefix` (prefixes contain no '-')."""
    return namespace.startswith(f"{prefix}-")


def state_dir(prefix: str) -> Path:
    return STATE_ROOT / prefix
