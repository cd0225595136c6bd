"""``slurm-spot status [--json]``: one row per cloud node: Slurm state, the instance behind it
(id, market, type, zone, uptime) and its current job; plus alive instances no node knows; then
each node set's capacity state (ok, or cooldown until when and why: issue 24) and where the
last failovers went (issue 24 part 6, from the events file)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.commands.tables import Field, is_terminal, print_table, table_options
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError, SlurmSpotError
from slurm_spot.power import ProviderFactory, _controller_unreachable
from slurm_spot.providers import assign_listings, get_provider
from slurm_spot.providers.base import Instance
from slurm_spot.reconcile.rules import pick_kept
from slurm_spot.slurm.client import Node, SlurmClient
from slurm_spot.slurm.reasons import parse_cooldown, reason_code, short_state, utc_stamp

COLUMNS = ("node", "state", "instance", "market", "type", "zone", "uptime", "job", "reason")
NODE_SET_COLUMNS = ("node_set", "provider", "weight", "capacity", "until", "why")
FAILOVER_COLUMNS = ("time", "job", "from", "to", "nodes", "after", "why")
#: How many failovers status shows (the newest), and how far back it looks for them.
FAILOVER_LIMIT = 5
FAILOVER_WINDOW = timedelta(hours=24)


def format_uptime(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``2d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


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
    requeued job's hold (:mod:`slurm_spot.failover`), joined with the ``failover_started``
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


def _failover_cells(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """The text of each failover row (:data:`FAILOVER_COLUMNS`)."""
    cells = []
    for r in rows:
        when = str(r["time"] or "")
        try:
            when = utc_stamp(datetime.fromisoformat(when))
        except ValueError:
            pass
        to = str(r["to_node_set"] or "")
        if not to:
            to = "(pending: " + (",".join(str(c) for c in r["candidates"])  # type: ignore[attr-defined]
                                 or "no other node set") + ")"
        seconds = r["seconds_from_error"]
        cells.append({"time": when or "-", "job": str(r["job"]), "from": str(r["from_node_set"]),
                      "to": to, "nodes": ",".join(str(n) for n in r["nodes"]) or "-",  # type: ignore[attr-defined]
                      "after": f"{float(seconds):.0f}s" if seconds is not None else "-",  # type: ignore[arg-type]
                      "why": f"no capacity ({r['code']})"})
    return cells


def _node_set_cells(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """The text of each node set row (:data:`NODE_SET_COLUMNS`)."""
    cells = []
    for r in rows:
        until = str(r["until"] or "")
        if until:
            until = utc_stamp(datetime.fromisoformat(until))
        cells.append({"node_set": str(r["node_set"]), "provider": str(r["provider"]),
                      "weight": str(r["weight"]), "capacity": str(r["capacity"]),
                      "until": until or "-", "why": str(r["why"] or "-")})
    return cells


def _cells(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """The text of each row's columns (:data:`COLUMNS`)."""
    cells = []
    for r in rows:
        jobs = ",".join(str(j) for j in r["jobs"]) or "-"  # type: ignore[attr-defined]
        instance = str(r["instance"] or "-")
        if r["extra_instances"]:
            instance += f" (+{len(r['extra_instances'])})"  # type: ignore[arg-type]
        cells.append({"node": str(r["node"]), "state": str(r["state"]), "instance": instance,
                      "market": str(r["market"] or "-"), "type": str(r["type"] or "-"),
                      "zone": str(r["zone"] or "-"),
                      "uptime": format_uptime(r["uptime_s"]),  # type: ignore[arg-type]
                      "job": jobs, "reason": str(r["reason"] or "")})
    return cells


_NO_SLURM_CONF = "could not establish a configuration source"


def explain_slurm_failure(exc: SlurmCommandError) -> SlurmSpotError:
    """``exc`` (Slurm's nodes could not be read) as the error the user should see.

    Slurm 22.05's scontrol/sinfo print "fatal: Could not establish a configuration source"
    when they find no slurm.conf (no ``$SLURM_CONF``, no /etc/slurm/slurm.conf, no DNS SRV
    record, slurm.conf(5)): that is a setup the user gives, so :class:`BadInputError` (exit 2).
    "Unable to contact slurm controller" and the like (:func:`slurm_spot.power._controller_
    unreachable`) mean a slurmctld that does not answer: an operation failure (exit 1). Both
    say which slurm.conf was meant and how to point at another; anything else is ``exc``.
    """
    conf = os.environ.get("SLURM_CONF")
    where = f"SLURM_CONF={conf}" if conf else "no SLURM_CONF set, so /etc/slurm/slurm.conf"
    hint = ("set SLURM_CONF to your cluster's slurm.conf, or start the local cluster with "
            "'slurm-spot local up' and use the SLURM_CONF it prints")
    if _NO_SLURM_CONF in str(exc).lower():
        return BadInputError(f"no Slurm controller answered: {exc.argv[0]} found no slurm.conf "
                             f"({where}); {hint}")
    if _controller_unreachable(exc):
        return SlurmSpotError(f"no Slurm controller answered ({where}): is slurmctld "
                              f"running? {hint} ({exc.stderr or 'timed out'})")
    return exc


