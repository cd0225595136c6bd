"""An interruption never makes a job FAILED: requeue batch jobs that ended during one.

Slurm itself requeues a ``--requeue`` batch job that is still running when its node goes DOWN
or POWER_DOWN_FORCE, and one that exits with ``RequeueExit`` (the training library's code).
A job whose processes die before that (a signal it does not handle, Google Cloud's ACPI
shutdown reaching its steps, a checkpoint handler that exits 143) ends FAILED instead, and
nothing brings it back. ``scontrol requeue`` accepts a finished batch job ("Requeue a
running, suspended or finished Slurm batch job into pending state", scontrol(1), Slurm
22.05), so the watcher (with notice) and the reconciler (without) requeue such a job, unless:

- it was submitted ``--no-requeue`` (``Requeue=0`` in ``scontrol show job``), or is no batch
  job (salloc, srun: Slurm cannot requeue those);
- it completed successfully (``COMPLETED``, ``ExitCode=0:0``): a job that chose to exit 0 is
  taken at its word;
- it ended by somebody's decision or its own limit: CANCELLED (scancel), TIMEOUT, DEADLINE,
  OUT_OF_MEMORY.

FAILED, NODE_FAIL, PREEMPTED and BOOT_FAIL are requeued whatever the exit code or signal.
A job Slurm no longer knows (older than MinJobAge, 300 s by default) cannot be requeued.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import expand
from slurm_spot.slurm.client import JobRecord, SlurmClient

REQUEUED_STATES = frozenset({"FAILED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})


@dataclass(frozen=True)
class RequeueDecision:
    """Whether one ended job is requeued, and why (for the event log)."""

    job_id: int
    requeue: bool
    why: str


def decide(record: JobRecord) -> RequeueDecision:
    """Pure: should this job, which ended during an interruption, be requeued? (module doc)"""
    state = record.state.base
    described = f"{state} (ExitCode={record.exit_code})"
    if record.state.is_active:
        return RequeueDecision(record.job_id, False, f"{state}: has not ended")
    if not record.batch:
        return RequeueDecision(record.job_id, False, f"{described}: not a batch job")
    if not record.requeue:
        return RequeueDecision(record.job_id, False, f"{described}: submitted --no-requeue")
    if state not in REQUEUED_STATES:
        return RequeueDecision(record.job_id, False, f"{described}: not an interruption's end")
    return RequeueDecision(record.job_id, True, f"{described} during the interruption")


def requeue_ended(slurm: SlurmClient, job_id: int) -> RequeueDecision:
    """Requeue ``job_id`` if it ended during an interruption (see :func:`decide`).

    Returns the decision; ``requeue`` is False as well when Slurm no longer knows the job or
    someone requeued it first.

    Raises:
        SlurmCommandError: scontrol failed (slurmctld down, refusal).
    """
    record = slurm.job_record(job_id)
    if record is None:
        return RequeueDecision(job_id, False, "Slurm no longer knows the job (MinJobAge)")
    decision = decide(record)
    if decision.requeue and not slurm.requeue(job_id):
        return RequeueDecision(job_id, False, "already requeued")
    return decision


def ended_on(records: Iterable[JobRecord], node: str, since: float) -> list[JobRecord]:
    """Jobs that ran on ``node`` and ended at or after ``since`` (epoch seconds)."""
    return [r for r in records
            if r.state.is_finished and r.end_time is not None and r.end_time >= since
            and r.nodes and node in expand(r.nodes)]


def requeue_ended_on(slurm: SlurmClient, node: str, since: float,
                     records: Sequence[JobRecord] | None = None,
                     ) -> tuple[list[RequeueDecision], list[str]]:
    """Requeue the jobs that ended on ``node`` since ``since`` (epoch seconds), for a node
    reclaimed without notice. ``records``: every job as :meth:`SlurmClient.job_records`
    read it (a pass with many lost nodes reads them once), else read here. Returns the
    decisions for every such job and the errors (one job's trouble never stops the others).

    Raises:
        SlurmCommandError: Slurm's jobs cannot be read.
    """
    decisions, errors = [], []
    for record in ended_on(slurm.job_records() if records is None else records, node, since):
        decision = decide(record)
        if decision.requeue:
            try:
                if not slurm.requeue(record.job_id):
                    decision = RequeueDecision(record.job_id, False, "already requeued")
            except SlurmCommandError as exc:
                errors.append(str(exc))
                continue
        decisions.append(decision)
    return decisions, errors
