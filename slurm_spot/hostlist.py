"""Hostlist expressions (``gpu-[001-003,010],cpu-[1-2]``), expanded and compressed.

Built on python-hostlist, whose expansion matches ``scontrol show hostnames`` for every
expression Slurm passes to ResumeProgram/SuspendProgram; this module adds validation and
errors that name the bad part.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import hostlist as _hostlist

from slurm_spot.errors import HostlistError, UnknownNodeError

if TYPE_CHECKING:
    from slurm_spot.config import SpotConfig

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)


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


def expand(expr: str) -> list[str]:
    """Expand a hostlist expression into node names, in order, without duplicates.

    Args:
        expr: e.g. ``"nodeA,nodeB[001,003]"``; surrounding whitespace is ignored.

    Returns:
        ``["nodeA", "nodeB001", "nodeB003"]``.

    Raises:
        HostlistError: empty input, unbalanced brackets, a reversed or non-numeric range, or a
            character that cannot appear in a node name; the message quotes the bad part.
    """
    text = expr.strip()
    if not text:
        raise HostlistError("empty hostlist: expected node names such as 'spot-[1-4]'")
    for part in _split_top_level(text):
        if not part.strip():
            raise HostlistError(f"bad hostlist {expr!r}: empty element between commas")
        try:
            names = _hostlist.expand_hostlist(part)
        except _hostlist.BadHostlist as exc:
            raise HostlistError(f"bad hostlist {expr!r}: part {part!r}: {exc}") from None
        for name in names:
            if not _NODE_NAME.fullmatch(name):
                raise HostlistError(
                    f"bad hostlist {expr!r}: part {part!r} gives {name!r}, not a valid node name"
                )
    return list(dict.fromkeys(_hostlist.expand_hostlist(text)))


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
