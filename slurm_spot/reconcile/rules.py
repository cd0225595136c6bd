"""Pure decisions of the reconciler (docs/DESIGN.md flow 6): one Slurm node and the provider's
instances tagged with its name in, one :class:`NodeDecision` out. No I/O, no clock, no logging.

Instances: an alive instance behind a powered-down node is an orphan once older than
``orphan_grace_s`` (younger ones may still be booting); behind a ``down~`` node it is a leftover
and goes at once. Of several alive instances for one up node, :func:`pick_kept` keeps the one
Slurm knows. The transitions that carry out each verdict are in :mod:`slurm_spot.reconcile.reconciler`.

Reasons: only reasons slurm-spot wrote (``spot-interruption:``, ``(Code:``, ``slurm-spot:``)
and slurmctld's own power-saving reasons (``ResumeTimeout reached``, ``Not responding``) are
ever replaced or cleared; a node DOWN or DRAINed with any other reason belongs to an admin.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurm_spot.config import PowerConfig, ReconcileConfig
from slurm_spot.providers import pick_kept
from slurm_spot.providers.base import Instance, normalize_code
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.reasons import (
    BREAKER_PREFIX,
    KILL_TASK_FAILED,
    breaker_reason,
    cooldown_reason,
    interruption_reason,
    is_clearable,
    kill_task_failed_reason,
    lost_while_booting_reason,
    low_memory_of,
    low_memory_reason,
    parse_cooldown,
    parse_slurm_time,
    reason_code,
)


class Verdict(str, enum.Enum):
    """What the reconciler does with a node (the action table in reconcile.py)."""

    OK = "ok"  # consistent: nothing to do
    WAIT = "wait"  # booting, powering down, or its provider did not answer
    HANDS_OFF = "hands-off"  # DOWN/DRAIN by an admin, or a tripped circuit breaker
    RECLAIMED = "reclaimed"  # up, instance gone: DOWN + POWER_DOWN_FORCE, requeue, expedite
    BOOT_LOST = "boot-lost"  # powering up, its instance gone: same transitions
    RESUME_FAILED = "resume-failed"  # down~ (resume failed / timed out): back to idle~
    BREAKER = "breaker"  # down~ once too often: idle~ + DRAIN
    COOL = "cool"  # its node set just had a capacity failure: down~ until the cooldown ends
    COOLING = "cooling"  # cooldown still running
    REENABLE = "reenable"  # cooldown over: back to idle~
    UNDRAIN = "undrain"  # powered down but still drained with one of our reasons
    # idle~ flagged NOT_RESPONDING (an admin's RESUME of a down~ node), no instance: idle~
    CLEAR_NOT_RESPONDING = "clear-not-responding"
    # drained by slurmctld for an unkillable step, instance alive, no job running: replace it
    KILL_TASK_FAILED = "kill-task-failed"
    # drained by slurmctld for Low RealMemory, instance alive: powered down, stays drained
    LOW_REAL_MEMORY = "low-real-memory"


_RECONCILE, _POWER = ReconcileConfig(), PowerConfig()


@dataclass(frozen=True)
class Settings:
    """The knobs of the rules, in seconds (from ``reconcile:`` and ``power:`` of spot.yaml;
    :func:`~slurm_spot.reconcile.reconciler.settings_of`). The defaults are the config
    model's, read from it, never written twice."""

    orphan_grace_s: float = _RECONCILE.orphan_grace_s
    cooldown_s: float = _RECONCILE.cooldown_s
    max_resume_failures: int = _RECONCILE.max_resume_failures
    failure_window_s: float = _RECONCILE.failure_window_s
    resume_timeout_s: float = float(_POWER.resume_timeout_s)
    missing_grace_s: float = _RECONCILE.missing_grace_s
    quota_backoff_s: float = _RECONCILE.quota_backoff_s


