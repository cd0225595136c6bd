"""``slurm-spot watch``: the node-side interruption watcher (docs/DESIGN.md flow 3).

On an interruption notice for its node it:

1. drains the node with reason ``spot-interruption:<action>@<time>`` (no new jobs land);
2. with ``preemption.prewarm`` (default), has one replacement node per job powered up at once,
   through slurmctld (:mod:`slurm_spot.lifecycle.prewarm`), so its boot hides behind the notice; it comes
   from any node set of the job's partition that has capacity, cheapest first, and is chosen
   again from the next node set if it fails to launch (a ``prewarm`` event with ``failed``);
3. sends every job on the node the preemption signal that job handles (its own ``--signal``,
   else what its processes catch, else spot.yaml's; never one its processes would die of:
   :mod:`slurm_spot.jobs.interruption.signal_choice`): with prewarm when the replacements are up, or at the
   latest at ``deadline - margin - the job's checkpoint + step time - signal_margin_s``
   (:func:`slurm_spot.lifecycle.prewarm.latest_signal_time`); without prewarm at once. A job with nothing
   to catch it yet (still in its prolog) is tried again while the watcher waits;
4. waits until those jobs have left the node, or until ``margin_s`` before the deadline;
5. for the jobs that left by themselves: requeues each that ended during the interruption,
   whatever its exit code (:mod:`slurm_spot.jobs.interruption.requeue`), clears the ~121 s requeue delay
   (``scontrol update jobid=N StartTime=now``), waits briefly for their new allocation and
   restores the replacements' Weight;
   An *elastic* job (``slurm-spot sbatch --torchrun --elastic``: one job step per node, marked
   by :data:`~slurm_spot.contract.names.ELASTIC_MARK` in its batch script) goes on without
   this node: once its steps here have ended (this node's ranks saved and left) and its batch
   script runs elsewhere, the node is released from the job (``scontrol update JobId=N
   NodeList=<the other nodes>``, scontrol(1) 22.05: "Change the nodes allocated to a running
   job to shrink its size"), so the power-down below does not requeue it;
6. one interruption is one requeue, whoever requeues first (issue 25): a job that requeued
   itself (``scontrol requeue`` from submitit's or Lightning's handler: ``JobState=REQUEUED``,
   or its ``Restarts`` rose since the notice; :func:`~slurm_spot.jobs.interruption.requeue.requeued_since`)
   is never requeued again, only expedited. A batch job still running here at
   ``deadline - margin`` is requeued (``scontrol requeue``) before the power-down, and the
   watcher then waits, until :data:`POWER_DOWN_BY_S` before the deadline, for every requeued
   job to leave the node: their accounting records read REQUEUED, not NODE_FAIL (which
   submitit's client takes for the job's end, ``UncompletedJobError``);
7. notes the requeue in each requeued job's AdminComment and emits ``requeued`` (the suspend
   hook ends this instance, and the watcher with it, seconds after the next step), then sets
   the node POWER_DOWN_FORCE, so slurmctld requeues a batch job still running there at once
   (not after SlurmdTimeout) and powers the node down, and expedites those jobs too.

Every step is an event (``notice``, ``prewarm``, ``signalled``/``signal_withheld`` (and
``signal_failed`` where scancel could not reach a step, which then gets it by kill(2)),
``requeue_ended``/``not_requeued``, ``requeued``/``powered_down``) with its time, which
``slurm-spot demo`` uses for its recovery breakdown. A ``signalled`` event says both which
signal and why (``reason``, ``extra.signal``, ``extra.steps``/``pids``) and when
(``extra.when``: replacement up, replacement failed, checkpoint deadline, prewarm off;
``extra.prewarmed``, ``extra.replacements``).

A rebalance recommendation (AWS) is only logged, or drains the node early when configured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_spot import events
from slurm_spot.checkpoint.files import SaveCost, save_costs
from slurm_spot.config import (
    SpotConfig,
)
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.hostlist import expand
from slurm_spot.jobs.interruption.elastic_release import RELEASE_REASON, ElasticJobs, release_elastic
from slurm_spot.jobs.interruption.requeue import requeue_ended, requeued_since
from slurm_spot.jobs.interruption.signal_choice import JobSignaller
from slurm_spot.lifecycle.prewarm import Prewarm, job_checkpoint_dir, latest_signal_time
from slurm_spot.providers.notices import Notice, NoticeSource
from slurm_spot.sdnotify import Notifier
from slurm_spot.slurm.client import Job, SlurmClient
from slurm_spot.slurm.reasons import interruption_reason

log = logging.getLogger(__name__)

# The power-down comes at the latest this many seconds before the notice's deadline, even while
# a requeued job is still leaving the node (the instance is gone at the deadline).
POWER_DOWN_BY_S = 1.0


def source_for(config: SpotConfig, node: str) -> NoticeSource:
    """The notice source for ``node``'s provider (imports only that provider's module).

    Raises:
        BadInputError: ``node`` belongs to no node set.
    """
    node_set = config.node_set_of(node)
    if node_set is None:
        raise BadInputError(f"node {node!r} belongs to no node set of {config.source_path}")
    from slurm_spot.providers import package_for

    settings = config.providers[node_set.provider]
    return package_for(config, node_set.provider).notice_source(config, node, settings)


@dataclass
class NoticeOutcome:
    """What the watcher did for one notice (for tests, events and the demo)."""

    notice: Notice
    jobs: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    replacements: list[str] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Watcher:
    """Acts on notices for one node.

    Args:
        config: the site config (preemption signal, log dir).
        node: this node's Slurm name.
        slurm: the Slurm client.
        source: where notices come from.
        margin_s: act (POWER_DOWN_FORCE) at the latest this many seconds before the deadline.
        clock, sleep: injectable for tests (seconds, time.time-like).
        instance_id: this instance's provider id, written as the ``instance`` of every event
            the watcher emits (None: left empty).
        notifier: systemd's ``Type=notify`` socket (:mod:`slurm_spot.sdnotify`): ``READY=1``
            when polling starts, ``WATCHDOG=1`` at every poll and every wait while a notice is
            handled. Default: from this process's environment (does nothing outside systemd).
    """

    def __init__(
        self,
        config: SpotConfig,
        node: str,
        slurm: SlurmClient,
        source: NoticeSource,
        margin_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        instance_id: str | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.notifier = notifier or Notifier()
        self.instance_id = instance_id
        self.node = node
        self.slurm = slurm
        self.source = source
        self.margin_s = margin_s
        self.clock = clock
        self._sleep = sleep
        self.signaller = JobSignaller(slurm, node, config.preemption.signal, self._event)
        # Per job whose signal time has come: when/why now, for its ``signalled`` event.
        self._when: dict[int, dict[str, object]] = {}
        # Per job: is it elastic (its batch script carries ELASTIC_MARK)? Read once per job.
        self._elastic = ElasticJobs(slurm, het_components=True)
        # Per job on the node at the notice: its restart count then (squeue's restart_cnt).
        self._restarts_at_notice: dict[int, int] = {}
        # Per job requeued since the notice (by itself, or here before the power-down): why.
        self._requeued: dict[int, str] = {}
        # Requeueable batch jobs on other nodes too, left to the power-down to requeue.
        self._left_to_power_down: set[int] = set()

    def sleep(self, seconds: float) -> None:
        """Waits ``seconds`` (the injected sleep), pinging systemd's watchdog first."""
        self.notifier.watchdog()
        self._sleep(seconds)

    def _event(self, action: events.Action, **fields: object) -> None:
        job_ids = fields.get("job_ids") or ()
        fields = events.with_job_refs(fields, self.slurm.known_refs(job_ids))  # type: ignore[arg-type]
        events.emit(self.config.log_dir,
                    events.Event(action, "watch", node=self.node, instance=self.instance_id,
                                 **fields))  # type: ignore[arg-type]

    def handle(self, notice: Notice) -> NoticeOutcome:
        """Drain, prewarm, signal, wait, expedite, power down (see the module docstring)."""
        outcome = NoticeOutcome(notice)
        reason = notice.reason
        self._try(outcome, lambda: self.slurm.set_state([self.node], "DRAIN", reason))
        jobs = self._jobs_here(outcome)
        outcome.jobs = jobs
        read = self._read_jobs(outcome, jobs)
        self._restarts_at_notice = {j.job_id: j.restarts for j in read}
        self._event(events.Action.NOTICE, reason=reason, job_ids=tuple(jobs),
                    extra={"deadline": notice.deadline.isoformat(), "source": notice.source,
                           # read by the reconciler (jobs.requeue.restarts_at_notice)
                           "restarts": {str(j): n for j, n in self._restarts_at_notice.items()}})
        prewarm = None
        if jobs and self.config.preemption.prewarm:
            # Replacements from any node set of the jobs' partitions (issue 24, part 3).
            prewarm = Prewarm(self.config, self.slurm, self.node, self.clock,
                              partitions=[j.partition for j in read if j.partition] or None,
                              on_retry=lambda failed, again: self._event(
                                  events.Action.PREWARM, job_ids=tuple(jobs),
                                  reason=f"replacement(s) {','.join(failed)} failed to launch: "
                                         "chosen again from the next node set",
                                  extra={"power_up": list(again.power_up),
                                         "ready": list(again.ready), "short": again.short,
                                         "failed": list(failed)}))
            chosen = prewarm.start(len(jobs))
            outcome.replacements = list(chosen.nodes)
            outcome.errors.extend(prewarm.errors)
            self._event(events.Action.PREWARM, job_ids=tuple(jobs),
                        extra={"power_up": list(chosen.power_up), "ready": list(chosen.ready),
                               "short": chosen.short})
        self._signal_jobs(outcome, jobs, notice, prewarm)
        act_at = notice.deadline.timestamp() - self.margin_s
        while self.clock() < act_at and jobs:
            # Poll often: the sooner a job that left is expedited, the sooner it runs again.
            self.sleep(max(0.05, min(0.25, act_at - self.clock())))
            jobs = [j for j in self._jobs_here(outcome) if j in outcome.jobs]
            self._note_requeued(outcome, jobs)
            self._retry_withheld(outcome, jobs)  # those still in their prolog
            self._release_elastic(outcome, jobs)
        jobs = self._requeue_before_power_down(outcome, jobs, notice.deadline.timestamp())
        # Jobs that left are expedited before the power-down, but never past its latest time:
        # one still REQUEUED (completing) then is expedited after it.
        power_down_by = notice.deadline.timestamp() - POWER_DOWN_BY_S
        later = list(jobs)
        for job in [j for j in outcome.jobs if j not in jobs and j not in outcome.released]:
            expedited = self._expedite(job, outcome, until=power_down_by)
            if expedited is None:
                later.append(job)
            elif expedited:  # left by itself: requeued by its exit code
                outcome.requeued.append(job)
        if prewarm is not None:
            self._await_allocation(outcome.requeued, act_at)
            prewarm.restore()
        # Recorded and reported before the power-down: the suspend hook terminates this
        # instance, and this process with it, seconds after it (a multi-node job left to the
        # power-down was still being expedited then, and its record was lost). What the
        # power-down requeues: jobs already requeued and still leaving, and the requeueable
        # batch jobs left to it (slurmctld: "requeue job N due to failure of node").
        at_power_down = [j for j in later if j in self._requeued or j in self._left_to_power_down]
        reported = [*outcome.requeued, *at_power_down]
        if reported or not later:  # nothing known yet: reported once expedited, as before
            self._report_requeued(outcome, reason, reported, with_why=True)
        self._try(outcome, lambda: self.slurm.power_down_force([self.node], reason))
        for job in later:
            if self._expedite(job, outcome) and job not in outcome.requeued:
                outcome.requeued.append(job)
        unreported = [j for j in outcome.requeued if j not in reported]
        if unreported:  # requeued by the power-down (or after it ended) and expedited here
            self._report_requeued(outcome, reason, unreported, with_why=not reported)
        return outcome

    def _report_requeued(self, outcome: NoticeOutcome, reason: str, jobs: list[int],
                         with_why: bool) -> None:
        """Note the interruption in each of ``jobs``' AdminComment and emit ``requeued`` (or
        ``powered_down`` for a notice that found no job: the node only powers down); with
        ``with_why``, the event says which jobs were requeued before the power-down and
        why."""
        outcome.errors += self.slurm.record_interruption(jobs, f"requeued: {reason}")
        self._event(events.Action.REQUEUED if jobs else events.Action.POWERED_DOWN,
                    reason=reason, job_ids=tuple(jobs),
                    extra={"requeued_before_power_down": dict(sorted(
                        (str(j), why) for j, why in self._requeued.items()))}
                    if self._requeued and with_why else {})

    def _read_jobs(self, outcome: NoticeOutcome, jobs: list[int]) -> list[Job]:
        """``jobs`` as squeue reads them now ([] when none, or squeue failed: noted)."""
        if not jobs:
            return []
        try:
            return self.slurm.jobs(jobs)
        except SlurmCommandError as exc:
            outcome.errors.append(str(exc))
            return []

    def _note_requeued(self, outcome: NoticeOutcome, jobs: list[int]) -> None:
        """Remember which of ``jobs`` (still on the node) requeued themselves since the
        notice, and why: the power-down waits for those to leave, and none is requeued by
        the watcher before it."""
        for job in self._read_jobs(outcome, [j for j in jobs if j not in self._requeued]):
            why = requeued_since(job.state, job.restarts,
                                 self._restarts_at_notice.get(job.job_id))
            if why is not None:
                self._requeued[job.job_id] = f"by itself: {why}"

    def _requeue_before_power_down(self, outcome: NoticeOutcome, jobs: list[int],
                                   deadline: float) -> list[int]:
        """Requeue each batch job of ``jobs`` (still on the node at ``deadline - margin_s``)
        that is still RUNNING its interrupted run, then wait until every requeued job has
        left the node or :data:`POWER_DOWN_BY_S` before ``deadline`` (epoch s): the power-down
        then finds no run of theirs, and their accounting records read REQUEUED, not NODE_FAIL.
        ``scontrol requeue`` takes "a running, suspended or finished Slurm batch job"
        (scontrol(1) 22.05). A job on other nodes too (a ``--no-kill`` one goes on without
        this node) and an elastic job are left to the power-down. Returns the jobs still on
        the node."""
        jobs = [j for j in jobs if j not in outcome.released]
        self._note_requeued(outcome, jobs)
        for job in [j for j in jobs if j not in self._requeued]:
            try:
                record = self.slurm.job_record(job)
                if (record is None or record.state.base != "RUNNING" or not record.batch
                        or not record.requeue or self._elastic.is_elastic(job)):
                    continue
                if expand(record.nodes) != [self.node]:
                    self._left_to_power_down.add(job)
                    continue
                if self.slurm.requeue(job):
                    self._requeued[job] = "by the watcher before the power-down"
            except (SlurmCommandError, ValueError) as exc:
                outcome.errors.append(f"requeueing job {job} before the power-down: {exc}")
        while jobs and all(j in self._requeued for j in jobs) \
                and self.clock() < deadline - POWER_DOWN_BY_S:
            self.sleep(max(0.05, min(0.25, deadline - POWER_DOWN_BY_S - self.clock())))
            jobs = [j for j in self._jobs_here(outcome) if j in jobs]
        return jobs

    def _signal_jobs(self, outcome: NoticeOutcome, jobs: list[int], notice: Notice,
                     prewarm: Prewarm | None) -> None:
        """Signal each job when the replacements are up (or failed), or at its own latest
        signal time; at once without prewarm. Jobs that leave meanwhile are not signalled."""
        latest = self._latest_signal_times(jobs, notice) if prewarm else {}
        pending = list(jobs)
        while pending:
            now = self.clock()
            status = prewarm.status() if prewarm else "off"
            due = [j for j in pending if status != "booting" or now >= latest[j]]
            for job in due:
                when = {"up": "replacement up", "failed": "replacement failed",
                        "off": "prewarm off"}.get(status, "checkpoint deadline")
                self._signal(outcome, job, when,
                             prewarm is not None and bool(prewarm.chosen.nodes))
                pending.remove(job)
            if pending:
                self.sleep(max(0.05, min(1.0, min(latest[j] for j in pending) - now)))
                try:  # a job that ended meanwhile needs no signal; an unreadable node keeps all
                    nodes = self.slurm.nodes([self.node])
                except SlurmCommandError as exc:
                    outcome.errors.append(str(exc))
                    continue
                here = nodes[0].jobs if nodes else ()
                pending = [j for j in pending if j in here]
                self._retry_withheld(outcome, [j for j in here if j not in pending])

    def _latest_signal_times(self, jobs: list[int], notice: Notice) -> dict[int, float]:
        """Per job, :func:`latest_signal_time` from its own saves (else the default)."""
        prefs = self.config.preemption
        try:
            found = {j.job_id: j for j in self.slurm.jobs(jobs)}
        except SlurmCommandError as exc:
            log.error("cannot read the jobs' users, assuming default checkpoint times: %s", exc)
            found = {}
        result = {}
        for job in jobs:
            directory = job_checkpoint_dir(self.config, found[job]) if job in found else None
            cost = save_costs(directory) if directory is not None else SaveCost()
            result[job] = latest_signal_time(notice.deadline.timestamp(), self.margin_s, cost,
                                             prefs.default_checkpoint_s, prefs.signal_margin_s)
            self._event(events.Action.SIGNAL_PLAN, job_ids=(job,), extra={
                "save_s": cost.save_s, "step_s": cost.step_s, "size_bytes": cost.size_bytes,
                "latest_signal_in_s": round(result[job] - self.clock(), 1)})
        return result

    def _await_allocation(self, jobs: list[int], act_at: float, limit_s: float = 20.0) -> None:
        """Wait (at most ``limit_s``, never past ``act_at``) until the requeued ``jobs`` have
        an allocation, so that the replacements' Weight can be restored."""
        until = min(act_at, self.clock() + limit_s)
        while jobs and self.clock() < until:
            try:
                found = self.slurm.jobs(jobs)
            except SlurmCommandError:
                return
            if all(not j.state.is_pending for j in found):
                return
            self.sleep(0.5)

    def _signal(self, outcome: NoticeOutcome, job: int, when: str, prewarmed: bool) -> None:
        """Have :class:`JobSignaller` signal ``job`` now; its ``signalled`` event also carries
        when and why now (``when``) and the prewarm facts the recovery breakdown reads."""
        self._when[job] = {"when": when, "prewarmed": prewarmed,
                           "replacements": list(outcome.replacements)}
        self._retry_withheld(outcome, [job])

    def _retry_withheld(self, outcome: NoticeOutcome, jobs: list[int]) -> None:
        """Signal those of ``jobs`` whose time has come but that had nothing to catch the
        signal yet (still in their prolog); jobs not due yet are left for :meth:`_signal_jobs`."""
        for job in jobs:
            if job in self._when and not self.signaller.signalled(job):
                outcome.errors += self.signaller.deliver([job], context=self._when[job])

    def _release_elastic(self, outcome: NoticeOutcome, jobs: list[int]) -> None:
        """Release this node from each elastic job whose steps here have ended and whose batch
        script runs on another node (see the module docstring, step 5, and
        :mod:`slurm_spot.jobs.interruption.elastic_release`, shared with the reconciler)."""
        ready = (job for job in jobs
                 if job not in outcome.released and self.signaller.signalled(job))
        for job, remaining in release_elastic(self._elastic, ready, self.node, outcome.errors,
                                              after_steps=True):
            if remaining is None:
                continue  # this node's ranks are still saving, or the job cannot go on
            outcome.released.append(job)
            self._event(events.Action.RELEASED, job_ids=(job,), reason=RELEASE_REASON,
                        extra={"remaining": remaining})

    def _jobs_here(self, outcome: NoticeOutcome) -> list[int]:
        try:
            nodes = self.slurm.nodes([self.node])
        except SlurmCommandError as exc:
            outcome.errors.append(str(exc))
            return []
        return list(nodes[0].jobs) if nodes else []

    def _expedite(self, job: int, outcome: NoticeOutcome, until: float | None = None,
                  ) -> bool | None:
        """Wait (up to 10 s, and not past ``until``, epoch s) for the requeued job to be
        pending, then clear its delay. Returns whether it was expedited; None when ``until``
        came first (the job is still leaving)."""
        for _ in range(20):
            if until is not None and self.clock() >= until:
                return None
            try:
                found = self.slurm.jobs([job])
            except SlurmCommandError as exc:
                outcome.errors.append(str(exc))
                return False
            if not found or found[0].state.is_finished:
                if not self._requeue_ended(job, outcome):
                    return False
                continue
            if found[0].state.is_pending:
                return self._try(outcome, lambda: self.slurm.expedite(job))
            self.sleep(0.5)
        return False

    def _requeue_ended(self, job: int, outcome: NoticeOutcome) -> bool:
        """Requeue ``job`` if it ended during the interruption (never FAILED by one)."""
        try:
            decision = requeue_ended(self.slurm, job, self._restarts_at_notice.get(job))
        except SlurmCommandError as exc:
            outcome.errors.append(str(exc))
            return False
        self._event(events.Action.REQUEUE_ENDED if decision.requeue else events.Action.NOT_REQUEUED,
                    job_ids=(job,), reason=decision.why)
        return decision.requeue

    def _try(self, outcome: NoticeOutcome, action: Callable[[], object]) -> bool:
        try:
            action()
        except SlurmCommandError as exc:
            log.error("%s", exc)
            outcome.errors.append(str(exc))
            return False
        return True

    def run(self, once: bool = False) -> NoticeOutcome | None:
        """Poll until an interruption notice arrives and handle it; returns its outcome.

        Rebalance recommendations are logged (and drain the node if the node set asks for
        it). With ``once``, poll a single time and return None if there is no notice.
        """
        drained_for_rebalance = False
        self.notifier.ready(f"watching node {self.node} for interruption notices")
        while True:
            self.notifier.watchdog()
            notice = self.source.poll()
            if notice is not None and notice.kind == "interruption":
                return self.handle(notice)
            if notice is not None and not drained_for_rebalance:
                drained_for_rebalance = True
                self._rebalance(notice)
            if once:
                return None
            self.sleep(self.source.interval_s)

    def _rebalance(self, notice: Notice) -> None:
        node_set = self.config.node_set_of(self.node)
        drain = bool(node_set and node_set.aws and node_set.aws.rebalance_drain)
        self._event(events.Action.REBALANCE, reason=notice.reason,
                    extra={"drained": drain})
        if drain:
            reason = interruption_reason("rebalance", notice.deadline)
            try:
                self.slurm.set_state([self.node], "DRAIN", reason)
            except SlurmCommandError as exc:
                log.error("%s", exc)
