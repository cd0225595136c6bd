"""Pending jobs of slurm-spot's partitions that nothing else would ever move (issue 25). Pure.

- **Launch failed, requeued held.** When a job's launch fails (its prolog failed, its node
  never booted), slurmctld requeues it *held*: ``JobState=PENDING
  Reason=launch_failed_requeued_held`` (squeue(1) 22.05-26.05, JOB REASON CODES), and it waits
  for ``scontrol release`` forever. On a spot partition the cause is almost always the lost
  instance, so :func:`split_launch_held` releases it, at most ``reconcile.max_fast_requeues``
  times within ``reconcile.fast_requeue_window_s`` (the cap of fast requeues,
  :mod:`slurm_spot.reconcile.requeue_exit`): a job that can never launch stays held, with one
  ``release_withheld`` event per requeue naming what to do.
- **BadConstraints.** A requeued job whose ``--constraint`` no node can satisfy any more
  (a node set renamed or its features changed) pends with ``Reason=BadConstraints`` and is never
  started. Only its owner or an admin can fix that, so :func:`bad_constraint_jobs` finds it
  and the pass reports it once per requeue: an event naming the job and its constraint, and a
  note in its AdminComment.

Counts come from the reconciler's own events (``job_released``, ``release_withheld``,
``bad_constraints``), so they survive a restart of the reconciler.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurm_spot.events import Action
from slurm_spot.reconcile.history import event_time
from slurm_spot.slurm.client import Job

#: squeue(1)'s reason for a job requeued held after a failed launch (FAIL_LAUNCH); some
#: releases print it with spaces, so both spellings are matched.
LAUNCH_FAILED_HELD = "launch_failed_requeued_held"
#: squeue(1)'s reason for a job whose constraint no node in its partitions satisfies.
BAD_CONSTRAINTS = "BadConstraints"


def _ours(job: Job, partitions: Collection[str]) -> bool:
    return bool(set(job.partition.split(",")) & set(partitions))


def is_launch_held(job: Job) -> bool:
    """True if ``job`` is PENDING, held by slurmctld after a failed launch."""
    return job.state.is_pending and job.reason.replace(" ", "_").lower() == LAUNCH_FAILED_HELD


@dataclass(frozen=True)
class Held:
    """A job held after a failed launch.

    Attributes:
        job_id: the job.
        restarts: its ``restart_cnt`` (squeue): which requeue this is.
        releases: releases by the reconciler within the window (this one not included).
        new: no ``release_withheld`` event names this job and requeue yet (emit one).
    """

    job_id: int
    restarts: int
    releases: int
    new: bool = True


def _counts(events: Sequence[Mapping[str, object]], since: datetime | None, counted: Action,
            said_action: Action) -> tuple[dict[int, int], set[tuple[int, object]]]:
    """Job -> ``counted`` events of source reconcile newer than ``since`` (None: none
    counted); and the (job, extra.restarts) pairs that ``said_action`` events reported."""
    counts: dict[int, int] = {}
    said: set[tuple[int, object]] = set()
    for event in events:
        action = event.get("action")
        if event.get("source") != "reconcile" or action not in (counted, said_action):
            continue
        when = event_time(event)
        jobs = event.get("job_ids")
        if when is None or not isinstance(jobs, list):
            continue
        extra = event.get("extra")
        for job in jobs:
            if action == counted and since is not None and when > since:
                counts[job] = counts.get(job, 0) + 1
            if action == said_action and isinstance(extra, dict):
                said.add((job, extra.get("restarts")))
    return counts, said


def split_launch_held(jobs: Sequence[Job], partitions: Collection[str],
                      events: Sequence[Mapping[str, object]], now: datetime, limit: int,
                      window_s: float) -> tuple[list[Held], list[Held]]:
    """The jobs (``squeue --json``) on ``partitions`` held after a failed launch, split into
    those to release (``scontrol release``) and those left held: released ``limit`` times
    within ``window_s`` seconds before ``now`` already (``job_released`` events). Pure.

    Returns:
        (to release, withheld); a withheld job's ``new`` is False once a ``release_withheld``
        event names it with the same ``restarts``.
    """
    counts, said = _counts(events, now - timedelta(seconds=window_s), Action.JOB_RELEASED,
                           Action.RELEASE_WITHHELD)
    release, withheld = [], []
    for job in jobs:
        if not is_launch_held(job) or not _ours(job, partitions):
            continue
        count = counts.get(job.job_id, 0)
        if count < limit:
            release.append(Held(job.job_id, job.restarts, count))
        else:
            withheld.append(Held(job.job_id, job.restarts, count,
                                 new=(job.job_id, job.restarts) not in said))
    return release, withheld


def release_withheld_reason(held: Held, limit: int, window_s: float) -> str:
    """What an admin reads on a job left held: how often it was released, the cap, and what
    to do."""
    return (f"launch failed again after {held.releases} releases within {window_s:g} s "
            f"(reconcile.max_fast_requeues={limit}): left held; check the node set's image, "
            f"prolog and slurmd logs, then 'scontrol release {held.job_id}'")


@dataclass(frozen=True)
class BadConstraint:
    """A job of ours pending on BadConstraints, with its ``--constraint`` (``features``)."""

    job_id: int
    restarts: int
    constraint: str


def bad_constraint_jobs(jobs: Sequence[Job], partitions: Collection[str],
                        events: Sequence[Mapping[str, object]]) -> list[BadConstraint]:
    """Jobs (``squeue --json``) on ``partitions`` pending with Reason=BadConstraints that no
    ``bad_constraints`` event has reported for their current requeue yet. Pure."""
    _, said = _counts(events, None, Action.BAD_CONSTRAINTS, Action.BAD_CONSTRAINTS)
    return [BadConstraint(j.job_id, j.restarts, j.features) for j in jobs
            if j.state.is_pending and j.reason == BAD_CONSTRAINTS and _ours(j, partitions)
            and (j.job_id, j.restarts) not in said]


def bad_constraint_reason(found: BadConstraint) -> str:
    """The event's reason and the job's AdminComment note: the constraint and what to do."""
    constraint = found.constraint or "(none shown)"
    return (f"job {found.job_id} pends on BadConstraints: no node of its partitions has "
            f"features '{constraint}'; fix the constraint ('scontrol update jobid="
            f"{found.job_id} Features=...') or the node sets' features in spot.yaml, "
            f"or cancel it")
