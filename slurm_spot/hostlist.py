"""Hostlist expressions (``gpu-[001-003,010],cpu-[1-2]``), expanded and compressed.

Built on python-hostlist, whose expansion matches ``scontrol show hostnames`` for every
expression Slurm passes to ResumeProgram/SuspendProgram; this module adds validation and
errors that name the bad part.

Which node names are valid: slurm.conf(5) (22.05), NodeName: "It may also be an arbitrary
string if NodeHostname is specified". Slurm's own hostlist code splits only on commas and
whitespace and reads ``[...]`` as ranges, so ``gpu+a100_1``, ``n.rack1-01``, ``a:b1`` and
``n@1`` are all node names (``scontrol show hostnames`` expands them, and slurmctld accepts
them; see tests/test_hostlist_e2e.py). What is refused here is what cannot survive the trip
through slurm.conf, a hostlist or a file name: whitespace and control characters, ``,``,
``[``, ``]``, ``=`` and ``#`` (slurm.conf key and comment), ``/`` and NUL (slurm-spot keeps
per-node files named after the node), and a leading ``-`` (scontrol reads it as an option).
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import hostlist as _hostlist

from slurm_spot.errors import HostlistError, UnknownNodeError

if TYPE_CHECKING:
    from slurm_spot.config import SpotConfig

# Printable, no whitespace, none of , [ ] = # / and not starting with '-'.
_NODE_NAME = re.compile(r"(?!-)[^\s\x00-\x1f\x7f,\[\]=#/]+")


def is_node_name(name: str) -> bool:
    """True if ``name`` is a node name slurm-spot can manage (see the module docstring)."""
    return bool(_NODE_NAME.fullmatch(name))


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def expand(expr: str, allow_duplicates: bool = False) -> list[str]:
    """Expand a hostlist expression into node names, in order.

    Args:
        expr: e.g. ``"nodeA,nodeB[001,003]"``; surrounding whitespace is ignored.
        allow_duplicates: keep names that appear twice (``scontrol show hostnames x[1-2,2]``
            prints ``x2`` twice) instead of refusing the expression.

    Returns:
        ``["nodeA", "nodeB001", "nodeB003"]``.

    Raises:
        HostlistError: empty input, unbalanced brackets, a reversed or non-numeric range, a
            name Slurm cannot take (see the module docstring), or, unless
            ``allow_duplicates``, a name given twice (``x[1-3,2-4]``: ``x2``, ``x3``); the
            message quotes the bad part.
    """
    text = expr.strip()
    if not text:
        raise HostlistError("empty hostlist: expected node names such as 'spot-[1-4]'")
    names: list[str] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise HostlistError(f"bad hostlist {expr!r}: empty element between commas")
        try:
            expanded = _hostlist.expand_hostlist(part, allow_duplicates=True)
        except _hostlist.BadHostlist as exc:
            raise HostlistError(f"bad hostlist {expr!r}: part {part!r}: {exc}") from None
        for name in expanded:
            if not is_node_name(name):
                raise HostlistError(
                    f"bad hostlist {expr!r}: part {part!r} gives {name!r}, not a valid node "
                    "name (no whitespace, control characters, ',', '[', ']', '=', '#', '/', "
                    "or leading '-')"
                )
        names.extend(expanded)
    if not allow_duplicates:
        twice = [name for name, n in Counter(names).items() if n > 1]
        if twice:
            raise HostlistError(
                f"bad hostlist {expr!r}: {', '.join(twice)} given more than once"
            )
    return names


def compress(names: Iterable[str]) -> str:
    """Compress node names into one hostlist expression (``["n1", "n2"]`` -> ``"n[1-2]"``)."""
    return str(_hostlist.collect_hostlist(list(names)))


def group_by_node_set(config: SpotConfig, hostlist: str) -> dict[str, list[str]]:
    """``{node set name: [nodes]}`` for a hostlist, in hostlist order.

    Raises:
        HostlistError: the expression is malformed.
        UnknownNodeError: a node belongs to no node set (nothing is changed then).
    """
    groups: dict[str, list[str]] = defaultdict(list)
    unknown = []
    for node in expand(hostlist):
        ns = config.node_set_of(node)
        if ns is None:
            unknown.append(node)
        else:
            groups[ns.name].append(node)
    if unknown:
        known = ", ".join(ns.hostlist for ns in config.node_sets)
        raise UnknownNodeError(
            f"node(s) {', '.join(unknown)} belong to no node set (configured: {known})"
        )
    return dict(groups)


def natural_compare(a: str, b: str) -> int:
    """-1, 0 or 1 as Slurm orders two node names: ``strnatcmp`` (src/common/strnatcmp.c, what
    slurmctld sorts its node table with when no topology plugin ranks the nodes), i.e.
    character by character, but a run of digits against a run of digits compared as numbers
    (``gpu-2`` before ``gpu-10``); a run with a leading zero compares digit by digit, as a
    fraction. Case-sensitive (ASCII). Spaces are not skipped (node names have none)."""
    i = j = 0
    while i < len(a) and j < len(b):
        ca, cb = a[i], b[j]
        if ca.isdigit() and cb.isdigit() and ca.isascii() and cb.isascii():
            ei, ej = i, j
            while ei < len(a) and a[ei].isdigit() and a[ei].isascii():
                ei += 1
            while ej < len(b) and b[ej].isdigit() and b[ej].isascii():
                ej += 1
            ra, rb = a[i:ei], b[j:ej]
            if ca == "0" or cb == "0":
                if ra != rb:  # fractional: left-aligned digit comparison
                    return -1 if ra < rb else 1
            elif int(ra) != int(rb):
                return -1 if int(ra) < int(rb) else 1
            i, j = ei, ej
            continue
        if ca != cb:
            return -1 if ca < cb else 1
        i += 1
        j += 1
    return (len(a) - i > len(b) - j) - (len(a) - i < len(b) - j)


def slurm_node_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order of slurmctld's node table (:func:`natural_compare`), which
    decides among equally weighted nodes: on Slurm before 23.02 that is every powered-down
    node (:attr:`slurm_spot.slurm.version.SlurmVersion.powered_down_weight`)."""
    return sorted(names, key=functools.cmp_to_key(natural_compare))
