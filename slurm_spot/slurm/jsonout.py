"""``--json`` output of every Slurm from 22.05 to 26.05, read into :class:`Node` and :class:`Job`.

One reader for all data_parser versions (``meta.plugins.data_parser`` in each document;
fixtures captured from the real releases are in tests/data/slurm-json/<version>/):

============  ==========  =================================================================
data_parser   Slurm       shape
============  ==========  =================================================================
v0.0.38       22.05       ``sinfo --json``: ``nodes`` of objects with ``state`` a string plus
                          ``state_flags``; numbers plain; ``scontrol`` has no ``--json``;
                          ``squeue --json``: ``job_state`` a string.
v0.0.39       23.02       ``scontrol show node --json``: ``nodes`` with ``state`` a list;
v0.0.40-41    23.11-24.05 numbers as ``{"set": true, "infinite": false, "number": N}``;
v0.0.42-45    24.11-26.05 ``job_state`` a list; ``sinfo --json`` becomes ``sinfo``: a list of
                          groups (``nodes.nodes`` = names, ``node.state`` = one state for
                          the group); nodes gain ``instance_id``/``instance_type`` (23.11+).
============  ==========  =================================================================

Every field is read defensively (missing keys, ``null``, an unset number) so a field that a
later release drops or renames leaves that field empty instead of failing the whole read; a
node or job object that cannot be read at all raises :class:`ValueError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from slurm_spot.slurm.client import Job, Node
from slurm_spot.slurm.states import NodeState, parse_job_state, parse_node_state_json


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
    None when unset, infinite or absent."""
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
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _slurm_time(value: object) -> str:
    """Unix seconds -> Slurm's text form (local time, ``2026-03-01T11:00:00``), as
    ``scontrol show node`` prints BootTime; ``None`` when unset."""
    seconds = number(value)
    if not seconds:
        return "None"
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%dT%H:%M:%S")


def _partitions(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(p for p in value.split(",") if p)
    if isinstance(value, list):
        return tuple(str(p) for p in value if p)
    return ()


def parse_node(obj: Mapping[str, Any]) -> Node:
    """One node object of ``sinfo --json`` (22.05) or ``scontrol show node --json`` (23.02+).

    Raises:
        ValueError: no ``name`` or no readable ``state``.
    """
    name = obj.get("name")
    if not name:
        raise ValueError(f"node object without a name: {sorted(obj)!r}")
    try:
        state = parse_node_state_json(obj)
    except ValueError as exc:
        raise ValueError(f"node {name}: {exc}") from None
    reason = _text(obj.get("reason"))
    return Node(
        name=str(name), state=state, reason="" if reason == "none" else reason,
        addr=_text(obj.get("address")), hostname=_text(obj.get("hostname")),
        partitions=_partitions(obj.get("partitions")),
        boot_time=_slurm_time(obj.get("boot_time")),
        instance_id=_text(obj.get("instance_id")), instance_type=_text(obj.get("instance_type")),
    )


def parse_nodes(document: Mapping[str, Any]) -> list[Node]:
    """Every node of a ``sinfo --json`` or ``scontrol show node --json`` document.

    From 23.02's ``sinfo`` groups only the name and state are known (one group per state and
    partition), so a node listed in several groups is kept once, with its partitions merged;
    read ``scontrol show node --json`` for the other fields.

    Raises:
        ValueError: a node that cannot be read (see :func:`parse_node`), or neither ``nodes``
            nor ``sinfo`` in the document.
    """
    if isinstance(document.get("nodes"), list):
        return [parse_node(obj) for obj in document["nodes"]]
    groups = document.get("sinfo")
    if not isinstance(groups, list):
        raise ValueError("neither 'nodes' nor 'sinfo' in the JSON document")
    found: dict[str, Node] = {}
    for group in groups:
        names = (group.get("nodes") or {}).get("nodes") or []
        node = group.get("node") or {}
        state = parse_node_state_json({"state": node.get("state") or []})
        partition = (group.get("partition") or {}).get("name")
        reason = _text((group.get("reason") or {}).get("description"))
        for name in names:
            old = found.get(name)
            parts = (old.partitions if old else ()) + ((str(partition),) if partition else ())
            found[name] = Node(name=str(name), state=state, reason=reason,
                               partitions=tuple(dict.fromkeys(parts)))
    return list(found.values())


def parse_job(obj: Mapping[str, Any]) -> Job:
    """One job object of ``squeue --json`` (22.05-26.05).

    Raises:
        ValueError: no ``job_id`` or no known job state.
    """
    job_id = number(obj.get("job_id"))
    if job_id is None:
        raise ValueError(f"job object without a job_id: {sorted(obj)!r}")
    raw = obj.get("job_state") or "PENDING"
    try:
        state = parse_job_state(raw)
    except ValueError as exc:
        raise ValueError(f"job {job_id}: {exc}") from None
    array_job = number(obj.get("array_job_id"))
    return Job(
        job_id=job_id, state=state, name=_text(obj.get("name")),
        reason=_text(obj.get("state_reason")), nodes=_text(obj.get("nodes")),
        partition=_text(obj.get("partition")), restarts=number(obj.get("restart_cnt")) or 0,
        array_job_id=array_job or None, array_task_id=number(obj.get("array_task_id")),
        user=_text(obj.get("user_name")), flags=state.flags,
    )


def parse_jobs(document: Mapping[str, Any]) -> list[Job]:
    """Every job of a ``squeue --json`` document (see :func:`parse_job`)."""
    return [parse_job(obj) for obj in document.get("jobs") or []]


__all__ = ["NodeState", "data_parser", "number", "parse_job", "parse_jobs", "parse_node",
           "parse_nodes"]