@dataclass(frozen=True)
class History:
    """Facts from slurm-spot's own events (:mod:`slurm_spot.reconcile.history`).

    Attributes:
        failures: node -> resume failures in the failure window since its last breaker trip.
        new_quota: node set -> (code, time) of its newest quota failure that no backoff
            has covered yet (quota is regional: a back-off, never a capacity cooldown).
        new_capacity: node set -> (code, time) of its newest capacity failure that no cooldown
            has covered yet.
        capacity_codes: provider codes known to mean "no capacity" (normalized with
            :func:`~slurm_spot.providers.base.normalize_code`).
        handled_instances: dead instances the reconciler already acted on.
        interrupted_jobs: jobs requeued recently because of an interruption we handled.
        responding_tried: nodes whose NOT_RESPONDING flag the reconciler already tried to
            clear, with no event about the node since (Slurm 22.05 accepts ``state=IDLE`` on
            an ``idle~*`` node and keeps the flag: trying again every pass only repeats it).
    """

    failures: Mapping[str, int] = field(default_factory=dict)
    new_capacity: Mapping[str, tuple[str, datetime]] = field(default_factory=dict)
    new_quota: Mapping[str, tuple[str, datetime]] = field(default_factory=dict)
    capacity_codes: frozenset[str] = frozenset()
    handled_instances: frozenset[str] = frozenset()
    interrupted_jobs: frozenset[int] = frozenset()
    responding_tried: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Termination:
    """An instance to terminate: ``why`` is ``orphan``, ``duplicate`` or ``leftover``
    (alive behind a ``down~`` node); ``kept`` is, for a duplicate, the id of the instance
    kept for the same node (:func:`pick_kept`)."""

    instance: Instance
    why: str
    kept: str | None = None


