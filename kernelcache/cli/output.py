"""Where the commands write: rich consoles made on first use, tables that stay whole when piped, JSON, a closed pipe."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click


class LazyConsole:
    """rich's ``Console``, made on first use: importing rich takes 20-30 ms that ``env``, ``run`` and a
    no-op ``install`` (on every pod start) never need."""

    def __init__(self, stderr: bool = False):
        self._stderr = stderr
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console(), name)

    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            class Quiet(Console):
                def on_broken_pipe(self) -> None:  # rich's exits 1
                    closed_pipe()

            self._console = Quiet(stderr=self._stderr, highlight=False, soft_wrap=True)
        return self._console


out = LazyConsole()
err = LazyConsole(stderr=True)


def new_table(**options: Any):
    from rich.table import Table

    return Table(**options)


def show(table: Any, console: LazyConsole = out) -> None:
    """A rich table on a terminal wide enough for every row on one line; else (piped, logged, narrow) one plain row
    per item, cells whole, in columns two spaces apart, as ``pip list`` and ``docker images`` print: a script, a
    log or ``ls | grep NAME`` reads each name whole."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1 << 20)  # the width every row takes on one line
    if console.is_terminal and Measurement.get(console.console(), unbounded, table).maximum <= console.width:
        console.print(table)
        return
    for line in plain_rows(table):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def plain_rows(table: Any) -> list[str]:
    """The title, the header (where the table shows one) and each row of a rich table, as plain text lines."""
    from rich.text import Text

    def plain(cell: Any) -> str:
        text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return " ".join(text.split())

    columns = [[plain(c.header), *map(plain, c.cells)] for c in table.columns]
    if not columns:
        return []
    rows = list(zip(*columns, strict=True))[0 if table.show_header else 1:]
    widths = [max(map(len, column)) for column in columns]
    lines = ["  ".join(cell.ljust(w) if c.justify != "right" else cell.rjust(w)
                       for cell, w, c in zip(row, widths, table.columns, strict=True)).rstrip() for row in rows]
    title = plain(table.title) if table.title else ""
    return [title, *lines] if title else lines


def closed_pipe() -> None:
    """Whoever read stdout stopped reading (``inspect B | head -1``): what was asked for is done, so exit 0 and say
    nothing, as ``git log | head -1`` leaves the pipeline's status to its reader; stdout goes to /dev/null first, so
    the interpreter's last flush of the closed pipe raises nothing."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=1))
