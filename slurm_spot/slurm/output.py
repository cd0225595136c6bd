"""Reading what Slurm's commands print: JSON (preferred) and the ``-o`` text form (fallback).

JSON where the Slurm version has it (docs/DESIGN.md; docs/local-slurm.md):

- Slurm 22.05 (data_parser v0.0.38): ``sinfo --json`` lists ``nodes`` with ``name``,
  ``address``, ``hostname``, ``state`` (a string) and ``state_flags``, ``reason`` (without the
  ``[user@time]`` suffix), ``partitions`` (a list) and ``boot_time`` (Unix seconds);
  ``scontrol --json`` does not exist (scontrol exits 1).
- Slurm 23.02+: ``scontrol --json show node`` gives the same ``nodes`` list with ``state`` as a
  list of words and numbers possibly as ``{"set": true, "number": N}``; ``sinfo --json``
  changed shape there (a ``sinfo`` list of groups), so it is read only if it has ``nodes``.

Both commands may print warning lines (``sinfo: error: ...``, plugin messages) before the JSON
object on stdout; :func:`load_json` skips them.

Text: ``scontrol -o show node`` puts a node on one line of ``Key=value`` words whose values
may hold spaces and ``=``. A node reason is free text written by whoever set it
(``maint: State=bad disk``, ``epilog failed: Exit=1 on step 3``), so it is cut out first, up to
the ``[user@time]`` suffix scontrol appends, before the other keys are read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from slurm_spot.slurm.states import NodeState, parse_node_state, parse_node_state_json

# scontrol appends " [user@2026-03-01T11:00:00]" to a reason (slurm 22.05 node_info.c).
_REASON = re.compile(r"(?:^| )Reason=(?P<text>.*) \[(?P<who>[^\s\]@]+)@(?P<when>[0-9T:-]+)\]")
# Keys scontrol 22.05-24.11 print after Reason= when the reason lacks its suffix.
_AFTER_REASON = re.compile(r" (?:Comment|Extra|ResumeAfterTime|InstanceId|InstanceType)=")


def load_json(stdout: str) -> Any:
    """The JSON document in ``stdout``, skipping any lines printed before it.

    Raises:
        ValueError: no line starts a JSON object/array, or the document is not valid JSON.
    """
    decoder = json.JSONDecoder()
    offset = 0
    for line in stdout.splitlines(keepends=True):
        if line.lstrip().startswith(("{", "[")):
            start = offset + len(line) - len(line.lstrip())
            value, _ = decoder.raw_decode(stdout, start)
            return value
        offset += len(line)
    raise ValueError("no JSON document in the command's output")


def _number(value: object) -> int | None:
    """22.05 plain ints or 23.02+ ``{"set": true, "number": N}``."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") and "number" in value else None
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _partitions(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(p for p in value.split(",") if p)
    if isinstance(value, list):
        return tuple(str(p) for p in value if p)
    return ()


def _local_time(text: str) -> float | None:
    """scontrol's local ``2026-03-01T08:22:00`` as Unix seconds; None for None/Unknown."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _unset(value: str) -> str:
    """An unset string field, as scontrol prints it (``(null)``, ``N/A``), is ``""``."""
    return "" if value in ("(null)", "N/A", "None") else value


def _weight(value: Any) -> int | None:
    """A node's scheduling Weight (an integer; newer data_parser versions wrap numbers in
    ``{"set": true, "number": N}``), None when absent or unreadable."""
    return _number(value)


def node_fields_json(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One node object of ``sinfo --json`` (22.05) / ``scontrol --json show node`` (23.02+)
    as the keyword arguments of :class:`~slurm_spot.slurm.client.Node` (without ``jobs``).

    ``boot_time`` is returned as Slurm's text form (``2026-03-01T11:00:00``, local time) or
    ``"None"``, as the text output gives it.

    Raises:
        ValueError: no ``name`` or no readable state.
    """
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"node object without a name: {dict(obj)!r:.200}")
    boot = _number(obj.get("boot_time"))
    reason = obj.get("reason")
    return {
        "name": name,
        "state": parse_node_state_json(obj),
        "reason": "" if reason in (None, "none", "None") else str(reason).strip(),
        "addr": str(obj.get("address") or ""),
        "hostname": str(obj.get("hostname") or ""),
        "partitions": _partitions(obj.get("partitions")),
        "boot_time": datetime.fromtimestamp(boot).isoformat(timespec="seconds") if boot else "None",
        "weight": _weight(obj.get("weight")),
        "instance_id": _unset(str(obj.get("instance_id") or "")),
        "instance_type": _unset(str(obj.get("instance_type") or "")),
        "slurmd_start_time": _number(obj.get("slurmd_start_time")) or None,
    }


def nodes_json(stdout: str) -> list[dict[str, Any]] | None:
    """Node field dicts from a JSON node listing; None if ``stdout`` holds no ``nodes`` list
    (another Slurm version's shape: the caller falls back to text).

    A node object that cannot be read is skipped (one node never stops the others).
    """
    try:
        data = load_json(stdout)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        return None
    found = []
    for obj in data["nodes"]:
        if isinstance(obj, dict):
            try:
                found.append(node_fields_json(obj))
            except ValueError:
                continue
    return found


def split_reason(line: str) -> tuple[str, str]:
    """``(line without its Reason=..., reason text)`` of one ``scontrol -o show node`` line.

    The reason runs up to scontrol's ``[user@time]`` suffix; without that suffix, up to the
    next of the few keys scontrol prints after it, or the end of the line. ``none`` -> ``""``.
    """
    match = _REASON.search(line)
    if match:
        text = match.group("text").strip()
        rest = line[: match.start()] + line[match.end():]
    else:
        if line.startswith("Reason="):
            start = 0
        else:
            start = line.find(" Reason=") + 1
            if start == 0:
                return line, ""
        body_start = start + len("Reason=")
        after = _AFTER_REASON.search(line, body_start)
        end = after.start() if after else len(line)
        text = line[body_start:end].strip()
        rest = line[:start] + line[end:]
    return rest, "" if text in ("none", "None", "(null)") else text


def node_fields_text(line: str) -> dict[str, Any]:
    """One ``scontrol -o show node`` line as :class:`~slurm_spot.slurm.client.Node` keyword
    arguments (without ``jobs``).

    Raises:
        ValueError: no ``NodeName=`` or an unreadable state.
    """
    from slurm_spot.slurm.states import parse_oneline

    rest, reason = split_reason(line)
    fields = parse_oneline(rest)
    name = fields.get("NodeName", "")
    if not name:
        raise ValueError(f"no NodeName in {line[:200]!r}")
    state: NodeState = parse_node_state(fields.get("State", "UNKNOWN"))
    return {
        "name": name,
        "state": state,
        "reason": reason,
        "addr": fields.get("NodeAddr", ""),
        "hostname": fields.get("NodeHostName", ""),
        "partitions": tuple(p for p in fields.get("Partitions", "").split(",") if p),
        "boot_time": fields.get("BootTime", ""),
        "weight": _weight(fields.get("Weight")),
        "instance_id": _unset(fields.get("InstanceId", "")),
        "instance_type": _unset(fields.get("InstanceType", "")),
        "slurmd_start_time": _local_time(fields.get("SlurmdStartTime", "")),
    }
