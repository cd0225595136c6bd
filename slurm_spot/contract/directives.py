"""``#SBATCH`` directives and sbatch options, read as sbatch reads them: the submit side
(``slurm-spot sbatch``, the ``--torchrun`` scripts) and the watcher (which reads a running job's
own ``--signal`` back from its batch script) share this one reader.

sbatch(1): "The batch script may contain options preceded with '#SBATCH' before any executable
commands in the script. sbatch will stop processing further #SBATCH directives once the first
non-comment non-whitespace line has been reached in the script." A directive line must begin
with ``#SBATCH`` itself: ``# SBATCH`` and ``### #SBATCH`` are plain comments.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_spot.contract.sbatch_options import canonical_option, split_clusters
from slurm_spot.errors import BadInputError


@dataclass(frozen=True)
class Directive:
    """One ``#SBATCH`` line: its 1-based line number and the options on it."""

    line: int
    options: tuple[str, ...]


@dataclass(frozen=True)
class ScriptDirectives:
    """Directives sbatch uses, and ``#SBATCH`` lines after the first command it ignores."""

    active: tuple[Directive, ...]
    ignored: tuple[Directive, ...]

    def options(self) -> list[str]:
        return [opt for d in self.active for opt in d.options]


def read_directives(script: str) -> ScriptDirectives:
    """Read a batch script's ``#SBATCH`` directives as sbatch does (see the module docstring).

    Raises:
        BadInputError: a directive's quoting is broken (names the line).
    """
    active: list[Directive] = []
    ignored: list[Directive] = []
    in_header = True
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if raw.startswith("#SBATCH"):  # only at column 0: sbatch ignores an indented one
            rest = raw[len("#SBATCH"):].rstrip()
            if rest and not rest[0].isspace():
                continue  # '#SBATCHX' is a comment too
            try:
                options = tuple(shlex.split(rest, comments=True))
            except ValueError as exc:
                raise BadInputError(f"line {number}: cannot parse #SBATCH directive: {exc}") from None
            (active if in_header else ignored).append(Directive(number, options))
        elif line and not line.startswith("#"):
            in_header = False
    return ScriptDirectives(tuple(active), tuple(ignored))


def option_values(options: Sequence[str], long: str, short: str | None = None) -> list[str]:
    """Values given to an option in ``options`` (``--nodes=2``, ``--nodes 2``, ``-N2``, ``-N 2``)."""
    values = []
    options = [canonical_option(w) for w in split_clusters(options)]
    for i, word in enumerate(options):
        if word.startswith(long + "="):
            values.append(word.split("=", 1)[1])
        elif word == long or (short and word == short):
            if i + 1 < len(options):
                values.append(options[i + 1])
        elif short and word.startswith(short) and len(word) > len(short) and not word.startswith("--"):
            values.append(word[len(short):])
    return values


def has_flag(options: Sequence[str], *names: str) -> bool:
    """True if any of ``names`` appears as an option (with or without ``=value``), also in an
    abbreviated form sbatch accepts."""
    words = [canonical_option(w) for w in options]
    return any(w == n or w.startswith(n + "=") for w in words for n in names)
