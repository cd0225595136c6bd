"""``slurm-spot events``: the decisions slurm-spot took, oldest first."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import click

from slurm_spot.commands.common import (
    AppContext,
    json_option,
    pass_app,
    print_json,
    require_events_file,
)
from slurm_spot.commands.completion import complete_nodes
from slurm_spot.commands.tables import Field, print_table, table_options
from slurm_spot.events import job_labels, read_events


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``2h``, ``1d``, ``30s`` ago, or an ISO 8601 time (UTC if no zone; a trailing
    ``Z`` means UTC, as ``date -u +%FT%TZ`` and the cloud APIs write it).

    Raises:
        click.BadParameter: neither form.
    """
    now = now or datetime.now(timezone.utc)
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        try:
            return now - timedelta(**{unit: int(match.group(1))})
        except OverflowError:
            raise click.BadParameter(f"{text!r} reaches before year 1", param_hint="--since") from None
    try:
        # Python 3.10's fromisoformat does not take 'Z' (3.11 does): spell it out for either.
        when = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text.strip()))
    except ValueError:
        raise click.BadParameter(f"{text!r}: use e.g. 10m, 2h, 1d or 2026-03-01T08:00:00",
                                 param_hint="--since") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


COLUMNS = ("time", "source", "action", "node", "instance", "jobs", "reason")


def _cells(event: dict) -> dict[str, str]:
    jobs = ",".join(job_labels(event))  # an array task as Slurm shows it: 11_1
    return {"time": str(event.get("time") or ""), "source": str(event.get("source") or ""),
            "action": str(event.get("action") or ""), "node": str(event.get("node") or "-"),
            "instance": str(event.get("instance") or "-"), "jobs": jobs or "-",
            "reason": str(event.get("reason") or "")}


@click.command("events")
@click.option("--since", default=None, help="Only events after this (10m, 2h, ISO time).")
@click.option("--node", default=None, shell_complete=complete_nodes,
              help="Only events of this node.")
@json_option
@table_options(COLUMNS)
@pass_app
def events_command(app: AppContext, since: str | None, node: str | None, as_json: bool,
                   fields: list[Field], noheader: bool) -> None:
    """Show slurm-spot's events (launches, terminations, notices, requeues, cooldowns),
    oldest first. Plain columns when stdout is not a terminal; --json for scripts."""
    after = parse_since(since) if since else None
    require_events_file(app.config)
    found = [e for e in read_events(app.config.log_dir, after) if node in (None, e.get("node"))]
    if as_json:
        print_json(found)
        return
    print_table([_cells(e) for e in found], fields, header=not noheader)


COMMANDS = [events_command]
