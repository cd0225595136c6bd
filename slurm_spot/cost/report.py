"""The work behind ``slurm-spot cost``: each recorded job's usage (sacct or the events, and
its checkpoints) priced with the site's price book (:mod:`.accounting`, :mod:`.prices`)."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from slurm_spot.config import SpotConfig
from slurm_spot.contract.location import Location, is_job_key, job_directory
from slurm_spot.cost.accounting import (
    CostReport,
    JobUsage,
    cost_report,
    job_ids_in_events,
    read_checkpoints,
    usage_from_events,
    usage_from_sacct,
)
from slurm_spot.cost.prices import site_prices
from slurm_spot.errors import CheckpointError, SlurmCommandError
from slurm_spot.events import read_events
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger(__name__)


def job_usage(config: SpotConfig, slurm: SlurmClient, job_id: int, events: list[dict[str, Any]],
              checkpoint_dir: Path | None, now: datetime) -> JobUsage:
    """The job's usage: sacct's runs where accounting answers, else the events; checkpoints
    from ``checkpoint_dir``, or from the job's own directory under ``checkpoint.root``
    (:func:`~slurm_spot.contract.location.job_directory`: ``<root>/<user>/<key>``, the key
    ``<array job>_<task>`` for an array task) when sacct names the user, listed by the store
    the location names (:func:`~.accounting.read_checkpoints`: a directory, ``s3://``, any
    store with a URL scheme, with ``checkpoint``'s settings). A location no store handles, or
    a store that cannot be read, adds a note (and a logged warning) saying that storage,
    egress and lost compute are counted without its checkpoints: never a silent 0.

    Raises:
        BadInputError: neither source knows the job."""
    try:
        rows = slurm.sacct_runs(job_id)
    except SlurmCommandError:
        rows = None
    rows = [r for r in rows or [] if r.get("JobIDRaw") == str(job_id)]
    if rows:
        usage = usage_from_sacct(job_id, rows, events, config, now)
    else:
        usage = usage_from_events(job_id, events, config)
    folder: Location | None = checkpoint_dir
    if folder is None and usage.user:
        shown = rows[0].get("JobID", "") if rows else ""
        key = shown if "_" in shown and is_job_key(shown) else str(job_id)
        folder = job_directory(config.checkpoint.root, usage.user, key)
    if folder is not None:
        try:
            usage.checkpoints = read_checkpoints(folder, config.checkpoint)
        except CheckpointError as exc:
            note = (f"checkpoints not read ({exc}): their storage and egress are not counted, "
                    "and lost compute is counted without them")
            log.warning("job %s: %s", job_id, note)
            usage.notes.append(note)
    return usage


def job_reports(config: SpotConfig, slurm: SlurmClient, job_id: int | None,
                after: datetime | None, checkpoint_dir: Path | None, now: datetime
                ) -> tuple[list[JobUsage], list[CostReport]]:
    """Usage and cost of job ``job_id``, or (None) of every job with events (after ``after``,
    when given) in ``<log_dir>/events.jsonl``, priced with :func:`~.prices.site_prices`
    (live AWS prices where an aws provider is configured).

    Raises:
        BadInputError: neither sacct nor the events know a job asked for by id."""
    events = list(read_events(config.log_dir))
    recent = list(read_events(config.log_dir, after)) if after else events
    ids = [job_id] if job_id is not None else job_ids_in_events(recent)
    prices = site_prices(config)
    reports: list[CostReport] = []
    usages: list[JobUsage] = []
    for jid in ids:
        usage = job_usage(config, slurm, jid, events, checkpoint_dir, now)
        usages.append(usage)
        reports.append(cost_report(usage, prices, now))
    return usages, reports
