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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from slurm_spot.checkpoint.files import SaveCost
from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.lifecycle.weights import (
    PREWARM_WEIGHT,
    cooling_node_sets,
    current_weights,
    static_weights,
)
from slurm_spot.slurm.client import Job, Node, SlurmClient

log = logging.getLogger(__name__)

BLOCKING_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "RESERVED",
                             "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN", "POWERING_DOWN",
                             "INVALID", "PLANNED"})


def natural_order(name: str) -> tuple[str, int]:
    """Sort key of a node name in hostlist order: ``spot-2`` before ``spot-10`` (prefix, then
    the trailing number as an int; -1 when there is none)."""
    match = re.fullmatch(r"(.*?)(\d*)", name)
    assert match is not None
    return match.group(1), int(match.group(2)) if match.group(2) else -1


def is_up(node: Node) -> bool:
    """The node runs (slurmd registered, not powered down, not booting, responding) and is not
    being powered down: a replacement whose launch failed goes ``DOWN`` then, as the resume
    hook asks, ``idle%`` (POWERING_DOWN) on 22.05.8, which is not a node that is up."""
    flags = node.state.flags
    return (node.state.base in ("IDLE", "ALLOCATED", "MIXED", "COMPLETING")
            and not flags & {"POWERED_DOWN", "POWERING_UP", "NOT_RESPONDING"}
            and not node.state.is_powering_down)


def is_ready_replacement(node: Node) -> bool:
    """Up, idle, runs no job and may take one: a replacement that needs no power-up."""
    return (is_up(node) and node.state.base == "IDLE" and not node.jobs
            and not node.state.flags & BLOCKING_FLAGS)


def can_power_up(node: Node) -> bool:
    """Powered down (``idle~``), not drained, down or cooling down: ``POWER_UP`` will boot it.

    ``idle~*`` (NOT_RESPONDING) counts as ``idle~``: a powered-down node is never pinged, so
    the flag is only what an admin's ``state=RESUME`` of a ``down~`` node leaves (ending a
    cooldown, docs/admin.md), and slurmctld still allocates and boots such a node (seen on
    22.05.8: a job ran on it, the flag cleared at registration)."""
    return (node.state.base == "IDLE" and node.state.is_powered_down
            and not node.state.is_powering_up
            and not node.state.flags & (BLOCKING_FLAGS - {"NOT_RESPONDING"}))


def compatible_node_sets(config: SpotConfig, node_set: NodeSetConfig,
                         partitions: Collection[str] | None = None,
                         weights: Mapping[str, int] | None = None,
                         exclude: Collection[str] = ()) -> list[NodeSetConfig]:
    """Node sets whose nodes can run any job ``node_set``'s nodes can, in the order Slurm
    would try them (pure).

    Candidates are the node sets of ``partitions`` (the job's; None: every partition
    ``node_set`` is in), ``node_set`` itself included, that have at least its CPUs, memory and
    GPUs (same type) and all its features, and are not in ``exclude`` (node sets cooling down
    after a capacity error, or whose replacement just failed to launch). They are ordered by
    ``weights`` (node set -> the Weight Slurm has now, :func:`slurm_spot.lifecycle.weights.current_weights`;
    None: slurm.conf's), so the cost order of :mod:`slurm_spot.cost.order` holds; at equal
    Weight ``node_set`` first, then spot.yaml's order.
    """
    if partitions is None:
        partitions = [p.name for p in config.partitions if node_set.name in p.node_sets]
    wanted = set(partitions)
    names = {n for p in config.partitions if p.name in wanted for n in p.node_sets}
    weight = dict(weights) if weights is not None else static_weights(config)
    found = []
    for position, other in enumerate(config.node_sets):
        if other.name not in names or other.name in exclude:
            continue
        gpus_ok = node_set.gpus is None or (
            other.gpus is not None and other.gpus.type == node_set.gpus.type
            and other.gpus.count >= node_set.gpus.count)
        if (other.cpus >= node_set.cpus and other.memory_mib >= node_set.memory_mib and gpus_ok
                and set(node_set.features) <= set(other.features)):
            found.append((weight.get(other.name, other.weight), other.name != node_set.name,
                          position, other))
    return [ns for *_, ns in sorted(found, key=lambda f: f[:3])]


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
                        needed: int, partitions: Collection[str] | None = None,
                        now: datetime | None = None,
                        exclude_sets: Collection[str] = ()) -> Replacements:
    """Pick ``needed`` replacements for node ``noticed`` (pure).

    Candidates come from any node set of the job's ``partitions`` (None: those of the noticed
    node's set) that can run its job and has capacity: :func:`compatible_node_sets`, without
    node sets cooling down at ``now`` (aware UTC; default the current time;
    :func:`slurm_spot.lifecycle.weights.cooling_node_sets`) or in ``exclude_sets``, in the Weight order
    Slurm has now (read from ``nodes``: the cost order). Nodes already up and idle are taken
    first (nothing to boot), then powered-down nodes, both in that node set order, then name
    order (``spot-2`` before ``spot-10``). The noticed node itself, and nodes drained, down,
    failing, booting or powering down, are never chosen.

    Raises:
        BadInputError: ``noticed`` is in no node set.
    """
    node_set = config.node_set_of(noticed)
    if node_set is None:
        raise BadInputError(f"node {noticed!r} belongs to no node set of {config.source_path}")
    if needed <= 0:
        return Replacements()
    cooling = cooling_node_sets(config, nodes, now or datetime.now(timezone.utc))
    sets = compatible_node_sets(config, node_set, partitions, current_weights(config, nodes),
                                cooling | set(exclude_sets))
    order = {ns.name: i for i, ns in enumerate(sets)}

    def rank(node: Node) -> tuple[int, tuple[str, int]]:
        ns = config.node_set_of(node.name)
        return (order[ns.name] if ns else len(order), natural_order(node.name))

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
    from slurm_spot.jobs.node.prolog import checkpoint_dir

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
    """``{node: its node set's Weight}`` for replacements whose wait is over (pure).

    A node at :data:`PREWARM_WEIGHT` that is not its node set's Weight is a replacement; its
    wait is over once it runs a job, or is powered down, down or drained again (unused:
    SuspendTime powered it down). A replacement still booting, or up and idle, keeps the low
    weight so the requeued job finds it. Other weights (an admin's) are left. The Weight it
    gets back is the one its node set's other nodes have in ``nodes`` (the cost order of the
    moment, :func:`slurm_spot.lifecycle.weights.current_weights`), else slurm.conf's.
    """
    listed = list(nodes)
    weights = current_weights(config, listed)
    result = {}
    for node in listed:
        ns = config.node_set_of(node.name)
        if ns is None or node.weight is None or node.weight == weights[ns.name]:
            continue
        if node.weight != PREWARM_WEIGHT:
            continue
        waiting = not node.state.is_down and (node.state.is_powering_up
                                              or is_ready_replacement(node))
        if not waiting:
            result[node.name] = weights[ns.name]
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


