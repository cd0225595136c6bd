"""Jobs that requeued themselves with the requeue exit code, held by Slurm's requeue delay.

A job that exits with slurm-spot's requeue exit code (``preemption.requeue_exit_code``,
rendered as slurm.conf ``RequeueExit``) is requeued by slurmctld, then held: Slurm 22.05.8
gives it ``JobState=PENDING Reason=BeginTime Restarts=N+1 ExitCode=85:0`` and
``EligibleTime = SubmitTime + 121 s``, ``SubmitTime`` being reset to the requeue (observed on
the local cluster, docs/local-slurm.md). On 24.11 the same hold is the credential lifetime;
from 25.11 it is ``SchedulerParameters=requeue_delay`` (slurm.conf(5) 26.05: "Delay before a
non-Expedited Requeue job is eligible to run after being requeued"), and
``--requeue=expedite`` covers node failures, not a requeue by exit code.

The watcher clears that hold for the jobs it saw leave a node; nobody watches a job whose own
batch script decided to requeue later, such as an elastic job whose survivors could not form a
rendezvous of MIN nodes. The reconciler's pass does, with :func:`held_by_requeue_exit`: it
clears the hold of every such job on one of slurm-spot's partitions, at any time after the
interruption. A hold much longer than the requeue delay was set by someone on purpose
(``scontrol update StartTime=...`` after the requeue) and is left alone.

A job that exits with the code at once, run after run (a wrong ``--rendezvous`` port makes
every run fall back), would then restart about once per pass. :func:`cap_fast_requeues` caps
that: a job already requeued by the code ``reconcile.max_fast_requeues`` times within
``reconcile.fast_requeue_window_s`` seconds (the ``expedited`` and ``expedite_withheld``
events of the reconciler's event history, so the count survives a restart of the reconciler)
is left to Slurm's own hold, with one ``expedite_withheld`` event per requeue saying why.
Requeues every ~121 s keep such a job in the window; once it runs longer than the window the
count falls and its requeues are expedited again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from slurm_spot.events import Action
from slurm_spot.reconcile.history import event_time
from slurm_spot.slurm.client import Job, JobRecord

#: A requeue hold up to this long (seconds, EligibleTime - SubmitTime) is Slurm's requeue
#: delay (121 s on 22.05 with the default 120 s credential lifetime); a longer one was chosen.
MAX_REQUEUE_HOLD_S = 300.0


def requeue_candidates(jobs: Sequence[Job], partitions: Collection[str]) -> list[int]:
    """Jobs (``squeue --json``) that may be held after a requeue: PENDING with
    Reason=BeginTime, restarted at least once, on one of ``partitions`` (a job submitted to
    several, ``-p a,b``, counts if any is ours). Pure."""
    return [j.job_id for j in jobs
            if j.state.is_pending and j.reason == "BeginTime" and j.restarts > 0
            and set(j.partition.split(",")) & set(partitions)]


def held_by_requeue_exit(records: Sequence[JobRecord], requeue_exit_code: int,
                         max_hold_s: float = MAX_REQUEUE_HOLD_S) -> list[int]:
    """Of ``records`` (``scontrol -o show job``), the jobs held by Slurm's requeue delay after
    their last run exited with ``requeue_exit_code`` (``ExitCode=<code>:0``): pending,
    restarted, and eligible at most ``max_hold_s`` seconds after their (re)submit time. Pure.
    """
    found = []
    for r in records:
        if not r.state.is_pending or r.restarts < 1 or r.exit_code != f"{requeue_exit_code}:0":
            continue
        if r.submit_time is None or r.eligible_time is None:
            continue
        if r.eligible_time - r.submit_time <= max_hold_s:
            found.append(r.job_id)
    return found


def exit_reason(requeue_exit_code: int) -> str:
    """The ``reason`` of the ``expedited`` event for a job requeued by ``requeue_exit_code``
    (``"requeued by exit code 85"``); :func:`cap_fast_requeues` counts these events."""
    return f"requeued by exit code {requeue_exit_code}"


@dataclass(frozen=True)
class Withheld:
    """A job held by the requeue delay that is not expedited: it requeued itself too often.

    Attributes:
        job_id: the job.
        restarts: its ``Restarts`` (scontrol): which requeue this is.
        requeues: requeues by the exit code within the window, this one included.
        eligible_time: when Slurm's hold ends (Unix seconds), None if not shown.
        new: no ``expedite_withheld`` event names this job and requeue yet (emit one).
    """

    job_id: int
    restarts: int
    requeues: int
    eligible_time: float | None
    new: bool



def cap_fast_requeues(held: Sequence[int], records: Sequence[JobRecord],
                      events: Sequence[Mapping[str, object]], now: datetime,
                      requeue_exit_code: int, limit: int, window_s: float,
                      ) -> tuple[list[int], list[Withheld]]:
    """Split ``held`` (:func:`held_by_requeue_exit`) into the jobs to expedite and those left
    to Slurm's requeue hold. Pure.

    Args:
        held: job ids held after a requeue by exit code.
        records: their ``scontrol show job`` records (``Restarts``, ``EligibleTime``).
        events: the event history (dicts as in the events file; ``time`` ISO 8601 with zone).
        now: aware UTC time of this pass.
        requeue_exit_code: the code (``preemption.requeue_exit_code``).
        limit: at most this many requeues by the code are expedited per window (>= 1).
        window_s: the window, seconds back from ``now``.

    Returns:
        (jobs to expedite, :class:`Withheld` for each job already requeued by the code
        ``limit`` times within the window: ``expedited`` events with reason
        :func:`exit_reason` and ``expedite_withheld`` events, source ``reconcile``).
    """
    since = now - timedelta(seconds=window_s)
    reason = exit_reason(requeue_exit_code)
    counts: dict[int, int] = {}
    said: set[tuple[int, int]] = set()
    for event in events:
        action = event.get("action")
        if event.get("source") != "reconcile" or action not in (
                Action.EXPEDITED, Action.EXPEDITE_WITHHELD):
            continue
        if action == Action.EXPEDITED and event.get("reason") != reason:
            continue
        when = event_time(event)
        jobs = event.get("job_ids")
        if when is None or when <= since or not isinstance(jobs, list):
            continue
        extra = event.get("extra")
        for job in jobs:
            counts[job] = counts.get(job, 0) + 1
            if action == Action.EXPEDITE_WITHHELD and isinstance(extra, dict):
                said.add((job, extra.get("restarts")))  # type: ignore[arg-type]
    record_of = {r.job_id: r for r in records}
    expedite, withheld = [], []
    for job in held:
        record = record_of.get(job)
        if counts.get(job, 0) < limit or record is None:
            expedite.append(job)
            continue
        new = (job, record.restarts) not in said
        withheld.append(Withheld(job, record.restarts, counts[job] + (1 if new else 0),
                                 record.eligible_time, new))
    return expedite, withheld


def withheld_reason(withheld: Withheld, requeue_exit_code: int, max_fast_requeues: int,
                    window_s: float) -> str:
    """The ``reason`` of the ``expedite_withheld`` event for ``withheld``: how often the job
    requeued itself within ``window_s`` (seconds), the limit, and when Slurm's hold ends
    (UTC, when known)."""
    until = "" if withheld.eligible_time is None else ", eligible at " + datetime.fromtimestamp(
        withheld.eligible_time, timezone.utc).isoformat(timespec="seconds")
    return (f"requeued by exit code {requeue_exit_code} {withheld.requeues} times within "
            f"{window_s:g} s (reconcile.max_fast_requeues={max_fast_requeues}): a crash "
            f"loop? left to Slurm's requeue hold{until}")
