"""``slurm-spot watch``: the node-side interruption watcher (docs/DESIGN.md flow 3).

On an interruption notice for its node it:

1. drains the node with reason ``spot-interruption:<action>@<time>`` (no new jobs land);
2. sends every job on the node the preemption signal that job handles (its own ``--signal``,
   else what its processes catch, else spot.yaml's; never one its processes would die of:
   :mod:`slurm_spot.jobs.signal_choice`), so training code checkpoints at its next step
   boundary; a job with nothing to catch it yet (still in its prolog) is tried again;
3. waits until those jobs have left the node, or until ``margin_s`` before the deadline;
4. sets the node POWER_DOWN_FORCE, so slurmctld requeues a batch job still running there at
   once (not after SlurmdTimeout) and powers the node down;
5. requeues each of those jobs that ended during the interruption, whatever its exit code
   (:mod:`slurm_spot.jobs.requeue`), and clears the ~121 s requeue delay of each
   (``scontrol update jobid=N StartTime=now``).

A rebalance recommendation (AWS) is only logged, or drains the node early when configured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_spot import events
from slurm_spot.config import (
    SpotConfig,
)
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.jobs.requeue import requeue_ended
from slurm_spot.jobs.signal_choice import JobSignaller
from slurm_spot.providers.notices import Notice, NoticeSource
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger(__name__)


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
    ) -> None:
        self.config = config
        self.node = node
        self.slurm = slurm
        self.source = source
        self.margin_s = margin_s
        self.clock = clock
        self.sleep = sleep
        self.signaller = JobSignaller(slurm, node, config.preemption.signal, self._event)

    def _event(self, action: events.Action, **fields: object) -> None:
        events.emit(self.config.log_dir,
                    events.Event(action, "watch", node=self.node, **fields))  # type: ignore[arg-type]

    def handle(self, notice: Notice) -> NoticeOutcome:
        """Drain, signal, wait, power down, expedite (see the module docstring)."""
        outcome = NoticeOutcome(notice)
        reason = notice.reason
        self._try(outcome, lambda: self.slurm.set_state([self.node], "DRAIN", reason))
        jobs = self._jobs_here(outcome)
        outcome.jobs = jobs
        self._event(events.Action.NOTICE, reason=reason, job_ids=tuple(jobs),
                    extra={"deadline": notice.deadline.isoformat(), "source": notice.source})
        outcome.errors += self.signaller.deliver(jobs)
        act_at = notice.deadline.timestamp() - self.margin_s
        while self.clock() < act_at and jobs:
            self.sleep(max(0.05, min(1.0, act_at - self.clock())))
            jobs = [j for j in self._jobs_here(outcome) if j in outcome.jobs]
            outcome.errors += self.signaller.deliver(jobs)  # those still in their prolog
        self._try(outcome, lambda: self.slurm.set_state([self.node], "POWER_DOWN_FORCE", reason))
        for job in outcome.jobs:
            if self._expedite(job, outcome):
                outcome.requeued.append(job)
        # "requeued" only when a job was: a notice on an idle node just powers it down.
        self._event(events.Action.REQUEUED if outcome.requeued else events.Action.POWERED_DOWN,
                    reason=reason,
                    job_ids=tuple(outcome.requeued))
        return outcome

    def _jobs_here(self, outcome: NoticeOutcome) -> list[int]:
        try:
            nodes = self.slurm.nodes([self.node])
        except SlurmCommandError as exc:
            outcome.errors.append(str(exc))
            return []
        return list(nodes[0].jobs) if nodes else []

    def _expedite(self, job: int, outcome: NoticeOutcome) -> bool:
        """Wait (up to 10 s) for the requeued job to be pending, then clear its delay."""
        for _ in range(20):
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
            decision = requeue_ended(self.slurm, job)
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
        while True:
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
            reason = f"spot-interruption:rebalance@{notice.deadline:%Y-%m-%dT%H:%M:%SZ}"
            try:
                self.slurm.set_state([self.node], "DRAIN", reason)
            except SlurmCommandError as exc:
                log.error("%s", exc)
