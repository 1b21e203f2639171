"""How `thornctl` prints: rich tables for people, the API's JSON (or YAML) for scripts.

Results go to stdout, errors and warnings to stderr. In ``-o json`` every command prints
exactly what the API answered (pretty-printed), so ``thornctl -o json nodes list | jq``
sees the API's own field names.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from typing import Any

import typer
import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 200  # tables written to a pipe or file are not squeezed to 80 columns


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def to_yaml(data: Any) -> str:
    dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper
    text: str = yaml.dump(
        data, Dumper=dumper, sort_keys=False, allow_unicode=True, default_flow_style=False
    )
    return text


def cell(value: Any) -> Text:
    """A table cell from API data: never interpreted as rich markup."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if value in ({}, []):
        return Text("-", style="dim")
    if isinstance(value, dict):
        return Text(", ".join(f"{k}={v}" for k, v in value.items()))
    if isinstance(value, list):
        return Text(", ".join(str(v) for v in value))
    return Text(str(value))


class Out:
    def __init__(self, fmt: OutputFormat) -> None:
        self.fmt = fmt
        width = None
        if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
            width = PIPE_WIDTH
        self.console = Console(highlight=False, width=width)
        self.err = Console(stderr=True, highlight=False)

    @property
    def table_mode(self) -> bool:
        return self.fmt is OutputFormat.table

    @property
    def stderr_is_terminal(self) -> bool:
        return self.err.is_terminal

    def data(self, data: Any) -> bool:
        """Print `data` as JSON or YAML if that is the output format; False in table mode."""
        if self.fmt is OutputFormat.json:
            typer.echo(to_json(data))
            return True
        if self.fmt is OutputFormat.yaml:
            typer.echo(to_yaml(data), nl=False)
            return True
        return False

    def line(self, text: str | Text = "") -> None:
        self.console.print(text, soft_wrap=True)

    def warn(self, message: str) -> None:
        typer.echo(f"warning: {message}", err=True)

    def note(self, message: str) -> None:
        """A remark for the person at the terminal, on stderr so stdout stays clean."""
        typer.echo(message, err=True)

    def _title(self, title: str | None) -> None:
        # Printed on its own line: a table's title would wrap to the table's width.
        if title is not None:
            self.console.print(Text(title, style="bold"), soft_wrap=True)

    def fields(self, rows: Iterable[tuple[str, Any]], title: str | None = None) -> None:
        self._title(title)
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("field", style="bold", no_wrap=True)
        table.add_column("value")
        for key, value in rows:
            table.add_row(key, cell(value))
        self.console.print(table)

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        title: str | None = None,
        caption: str | None = None,
        no_wrap: int = 1,
    ) -> None:
        """A table; the first `no_wrap` columns (names, ids) never wrap."""
        self._title(title)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for i, column in enumerate(columns):
            table.add_column(column, no_wrap=i < no_wrap)
        for row in rows:
            table.add_row(*(cell(v) for v in row))
        self.console.print(table)
        if caption is not None:  # on its own line, like the title
            self.console.print(Text(caption, style="dim"), soft_wrap=True)


def spinner(out: Out, message: str) -> AbstractContextManager[object]:
    """A spinner on stderr while a long request runs (only on a terminal)."""
    return out.err.status(message) if out.stderr_is_terminal else nullcontext()


def page_caption(page: dict[str, Any], noun: str) -> str | None:
    """'showing 101-200 of 340 nodes' when a page is not the whole list, else None."""
    shown = len(page["items"])
    total = int(page["total"])
    offset = int(page["offset"])
    if total == 0:
        return f"no {noun}"
    if shown == total:
        return f"{total} {noun}"
    if shown == 0:
        return f"nothing at offset {offset}; {total} {noun} in all"
    hint = " (--all for every one, or --offset)"
    return f"showing {offset + 1}-{offset + shown} of {total} {noun}{hint}"


def declared(budget: dict[str, Any], key: str) -> str:
    """An RC budget value, marked when it is NCCL's default rather than declared."""
    return f"{budget[key]}" if budget[f"{key}_declared"] else f"{budget[key]} (default)"
