"""Shared by the benchmarks: replace one marked section of docs/benchmarks.md, and print
result tables with a verdict per target."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

Rows = Iterable[tuple[str, Sequence[str], Iterable[Sequence[str]]]]


def write_section(path: Path, section: str, begin: str, end: str) -> None:
    """Put `section` (which starts with `begin` and ends with `end`) in place of the old one,
    or append it; other sections stay as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def print_results(
    console: Console, tables: Rows, targets: Iterable[tuple[str, str, str]], width: int = 160
) -> None:
    """Each (title, columns, rows) as a table, then the targets: met in green, MISSED in red."""
    if not console.is_terminal:
        console.width = max(console.width, width)  # a file or a pipe: do not wrap the tables
    for title, columns, rows in tables:
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    verdicts = Table(title="Targets")
    for column in ("target", "measured", "verdict"):
        verdicts.add_column(column)
    for target, measured, verdict in targets:
        style = "green" if verdict == "met" else "red" if verdict.lower() == "missed" else ""
        verdicts.add_row(target, measured, f"[{style}]{verdict}[/]" if style else verdict)
    console.print(verdicts)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines."""
    return [
        "| " + " | ".join(columns) + " |",
        "|" + " --- |" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
