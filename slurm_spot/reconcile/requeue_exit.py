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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

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
