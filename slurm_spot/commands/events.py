"""``slurm-spot events``: the decisions slurm-spot took, oldest first."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import click

from slurm_spot.commands.common import (
    AppContext,
    json_option,
    pass_app,
    print_json,
    require_events_file,
)
from slurm_spot.commands.completion import complete_jobs, complete_nodes
from slurm_spot.commands.tables import Field, plain_lines, print_table, table_options
from slurm_spot.eventfollow import EventFollower
from slurm_spot.events import job_labels, read_events
from slurm_spot.rawtext import escaped

#: Slurm's relative time (sacct(1), "-S, --starttime"): ``now[{+|-}count[seconds(default)|
#: minutes|hours|days|weeks]]``; the unit also singular, as ``now-1hour``.
_SLURM_NOW = re.compile(r"now(?:([+-])(\d+)(seconds?|minutes?|hours?|days?|weeks?)?)?",
                        re.IGNORECASE)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``2h``, ``1d``, ``30s`` ago; Slurm's ``now``, ``now-1hour``, ``now-90``
    (seconds), ``now-2days`` (sacct(1)'s ``now[{+|-}count[seconds|minutes|hours|days|weeks]]``);
    or an ISO 8601 time (UTC if no zone; a trailing ``Z`` means UTC, as ``date -u +%FT%TZ``
    and the cloud APIs write it).

    Raises:
        click.BadParameter: none of these forms, or a time before year 1.
    """
    now = now or datetime.now(timezone.utc)
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    slurm = _SLURM_NOW.fullmatch(text.strip())
    try:
        if match:
            unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
            return now - timedelta(**{unit: int(match.group(1))})
        if slurm:
            sign, count, unit = slurm.groups()
            if sign is None:
                return now
            name = (unit or "seconds").lower().rstrip("s") + "s"
            delta = timedelta(**{name: int(count)})
            return now + delta if sign == "+" else now - delta
    except OverflowError:
        raise click.BadParameter(f"{text!r} reaches outside years 1-9999",
                                 param_hint="--since") from None
    try:
        # fromisoformat (3.11) reads a final 'Z' but not the lowercase 'z' RFC 3339 allows
        stamp = text.strip()
        when = datetime.fromisoformat(stamp[:-1] + "Z" if stamp.endswith("z") else stamp)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use e.g. 10m, 2h, 1d, now-1hour or "
                                 "2026-03-01T08:00:00",
                                 param_hint="--since") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


COLUMNS = ("time", "source", "action", "node", "instance", "jobs", "reason")


def _cells(event: dict) -> dict[str, str]:
    jobs = ",".join(job_labels(event))  # an array task as Slurm shows it: 11_1
    return {"time": str(event.get("time") or ""), "source": str(event.get("source") or ""),
            "action": str(event.get("action") or ""), "node": str(event.get("node") or "-"),
            "instance": str(event.get("instance") or "-"), "jobs": jobs or "-",
            "reason": str(event.get("reason") or "")}


def of_job(event: dict, job: str) -> bool:
    """True if ``event`` concerns job ``job``: its id (``12``), an array job's id (``11``:
    every task of it) or an array task as Slurm names it (``11_1``)."""
    labels = job_labels(event)
    return job in labels or any(label.split("_", 1)[0] == job for label in labels)


def _job_filter(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"\d+(_\d+)?", value.strip()):
        raise click.BadParameter(f"{value!r}: a job id (12) or an array task (11_1)",
                                 param_hint="--job")
    return value.strip() if value is not None else None


@click.command("events")
@click.option("--since", default=None,
              help="Only events at or after this: 10m, 2h, 1d, Slurm's now-1hour, or an ISO "
                   "time.")
@click.option("--node", default=None, shell_complete=complete_nodes,
              help="Only events of this node.")
@click.option("--job", default=None, shell_complete=complete_jobs,
              callback=lambda _ctx, _param, value: _job_filter(value),
              help="Only events of this job (12; an array job's id takes all its tasks; 11_1 "
                   "one task).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep reading: print new events as they are written, across log rotation, "
                   "until Ctrl-C (--json: one envelope per line).")
@json_option
@table_options(COLUMNS)
@pass_app
def events_command(app: AppContext, since: str | None, node: str | None, job: str | None,
                   follow: bool, as_json: bool, fields: list[Field], noheader: bool) -> None:
    """Show slurm-spot's events (launches, terminations, notices, requeues, cooldowns),
    oldest first. Plain columns when stdout is not a terminal; --json for scripts."""
    after = parse_since(since) if since else None
    require_events_file(app.config)

    def wanted(event: dict) -> bool:
        return node in (None, event.get("node")) and (job is None or of_job(event, job))

    if follow:
        _follow(app, after, wanted, as_json, fields, header=not noheader)
        return
    found = [e for e in read_events(app.config.log_dir, after) if wanted(e)]
    if as_json:
        print_json(found)
        return
    print_table([_cells(e) for e in found], fields, header=not noheader)


def _follow(app: AppContext, after: datetime | None, wanted: Callable[[dict], bool],
            as_json: bool, fields: list[Field], header: bool) -> None:
    """Print matching events as they come (plain columns, or one JSON envelope per event and
    line), flushing each, until Ctrl-C or a closed pipe."""
    follower = EventFollower(app.config.log_dir, after)
    try:
        for event in follower.follow():
            if not wanted(event):
                continue
            if as_json:
                print_json(event, one_line=True)
            else:
                for line in plain_lines([_cells(event)], fields, header):
                    click.echo(escaped(line))
                header = False
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()


COMMANDS = [events_command]
