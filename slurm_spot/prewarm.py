"""Boot hidden behind the notice (docs/DESIGN.md flow 3): on an interruption notice, power up a
replacement node for each job on the node at once, let the jobs train on while it boots, and
signal each job when the replacement is up or, at the latest, when its own checkpoint time
says so.

**Where this runs, and why.** In the node-side watcher (``slurm-spot watch``, :mod:`.watch`):
it sees the notice within seconds, where a reconciler pass (every 30-60 s) would use up a
30 s notice before acting. The watcher acts only through ``scontrol``: ``state=POWER_UP``
makes slurmctld run ResumeProgram *on the controller* (scontrol(1), Slurm 22.05 to 26.05), so
the cloud API call and its credentials stay there and the replacement goes through the normal
resume path (addresses, launch-failure handling). The reconciler only restores what a watcher
could not (it dies with its node): :func:`weights_to_restore`.

**How the requeued job is steered to the replacement.** Chosen for Slurm 22.05 through 26.05
because it uses only what every one of them has: ``scontrol update nodename=N state=POWER_UP``
and ``weight=W`` (both in scontrol(1) of 22.05; later versions add ``scontrol power up`` beside
them) and the scheduler's own order. The man page text quoted below is
22.05.8's (Debian 12), where this was run; 24.11 and 26.05 were not re-run with prewarm here.

- slurm.conf(5), Weight, NOTE: "Node weights are first considered among currently available
  nodes. For example, a POWERED_DOWN node with a lower weight will not be evaluated before an
  IDLE node." Once the replacement is up, slurmctld prefers it (and the job's surviving nodes)
  over every powered-down node by itself, and a job allocated to nodes that are up starts at
  once (no power-up, no wait for slurmctld's periodic 30 s check of docs/local-slurm.md).
  That is why the job is signalled when its replacement is up.
- A temporary ``Weight=0`` (:data:`PREWARM_WEIGHT`; ``scontrol update nodename=N weight=0``,
  scontrol(1)) ranks the replacement first among the nodes that are *not* up yet: a job
  signalled at its deadline while the replacement still boots gets the booting replacement, not
  a cold powered-down node. The configured weight comes back when the requeued job has its
  allocation (the watcher), else when the replacement is allocated or powered down again (the
  reconciler, :func:`weights_to_restore`); slurmctld's own restart or ``scontrol reconfigure``
  also restores slurm.conf's weights (scontrol(1), Weight).
- Not chosen: ``ReqNodeList`` on the pending job (sticky: the job would wait for ever for a
  replacement that failed to launch), a reservation (outlives a dead watcher and blocks other
  users' jobs), node features (changing them at run time differs between versions).

An unused replacement is powered down by SuspendTime like any idle node.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_spot.checkpoint.files import SaveCost
from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.slurm.client import Job, Node, SlurmClient

log = logging.getLogger(__name__)

#: The Weight a replacement has while it waits for its job (the lowest Slurm accepts).
PREWARM_WEIGHT = 0
_BLOCKING_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "RESERVED",
                             "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN", "POWERING_DOWN",
                             "INVALID", "PLANNED"})


def _natural(name: str) -> tuple[str, int]:
    match = re.fullmatch(r"(.*?)(\d*)", name)
    assert match is not None
    return match.group(1), int(match.group(2)) if match.group(2) else -1


def is_up(node: Node) -> bool:
    """The node runs (slurmd registered, not powered down, not booting, responding)."""
    flags = node.state.flags
    return (node.state.base in ("IDLE", "ALLOCATED", "MIXED", "COMPLETING")
            and not flags & {"POWERED_DOWN", "POWERING_UP", "NOT_RESPONDING"})


def is_ready_replacement(node: Node) -> bool:
    """Up, idle, runs no job and may take one: a replacement that needs no power-up."""
    return (is_up(node) and node.state.base == "IDLE" and not node.jobs
            and not node.state.flags & _BLOCKING_FLAGS)


def can_power_up(node: Node) -> bool:
    """Powered down (``idle~``), not drained, down or cooling down: ``POWER_UP`` will boot it."""
    return (node.state.base == "IDLE" and node.state.is_powered_down
            and not node.state.is_powering_up and not node.state.flags & _BLOCKING_FLAGS)


def compatible_node_sets(config: SpotConfig, node_set: NodeSetConfig) -> list[NodeSetConfig]:
    """Node sets whose nodes can run any job ``node_set``'s nodes can: ``node_set`` itself
    first, then the others that share a partition with it and have at least its CPUs, memory
    and GPUs (same type), and all its features; by Weight, then config order."""
    partitions = [p for p in config.partitions if node_set.name in p.node_sets]
    names = {n for p in partitions for n in p.node_sets} - {node_set.name}
    others = []
    for other in config.node_sets:
        if other.name not in names:
            continue
        gpus_ok = node_set.gpus is None or (
            other.gpus is not None and other.gpus.type == node_set.gpus.type
            and other.gpus.count >= node_set.gpus.count)
        if (other.cpus >= node_set.cpus and other.memory_mib >= node_set.memory_mib and gpus_ok
                and set(node_set.features) <= set(other.features)):
            others.append(other)
    others.sort(key=lambda ns: ns.weight)
    return [node_set, *others]


@dataclass(frozen=True)
class Replacements:
    """Which nodes stand in for the node under notice.

    Attributes:
        ready: nodes already up and idle (no power-up needed).
        power_up: powered-down nodes to power up now, best first.
        short: how many replacements could not be found (0 when all were).
    """

    ready: tuple[str, ...] = ()
    power_up: tuple[str, ...] = ()
    short: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.ready + self.power_up


def choose_replacements(config: SpotConfig, noticed: str, nodes: Sequence[Node],
                        needed: int) -> Replacements:
    """Pick ``needed`` replacements for node ``noticed`` (pure).

    Candidates come from :func:`compatible_node_sets` of the noticed node's set (its own set
    first). Nodes already up and idle are taken first (nothing to boot), then powered-down
    nodes in set order, lowest configured Weight, then name order (``spot-2`` before
    ``spot-10``). The noticed node itself, and nodes drained, down, failing, booting or powering
    down, are never chosen.

    Raises:
        BadInputError: ``noticed`` is in no node set.
    """
    node_set = config.node_set_of(noticed)
    if node_set is None:
        raise BadInputError(f"node {noticed!r} belongs to no node set of {config.source_path}")
    if needed <= 0:
        return Replacements()
    order = {ns.name: i for i, ns in enumerate(compatible_node_sets(config, node_set))}

    def rank(node: Node) -> tuple[int, tuple[str, int]]:
        ns = config.node_set_of(node.name)
        return (order[ns.name] if ns else len(order), _natural(node.name))

    usable = [n for n in nodes if n.name != noticed
              and (ns := config.node_set_of(n.name)) is not None and ns.name in order]
    ready = sorted((n for n in usable if is_ready_replacement(n)), key=rank)[:needed]
    cold = sorted((n for n in usable if can_power_up(n)), key=rank)[:needed - len(ready)]
    return Replacements(tuple(n.name for n in ready), tuple(n.name for n in cold),
                        needed - len(ready) - len(cold))


def latest_signal_time(deadline_s: float, margin_s: float, cost: SaveCost,
                       default_checkpoint_s: float, signal_margin_s: float) -> float:
    """The latest moment (epoch seconds) to signal a job on a node whose instance goes away at
    ``deadline_s`` and is powered down ``margin_s`` before it (pure).

    The job needs, after the signal, up to one more training step (``cost.step_s``, 0 when
    unknown) and one save (``cost.save_s``, else ``default_checkpoint_s``), plus
    ``signal_margin_s`` for exiting and the requeue::

        deadline - margin - signal_margin - save - step
    """
    save = cost.save_s if cost.save_s is not None else default_checkpoint_s
    return deadline_s - margin_s - signal_margin_s - save - (cost.step_s or 0.0)


def job_checkpoint_dir(config: SpotConfig, job: Job) -> Path | None:
    """The job's checkpoint directory as the Prolog makes it (``<root>/<user>/<key>``), or
    None when the job's user or id cannot name one, or its checkpoints are in S3 (the node
    does not read the bucket: the default checkpoint time applies)."""
    from slurm_spot.jobs.prolog import checkpoint_dir

    env = {"SLURM_JOB_USER": job.user, "SLURM_JOB_ID": str(job.job_id)}
    if job.array_job_id is not None and job.array_task_id is not None:
        env |= {"SLURM_ARRAY_JOB_ID": str(job.array_job_id),
                "SLURM_ARRAY_TASK_ID": str(job.array_task_id)}
    try:
        found = checkpoint_dir(config, env)
    except BadInputError:
        return None
    return found if isinstance(found, Path) else None


def weights_to_restore(config: SpotConfig, nodes: Iterable[Node]) -> dict[str, int]:
    """``{node: configured weight}`` for replacements whose wait is over (pure).

    A node at :data:`PREWARM_WEIGHT` that is not its node set's configured Weight is a
    replacement; its wait is over once it runs a job, or is powered down, down or drained
    again (unused: SuspendTime powered it down). A replacement still booting, or up and idle,
    keeps the low weight so the requeued job finds it. Other weights (an admin's) are left.
    """
    result = {}
    for node in nodes:
        ns = config.node_set_of(node.name)
        if ns is None or node.weight is None or node.weight == ns.weight:
            continue
        if node.weight != PREWARM_WEIGHT:
            continue
        waiting = node.state.is_powering_up or is_ready_replacement(node)
        if not waiting:
            result[node.name] = ns.weight
    return result


def restore_weights(config: SpotConfig, slurm: SlurmClient, nodes: Iterable[Node]) -> list[str]:
    """Apply :func:`weights_to_restore`; one node's failure does not stop the others.
    Returns the nodes restored."""
    done = []
    for name, weight in sorted(weights_to_restore(config, nodes).items()):
        try:
            slurm.set_weight([name], weight)
        except SlurmCommandError as exc:
            log.error("could not restore the weight of %s: %s", name, exc)
            continue
        done.append(name)
    return done


@dataclass
class Prewarm:
    """One notice's replacements: power them up, tell when they are up, restore their weight.

    Args:
        config: the site config.
        slurm: the Slurm client (``scontrol`` to slurmctld).
        noticed: the node under notice.
        clock: epoch seconds (injectable for tests).
    """

    config: SpotConfig
    slurm: SlurmClient
    noticed: str
    clock: Callable[[], float]
    chosen: Replacements = field(default_factory=Replacements)
    requested_at: float = 0.0
    errors: list[str] = field(default_factory=list)

    def start(self, jobs: int) -> Replacements:
        """Choose one replacement per job and power up those that are down (Weight 0 first,
        so a job requeued at once already prefers them). Failures are recorded, not raised."""
        try:
            nodes = self.slurm.nodes()
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return self.chosen
        self.chosen = choose_replacements(self.config, self.noticed, nodes, jobs)
        self.requested_at = self.clock()
        if self.chosen.power_up:
            try:
                self.slurm.set_weight(self.chosen.power_up, PREWARM_WEIGHT)
            except SlurmCommandError as exc:
                self.errors.append(str(exc))
            try:
                self.slurm.power_up(self.chosen.power_up)
            except SlurmCommandError as exc:
                self.errors.append(str(exc))
                self.restore()
                self.chosen = Replacements(self.chosen.ready, (), self.chosen.short
                                           + len(self.chosen.power_up))
        return self.chosen

    def status(self) -> str:
        """``"up"`` (every replacement is up, or none was booted), ``"failed"`` (none of the
        booting ones can come up: down, or powered down again 15 s after the request) or
        ``"booting"``."""
        if not self.chosen.power_up:
            return "up"
        try:
            nodes = self.slurm.nodes(self.chosen.power_up, with_jobs=False)
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return "booting"
        late = self.clock() - self.requested_at > 15
        states = []
        for node in nodes:
            if is_up(node):
                states.append("up")
            elif node.state.is_down or node.state.flags & {"FAIL", "DRAIN"} or (
                    late and node.state.is_powered_down and not node.state.is_powering_up):
                states.append("failed")
            else:
                states.append("booting")
        if "booting" in states:
            return "booting"
        return "up" if "up" in states else "failed"

    def restore(self) -> list[str]:
        """Restore the configured weight of replacements whose wait is over (or all of them
        when the power-up was refused)."""
        if not self.chosen.power_up:
            return []
        try:
            nodes = self.slurm.nodes(self.chosen.power_up)
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return []
        return restore_weights(self.config, self.slurm, nodes)
