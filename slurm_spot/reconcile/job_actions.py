"""The job side of a reconciler pass (:mod:`slurm_spot.reconcile.reconciler`): what happens to
the jobs of the nodes the pass acted on, and to the jobs nothing else would move.

- an *elastic* job on a lost node goes on without it (``released``), or is requeued if its
  batch script ran there (:mod:`slurm_spot.jobs.interruption.elastic_release`);
- a batch job that ended on a lost node during its interruption is requeued
  (:mod:`slurm_spot.jobs.interruption.requeue`);
- the requeue hold of the jobs the pass requeued, of the jobs held after an interruption and
  of the jobs that requeued themselves with the requeue exit code is cleared
  (:mod:`.requeue_exit`, capped against crash loops);
- the snapshot's jobs held after an interruption (Reason=BeginTime) are read;
- pending jobs held after a failed launch are released, jobs on BadConstraints reported
  (:mod:`.held_jobs`).

Every action is an event, through the reconciler's own ``emit`` (source ``reconcile``), and a
metric. One job's failure never stops the others: it is an error of the pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from slurm_spot.config import SpotConfig
from slurm_spot.errors import SlurmCommandError
from slurm_spot.events import Action
from slurm_spot.jobs.interruption.elastic_release import RELEASE_REASON, ElasticJobs, release_elastic
from slurm_spot.jobs.interruption.requeue import requeue_ended_on, restarts_at_notice
from slurm_spot.reconcile.held_jobs import (
    bad_constraint_jobs,
    bad_constraint_reason,
    release_withheld_reason,
    split_launch_held,
)
from slurm_spot.reconcile.metrics import ReconcileMetrics
from slurm_spot.reconcile.requeue_exit import (
    cap_fast_requeues,
    exit_reason,
    held_by_requeue_exit,
    requeue_candidates,
    withheld_reason,
)
from slurm_spot.reconcile.rules import History, NodeDecision
from slurm_spot.slurm.client import JobRecord, SlurmClient

if TYPE_CHECKING:  # the reconciler imports this module
    from slurm_spot.reconcile.reconciler import PassResult, Snapshot

# The reconciler's log: these lines kept the logger name they had inside the reconciler.
log = logging.getLogger("slurm_spot.reconcile.reconciler")
# Jobs that ended this long (plus one pass interval) before a lost node was seen are taken as
# ended by its interruption: the longest notice any provider gives (AWS, 120 s).
ENDED_WINDOW_S = 120.0


class Emit(Protocol):
    """Records one action of the pass: the event file, ``result.actions`` and the log
    (:class:`~slurm_spot.reconcile.reconciler.Reconciler` has it)."""

    def __call__(self, result: PassResult, action: Action, **fields: object) -> None: ...


class JobActions:
    """The job side of one reconciler's passes.

    Args:
        config: the site config (partitions, ``preemption.requeue_exit_code``, ``reconcile:``).
        slurm: the Slurm client (all Slurm access goes through it).
        metrics: where actions are counted (``expedite``, ``release``).
        emit: records an action as an event of the pass.
        sleep: seconds -> None, between the rounds of :meth:`expedite` (injectable for tests).
        expedite_wait_s: how long a pass waits for requeued jobs to become PENDING before it
            clears their requeue delay (the next pass catches later ones).
    """

    def __init__(self, config: SpotConfig, slurm: SlurmClient, metrics: ReconcileMetrics,
                 emit: Emit, sleep: Callable[[float], None] = time.sleep,
                 expedite_wait_s: float = 10.0) -> None:
        self.config = config
        self.slurm = slurm
        self.metrics = metrics
        self.emit = emit
        self.sleep = sleep
        self.expedite_wait_s = expedite_wait_s
        self._job_records: list[JobRecord] | SlurmCommandError | None = None
        self._elastic = ElasticJobs(slurm)  # per pass: which jobs are elastic

    def new_pass(self) -> None:
        """Forget what the last pass read: every job's record (read once per pass, if a lost
        node needs them) and which jobs are elastic."""
        self._job_records = None
        self._elastic = ElasticJobs(self.slurm)

    def held_jobs(self, history: History, result: PassResult) -> tuple[int, ...]:
        """The jobs of ``history.interrupted_jobs`` that are PENDING with Reason=BeginTime
        (Slurm's requeue hold), for :attr:`Snapshot.held_jobs`; none, with an error, when
        Slurm cannot be read."""
        if not history.interrupted_jobs:
            return ()
        try:
            jobs = self.slurm.jobs(sorted(history.interrupted_jobs))
        except SlurmCommandError as exc:
            result.errors.append(str(exc))
            return ()
        return tuple(j.job_id for j in jobs if j.state.is_pending and j.reason == "BeginTime")

    def release_elastic(self, d: NodeDecision, result: PassResult) -> list[int]:
        """The elastic jobs of the lost node ``d.node`` that go on without it (DOWN, just
        issued, took the node out of them; :func:`release_node` shrinks any that Slurm kept
        it in): one ``released`` event each. Returns their ids; a job that cannot be read is
        left to the usual path (requeue), with an error."""
        released = []
        for job, remaining in release_elastic(self._elastic, d.jobs, d.node, result.errors,
                                              after_steps=False):
            if remaining is None:  # its batch script ran there, or that was its last node
                self._requeue_headless(d, job, result)
                continue
            released.append(job)
            self.emit(result, Action.RELEASED, node=d.node, instance=d.instance,
                      job_ids=(job,), reason=RELEASE_REASON,
                      extra={"remaining": remaining, "notice": False})
        return released

    def _requeue_headless(self, d: NodeDecision, job: int, result: PassResult) -> None:
        """The fallback: an elastic job whose batch host was the lost node keeps running
        without its batch script after DOWN (``--no-kill``: slurmctld removes any failed node,
        job_mgr.c kill_running_job_by_node_name, 22.05), so it is requeued here
        (``scontrol requeue``); it then restarts from its checkpoint like any other job."""
        try:
            record = self.slurm.job_record(job)
            if record is None or record.state.base != "RUNNING":
                return  # Slurm requeued it (one node left) or it ended
            self.slurm.requeue(job)
        except SlurmCommandError as exc:
            result.errors.append(f"{d.node}: requeueing elastic job {job}: {exc}")

    def requeue_ended(self, d: NodeDecision, snap: Snapshot, result: PassResult) -> list[int]:
        """Requeue the batch jobs that ended on a lost node during its interruption (an
        interruption never makes a job FAILED; :mod:`slurm_spot.jobs.interruption.requeue`): those that
        ended within the last pass interval plus the longest notice (AWS's 120 s), but not
        one whose restart count rose since the node's watcher got its notice: it was requeued
        already (:func:`restarts_at_notice`; one interruption, one requeue). Returns the
        jobs requeued."""
        since = snap.now.timestamp() - self.config.reconcile.interval_s - ENDED_WINDOW_S
        try:
            if self._job_records is None:  # once per pass, however many nodes were lost
                try:  # only the jobs that ended in the window: each lost node scans these
                    self._job_records = [
                        r for r in self.slurm.job_records() if r.state.is_finished
                        and r.end_time is not None and r.end_time >= since]
                except SlurmCommandError as exc:
                    self._job_records = exc
            if isinstance(self._job_records, SlurmCommandError):
                raise self._job_records
            decisions, errors = requeue_ended_on(
                self.slurm, d.node, since, self._job_records,
                restarts_at_notice(snap.events, d.node, since))
        except SlurmCommandError as exc:
            result.errors.append(f"{d.node}: requeue ended jobs: {exc}")
            return []
        result.errors.extend(errors)
        for decision in decisions:
            self.emit(result, Action.REQUEUE_ENDED if decision.requeue else Action.NOT_REQUEUED,
                      node=d.node, job_ids=(decision.job_id,), reason=decision.why)
        return [x.job_id for x in decisions if x.requeue]

    def expedite(self, requeued: list[int], held: Sequence[int], result: PassResult) -> None:
        """Clear the requeue delay of ``held`` jobs at once and of ``requeued`` ones as soon
        as they are PENDING (up to ``expedite_wait_s``): one ``scontrol update jobid=<list>``
        per round for all of them (:meth:`SlurmClient.expedite_many`)."""
        waiting = set(requeued)
        self._expedite_jobs(list(held), result, "safety net")
        deadline = time.monotonic() + self.expedite_wait_s
        while waiting:
            try:
                jobs = self.slurm.jobs(sorted(waiting))
            except SlurmCommandError as exc:
                result.errors.append(str(exc))
                return
            self._expedite_jobs([j.job_id for j in jobs if j.state.is_pending], result,
                                Action.REQUEUED)
            waiting &= {j.job_id for j in jobs if not j.state.is_pending and j.state.is_active}
            if not waiting or time.monotonic() >= deadline:
                return
            self.sleep(0.5)

    def expedite_requeue_exits(self, result: PassResult, skip: Sequence[int],
                               snap: Snapshot) -> list[int]:
        """Clear the requeue delay of jobs on our partitions that requeued themselves with the
        requeue exit code (an elastic job below MIN, a job that saved and left), however long
        after an interruption: one ``squeue``, then ``scontrol show job`` for the few
        candidates, or one for all jobs when there are many; ``skip``: the jobs this pass
        requeued itself (expedited as such). A job requeued that way too often is left to
        Slurm's hold (:func:`cap_fast_requeues`, event ``expedite_withheld``). Returns the jobs
        expedited and those withheld (neither is expedited again this pass)."""
        ours = [p.name for p in self.config.partitions]
        try:
            candidates = [j for j in requeue_candidates(self.slurm.jobs(), ours) if j not in skip]
            if len(candidates) > 3:
                records = [r for r in self.slurm.job_records() if r.job_id in candidates]
            else:
                records = [r for j in candidates if (r := self.slurm.job_record(j)) is not None]
        except SlurmCommandError as exc:
            result.errors.append(str(exc))
            return []
        code = self.config.preemption.requeue_exit_code
        settings = self.config.reconcile
        expedite, withheld = cap_fast_requeues(
            held_by_requeue_exit(records, code), records, snap.events, snap.now, code,
            settings.max_fast_requeues, settings.fast_requeue_window_s)
        for w in withheld:
            if not w.new:
                continue
            self.emit(result, Action.EXPEDITE_WITHHELD, job_ids=(w.job_id,),
                      reason=withheld_reason(w, code, settings.max_fast_requeues,
                                             settings.fast_requeue_window_s),
                      extra={"restarts": w.restarts, "requeues": w.requeues,
                             "window_s": settings.fast_requeue_window_s})
        return self._expedite_jobs(expedite, result, exit_reason(code)) + [
            w.job_id for w in withheld]

    def stuck_jobs(self, snap: Snapshot, result: PassResult) -> None:
        """Pending jobs of our partitions nothing else would move (:mod:`.held_jobs`): one
        ``squeue``; a job held after a failed launch is released (``scontrol release``, event
        ``job_released``) up to the fast-requeue cap, then left held with one
        ``release_withheld`` event per requeue; a job on BadConstraints is reported once per
        requeue (event ``bad_constraints`` and an AdminComment note). One job's refusal
        never stops the others."""
        settings = self.config.reconcile
        ours = [p.name for p in self.config.partitions]
        try:
            jobs = self.slurm.jobs()
        except SlurmCommandError as exc:
            result.errors.append(str(exc))
            return
        release, withheld = split_launch_held(jobs, ours, snap.events, snap.now,
                                              settings.max_fast_requeues,
                                              settings.fast_requeue_window_s)
        for held in release:
            if not self.metrics.slurm_action("release", result.errors, f"job {held.job_id}: release",
                                             self.slurm.release, held.job_id):
                continue
            self.emit(result, Action.JOB_RELEASED, job_ids=(held.job_id,),
                      reason="launch_failed_requeued_held on a spot partition",
                      extra={"restarts": held.restarts, "releases": held.releases + 1})
        for held in withheld:
            if held.new:
                self.emit(result, Action.RELEASE_WITHHELD, job_ids=(held.job_id,),
                          reason=release_withheld_reason(held, settings.max_fast_requeues,
                                                         settings.fast_requeue_window_s),
                          extra={"restarts": held.restarts, "releases": held.releases})
        found = bad_constraint_jobs(jobs, ours, snap.events)
        for bad in found:
            self.emit(result, Action.BAD_CONSTRAINTS, job_ids=(bad.job_id,),
                      reason=bad_constraint_reason(bad),
                      extra={"constraint": bad.constraint, "restarts": bad.restarts})
        result.errors += self.slurm.record_interruptions(
            [(bad.job_id, f"slurm-spot: {bad_constraint_reason(bad)}") for bad in found])

    def _expedite_jobs(self, job_ids: list[int], result: PassResult, why: str) -> list[int]:
        if not job_ids:
            return []
        done, errors = self.slurm.expedite_many(job_ids)
        for error in errors:
            log.error("expediting: %s", error)
            result.errors.append(error)
            self.metrics.action("expedite", ok=False)
        for job in done:
            self.metrics.action("expedite", ok=True)
            self.emit(result, Action.EXPEDITED, job_ids=(job,), reason=why)
        return done
