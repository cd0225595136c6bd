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

One interruption is one requeue, whoever requeues first (issue 25). A job that requeued
itself on the signal (submitit's and Lightning's handlers run ``scontrol requeue``) is not
requeued again: :func:`requeued_since` tells it from its state and restart count. In Slurm
22.05 a running job requeued by ``scontrol requeue`` reads ``JobState=REQUEUED`` (flag
COMPLETING) until its processes and epilog are done, and only then ``PENDING`` with
``Restarts`` one higher (job_mgr.c ``_job_requeue_op``/``batch_requeue_fini``); a node taken
down meanwhile leaves its accounting record NODE_FAIL (sacct(1): "Job terminated due to
failure of one or more allocated nodes"), which submitit's client reads as the job's end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import expand
from slurm_spot.slurm.client import JobRecord, SlurmClient
from slurm_spot.slurm.states import JobState

REQUEUED_STATES = frozenset({"FAILED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})
# Job states (base or flag, squeue/scontrol 22.05) of a job already on its way back to the
# queue: requeued and leaving, or pending again (with or without a hold).
ALREADY_REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def requeued_since(state: JobState, restarts: int, restarts_at_notice: int | None) -> str | None:
    """Pure: why a job counts as requeued since an interruption began, or None if not.

    Args:
        state: the job's state now (``squeue``/``scontrol show job``).
        restarts: its ``Restarts``/``restart_cnt`` now.
        restarts_at_notice: its restart count when the interruption began (None: unknown).

    Returns:
        ``"Restarts 0 -> 1"`` when its restart count rose, ``"JobState=REQUEUED"`` (or
        PENDING, REQUEUE_HOLD, REQUEUE_FED, as base or flag) when it is leaving for or back in
        the queue; None for a job that still runs its interrupted run, or that ended.
    """
    if restarts_at_notice is not None and restarts > restarts_at_notice:
        return f"Restarts {restarts_at_notice} -> {restarts}"
    if state.base in ALREADY_REQUEUED_STATES:
        return f"JobState={state.base}"
    flags = sorted(state.flags & ALREADY_REQUEUED_STATES)
    return f"JobState={state.base}+{flags[0]}" if flags else None


@dataclass(frozen=True)
class RequeueDecision:
    """Whether one ended job is requeued, and why (for the event log)."""

    job_id: int
    requeue: bool
    why: str


def decide(record: JobRecord, restarts_at_interruption: int | None = None) -> RequeueDecision:
    """Pure: should this job, which ended during an interruption, be requeued? (module doc)

    ``restarts_at_interruption``: its restart count when the interruption began (the
    watcher's ``notice`` event; None: unknown). A job whose count rose since was requeued
    already (by itself, its watcher or Slurm): the run that ended is a later one, and it is
    not requeued a second time for the same interruption."""
    state = record.state.base
    described = f"{state} (ExitCode={record.exit_code})"
    if restarts_at_interruption is not None and record.restarts > restarts_at_interruption:
        return RequeueDecision(record.job_id, False, f"{described}: already requeued since the "
                               f"interruption (Restarts {restarts_at_interruption} -> "
                               f"{record.restarts})")
    if record.state.is_active:
        return RequeueDecision(record.job_id, False, f"{state}: has not ended")
    if not record.batch:
        return RequeueDecision(record.job_id, False, f"{described}: not a batch job")
    if not record.requeue:
        return RequeueDecision(record.job_id, False, f"{described}: submitted --no-requeue")
    if state not in REQUEUED_STATES:
        return RequeueDecision(record.job_id, False, f"{described}: not an interruption's end")
    return RequeueDecision(record.job_id, True, f"{described} during the interruption")


def requeue_ended(slurm: SlurmClient, job_id: int,
                  restarts_at_interruption: int | None = None) -> RequeueDecision:
    """Requeue ``job_id`` if it ended during an interruption (see :func:`decide`; a job whose
    restart count rose above ``restarts_at_interruption`` is not requeued again).

    Returns the decision; ``requeue`` is False as well when Slurm no longer knows the job or
    someone requeued it first.

    Raises:
        SlurmCommandError: scontrol failed (slurmctld down, refusal).
    """
    record = slurm.job_record(job_id)
    if record is None:
        return RequeueDecision(job_id, False, "Slurm no longer knows the job (MinJobAge)")
    decision = decide(record, restarts_at_interruption)
    if decision.requeue and not slurm.requeue(job_id):
        return RequeueDecision(job_id, False, "already requeued")
    return decision


def restarts_at_notice(events: Iterable[Mapping[str, object]], node: str,
                       since: float) -> dict[int, int]:
    """Pure: per job on ``node`` when its watcher got an interruption notice, the job's
    restart count then, from the watcher's ``notice`` events (events.jsonl records, their
    ``extra.restarts``) at or after ``since`` (epoch s); the earliest count where several
    notices name a job. A record whose time or counts cannot be read is skipped. For the
    reconciler: a job whose count rose since was requeued already and is not requeued again
    (one interruption, one requeue)."""
    found: dict[int, int] = {}
    for event in events:
        if (event.get("source"), event.get("node"), event.get("action")) != (
                "watch", node, "notice"):
            continue
        extra = event.get("extra")
        counts = extra.get("restarts") if isinstance(extra, Mapping) else None
        try:
            at = datetime.fromisoformat(str(event.get("time"))).timestamp()
            if at < since or not isinstance(counts, Mapping):
                continue
            for job, count in counts.items():
                found[int(job)] = min(int(count), found.get(int(job), int(count)))
        except (TypeError, ValueError):
            continue
    return found


def ended_on(records: Iterable[JobRecord], node: str, since: float) -> list[JobRecord]:
    """Jobs that ran on ``node`` and ended at or after ``since`` (epoch seconds)."""
    return [r for r in records
            if r.state.is_finished and r.end_time is not None and r.end_time >= since
            and r.nodes and node in expand(r.nodes)]


def requeue_ended_on(slurm: SlurmClient, node: str, since: float,
                     records: Sequence[JobRecord] | None = None,
                     restarts_at_interruption: Mapping[int, int] | None = None,
                     ) -> tuple[list[RequeueDecision], list[str]]:
    """Requeue the jobs that ended on ``node`` since ``since`` (epoch seconds), for a node
    reclaimed without notice. ``records``: every job as :meth:`SlurmClient.job_records`
    read it (a pass with many lost nodes reads them once), else read here.
    ``restarts_at_interruption``: job id -> its restart count when the interruption began
    (:func:`restarts_at_notice`); a job whose count rose since is not requeued again.
    Returns the decisions for every such job and the errors (one job's trouble never stops
    the others).

    Raises:
        SlurmCommandError: Slurm's jobs cannot be read.
    """
    decisions, errors = [], []
    for record in ended_on(slurm.job_records() if records is None else records, node, since):
        decision = decide(record, (restarts_at_interruption or {}).get(record.job_id))
        if decision.requeue:
            try:
                if not slurm.requeue(record.job_id):
                    decision = RequeueDecision(record.job_id, False, "already requeued")
            except SlurmCommandError as exc:
                errors.append(str(exc))
                continue
        decisions.append(decision)
    return decisions, errors
