"""What ``slurm-spot status`` shows, as data: one row per cloud node (its Slurm state, the
instance behind it, its jobs), one per node set (capacity: ok, or cooldown until when and why;
issue 24) and the last failovers (from the events file). The command
(:mod:`slurm_spot.commands.status`) formats them; tests and scripts read them here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_spot.config import SpotConfig
from slurm_spot.lifecycle.power import ProviderFactory
from slurm_spot.providers import assign_listings, get_provider, pick_kept
from slurm_spot.providers.base import Instance
from slurm_spot.slurm.client import Node, SlurmClient
from slurm_spot.slurm.reasons import parse_cooldown, reason_code, short_state

#: How many failovers status shows (the newest), and how far back it looks for them.
FAILOVER_LIMIT = 5
FAILOVER_WINDOW = timedelta(hours=24)


def _row(node: Node | None, name: str, node_set: str | None, alive: Sequence[Instance],
         provider: dict[str, str], now: datetime) -> dict[str, object]:
    inst = (pick_kept(node, alive) if node else alive[0]) if alive else None
    return {
        "node": name,
        "node_set": node_set,
        "state": short_state(node.state) if node else "(not in Slurm)",
        "slurm_state": str(node.state) if node else None,
        "reason": node.reason if node else "",
        "instance": inst.instance_id if inst else None,
        "provider": provider.get(inst.instance_id) if inst else None,
        "instance_state": inst.state.value if inst else None,
        "market": inst.market if inst else None,
        "type": inst.instance_type if inst else None,
        "zone": inst.zone if inst else None,
        "uptime_s": round(inst.age_s(now), 1) if inst else None,
        "extra_instances": [i.instance_id for i in alive if i is not inst],
        "jobs": list(node.jobs) if node else [],
    }


def status_rows(
    config: SpotConfig,
    slurm: SlurmClient,
    providers: ProviderFactory = get_provider,
    now: datetime | None = None,
    slurm_nodes: Sequence[Node] | None = None,
) -> tuple[list[dict[str, object]], list[str]]:
    """Rows for every node of every node set, then for alive instances of unknown nodes;
    and one error line per provider that could not be listed. ``slurm_nodes``: Slurm's
    nodes if already read (else read here).

    Raises:
        SlurmCommandError: Slurm's nodes cannot be read.
    """
    now = now or datetime.now(timezone.utc)
    alive: dict[str, list[Instance]] = {}
    provider_of: dict[str, str] = {}
    errors = []
    listings: dict[str, list[Instance]] = {}
    for name in sorted({ns.provider for ns in config.node_sets}):
        try:
            listings[name] = list(providers(config, name).list_instances())
        except Exception as exc:  # any SDK error: show the rest
            errors.append(f"provider {name}: {exc}")
    for name, listed in sorted(assign_listings(config, listings).items()):
        for inst in listed:
            if inst.state.is_alive:
                alive.setdefault(inst.node or "?", []).append(inst)
                provider_of[inst.instance_id] = name
    set_of = {n: ns.name for ns in config.node_sets for n in ns.node_names}
    read = slurm.nodes() if slurm_nodes is None else slurm_nodes
    nodes = {n.name: n for n in read if n.name in set_of}
    rows = [_row(nodes[n], n, set_of[n], alive.get(n, []), provider_of, now)
            for n in set_of if n in nodes]
    for name in sorted(set(alive) - set(nodes)):
        rows.append(_row(None, name, set_of.get(name), alive[name], provider_of, now))
    return rows, errors


def node_set_rows(config: SpotConfig, nodes: Sequence[Node],
                  now: datetime) -> list[dict[str, object]]:
    """One row per node set: its capacity state, read from Slurm's node reasons (Slurm is
    the record; :mod:`slurm_spot.slurm.reasons`). Pure.

    ``capacity`` is ``cooldown`` while a node of the set is DOWN with ``(Code:X)Temporarily
    disabled until T`` and T (``until``, ISO 8601 UTC) is after ``now`` (aware); else ``ok``.
    ``code`` is the provider code of the cooldown; ``why`` says it in words, with the launch
    error's message where a node of the set still shows it (``(Code:X)<message>``).
    """
    rows: list[dict[str, object]] = []
    for ns in config.node_sets:
        members = set(ns.node_names)
        mine = [n for n in nodes if n.name in members]
        running = [c for n in mine if n.state.is_down
                   and (c := parse_cooldown(n.reason)) is not None and c[1] > now]
        row: dict[str, object] = {"node_set": ns.name, "provider": ns.provider,
                                  "weight": ns.weight, "capacity": "ok", "until": None,
                                  "code": None, "why": ""}
        if running:
            code, until = max(running, key=lambda c: c[1])
            messages = [n.reason.split(")", 1)[1] for n in mine
                        if reason_code(n.reason) == code and parse_cooldown(n.reason) is None
                        and ")" in n.reason]
            why = f"no capacity ({code})"
            if messages and messages[0].strip():
                why += f": {messages[0].strip()}"
            row.update(capacity="cooldown", until=until.isoformat(), code=code, why=why)
        rows.append(row)
    return rows


def failover_rows(found: Iterable[dict[str, object]],
                  limit: int = FAILOVER_LIMIT) -> list[dict[str, object]]:
    """Where the last failovers went (pure): the newest ``limit`` jobs moved off a node set
    without capacity, newest first, from events (dicts as :func:`slurm_spot.events.
    read_events` yields them, oldest first).

    A move is the ``failover`` event the resume hook's worker writes when it clears a
    requeued job's hold (:mod:`slurm_spot.lifecycle.failover`), joined with the ``failover_started``
    event of the same job and failed node set that follows it once the job runs again. Each
    row: ``time`` (the failover event's, ISO 8601), ``job`` (id), ``from_node_set``,
    ``code`` (the provider's capacity code), ``to_node_set`` and ``nodes`` (where it
    started; None and [] until it has), ``seconds_from_error`` (capacity error -> seen
    started, seconds; None until then), ``candidates`` (the node sets it was eligible on,
    lowest Weight first), ``expedited`` (the requeue hold was cleared at once; False: left to
    the reconciler) and ``reason`` (the event's text, also the job's AdminComment note).
    """
    rows: list[dict[str, object]] = []
    open_moves: dict[tuple[int, str], dict[str, object]] = {}
    for event in found:
        action = event.get("action")
        if action not in ("failover", "failover_started"):
            continue
        extra = event.get("extra") if isinstance(event.get("extra"), dict) else {}
        assert isinstance(extra, dict)
        job_ids = event.get("job_ids") or []
        if not isinstance(job_ids, list) or not job_ids:
            continue
        key = (int(job_ids[0]), str(extra.get("from_node_set")))
        if action == "failover":
            row: dict[str, object] = {
                "time": event.get("time"), "job": key[0], "from_node_set": key[1],
                "code": _text_or_none(extra.get("code")), "to_node_set": None, "nodes": [],
                "seconds_from_error": None, "candidates": _texts(extra.get("candidates")),
                "expedited": extra.get("expedited") is True, "reason": event.get("reason", "")}
            rows.append(row)
            open_moves[key] = row
        elif key in open_moves:
            row = open_moves.pop(key)
            row.update(to_node_set=_text_or_none(extra.get("node_set")),
                       nodes=_texts(extra.get("nodes")),
                       seconds_from_error=_seconds(extra.get("seconds_from_error")),
                       reason=event.get("reason", row["reason"]))
    return list(reversed(rows))[:max(0, limit)]


def _texts(value: object) -> list[str]:
    """A list of names from an event's ``extra`` (a list there), else ``[]``: a line of
    another shape (``"nodes": 5``) is shown as no names, never stops ``status``."""
    return [str(v) for v in value] if isinstance(value, list) else []


def _text_or_none(value: object) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def _seconds(value: object) -> float | None:
    """A number of seconds from an event's ``extra`` (not a bool, finite), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def last_failovers(log_dir: Path, now: datetime, limit: int = FAILOVER_LIMIT,
                   window: timedelta = FAILOVER_WINDOW) -> list[dict[str, object]]:
    """:func:`failover_rows` of the events of the last ``window`` before ``now`` (aware),
    read from ``log_dir``'s events file and its rotated copies; none when there is no events
    file (status run where the controller's log is not)."""
    from slurm_spot.events import read_events

    return failover_rows(read_events(log_dir, since=now - window), limit)
