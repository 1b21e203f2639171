"""The fabric lane: real namespaces, veths, tc and BPF on this machine's kernel (root).

Not root: every test here is skipped with the reason, except under CI=true, where that is
a failure (CI runs as root, so a skip there would hide a broken lane). Each lab gets a
prefix of its own ("tf" + 8 random hex digits) and is taken down after its test or module,
also when the test fails; a last sweep at the end of the session removes any of its own
labs left (not those of another session running on the machine at the same time).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from thorn import netns
from thorn.generators import leaf_spine
from thorn.model import FabricDocument
from thorn_lab import build
from thorn_lab.handle import Lab

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
OURS = re.compile(r"^(tf[0-9a-f]{8})-")


@pytest.fixture(autouse=True, scope="session")
def _root() -> Iterator[None]:
    if os.geteuid() != 0:
        reason = "the fabric lane needs root (network namespaces, netlink, BPF)"
        if IN_CI:
            pytest.fail(f"{reason}, and CI=true must not skip it")
        pytest.skip(reason)
    yield
    # Only this session's labs: another session on the machine may be using its own.
    leftovers = {m.group(1) for n in netns.listed() if (m := OURS.match(n))}
    for prefix in leftovers & _MADE:
        build.down(prefix)


_MADE: set[str] = set()  # the prefixes this session made


def _prefix() -> str:
    prefix = f"tf{uuid.uuid4().hex[:8]}"
    _MADE.add(prefix)
    return prefix


def _labs() -> Iterator[Callable[..., Lab]]:
    made: list[str] = []

    def make(doc: FabricDocument | None = None, prefix: str | None = None) -> Lab:
        prefix = prefix or _prefix()
        _MADE.add(prefix)
        made.append(prefix)
        build.up(doc or leaf_spine(2, 2, 2), prefix)
        return Lab.open(prefix)

    try:
        yield make
    finally:
        for prefix in made:
            build.down(prefix)


@pytest.fixture
def make_lab() -> Iterator[Callable[..., Lab]]:
    """Bring up labs for one test (leaf_spine(2, 2, 2) by default); all go down after it."""
    yield from _labs()


@pytest.fixture(scope="module")
def make_module_lab() -> Iterator[Callable[..., Lab]]:
    """`make_lab` for labs a whole module shares; they go down after its last test."""
    yield from _labs()


@pytest.fixture(scope="module")
def shared_lab() -> Iterator[Lab]:
    """One leaf_spine(2, 2, 2) lab for a module whose tests restore what they change."""
    prefix = _prefix()
    try:
        build.up(leaf_spine(2, 2, 2), prefix)
        yield Lab.open(prefix)
    finally:
        build.down(prefix)
