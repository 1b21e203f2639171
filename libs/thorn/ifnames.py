"""Interface names: what Linux accepts (15 characters, no '/', ':' or spaces) and how a
fabric port or a VF representor is named when its own name does not fit. Pure functions,
shared by the agents' registration checks and the lab that emulates a fabric."""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_IFNAME", "port_ifname", "representor_ifname", "valid_ifname"]

MAX_IFNAME = 15  # IFNAMSIZ - 1
_IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}$")
_NOT_IFNAME_CHAR = re.compile(r"[^A-Za-z0-9._-]")
_REP_SUFFIX = "_rep"
_HASH_CHARS = 4


def valid_ifname(name: str) -> bool:
    """A name the kernel accepts and that is safe in `ip` commands (no '/', ':', spaces)."""
    return bool(_IFNAME.match(name))


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_CHARS]


def port_ifname(port: str) -> str:
    """The interface name of fabric port `port`: the port name itself when Linux allows it.

    Otherwise invalid characters become '_' (``Ethernet1/1`` -> ``Ethernet1_1``), and a
    name still too long keeps its first 10 characters plus '-' and 4 hex digits of a hash
    of the original name, so different long names stay different.
    """
    if valid_ifname(port):
        return port
    cleaned = _NOT_IFNAME_CHAR.sub("_", port)
    if valid_ifname(cleaned):
        return cleaned
    head = MAX_IFNAME - _HASH_CHARS - 1
    return f"{cleaned[:head]}-{_short_hash(port)}"


def representor_ifname(vf: str) -> str:
    """The representor of VF netdev `vf` in the host namespace: ``<vf>_rep``, shortened
    (first characters plus a hash) when that would exceed 15 characters."""
    name = f"{vf}{_REP_SUFFIX}"
    if len(name) <= MAX_IFNAME:
        return name
    head = MAX_IFNAME - _HASH_CHARS - len(_REP_SUFFIX)
    return f"{vf[:head]}{_short_hash(vf)}{_REP_SUFFIX}"
