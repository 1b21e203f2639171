"""Reading fabric documents and containerlab files for `thornctl import`, writing exports.

A file that is missing or unreadable is EX_NOINPUT (66); one that is not UTF-8, not valid
JSON/YAML, empty or not a mapping is EX_DATAERR (65), with ``file:line:column`` when the
parser knows where. Checking syntax here gives a precise local message before anything is
sent; the server still validates the content.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from thorn import strictyaml
from thornctl.errors import CliError, ExitCode

CLAB_SUFFIXES = (".clab.yml", ".clab.yaml")
YAML_SUFFIXES = (".yml", ".yaml")
STDIN = "-"


class InputFormat(StrEnum):
    auto = "auto"
    thorn = "thorn"
    clab = "clab"


@dataclass(frozen=True)
class Document:
    """What to send: the body, its content type and which import endpoint takes it."""

    name: str
    kind: InputFormat  # thorn or clab, never auto
    body: bytes
    content_type: str


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def read_text(path: str) -> str:
    """The file's text (or stdin's for '-'); 66 if it cannot be read, 65 if not UTF-8."""
    name = display_name(path)
    try:
        raw = sys.stdin.buffer.read() if path == STDIN else Path(path).read_bytes()
    except FileNotFoundError as exc:
        raise CliError(f"{name}: no such file", ExitCode.NOINPUT) from exc
    except IsADirectoryError as exc:
        raise CliError(f"{name}: is a directory, not a file", ExitCode.NOINPUT) from exc
    except OSError as exc:
        raise CliError(f"{name}: cannot read: {exc.strerror or exc}", ExitCode.NOINPUT) from exc
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CliError(
            f"{name}: not UTF-8 text (invalid byte at offset {exc.start})", ExitCode.DATAERR
        ) from exc


def parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{name}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}", ExitCode.DATAERR
        ) from exc


def parse_yaml(text: str, name: str) -> Any:
    try:
        return strictyaml.load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = exc.problem or exc.context or "syntax error"
        raise CliError(f"{where}: not valid YAML: {problem}", ExitCode.DATAERR) from exc
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: not valid YAML: {exc}", ExitCode.DATAERR) from exc


def _looks_like_json(path: str, text: str) -> bool:
    lowered = path.lower()
    if lowered.endswith(".json"):
        return True
    if lowered.endswith(YAML_SUFFIXES):
        return False
    return text.lstrip().startswith("{")


def _jsonable(value: object) -> object:
    # YAML turns unquoted dates into date objects; send them back as the text they were.
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    raise TypeError(f"{type(value).__name__} cannot be sent as JSON")


def load_document(path: str, fmt: InputFormat) -> Document:
    """Read `path` ('-' for stdin) as a THORN document or a containerlab file."""
    name = display_name(path)
    text = read_text(path)
    if not text.strip():
        raise CliError(f"{name}: the file is empty", ExitCode.DATAERR)
    clab_by_name = path.lower().endswith(CLAB_SUFFIXES)
    if fmt is InputFormat.clab or (fmt is InputFormat.auto and clab_by_name):
        parse_yaml(text, name)  # syntax errors are reported here, with their line
        return _clab(name, text)
    as_json = _looks_like_json(path, text)
    data = parse_json(text, name) if as_json else parse_yaml(text, name)
    if fmt is InputFormat.auto and isinstance(data, dict) and "topology" in data:
        return _clab(name, text)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise CliError(
            f"{name}: a THORN fabric document is a mapping (format, nodes, links, ...), "
            f"but this is {kind}",
            ExitCode.DATAERR,
        )
    if as_json:
        body = text.encode()
    else:
        try:
            body = json.dumps(data, ensure_ascii=False, allow_nan=False, default=_jsonable).encode()
        except (TypeError, ValueError) as exc:
            raise CliError(f"{name}: cannot be sent as JSON: {exc}", ExitCode.DATAERR) from exc
    return Document(name, InputFormat.thorn, body, "application/json")


def _clab(name: str, text: str) -> Document:
    return Document(name, InputFormat.clab, text.encode(), "application/yaml")


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader never sees half a file); 73 on failure."""
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or exc}", ExitCode.CANTCREAT) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, _mode_for(path))  # mkstemp makes 0600; keep what a plain write would
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CliError(f"{path}: cannot write: {exc.strerror or exc}", ExitCode.CANTCREAT) from exc


def _mode_for(path: Path) -> int:
    """The existing file's permissions, else 0666 less the umask (as open() would give)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