def _show(app: AppContext, as_json: bool, fields: list[Field], noheader: bool,
          one_line: bool = False, capacity: bool = False) -> list[str]:
    """Print the status once; returns the providers' errors (also printed on stderr).

    The node sets' capacity table, then the last failovers (:func:`last_failovers`; none:
    no table), follow the node rows on a terminal, or in a pipe with ``capacity``
    (``--capacity``): piped rows stay one node per line for awk. ``--json`` always has
    both (``node_sets``, ``failovers``).

    Raises:
        BadInputError, SlurmSpotError: Slurm's nodes cannot be read
            (:func:`explain_slurm_failure`).
    """
    now = datetime.now(timezone.utc)
    try:
        slurm = app.slurm()
        nodes = slurm.nodes()
        rows, errors = status_rows(app.config, slurm, providers=get_provider, now=now,
                                   slurm_nodes=nodes)
    except SlurmCommandError as exc:
        raise explain_slurm_failure(exc) from None
    sets = node_set_rows(app.config, nodes, now)
    moves = last_failovers(app.config.log_dir, now)
    document = {"nodes": rows, "node_sets": sets, "failovers": moves, "errors": errors}
    if as_json and one_line:  # --watch --json: one document per line (JSON Lines)
        print_json(document, one_line=True)
    elif as_json:
        print_json(document)
    else:
        print_table(_cells(rows), fields, header=not noheader)
        if not noheader and (capacity or is_terminal()):
            click.echo("")
            print_table(_node_set_cells(sets), [Field(c) for c in NODE_SET_COLUMNS])
            if moves:
                click.echo("")
                click.echo(f"last failovers (newest first, {FAILOVER_WINDOW.total_seconds() / 3600:g} h):")
                print_table(_failover_cells(moves), [Field(c) for c in FAILOVER_COLUMNS])
    for error in errors:
        click.echo(f"slurm-spot: error: {error}", err=True)
    return errors


def _watch(app: AppContext, interval_s: float, as_json: bool, fields: list[Field],
           noheader: bool, capacity: bool = False) -> None:
    """Refresh every ``interval_s`` seconds until Ctrl-C (then exit 0), as ``squeue -i``: on
    a terminal the screen is redrawn; in a pipe each refresh is appended, after a time line."""
    terminal = is_terminal() and not as_json
    try:
        while True:
            if terminal:
                click.clear()
            if not as_json:
                click.echo(f"{datetime.now().astimezone():%a %b %d %H:%M:%S %Y}"
                           f"  (every {interval_s:g} s; Ctrl-C to stop)")
            try:
                _show(app, as_json, fields, noheader, one_line=True, capacity=capacity)
            except SlurmSpotError as exc:  # Slurm unreachable for a moment: keep watching
                click.echo(f"slurm-spot: error: {exc}", err=True)
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return


@click.command("status")
@json_option
@table_options(COLUMNS)
@click.option("-i", "--watch", "watch_s", type=click.FloatRange(min=0.1), is_flag=False,
              flag_value=2.0, default=None, metavar="[SECONDS]",
              help="Refresh every SECONDS (default 2) until Ctrl-C, as squeue -i.")
@click.option("--capacity", is_flag=True,
              help="After the nodes, each node set's capacity (ok, or cooldown until when and "
                   "why) and the last failovers, in a pipe too; a terminal always shows them.")
@pass_app
def status_command(app: AppContext, as_json: bool, fields: list[Field], noheader: bool,
                   watch_s: float | None, capacity: bool) -> None:
    """Show every cloud node: Slurm state, instance (market, type, zone, uptime), job; then
    each node set's capacity state (ok, or cooldown until when and why) and where the last
    failovers went (job, from and to node set, after how long, why; last 24 h).

    Plain columns when stdout is not a terminal (for awk, grep); --json for scripts."""
    if watch_s is not None:
        _watch(app, watch_s, as_json, fields, noheader, capacity)
        return
    if _show(app, as_json, fields, noheader, capacity=capacity):
        raise SystemExit(1)


COMMANDS = [status_command]
