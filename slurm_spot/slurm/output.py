"""Reading what Slurm's commands print: JSON (preferred) and the ``-o`` text form (fallback).
The one reader of Slurm's output: :class:`~slurm_spot.slurm.client.SlurmClient` builds its
records from these field dicts, and the fixture tests read every captured version with them.

JSON of every data_parser version from v0.0.38 (22.05) to v0.0.45 (26.05) (``meta.plugin(s)
.data_parser`` in each document, :func:`data_parser`; fixtures captured from the real releases
are in tests/data/slurm-json/<release>/<data_parser>/, docs/slurm-versions.md):

============  ==========  =================================================================
data_parser   Slurm       shape
============  ==========  =================================================================
v0.0.38       22.05       ``sinfo --json``: ``nodes`` of objects with ``state`` a string plus
                          ``state_flags``, ``reason`` without the ``[user@time]`` suffix,
                          ``partitions`` a list, ``boot_time`` Unix seconds, numbers plain;
                          ``scontrol --json`` does not exist (scontrol exits 1);
                          ``squeue --json``: ``job_state`` a string.
v0.0.39       23.02       ``scontrol --json show node``: the same ``nodes`` list with
                          ``state`` a list of words;
v0.0.40-41    23.11-24.05 numbers as ``{"set": true, "infinite": false, "number": N}``;
v0.0.42-45    24.11-26.05 ``job_state`` a list; ``sinfo --json`` becomes ``sinfo``: a list of
                          groups (``nodes.nodes`` = names, ``node.state`` = one state for
                          the group); nodes gain ``instance_id``/``instance_type`` (23.11+).
============  ==========  =================================================================

Every field is read defensively (missing keys, ``null``, an unset number), so a field that a
later release drops or renames leaves that field empty instead of failing the whole read; a
node or job object that cannot be read at all raises :class:`ValueError` naming it.
Commands may print warning lines (``sinfo: error: ...``, plugin messages) before the JSON
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

from slurm_spot.slurm.states import (
    NodeState,
    parse_job_state,
    parse_node_state,
    parse_node_state_json,
)

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


def reported_errors(document: object) -> list[str]:
    """The errors a Slurm JSON document reports in its ``errors`` list, as texts
    (``"slurm_load_jobs: Failed while looking for jobs (Unspecified error)"``); [] for none.

    Slurm 22.05's ``sinfo --json`` and ``squeue --json`` exit 0 when slurmctld cannot be
    reached or refuses them (MUNGE down, a restart): they print empty ``nodes``/``jobs``
    lists with the failure only in ``errors`` (measured with 22.05.8; 24.11 and 26.05 exit
    1 instead). An empty list read from such a document is no listing at all."""
    if not isinstance(document, dict) or not isinstance(document.get("errors"), list):
        return []
    texts = []
    for entry in document["errors"]:
        if isinstance(entry, dict):
            words = [_text(entry.get(key)) for key in ("source", "description", "error")]
            text = ": ".join(w for w in words[:2] if w)
            texts.append(f"{text} ({words[2]})" if text and words[2] else text or words[2]
                         or "an error without a description")
        elif entry:
            texts.append(str(entry))
    return texts


class ReportedErrors(ValueError):
    """A Slurm JSON document that reports errors (:func:`reported_errors`): its lists are
    not to be read as the cluster's."""


def data_parser(document: Mapping[str, Any]) -> str | None:
    """The data_parser version that wrote ``document`` (``"v0.0.42"``), if it says.

    22.05 has ``meta.plugin.data_parser`` absent and ``meta.Slurm.version``; 23.02+ have
    ``meta.plugin.data_parser`` (``data_parser/v0.0.39``) or ``meta.plugins.data_parser``."""
    meta = document.get("meta") or {}
    for key in ("plugin", "plugins"):
        value = (meta.get(key) or {}).get("data_parser") if isinstance(meta.get(key), dict) else None
        if value:
            return str(value).rsplit("/", 1)[-1]
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    version = slurm.get("version") if isinstance(slurm, dict) else None
    if isinstance(version, dict) and version.get("major") in (22, "22"):
        return "v0.0.38"
    return None


