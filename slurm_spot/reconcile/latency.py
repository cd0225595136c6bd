"""Latencies the reconciler measures from what it already sees: events, nodes, jobs.

Three durations, each observed once (seconds), for the histograms in
:mod:`slurm_spot.reconcile.metrics`:

- **launch latency** (per node set): the resume hook's launch request (the ``launched``
  event's ``extra.requested``, else its time) -> the node's slurmd up and registered
  (``SlurmdStartTime``, which slurmctld learns at registration; slurm.conf(5)/scontrol(1) of
  Slurm 22.05). Observed on the first pass that sees a SlurmdStartTime at or after the request.
- **time to running** (per partition): a job's submission -> its start (squeue's
  ``submit_time``/``start_time``), once per job, the first time a pass sees it RUNNING, for
  jobs of slurm-spot's partitions that started after the reconciler did (a restarted
  reconciler does not count old jobs twice). A job requeued before a pass saw it run (its
  node lost while booting) counts with the times squeue shows for the run that is seen.
- **recovery time** (per node set of the interrupted node): an interruption (the watcher's
  ``notice`` or the reconciler's ``reclaimed`` event naming the job) -> the job running
  again (its ``start_time`` after the interruption). Several events of one interruption
  (notice, then reclaimed) count once, from the earliest.

Pure bookkeeping: :meth:`LatencyTracker.observe` takes one pass's view and returns what is
new; it never calls Slurm or a provider. Times are compared as Unix seconds, so an event's
ISO time (UTC) and Slurm's epoch fields agree whatever the controller's time zone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from slurm_spot.events import Action
from slurm_spot.slurm.client import Job, Node

LAUNCH, TIME_TO_RUNNING, RECOVERY = "launch", "time_to_running", "recovery"
INTERRUPTIONS = (Action.NOTICE, Action.RECLAIMED)


@dataclass(frozen=True)
class Observation:
    """One measured duration: ``kind`` (:data:`LAUNCH`, :data:`TIME_TO_RUNNING`,
    :data:`RECOVERY`), ``label`` (node set, or partition for time to running), ``seconds``."""

    kind: str
    label: str
    seconds: float


def _epoch(text: object) -> float | None:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


class LatencyTracker:
    """Remembers what was already observed, so each launch, job start and recovery counts once.

    One per process (kept by :class:`~slurm_spot.reconcile.metrics.ReconcileMetrics`), so a
    reloaded configuration does not count anything twice.

    Args:
        started: Unix seconds at which the reconciler started; jobs that started earlier are
            not counted as time to running.
        forget_s: how long a launch or interruption event is considered (seconds).
    """

    def __init__(self, started: float, forget_s: float = 86400) -> None:
        self.started = started
        self.forget_s = forget_s
        self._done: dict[tuple[object, ...], float] = {}  # observed key -> when (Unix s)
        self._runs: dict[int, tuple[float | None, float]] = {}  # job -> (previous, last start)

    def observe(self, events: Iterable[Mapping[str, object]], nodes: Iterable[Node],
                jobs: Iterable[Job], node_set_of: Mapping[str, str], partitions: Iterable[str],
                now: float) -> list[Observation]:
        """What completed since the last call.

        Args:
            events: the events file's recent lines (the reconciler's tail), oldest first.
            nodes: Slurm's nodes this pass (``slurmd_start_time`` set once registered).
            jobs: the jobs squeue lists this pass (``submit_time``/``start_time``).
            node_set_of: node name -> node set.
            partitions: slurm-spot's partition names (jobs elsewhere are not counted).
            now: this pass's time, Unix seconds.
        """
        self._done = {k: t for k, t in self._done.items() if now - t < 2 * self.forget_s}
        self._runs = {j: r for j, r in self._runs.items() if now - r[1] < 2 * self.forget_s}
        job_list = list(jobs)
        found = self._launches(events, {n.name: n for n in nodes}, node_set_of, now)
        found += self._starts(job_list, frozenset(partitions))
        found += self._recoveries(events, {j.job_id: j for j in job_list}, node_set_of, now)
        return found

    def _once(self, key: tuple[object, ...], now: float) -> bool:
        if key in self._done:
            return False
        self._done[key] = now
        return True

    def _launches(self, events: Iterable[Mapping[str, object]], nodes: Mapping[str, Node],
                  node_set_of: Mapping[str, str], now: float) -> list[Observation]:
        # node -> the latest launch request before its slurmd started (an earlier launch of
        # the same node, whose instance never registered, is not this registration's)
        latest: dict[str, tuple[float, object]] = {}
        for event in events:
            if event.get("action") != Action.LAUNCHED:
                continue
            name = str(event.get("node"))
            extra = event.get("extra")
            requested = _epoch(extra.get("requested") if isinstance(extra, dict)
                               and extra.get("requested") else event.get("time"))
            node = nodes.get(name)
            if requested is None or node is None or now - requested > self.forget_s:
                continue
            up = node.slurmd_start_time
            if up is None or up < requested:
                continue  # not registered since this launch (yet)
            if name not in latest or latest[name][0] < requested:
                latest[name] = (requested, event.get("instance"))
        found = []
        for name, (requested, instance) in latest.items():
            if self._once((LAUNCH, name, instance, requested), now):
                up = nodes[name].slurmd_start_time or requested
                found.append(Observation(LAUNCH, node_set_of.get(name, "unknown"), up - requested))
        return found

    def _starts(self, jobs: Iterable[Job], ours: frozenset[str]) -> list[Observation]:
        found = []
        for job in jobs:
            partitions = set(job.partition.split(",")) & ours
            if (job.state.base != "RUNNING" or not partitions
                    or job.submit_time is None or job.start_time is None
                    or job.start_time < self.started):
                continue
            if self._once((TIME_TO_RUNNING, job.job_id), job.start_time):
                found.append(Observation(TIME_TO_RUNNING, min(partitions),
                                         max(0.0, job.start_time - job.submit_time)))
        return found

    def _recoveries(self, events: Iterable[Mapping[str, object]], jobs: Mapping[int, Job],
                    node_set_of: Mapping[str, str], now: float) -> list[Observation]:
        running = {j.job_id: j.start_time for j in jobs.values()
                   if j.state.base == "RUNNING" and j.start_time is not None}
        for job_id, start in running.items():  # (previous run's start, this run's start)
            previous, current = self._runs.get(job_id, (None, start))
            self._runs[job_id] = (previous, start) if current == start else (current, start)
        # job -> (earliest interruption between its previous start and this one, node set)
        pending: dict[int, tuple[float, str]] = {}
        for event in events:
            when = _epoch(event.get("time"))
            ids = event.get("job_ids")
            if (event.get("action") not in INTERRUPTIONS or when is None
                    or not isinstance(ids, list) or now - when > self.forget_s):
                continue
            for job_id in (int(j) for j in ids):
                if job_id not in running:
                    continue
                previous, start = self._runs[job_id]
                if when <= start and (previous is None or when > previous) and (
                        job_id not in pending or pending[job_id][0] > when):
                    pending[job_id] = (when, node_set_of.get(str(event.get("node")), "unknown"))
        found = []
        for job_id, (when, node_set) in pending.items():
            start = running[job_id]
            if self._once((RECOVERY, job_id, start), now):
                found.append(Observation(RECOVERY, node_set, start - when))
        return found
