"""What a lab keeps under ``/run/thorn-lab/<prefix>/``: its description and its faults.

- ``lab.json``: `LabDescription`, the fabric document, the prefix and the plan (the
  namespace and interface maps). Any process reads it to find the lab without the store.
- ``faults.json``: `FaultBook`, every injected failure with what `restore` must undo.
- ``/run/thorn-lab/.<prefix>.lock``: an flock that serialises up/down/fail/restore of one
  lab across processes.

Files are replaced atomically (write, then rename), so a reader never sees half a file.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from thorn.model import FabricDocument
from thorn_lab import names
from thorn_lab.blueprint import LabPlan

__all__ = [
    "Device",
    "FaultBook",
    "FaultKind",
    "FaultRecord",
    "LabDescription",
    "list_labs",
    "load_description",
    "load_faults",
    "lock",
    "now",
    "remove_state",
    "save_description",
    "save_faults",
]

LAB_FORMAT: Literal["thorn_lab/v1"] = "thorn_lab/v1"
DESCRIPTION = "lab.json"
FAULTS = "faults.json"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabDescription(_Model):
    format: Literal["thorn_lab/v1"] = LAB_FORMAT
    prefix: str
    created_at: str
    fabric: FabricDocument
    plan: LabPlan


class FaultKind(StrEnum):
    link_down = "link-down"
    carrier = "carrier"
    node_down = "node-down"
    drop = "drop"
    loss = "loss"


class Device(_Model):
    """One interface a fault acts on."""

    node: str
    port: str
    namespace: str
    ifname: str

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


class FaultRecord(_Model):
    id: str
    kind: FaultKind
    target: str  # the link ("a:p--b:q") or the node
    percent: float | None = None  # loss only
    created_at: str
    sees: dict[str, str]  # "node:port" -> what that side observes
    admin_down: list[Device] = []  # restore sets these admin up
    filters: list[Device] = []  # restore removes the ingress drop filter on these
    touches: list[Device] = []  # every device whose state the fault changes (conflicts)


class FaultBook(_Model):
    next_id: int = 1
    faults: list[FaultRecord] = []


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_description(description: LabDescription) -> None:
    path = names.state_dir(description.prefix) / DESCRIPTION
    _write(path, description.model_dump_json(indent=1))


def load_description(prefix: str) -> LabDescription | None:
    try:
        text = (names.state_dir(prefix) / DESCRIPTION).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return LabDescription.model_validate_json(text)


def load_faults(prefix: str) -> FaultBook:
    try:
        text = (names.state_dir(prefix) / FAULTS).read_text(encoding="utf-8")
    except FileNotFoundError:
        return FaultBook()
    return FaultBook.model_validate_json(text)


def save_faults(prefix: str, book: FaultBook) -> None:
    _write(names.state_dir(prefix) / FAULTS, book.model_dump_json(indent=1))


def remove_state(prefix: str) -> bool:
    directory = names.state_dir(prefix)
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    return True


def _lock_path(prefix: str) -> Path:
    return names.STATE_ROOT / f".{prefix}.lock"


@contextmanager
def lock(prefix: str, *, forget: bool = False) -> Iterator[None]:
    """Hold the lab's lock for the block; `forget` deletes the lock file at the end (down)."""
    path = _lock_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        if forget:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def list_labs() -> list[str]:
    """Prefixes of the labs described under /run/thorn-lab."""
    try:
        entries = os.listdir(names.STATE_ROOT)
    except FileNotFoundError:
        return []
    return sorted(e for e in entries if (names.STATE_ROOT / e / DESCRIPTION).is_file())