@dataclass(frozen=True)
class NodeDecision:
    """The verdict on one node, what to write and what to terminate first.

    ``reason`` is the node reason to write ("" to write none); ``instance`` names the
    instance the verdict is about (for events), ``jobs`` the node's jobs.
    """

    node: str
    verdict: Verdict
    reason: str = ""
    terminate: tuple[Termination, ...] = ()
    instance: str | None = None
    jobs: tuple[int, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Cooldown:
    """A node set's cooldown: provider code, end (UTC), and whether it starts in this pass."""

    code: str
    until: datetime
    new: bool



def cooldowns(
    nodes: Sequence[Node], node_set_of: Mapping[str, str], history: History, now: datetime,
    cooldown_s: float, quota_backoff_s: float = 0.0,
) -> dict[str, Cooldown]:
    """Node set -> its cooldown: running ones read back from node reasons (Slurm is the
    record); new ones from capacity failures no cooldown covered yet, as events report them
    or as a ``down~`` node's ``(Code:<capacity code>)`` reason shows."""
    result: dict[str, Cooldown] = {}
    fresh = dict(history.new_capacity)
    for node in nodes:
        found = parse_cooldown(node.reason)
        set_name = node_set_of.get(node.name)
        if not set_name or not node.state.is_down:
            continue
        if found and found[1] > now:
            current = result.get(set_name)
            if current is None or found[1] > current.until:
                result[set_name] = Cooldown(found[0], found[1], new=False)
        code = reason_code(node.reason)
        if not found and code and normalize_code(code) in history.capacity_codes:
            fresh.setdefault(set_name, (code, now))
    starts = {s: (code, cooldown_s) for s, (code, _) in fresh.items() if cooldown_s > 0}
    for set_name, (code, _when) in history.new_quota.items():
        if quota_backoff_s > 0 and quota_backoff_s >= starts.get(set_name, ("", 0.0))[1]:
            starts[set_name] = (code, quota_backoff_s)  # the longer of the two wins
    for set_name, (code, seconds) in starts.items():
        if set_name not in result:
            result[set_name] = Cooldown(code, now + timedelta(seconds=seconds), new=True)
    return result


def classify_node(
    node: Node,
    instances: Sequence[Instance],
    now: datetime,
    settings: Settings,
    history: History,
    cooldown: Cooldown | None = None,
    missing_since: datetime | None = None,
) -> NodeDecision:
    """Decide what to do with one node (see :class:`Verdict` and the module docstring).

    A node is RECLAIMED only on the provider's evidence: its instance is listed as ended, or
    no instance of it has been listed (by listings that succeeded) since ``missing_since``,
    for at least ``settings.missing_grace_s``. An instance without a private IP (pending,
    eventually consistent) is matched by its node tag and counts as alive.

    RECLAIMED also covers a node still powering down whose job is stuck COMPLETING behind a
    dead instance (POWER_DOWN_FORCE issued after the instance died, e.g. by a late watcher).

    Args:
        node: the node as Slurm reports it.
        instances: every listed instance tagged with the node's name, alive or ended.
        now: the pass's time (aware UTC).
        settings: grace, cooldown, circuit-breaker settings.
        history: facts from the events file.
        cooldown: the node set's cooldown, running or starting now, if any.
    """
    state = node.state
    alive = [i for i in instances if i.state.is_alive]
    if state.is_powered_down:
        return _powered_down(node, alive, now, settings, history, cooldown)
    if state.is_powering_down and not (state.has_jobs and not alive):
        return NodeDecision(node.name, Verdict.WAIT, why="powering down")
    if state.is_powering_up:
        return _powering_up(node, instances, alive, now, settings, history)
    if alive and state.is_drained and not state.is_down and node.reason == KILL_TASK_FAILED:
        return _kill_task_failed(node, alive, now)
    low = low_memory_of(node.reason) if alive and state.is_drained else None
    if low is not None and not state.has_jobs:
        return NodeDecision(node.name, Verdict.LOW_REAL_MEMORY, low_memory_reason(*low),
                            instance=pick_kept(node, alive).instance_id, why=node.reason)
    if alive:
        return _up_and_alive(node, alive)
    if (state.is_down or state.is_drained) and not is_clearable(node.reason):
        return NodeDecision(node.name, Verdict.HANDS_OFF, why="admin reason; instance gone")
    if not instances and settings.missing_grace_s > 0 and (
            missing_since is None
            or (now - missing_since).total_seconds() < settings.missing_grace_s):
        return NodeDecision(node.name, Verdict.WAIT,
                            why="no instance listed yet; within missing_grace_s")
    dead = _newest(instances)
    return NodeDecision(
        node.name, Verdict.RECLAIMED, interruption_reason("reclaimed", now),
        instance=dead.instance_id if dead else None, jobs=node.jobs,
        why=dead.state_reason if dead else "no instance",
    )


def _newest(instances: Sequence[Instance]) -> Instance | None:
    return max(instances, key=lambda i: i.launch_time, default=None)


def _up_and_alive(node: Node, alive: list[Instance]) -> NodeDecision:
    if len(alive) == 1:
        return NodeDecision(node.name, Verdict.OK, instance=alive[0].instance_id)
    kept = pick_kept(node, alive)
    extra = tuple(Termination(i, "duplicate", kept=kept.instance_id)
                  for i in alive if i is not kept)
    return NodeDecision(node.name, Verdict.OK, terminate=extra, instance=kept.instance_id,
                        why=f"{len(alive)} instances; kept {kept.instance_id}")


def _kill_task_failed(node: Node, alive: list[Instance], now: datetime) -> NodeDecision:
    """Drained by slurmctld with reason ``Kill task failed`` (a step outlived
    UnkillableStepTimeout, slurm.conf(5) 22.05: the node is drained): its instance is
    replaced by a power down once no job runs there any more (a COMPLETING job is the
    unkillable one, POWER_DOWN_FORCE ends it); a job still running keeps it, as DRAIN means."""
    kept = pick_kept(node, alive) if len(alive) > 1 else alive[0]
    if node.state.base in ("ALLOCATED", "MIXED"):
        return NodeDecision(node.name, Verdict.WAIT, instance=kept.instance_id,
                            why="Kill task failed; jobs still running")
    return NodeDecision(node.name, Verdict.KILL_TASK_FAILED, kill_task_failed_reason(now),
                        instance=kept.instance_id, jobs=node.jobs, why=KILL_TASK_FAILED)


def _powering_up(
    node: Node, instances: Sequence[Instance], alive: list[Instance], now: datetime,
    settings: Settings, history: History,
) -> NodeDecision:
    """Booting. Lost if its newest instance is dead, belongs to this power-up (launched after
    the node's last BootTime, within ResumeTimeout) and was not handled before."""
    newest = _newest(instances)
    if alive or newest is None or newest.instance_id in history.handled_instances:
        return NodeDecision(node.name, Verdict.WAIT, why="booting")
    boot = parse_slurm_time(node.boot_time)
    recent = now - newest.launch_time <= timedelta(seconds=settings.resume_timeout_s)
    if not recent or (boot is not None and newest.launch_time <= boot):
        return NodeDecision(node.name, Verdict.WAIT, why="booting; no instance yet")
    if (node.state.is_down or node.state.is_drained) and not is_clearable(node.reason):
        return NodeDecision(node.name, Verdict.HANDS_OFF, why="admin reason; instance gone")
    reason = (interruption_reason("reclaimed", now) if newest.was_reclaimed
              else lost_while_booting_reason(now))
    return NodeDecision(node.name, Verdict.BOOT_LOST, reason, instance=newest.instance_id,
                        jobs=node.jobs, why=newest.state_reason or newest.state.value)


def _powered_down(
    node: Node, alive: list[Instance], now: datetime, settings: Settings, history: History,
    cooldown: Cooldown | None,
) -> NodeDecision:
    state = node.state
    leftovers = tuple(Termination(i, "leftover") for i in alive)
    if not (state.is_down or state.is_drained):
        orphans = tuple(Termination(i, "orphan") for i in alive
                        if i.age_s(now) > settings.orphan_grace_s)
        if cooldown is not None and is_clearable(node.reason):
            return _cool(node, cooldown, orphans)
        failures = history.failures.get(node.name, 0)
        if failures >= settings.max_resume_failures and is_clearable(node.reason):
            return _breaker(node, failures, orphans, settings)
        if not state.is_responding and not alive and is_clearable(node.reason) \
                and node.name not in history.responding_tried:
            return NodeDecision(node.name, Verdict.CLEAR_NOT_RESPONDING,
                                why=node.reason or "idle~ and NOT_RESPONDING, no instance")
        return NodeDecision(node.name, Verdict.OK, terminate=orphans)
    if not is_clearable(node.reason) or node.reason.startswith(BREAKER_PREFIX):
        orphans = tuple(Termination(i, "orphan") for i in alive
                        if i.age_s(now) > settings.orphan_grace_s)
        return NodeDecision(node.name, Verdict.HANDS_OFF, terminate=orphans,
                            why="admin reason or circuit breaker")
    running = parse_cooldown(node.reason)
    if running is not None:
        if running[1] > now:
            return NodeDecision(node.name, Verdict.COOLING, terminate=leftovers)
        return NodeDecision(node.name, Verdict.REENABLE, terminate=leftovers, why=node.reason)
    if not state.is_down:
        return NodeDecision(node.name, Verdict.UNDRAIN, terminate=leftovers, why=node.reason)
    if cooldown is not None:
        return _cool(node, cooldown, leftovers)
    return _resume_failed(node, leftovers, settings, history)


def _cool(node: Node, cooldown: Cooldown, terminate: tuple[Termination, ...]) -> NodeDecision:
    return NodeDecision(node.name, Verdict.COOL, cooldown_reason(cooldown.code, cooldown.until),
                        terminate=terminate, why=node.reason)


def _resume_failed(
    node: Node, leftovers: tuple[Termination, ...], settings: Settings, history: History
) -> NodeDecision:
    code = reason_code(node.reason)
    capacity = code is not None and normalize_code(code) in history.capacity_codes
    failures = history.failures.get(node.name, 0) + (0 if capacity else 1)
    if failures >= settings.max_resume_failures:
        return _breaker(node, failures, leftovers, settings)
    return NodeDecision(node.name, Verdict.RESUME_FAILED, terminate=leftovers,
                        why=node.reason or "down~ without a reason")


def _breaker(node: Node, failures: int, terminate: tuple[Termination, ...],
             settings: Settings) -> NodeDecision:
    reason = breaker_reason(failures, settings.failure_window_s, node.reason)
    return NodeDecision(node.name, Verdict.BREAKER, reason, terminate=terminate,
                        why=node.reason)


@dataclass(frozen=True)
class Plan:
    """Everything one pass decided: a decision per node, orphans without a (known) node, and
    jobs to expedite (requeued by an interruption we handled, still held by BeginTime).

    ``unlisted`` are alive instances of a node spot.yaml configures that Slurm's listing
    left out (a record it could not read, a listing cut short): they are left alone, never
    taken for orphans, since their node may be running a job."""

    nodes: tuple[NodeDecision, ...]
    orphans: tuple[Termination, ...] = ()
    expedite: tuple[int, ...] = ()
    cooldowns: Mapping[str, Cooldown] = field(default_factory=dict)
    unlisted: tuple[Instance, ...] = ()


def missing_since(
    nodes: Sequence[Node], instances: Sequence[Instance], node_set_of: Mapping[str, str],
    unavailable_sets: frozenset[str], now: datetime, before: Mapping[str, datetime],
) -> dict[str, datetime]:
    """Node -> since when it has been up (not powered down or powering up/down) while the
    listings, all successful for its node set, showed no instance of it at all (pure).

    A node whose provider listing failed keeps its earlier time, never gets a new one: a
    failed call is no evidence.
    """
    listed = {i.node for i in instances if i.node}
    result: dict[str, datetime] = {}
    for node in nodes:
        set_name = node_set_of.get(node.name)
        state = node.state
        if set_name is None or state.is_powered_down or state.is_powering_up \
                or state.is_powering_down:
            continue
        if set_name in unavailable_sets:
            if node.name in before:
                result[node.name] = before[node.name]
        elif node.name not in listed:
            result[node.name] = before.get(node.name, now)
    return result


def plan_pass(
    nodes: Sequence[Node],
    instances: Sequence[Instance],
    node_set_of: Mapping[str, str],
    now: datetime,
    settings: Settings,
    history: History,
    unavailable_sets: frozenset[str] = frozenset(),
    held_jobs: Sequence[int] = (),
    missing: Mapping[str, datetime] | None = None,
) -> Plan:
    """Classify every node of our node sets and every instance (pure).

    Args:
        nodes: Slurm's nodes (others than ours are ignored).
        instances: every instance of every provider that answered.
        node_set_of: node name -> node set name, for every configured node.
        now: the pass's time (aware UTC).
        settings, history: see :class:`Settings` and :class:`History`.
        unavailable_sets: node sets whose provider listing failed: their nodes WAIT.
        held_jobs: PENDING jobs with Reason=BeginTime (requeue delay).
        missing: node -> since when it has been up with no instance listed
            (:func:`missing_since`); absent: not yet seen so, no RECLAIMED on absence alone.
    """
    ours = [n for n in nodes if n.name in node_set_of]
    by_node: dict[str, list[Instance]] = {}
    for inst in instances:
        by_node.setdefault(inst.node or "", []).append(inst)
    cools = cooldowns(ours, node_set_of, history, now, settings.cooldown_s,
                      settings.quota_backoff_s)
    decisions = []
    for node in ours:
        set_name = node_set_of[node.name]
        if set_name in unavailable_sets:
            decisions.append(NodeDecision(node.name, Verdict.WAIT, why="provider unavailable"))
            continue
        decisions.append(classify_node(node, by_node.get(node.name, ()), now, settings,
                                       history, cools.get(set_name),
                                       (missing or {}).get(node.name)))
    known = {n.name for n in ours}
    # An instance is an orphan only when its node is none spot.yaml configures: a configured
    # node missing from Slurm's listing is a listing that failed to say, not a node that is gone.
    orphans = tuple(
        Termination(i, "orphan") for i in instances
        if i.state.is_alive and (i.node or "") not in node_set_of
        and i.age_s(now) > settings.orphan_grace_s
    )
    unlisted = tuple(i for i in instances
                     if i.state.is_alive and i.node in node_set_of and i.node not in known)
    expedite = tuple(j for j in held_jobs if j in history.interrupted_jobs)
    return Plan(tuple(decisions), orphans, expedite, cools, unlisted)
