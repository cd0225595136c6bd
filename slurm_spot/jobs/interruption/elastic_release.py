"""Releasing one node from an elastic job, so the job goes on with its other nodes.

An *elastic* job (``slurm-spot sbatch --torchrun --elastic``) runs one job step per node and
is submitted ``--no-kill``; its batch script carries
:data:`~slurm_spot.contract.names.ELASTIC_MARK`. When one of its nodes goes, the job must lose
that node only, never be requeued. Two callers:

- the watcher (:mod:`slurm_spot.lifecycle.watch`), with notice: once the node's ranks saved and left
  (no step of the job is left on the node), it shrinks the job to its other nodes;
- the reconciler (:mod:`slurm_spot.reconcile.reconciler`), without notice: it sets the dead
  node DOWN first, which for a ``--no-kill`` job removes the node from the job and ends the
  job's steps there at once (sbatch(1) 22.05, ``--no-kill``: "Do not automatically terminate a
  job if one of the nodes it has been allocated fails. [...] The job will assume all
  responsibilities for fault-tolerance"), instead of waiting SlurmdTimeout for the dead
  slurmd; then it releases the node here in case Slurm kept it in the job's node list.

Both record the release as a ``released`` event with :data:`RELEASE_REASON` and
``extra.remaining`` (the job's nodes after the release).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from slurm_spot.contract.names import ELASTIC_MARK
from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import compress, expand
from slurm_spot.slurm.client import SlurmClient

#: The ``reason`` of every ``released`` event.
RELEASE_REASON = "elastic job goes on without this node"


def field_value(line: str, name: str) -> str:
    """``NAME=value`` from one ``scontrol -o`` line ("" when absent)."""
    for word in line.split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return ""


class ElasticJobs:
    """Which jobs are elastic: read once per job from its batch script
    (:meth:`SlurmClient.batch_script`; a job without one, or one Slurm will not show, is not).

    Raises (from :meth:`is_elastic`):
        SlurmCommandError: scontrol could not be run.
    """

    def __init__(self, slurm: SlurmClient, het_components: bool = False) -> None:
        self.slurm = slurm
        #: also recognise a heterogeneous job's worker component (one more ``scontrol show job``
        #: per job): the watcher's case; the reconciler's lost node without notice ends a whole
        #: heterogeneous job in Slurm 22.05 (docs/ml-engineer.md), so it reads scripts only
        self.het_components = het_components
        self._known: dict[int, bool] = {}

    def is_elastic(self, job: int) -> bool:
        """True if ``job``'s batch script carries :data:`ELASTIC_MARK`: its own, or (with
        ``het_components``) for a component of a heterogeneous job (``slurm-spot sbatch
        --coordinator-partition``) the leader's (``HetJobId``; a component's own script is a
        stub of its directives)."""
        if job not in self._known:
            leader = job
            if self.het_components:
                record = self.slurm.job_record(job)
                leader = record.het_job_id if record is not None and record.het_job_id else job
            script = self.slurm.batch_script(leader)
            self._known[job] = bool(script) and ELASTIC_MARK in (script or "")
        return self._known[job]


def steps_on(slurm: SlurmClient, job: int, node: str) -> bool:
    """True if a step of ``job`` other than ``batch``/``extern`` still runs on ``node``
    (``scontrol -o show step <job>``, NodeList of each step).

    Raises:
        ValueError: a step's NodeList is not a hostlist.
    """
    steps = slurm.run("scontrol", "-o", "show", "step", str(job), check=False).stdout
    return any(node in expand(field_value(line, "NodeList"))
               for line in steps.splitlines() if line.startswith("StepId=")
               and not line.split()[0].endswith((".batch", ".extern")))


def release_node(slurm: SlurmClient, job: int, node: str, *, after_steps: bool) -> str | None:
    """Release ``node`` from the running elastic ``job``: ``scontrol update JobId=<job>
    NodeList=<its other nodes>`` (scontrol(1) 22.05: "Change the nodes allocated to a running
    job to shrink its size"), unless Slurm already took the node out of the job.

    Args:
        slurm: the Slurm client.
        job: an elastic job (see :class:`ElasticJobs`; not checked here).
        node: the node that goes.
        after_steps: release only once no step of the job is left on ``node`` (the watcher:
            its ranks are still saving); False releases at once (the node is dead).

    Returns:
        The job's nodes after the release (a hostlist), or None when the job does not go on
        without ``node``: Slurm no longer knows it, it holds no node (requeued, ended), its
        batch script runs on ``node`` (that is the fallback to requeue), ``node`` would be its
        last node, or (``after_steps``) a step still runs there.

    Raises:
        SlurmCommandError: scontrol could not read or update the job.
        ValueError: a NodeList is not a hostlist.
    """
    record = slurm.job_record(job)
    if record is None or not record.state.is_active or record.batch_host == node:
        return None
    nodes = expand(record.nodes) if record.nodes and record.nodes != "(null)" else []
    remaining = [n for n in nodes if n != node]
    if not remaining:
        return None
    if after_steps and steps_on(slurm, job, node):
        return None
    if len(remaining) < len(nodes):
        slurm.run("scontrol", "update", f"JobId={job}", f"NodeList={compress(remaining)}")
    return compress(remaining)


def release_elastic(elastic: ElasticJobs, jobs: Iterable[int], node: str, errors: list[str], *,
                    after_steps: bool) -> Iterator[tuple[int, str | None]]:
    """``(job, remaining)`` for each elastic one of ``jobs``, ``node`` released from it as
    :func:`release_node` does (``remaining``: its nodes after, None when it does not go on
    without ``node``); jobs that are not elastic are passed over. ``jobs`` is read lazily,
    one job per step of the iteration.

    A job whose batch script or record cannot be read or updated is passed over too, with one
    line in ``errors`` (``<node>: releasing it from job <job>: <why>``): this raises nothing
    of Slurm's (:class:`SlurmCommandError`) and no bad hostlist (:class:`ValueError`).
    """
    for job in jobs:
        try:
            if not elastic.is_elastic(job):
                continue
            remaining = release_node(elastic.slurm, job, node, after_steps=after_steps)
        except (SlurmCommandError, ValueError) as exc:
            errors.append(f"{node}: releasing it from job {job}: {exc}")
            continue
        yield job, remaining
