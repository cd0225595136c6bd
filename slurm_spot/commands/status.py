"""``slurm-spot status [--json]``: one row per cloud node: Slurm state, the instance behind it
(id, market, type, zone, uptime) and its current job; plus alive instances no node knows; then
each node set's capacity state (ok, or cooldown until when and why: issue 24) and where the
last failovers went (issue 24 part 6, from the events file). The rows are built by
:mod:`slurm_spot.lifecycle.status`; this module formats them."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.commands.tables import Field, is_terminal, print_table, table_options
from slurm_spot.errors import BadInputError, SlurmCommandError, SlurmSpotError
from slurm_spot.lifecycle.power import controller_unreachable
from slurm_spot.lifecycle.status import (
    FAILOVER_WINDOW,
    last_failovers,
    node_set_rows,
    status_rows,
)
from slurm_spot.providers import get_provider
from slurm_spot.slurm.reasons import utc_stamp

COLUMNS = ("node", "state", "instance", "market", "type", "zone", "uptime", "job", "reason")
NODE_SET_COLUMNS = ("node_set", "provider", "weight", "capacity", "until", "why")
FAILOVER_COLUMNS = ("time", "job", "from", "to", "nodes", "after", "why")


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
    "Unable to contact slurm controller" and the like (:func:`slurm_spot.lifecycle.power._controller_
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
    if controller_unreachable(exc):
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
