"""Tables of the commands that list things (``status``, ``instances``, ``events``,
``local status``): boxed for a person at a terminal, plain columns for a pipe, and the
``--noheader`` / ``--format`` options Slurm's listing commands have.

``--format`` takes sacct(1)'s form (Slurm 22.05, ``--format``): comma-separated field names,
any case, each optionally ``%WIDTH`` (``node,state,reason%40``): the column is that many
characters wide, longer values cut. ``-h`` stays help, as on every slurm-spot command (and
sbatch, scontrol); the short form of ``--noheader`` is ``-n``, as in sacct(1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from slurm_spot.rawtext import escaped

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Field:
    """One ``--format`` field: its name and fixed width (None: as wide as its values)."""

    name: str
    width: int | None = None


def parse_format(text: str, fields: Sequence[str]) -> list[Field]:
    """``"node,STATE,reason%40"`` -> fields, checked against ``fields`` (the command's).

    Raises:
        click.BadParameter: an empty list, an unknown field (named, with the valid ones) or a
            width that is not a positive integer (exit 2).
    """
    chosen = []
    for item in (part.strip() for part in text.replace(" ", ",").split(",")):
        if not item:
            continue
        name, pct, width = item.partition("%")
        if name.lower() not in fields:
            raise click.BadParameter(f"unknown field {name!r}; fields: {', '.join(fields)}",
                                     param_hint="--format")
        if pct and not (width.isdigit() and int(width) > 0):
            raise click.BadParameter(f"{item!r}: the width after '%' must be a positive "
                                     "integer", param_hint="--format")
        chosen.append(Field(name.lower(), int(width) if pct else None))
    if not chosen:
        raise click.BadParameter("no field given; fields: " + ", ".join(fields),
                                 param_hint="--format")
    return chosen


def table_options(fields: Sequence[str]) -> Callable[[F], F]:
    """Add ``-n/--noheader`` and ``-o/--format FIELDS`` (parsed to ``list[Field]``, default
    every field in order) to a listing command."""

    def check(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[Field]:
        return [Field(f) for f in fields] if value is None else parse_format(value, fields)

    def decorate(func: F) -> F:
        func = click.option(
            "-o", "--format", "fields", default=None, callback=check, metavar="FIELDS",
            help="Columns to show, comma-separated, each optionally %WIDTH (as sacct "
                 f"--format): {', '.join(fields)}.")(func)
        return click.option(
            "-n", "--noheader", is_flag=True,
            help="No header line (squeue/sinfo -h, sacct -n; -h is help on every "
                 "slurm-spot command).")(func)

    return decorate


def is_terminal() -> bool:
    """Whether stdout is a terminal (a person reading) rather than a pipe or a file."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def _cell(value: str, width: int | None) -> str:
    return value if width is None or len(value) <= width else value[:width]


def plain_lines(rows: Sequence[Mapping[str, str]], fields: Sequence[Field],
                header: bool = True) -> list[str]:
    """Columns separated by two spaces, left-aligned, no trailing blanks; an empty value is
    ``-`` so every row has as many words before the last column as the header (pure)."""
    table = [[_cell(str(r.get(f.name, "")) or "-", f.width) for f in fields] for r in rows]
    if header:
        table.insert(0, [_cell(f.name, f.width) for f in fields])
    widths = [f.width or max((len(line[i]) for line in table), default=0)
              for i, f in enumerate(fields)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in table]


def print_table(rows: Sequence[Mapping[str, str]], fields: Sequence[Field],
                header: bool = True) -> None:
    """Print ``rows`` (field name -> text): a rich table on a terminal, plain columns
    (:func:`plain_lines`) when stdout is a pipe or a file. Text holding an undecodable byte
    (a job name, a node reason) is shown escaped (``bad\\xff``) and aligned as shown. Cells are
    shown as written: rich's markup (``[bold]``, ``[/]``) and emoji codes (``:x:``) in a
    value are not read (an admin's reason ``[jdoe] disk`` lost its ``[jdoe]``, and ``[/]``
    stopped the command with a traceback)."""
    rows = [{name: escaped(str(text)) for name, text in r.items()} for r in rows]
    if not is_terminal():
        for line in plain_lines(rows, fields, header):
            click.echo(line)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(show_header=header)
    for f in fields:
        table.add_column(f.name, width=f.width, no_wrap=f.width is not None,
                         overflow="crop" if f.width else "fold")
    for r in rows:
        table.add_row(*(Text(_cell(str(r.get(f.name, "")), f.width)) for f in fields))
    Console(file=sys.stdout).print(table)