def number(value: object) -> int | None:
    """A plain int (22.05) or ``{"set": bool, "infinite": bool, "number": N}`` (23.02+);
    None when unset, infinite, absent or unreadable."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _text(value: object) -> str:
    """A string field; a list (some versions' ``reason``, ``partition``) joined with commas."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _partitions(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(p for p in value.split(",") if p)
    if isinstance(value, list):
        return tuple(str(p) for p in value if p)
    return ()


def local_time(text: str) -> float | None:
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
    return number(value)


def _boot_time(value: object) -> str:
    """Unix seconds -> Slurm's text form (local time, ``2026-03-01T11:00:00``), as
    ``scontrol show node`` prints BootTime; ``"None"`` when unset."""
    seconds = number(value)
    return datetime.fromtimestamp(seconds).isoformat(timespec="seconds") if seconds else "None"


def node_fields_json(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One node object of ``sinfo --json`` (22.05) / ``scontrol --json show node`` (23.02+)
    as the keyword arguments of :class:`~slurm_spot.slurm.client.Node` (without ``jobs``).

    ``boot_time`` is returned as Slurm's text form (``2026-03-01T11:00:00``, local time) or
    ``"None"``, as the text output gives it.

    Raises:
        ValueError: no ``name`` or no readable state (the message names the node).
    """
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"node object without a name: {dict(obj)!r:.200}")
    try:
        state = parse_node_state_json(obj)
    except ValueError as exc:
        raise ValueError(f"node {name}: {exc}") from None
    reason = _text(obj.get("reason")).strip()
    return {
        "name": name,
        "state": state,
        "reason": "" if reason in ("none", "None") else reason,
        "addr": _text(obj.get("address")),
        "hostname": _text(obj.get("hostname")),
        "partitions": _partitions(obj.get("partitions")),
        "boot_time": _boot_time(obj.get("boot_time")),
        "weight": _weight(obj.get("weight")),
        "instance_id": _unset(_text(obj.get("instance_id"))),
        "instance_type": _unset(_text(obj.get("instance_type"))),
        "slurmd_start_time": number(obj.get("slurmd_start_time")) or None,
    }


def nodes_from_json(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every node of a ``sinfo --json`` or ``scontrol --json show node`` document of any
    data_parser version, as :func:`node_fields_json` dicts.

    From 24.11's ``sinfo`` groups only the name, state, reason and partitions are known (one
    group per state and partition; the other fields are left empty), so a node listed in
    several groups is kept once, with its partitions merged; read ``scontrol --json show
    node`` for the other fields.

    Raises:
        ValueError: a node that cannot be read (see :func:`node_fields_json`), or neither
            ``nodes`` nor ``sinfo`` in the document.
    """
    if isinstance(document.get("nodes"), list):
        return [node_fields_json(obj) for obj in document["nodes"]]
    groups = document.get("sinfo")
    if not isinstance(groups, list):
        raise ValueError("neither 'nodes' nor 'sinfo' in the JSON document")
    found: dict[str, dict[str, Any]] = {}
    for group in groups:
        names = (group.get("nodes") or {}).get("nodes") or []
        if not names:
            continue
        partition = _text((group.get("partition") or {}).get("name"))
        fields = node_fields_json({"name": str(names[0]),
                                   "state": (group.get("node") or {}).get("state") or [],
                                   "reason": (group.get("reason") or {}).get("description")})
        for name in names:
            old = found.get(name, {}).get("partitions", ())
            parts = old + ((partition,) if partition else ())
            found[name] = {**fields, "name": str(name), "partitions": tuple(dict.fromkeys(parts))}
    return list(found.values())


def job_fields_json(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One job object of ``squeue --json`` (22.05-26.05) as the keyword arguments of
    :class:`~slurm_spot.slurm.client.Job`.

    Raises:
        ValueError: no ``job_id`` or no known job state (the message names the job).
    """
    job_id = number(obj.get("job_id"))
    if job_id is None:
        raise ValueError(f"job object without a job_id: {sorted(obj)!r}")
    try:
        state = parse_job_state(obj.get("job_state") or "PENDING")
    except ValueError as exc:
        raise ValueError(f"job {job_id}: {exc}") from None
    return {
        "job_id": job_id, "state": state, "name": _text(obj.get("name")),
        "reason": _text(obj.get("state_reason")), "nodes": _text(obj.get("nodes")),
        "partition": _text(obj.get("partition")), "restarts": number(obj.get("restart_cnt")) or 0,
        "array_job_id": number(obj.get("array_job_id")) or None,
        "array_task_id": number(obj.get("array_task_id")),
        "user": _text(obj.get("user_name")), "flags": state.flags,
        "submit_time": number(obj.get("submit_time")) or None,
        "start_time": number(obj.get("start_time")) or None,
        "features": _text(obj.get("features")),
    }


def jobs_from_json(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every job of a ``squeue --json`` document (see :func:`job_fields_json`).

    Raises:
        ValueError: a job that cannot be read.
    """
    return [job_fields_json(obj) for obj in document.get("jobs") or []]


def nodes_json(stdout: str) -> list[dict[str, Any]] | None:
    """Node field dicts from a JSON node listing; None if ``stdout`` holds no ``nodes`` list
    (another Slurm version's shape: the caller falls back to text).

    A node object that cannot be read is skipped (one node never stops the others).

    Raises:
        ReportedErrors: the document reports errors (:func:`reported_errors`).
    """
    try:
        data = load_json(stdout)
    except ValueError:
        return None
    errors = reported_errors(data)
    if errors:
        raise ReportedErrors("; ".join(errors))
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
        "slurmd_start_time": local_time(fields.get("SlurmdStartTime", "")),
    }