#: How many times a notice's replacements are chosen again, from the next node set, after
#: the chosen ones failed to launch (no capacity there: the resume hook set them DOWN).
PREWARM_RETRIES = 2


@dataclass
class Prewarm:
    """One notice's replacements: power them up, tell when they are up, restore their weight.

    Args:
        config: the site config.
        slurm: the Slurm client (``scontrol`` to slurmctld).
        noticed: the node under notice.
        clock: epoch seconds (injectable for tests).
        partitions: the partitions of the node's jobs (squeue's ``partition``, each may be a
            comma list): replacements come from any of their node sets; None: those of the
            noticed node's set.
        retries: how many times replacements that failed to launch are chosen again from
            the node sets not tried yet (:data:`PREWARM_RETRIES`).
        on_retry: called with the failed nodes and the new choice after each retry (the
            watcher writes it as a ``prewarm`` event).
    """

    config: SpotConfig
    slurm: SlurmClient
    noticed: str
    clock: Callable[[], float]
    partitions: Collection[str] | None = None
    retries: int = PREWARM_RETRIES
    on_retry: Callable[[tuple[str, ...], Replacements], None] | None = None
    chosen: Replacements = field(default_factory=Replacements)
    requested_at: float = 0.0
    errors: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    failed_sets: set[str] = field(default_factory=set)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), timezone.utc)

    def _partitions(self) -> list[str] | None:
        found = sorted({p for item in self.partitions or () for p in item.split(",") if p})
        return found or None

    def start(self, jobs: int) -> Replacements:
        """Choose one replacement per job and power up those that are down (Weight 0 first,
        so a job requeued at once already prefers them). Failures are recorded, not raised."""
        try:
            nodes = self.slurm.nodes()
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return self.chosen
        self.chosen = choose_replacements(self.config, self.noticed, nodes, jobs,
                                          self._partitions(), self._now())
        self._power_up()
        return self.chosen

    def _power_up(self) -> None:
        self.requested_at = self.clock()
        if not self.chosen.power_up:
            return
        self.tried += [n for n in self.chosen.power_up if n not in self.tried]
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

    def status(self) -> str:
        """``"up"`` (every replacement is up, or none was booted), ``"failed"`` (none of the
        booting ones can come up: down, or powered down again 15 s after the request) or
        ``"booting"``. When every booting one failed and retries are left, replacements are
        chosen again from the other node sets (:meth:`retry`): ``"booting"`` then."""
        status = self._status()
        if status == "failed" and self.retries > 0 and self.retry():
            return "booting"
        return status

    def _status(self) -> str:
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
            elif node.state.is_down or node.state.flags & {"FAIL", "DRAIN"} \
                    or node.state.is_powering_down or (
                    late and node.state.is_powered_down and not node.state.is_powering_up):
                states.append("failed")
            else:
                states.append("booting")
        if "booting" in states:
            return "booting"
        return "up" if "up" in states else "failed"

    def retry(self) -> bool:
        """Choose the failed replacements again from node sets not tried yet (the cost order
        still holds; the failed node sets are cooling down or excluded) and power them up.
        Returns True when new ones are booting. Uses up one retry."""
        self.retries -= 1
        failed = self.chosen.power_up
        self.failed_sets |= {ns.name for n in failed
                             if (ns := self.config.node_set_of(n)) is not None}
        try:
            nodes = self.slurm.nodes()
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return False
        again = choose_replacements(self.config, self.noticed,
                                    [n for n in nodes if n.name not in self.chosen.nodes],
                                    len(failed), self._partitions(), self._now(),
                                    self.failed_sets)
        self.chosen = Replacements(self.chosen.ready + again.ready, again.power_up, again.short)
        self._power_up()
        if self.on_retry is not None:
            self.on_retry(failed, again)
        return bool(self.chosen.power_up)

    def restore(self) -> list[str]:
        """Restore the Weight of every replacement this notice powered up whose wait is over
        (or all of them when the power-up was refused): its node set's Weight of the moment."""
        if not self.tried:
            return []
        try:
            nodes = self.slurm.nodes()
        except SlurmCommandError as exc:
            self.errors.append(str(exc))
            return []
        mine = set(self.tried)
        return restore_weights(self.config, self.slurm,
                               [n for n in nodes if n.name in mine or n.weight != PREWARM_WEIGHT])
