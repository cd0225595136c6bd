"""Failover in seconds (issue 24, part 1): a job whose nodes got no capacity runs on another
node set of its partition at once, instead of after Slurm's requeue hold.

When the resume hook cannot launch a node for lack of capacity (any provider's capacity or
quota class: EC2 InsufficientInstanceCapacity, GCE ZONE_RESOURCE_POOL_EXHAUSTED, the local
provider's limit), it sets the node DOWN (:func:`slurm_spot.lifecycle.power.mark_launch_failed`) and
slurmctld requeues the node's batch job. A requeued job then waits out Slurm's requeue hold
(``BeginTime``, about 121 s on 22.05: job_mgr.c sets ``begin_time = now + 120`` plus a pass)
before the scheduler looks at it again; nothing cleared that hold after a launch failure, so
a job reached the next node set 211 s after it was submitted. Here, in the hook's detached
worker, right after the nodes are marked:

1. **The node set is cooled down at once** (:func:`cooldown_targets`): every other node of
   the failed node set that is powered down and free (``idle~``, no admin reason) is set
   ``DOWN`` with ``(Code:<code>)Temporarily disabled until <T>`` (``reconcile.cooldown_s``),
   the reason the reconciler writes and reads back (:mod:`slurm_spot.slurm.reasons`), so
   the scheduler skips the whole node set while the cooldown lasts and the reconciler ends it
   (``cooldown_end``). Without this the requeued job would land on the next ``idle~`` node of
   the same cheap node set (lowest Weight) and fail again.
2. **The hold is cleared as soon as the job is requeued**: the worker polls the jobs of the
   failed nodes (``squeue --json``, every :data:`POLL_S` s for up to :data:`REQUEUE_WAIT_S`)
   and sends ``scontrol update jobid=<ids> StartTime=now``
   (:meth:`~slurm_spot.slurm.actions.SlurmActions.expedite_many`) as soon as each one is
   PENDING. Which job to wait for and when to act is :func:`hold_step` (pure).
3. **Where it went and why** is written once the job runs again (or the wait ends): a
   ``failover`` event at the expedite, a ``failover_started`` event naming the node set and
   nodes it started on, and one AdminComment note on the job.

Why the hook's worker and not the hook itself or the reconciler: the hook process must return
to slurmctld at once (and Slurm 23.02+ kills its process group at ResumeTimeout), and at the
instant the nodes are marked DOWN the job may still be CONFIGURING: slurmctld requeues it
during or just after the update, so one ``StartTime=now`` sent at once can reach a job that is
not pending yet and change nothing. The reconciler's next pass comes every
``reconcile.interval_s`` (30-60 s on a real site), which alone misses the 30 s target. The
worker is already detached (own session, :func:`slurm_spot.hooks.detach`), so it can afford to
wait for the requeue: the job is pending within a second or two of the DOWN, and the hold is
cleared within :data:`POLL_S` of that. A job the worker gave up on is still expedited by the
reconciler's safety net: the ``failover`` event names it, and the reconciler expedites the
jobs of such events that still pend on ``BeginTime``.

A failover is not a failure of the job: the job is requeued (its restart count goes up by
one), never cancelled or FAILED, and the launch failure counts against the node set's
capacity (cooldown), not the node's circuit breaker (capacity codes are excluded there).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from slurm_spot import events
from slurm_spot.config import SpotConfig
from slurm_spot.errors import SlurmCommandError
from slurm_spot.hostlist import expand
from slurm_spot.lifecycle.power import PowerResult
from slurm_spot.providers.base import ErrorClass, LaunchFailure
from slurm_spot.slurm.client import Job, Node, SlurmClient
from slurm_spot.slurm.reasons import cooldown_reason, is_clearable, parse_cooldown, utc_stamp

log = logging.getLogger(__name__)

#: How long the worker waits for slurmctld to requeue a job of a failed node (seconds). A
#: requeue after DOWN takes well under a second on 22.05; the rest is margin for a busy
#: controller: slurmctld 22.05 was seen answering nothing for 10 s per failed node while it
#: failed to resolve their names (a 2-node job: 20 s, and the job then waited out the whole
#: requeue hold). The worker is detached: the wait delays no hook. Later ones are left to
#: the reconciler's safety net.
REQUEUE_WAIT_S = 60.0
#: How long, after the hold is cleared, the worker waits to see where the job started, for
#: the event and AdminComment (seconds). It only delays the note, never the job.
START_WAIT_S = 60.0
#: Polling interval of both waits (seconds): the hold is cleared at most this long after the
#: requeue.
POLL_S = 0.5
#: How long an expedited job may show ``Reason=Cleaning`` before its failed nodes are set DOWN
#: again, and how often that is repeated while it lasts (seconds). slurmctld 22.05 requeues a
#: job whose node is set DOWN while its PrologSlurmctld still runs (a busy controller starts
#: that program seconds late) as PENDING, Reason=Cleaning, and keeps the failed node in the
#: job's completing set after the program ends: no epilog comes from a node that never
#: booted, so the job waits for the next DOWN of that node (the reconciler's cooldown, a pass
#: or more later), not for the cleared hold. A fresh-clone CI run: 16.7 s from the error to
#: the allocation; a PrologSlurmctld made 4 s slow here: 12-17 s. Setting the node DOWN again
#: takes it out of the job's completing set (slurmctld's ``update_node``) and the job is
#: scheduled within a second.
CLEANING_NUDGE_S = 1.0
#: Error classes that mean "no capacity here, try elsewhere" (providers' error tables).
FAILOVER_CLASSES = frozenset({ErrorClass.CAPACITY, ErrorClass.QUOTA})


@dataclass(frozen=True)
class NodeSetCooldown:
    """The cooldown one failed node set gets: provider ``code``, its end ``until`` (aware
    UTC), the node ``reason`` written, and the ``nodes`` to set DOWN with it now."""

    node_set: str
    code: str
    until: datetime
    reason: str
    nodes: tuple[str, ...]


@dataclass
class Failover:
    """One job moved off a node set without capacity.

    Attributes:
        job_id: the job.
        from_node_set: the node set that had no capacity; code: the provider's code.
        candidates: the other node sets of the job's partitions, not cooling down, in the
            Weight order Slurm has now (where Slurm may start it).
        cooldown_until: end of the failed node set's cooldown (aware UTC), None if none.
        error_at: when the capacity error was recorded (``time.time()`` seconds).
        expedited_at, started_at: when the hold was cleared / the job was seen started
            (``time.time()`` seconds), None until then.
        node_set, nodes: where it started (None/() until it has).
        restarts: the job's restart count when it was requeued.
        failed_nodes: the job's nodes that got no capacity (set DOWN by the resume hook).
    """

    job_id: int
    from_node_set: str
    code: str
    candidates: tuple[str, ...]
    cooldown_until: datetime | None
    error_at: float
    expedited_at: float | None = None
    started_at: float | None = None
    node_set: str | None = None
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    failed_nodes: tuple[str, ...] = ()


class HoldStep(str, enum.Enum):
    """What to do about one requeued job now (:func:`hold_step`)."""

    WAIT = "wait"  # not requeued yet (still CONFIGURING/RUNNING on the failed node)
    EXPEDITE = "expedite"  # PENDING behind the requeue hold: StartTime=now
    LEAVE = "leave"  # held by a user or admin (StartTime=now would not release it)
    GONE = "gone"  # ended or unknown to slurmctld: nothing to do


def hold_step(job: Job | None, failed_nodes: Sequence[str]) -> HoldStep:
    """The next step for a job of nodes that just failed to launch (pure).

    ``job`` as ``squeue --json`` shows it (None: slurmctld no longer lists it). A PENDING job
    was requeued: clear its hold, unless a user or admin holds it (``JobHeldUser``,
    ``JobHeldAdmin``, squeue(1) JOB REASON CODES, 22.05: the quota check of the resume hook
    holds a job that can never fit), which only ``scontrol release`` moves. A job still
    active on one of ``failed_nodes`` is not requeued yet: wait. A job active elsewhere
    (requeued and started again already) or finished is left alone.
    """
    if job is None or job.state.is_finished:
        return HoldStep.GONE
    if job.state.is_pending:
        return HoldStep.LEAVE if job.reason.startswith("JobHeld") else HoldStep.EXPEDITE
    running_on = set(expand(job.nodes)) if job.nodes else set()
    return HoldStep.WAIT if running_on & set(failed_nodes) or not running_on else HoldStep.GONE


def stuck_cleaning(job: Job | None) -> bool:
    """True when ``job`` (``squeue --json``) is requeued and pending with ``Reason=Cleaning``
    (squeue(1) JOB REASON CODES, 22.05: "The job is being requeued and still cleaning up
    from its previous execution"): slurmctld does not schedule it until its last run's
    nodes are released (see :data:`CLEANING_NUDGE_S`)."""
    return job is not None and job.state.is_pending and job.reason == "Cleaning"


def nodes_to_set_down_again(move: Failover, nodes: Sequence[Node],
                            reasons: Mapping[str, str]) -> list[tuple[str, str]]:
    """The failed nodes of ``move`` to set DOWN again so that slurmctld releases them from
    the job's last run (pure), as (node, reason).

    A failed node qualifies while it is still out of service: DOWN, or powering down or
    powered down (slurmctld 22.05 turns the hook's DOWN into ``IDLE+POWERING_DOWN`` as it
    powers the node down), never powering up or allocated again, and its reason is one the
    reconciler may replace (:func:`~slurm_spot.slurm.reasons.is_clearable`; an admin's is
    left alone). The reason written is the node set's cooldown reason from ``reasons``
    (node set -> reason: what the reconciler's next pass writes there anyway), else the
    node's own reason (the hook's ``(Code:X)...``, which the reconciler clears like the
    first); a node with neither is skipped (Slurm requires a reason for DOWN).

    Args:
        nodes: the failed nodes as ``scontrol show node`` reads them now.
        reasons: node set name -> the cooldown reason written at the failover.
    """
    failed = set(move.failed_nodes)
    found = []
    for node in nodes:
        state = node.state
        out = state.is_down or state.is_powered_down or state.is_powering_down
        if (node.name not in failed or not out or state.is_powering_up
                or state.base not in ("DOWN", "IDLE") or not is_clearable(node.reason)):
            continue
        reason = reasons.get(move.from_node_set) or node.reason
        if reason:
            found.append((node.name, reason))
    return found


def failover_failures(result: PowerResult) -> list[LaunchFailure]:
    """The launch failures of a resume that a failover answers: capacity or quota classes
    (:data:`FAILOVER_CLASSES`)."""
    return [f for f in result.failed if f.error_class in FAILOVER_CLASSES]


def cooldown_seconds(config: SpotConfig, failure: LaunchFailure) -> float:
    """How long a node set is skipped after ``failure`` (seconds; 0: not at all): a capacity
    error ``reconcile.cooldown_s``; a quota error (regional: the pool next door will not help
    either) the longer of that and ``reconcile.quota_backoff_s``, the rule the reconciler
    applies to the quota failures it finds itself (:func:`slurm_spot.reconcile.rules.
    cooldowns`), which reads this cooldown back from the node reasons and keeps it."""
    seconds = config.reconcile.cooldown_s
    if failure.error_class is ErrorClass.QUOTA:
        seconds = max(seconds, config.reconcile.quota_backoff_s)
    return seconds


def cooldown_targets(config: SpotConfig, failures: Sequence[LaunchFailure],
                     nodes: Sequence[Node], now: datetime) -> list[NodeSetCooldown]:
    """The cooldown of each node set in ``failures`` (pure): its end is ``now`` +
    :func:`cooldown_seconds` of the failure (or a cooldown already running there, if it ends
    later, read back from node reasons); its nodes to set DOWN now are the set's other nodes
    that are powered down and free: not failed just now, not DOWN or drained, no job, and no
    reason but one the reconciler may replace
    (:func:`~slurm_spot.slurm.reasons.is_clearable`). A node set whose failures all have
    0 seconds (cooldowns and quota back-offs turned off) gets nothing."""
    by_set: dict[str, LaunchFailure] = {}
    failed: set[str] = set()
    for failure in failures:
        failed.update(failure.nodes)
        node_set = config.node_set_of(failure.nodes[0]) if failure.nodes else None
        if node_set is None:
            continue
        known = by_set.get(node_set.name)
        if known is None or cooldown_seconds(config, failure) > cooldown_seconds(config, known):
            by_set[node_set.name] = failure
    found = []
    for set_name, failure in sorted(by_set.items()):
        seconds = cooldown_seconds(config, failure)
        if seconds <= 0:
            continue
        members = set(config.node_set(set_name).node_names)
        mine = [n for n in nodes if n.name in members]
        until = now + timedelta(seconds=seconds)
        for node in mine:
            running = parse_cooldown(node.reason)
            if running is not None and node.state.is_down and running[1] > until:
                until = running[1]
        until = until.replace(microsecond=0)
        free = tuple(sorted(
            n.name for n in mine
            if n.name not in failed and n.state.is_powered_down and not n.state.is_down
            and not n.state.is_drained and not n.jobs and is_clearable(n.reason)))
        found.append(NodeSetCooldown(set_name, failure.code, until,
                                     cooldown_reason(failure.code, until), free))
    return found


def candidate_node_sets(config: SpotConfig, partitions: str, exclude: Sequence[str],
                        weights: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """The node sets of the job's ``partitions`` (squeue's comma list) other than
    ``exclude``, lowest Weight first (slurm.conf(5) 22.05: "the lowest weight nodes that
    satisfy the job are allocated first"), then as spot.yaml lists them. ``weights``: node
    set -> the Weight Slurm has now (:func:`slurm_spot.lifecycle.weights.current_weights`); None:
    slurm.conf's (:func:`slurm_spot.lifecycle.weights.static_weights`)."""
    from slurm_spot.lifecycle.weights import static_weights

    weight = dict(weights) if weights is not None else static_weights(config)
    wanted = set(partitions.split(","))
    names: list[str] = []
    for partition in config.partitions:
        if partition.name in wanted:
            names += [n for n in partition.node_sets if n not in exclude and n not in names]
    return tuple(sorted(names, key=lambda n: weight.get(n, config.node_set(n).weight)))


def note_text(move: Failover) -> str:
    """The AdminComment note and ``failover_started`` reason: where the job went and why."""
    why = f"no capacity on node set {move.from_node_set} (Code:{move.code})"
    if move.cooldown_until is not None:
        why += f", cooled down until {utc_stamp(move.cooldown_until)}"
    if move.node_set is not None:
        took = (move.started_at or 0.0) - move.error_at
        return (f"slurm-spot: failover: {why}; requeued at once and started on node set "
                f"{move.node_set} ({','.join(move.nodes)}) {took:.0f} s after the error")
    where = ", ".join(move.candidates) or "no other node set"
    return (f"slurm-spot: failover: {why}; requeued at once, eligible now on {where}")


@dataclass
class FailoverRun:
    """What :func:`fail_over` did: cooldowns written, jobs moved, errors (one line each)."""

    cooldowns: list[NodeSetCooldown] = field(default_factory=list)
    moves: dict[int, Failover] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fail_over(
    config: SpotConfig, slurm: SlurmClient, result: PowerResult,
    jobs: Mapping[int, Sequence[str]] | None,
    clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
    requeue_wait_s: float = REQUEUE_WAIT_S, start_wait_s: float = START_WAIT_S,
) -> FailoverRun:
    """After a resume (in the hook's detached worker): cool down the node sets that had no
    capacity, clear the requeue hold of the jobs of their nodes as soon as slurmctld requeued
    them, and record where each went (see the module docstring).

    Args:
        result: the resume's outcome (:func:`slurm_spot.lifecycle.power.resume`).
        jobs: job id -> its nodes, from ``SLURM_RESUME_FILE``; None or empty: no job is known
            (an admin's ``slurm-spot resume``), so only the cooldown is written.
        clock: ``time.time``-like seconds; sleep: seconds -> None (both injectable).
        requeue_wait_s, start_wait_s: :data:`REQUEUE_WAIT_S`, :data:`START_WAIT_S`.

    Never raises for a Slurm refusal: each is one line in the returned ``errors``.
    """
    run = FailoverRun()
    failures = failover_failures(result)
    if not failures:
        return run
    error_at = clock()
    failed_nodes = sorted({n for f in failures for n in f.nodes})
    try:
        nodes = slurm.nodes(with_jobs=False)
    except SlurmCommandError as exc:
        run.errors.append(f"failover: reading nodes: {exc}")
        nodes = []
    now = datetime.now(timezone.utc)
    run.cooldowns = cooldown_targets(config, failures, nodes, now)
    _cool_down(config, slurm, run)
    code_of = {n: f.code for f in failures for n in f.nodes}
    # Not a candidate: a node set cooled down now, or still cooling from an earlier failure
    # (a job that already failed over once must not be told it may go back there).
    from slurm_spot.lifecycle.weights import cooling_node_sets

    cooling = sorted({c.node_set for c in run.cooldowns} | cooling_node_sets(config, nodes, now))
    until_of = {c.node_set: c.until for c in run.cooldowns}
    for job_id, job_nodes in sorted((jobs or {}).items()):
        lost = [n for n in job_nodes if n in code_of]
        if not lost:
            continue
        node_set = config.node_set_of(lost[0])
        from_set = node_set.name if node_set is not None else "?"
        run.moves[job_id] = Failover(job_id, from_set, code_of[lost[0]], (), until_of.get(from_set),
                                     error_at, failed_nodes=tuple(lost))
    if run.moves:
        from slurm_spot.lifecycle.weights import current_weights

        weights = current_weights(config, nodes)
        _clear_holds(config, slurm, run, failed_nodes, cooling, weights, clock, sleep,
                     requeue_wait_s)
        _see_starts(config, slurm, run, clock, sleep, start_wait_s)
    return run


def _cool_down(config: SpotConfig, slurm: SlurmClient, run: FailoverRun) -> None:
    for cool in run.cooldowns:
        if cool.nodes:
            try:
                slurm.set_state(cool.nodes, "DOWN", cool.reason)
            except SlurmCommandError as exc:
                run.errors.append(f"failover: cooling {cool.node_set} down: {exc}")
                continue
        events.record(config.log_dir, "resume", events.Action.COOLDOWN, cool.nodes or (None,),
                      reason=cool.reason,
                      extra={"node_set": cool.node_set, "code": cool.code,
                             "until": cool.until.isoformat(), "failover": True})


def _clear_holds(config: SpotConfig, slurm: SlurmClient, run: FailoverRun,
                 failed_nodes: Sequence[str], cooling: Sequence[str],
                 weights: Mapping[str, int],
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 wait_s: float) -> None:
    """Poll the moved jobs until each is requeued, then ``StartTime=now`` it; a job not
    requeued within ``wait_s`` gets a ``failover`` event without ``expedited`` (the
    reconciler's safety net clears its hold later)."""
    waiting = set(run.moves)
    deadline = clock() + wait_s
    while waiting:
        try:
            listed = {j.job_id: j for j in slurm.jobs(sorted(waiting))}
        except SlurmCommandError as exc:
            run.errors.append(f"failover: reading jobs: {exc}")
            listed = None
        ready = []
        for job_id in sorted(waiting) if listed is not None else ():
            job = listed.get(job_id) if listed is not None else None
            step = hold_step(job, failed_nodes)
            if step is HoldStep.WAIT:
                continue
            waiting.discard(job_id)
            if step is HoldStep.GONE and job is not None and not job.state.is_finished:
                # Requeued and placed already: the reconciler's safety net cleared the hold
                # while slurmctld kept this worker waiting (seen: squeue timing out for 14 s
                # while slurmctld resolved the failed node's name). Still a move: record it.
                move = run.moves[job_id]
                move.candidates = candidate_node_sets(config, job.partition,
                                                      [move.from_node_set, *cooling], weights)
                move.restarts = job.restarts
                _record_failover(config, move, False, clock,
                                 " (requeue hold cleared by the reconciler)")
                _record_start(config, move, job, clock())
                continue
            if step is HoldStep.EXPEDITE and job is not None:
                move = run.moves[job_id]
                move.candidates = candidate_node_sets(config, job.partition,
                                                      [move.from_node_set, *cooling],
                                                      weights)
                move.restarts = job.restarts
                ready.append(job_id)
            else:
                run.moves.pop(job_id)
        if ready:
            done, errors = slurm.expedite_many(ready)
            run.errors += [f"failover: {e}" for e in errors]
            for job_id in ready:
                _record_failover(config, run.moves[job_id], job_id in done, clock)
        if not waiting or clock() >= deadline:
            break
        sleep(POLL_S)
    for job_id in sorted(waiting):  # not requeued in time: the reconciler's safety net
        _record_failover(config, run.moves.pop(job_id), False, clock)


def _record_failover(config: SpotConfig, move: Failover, expedited: bool,
                     clock: Callable[[], float],
                     not_expedited: str = " (requeue hold not cleared yet: the reconciler will)",
                     ) -> None:
    """The ``failover`` event of one job (its AdminComment is written once its start is
    known, by :func:`_see_starts`); ``not_expedited``: what the reason adds when this
    worker did not clear the hold."""
    if expedited:
        move.expedited_at = clock()
    reason = note_text(move)
    if not expedited:
        reason += not_expedited
    events.emit(config.log_dir, events.Event(
        events.Action.FAILOVER, "resume", reason=reason, job_ids=(move.job_id,),
        extra={"from_node_set": move.from_node_set, "code": move.code,
               "candidates": list(move.candidates), "expedited": expedited,
               "cooldown_until": move.cooldown_until.isoformat() if move.cooldown_until else None,
               "restarts": move.restarts,
               "hold_cleared_after_s": (round(move.expedited_at - move.error_at, 2)
                                        if move.expedited_at else None)}))


def _see_starts(config: SpotConfig, slurm: SlurmClient, run: FailoverRun,
                clock: Callable[[], float], sleep: Callable[[float], None],
                wait_s: float) -> None:
    """Wait up to ``wait_s`` for the expedited jobs to start, then write a
    ``failover_started`` event per job that did and an AdminComment note per job."""
    waiting = {j for j, m in run.moves.items() if m.expedited_at is not None}
    deadline = clock() + wait_s
    failed_reads = 0
    cleaning_since: dict[int, float] = {}
    nudged_at: dict[int, float] = {}
    while waiting:
        try:
            listed = {j.job_id: j for j in slurm.jobs(sorted(waiting))}
        except SlurmCommandError as exc:
            # A busy slurmctld (seen: 20 s stalled resolving the failed nodes' names while it
            # requeued a 2-node job) times squeue out; keep asking until the deadline, so
            # the start is still recorded once it answers.
            failed_reads += 1
            if failed_reads == 1:
                run.errors.append(f"failover: reading jobs: {exc}")
            listed = None
        for job_id in sorted(waiting) if listed is not None else ():
            job = listed.get(job_id) if listed is not None else None
            if job is None:
                # Not in an answer that did come: squeue keeps an ended job for MinJobAge
                # (300 s), so this is a read that lost it (seen in CI: an empty answer while
                # slurmctld stalled 20 s on a 2-node job), not an end. Ask again.
                continue
            if job.state.is_finished:
                waiting.discard(job_id)
            elif not job.state.is_pending and job.nodes:
                waiting.discard(job_id)
                _record_start(config, run.moves[job_id], job, clock())
            elif stuck_cleaning(job):
                now = clock()
                since = cleaning_since.setdefault(job_id, now)
                if (now - since >= CLEANING_NUDGE_S
                        and now - nudged_at.get(job_id, since) >= CLEANING_NUDGE_S):
                    nudged_at[job_id] = now
                    _set_down_again(slurm, run, run.moves[job_id])
            else:
                cleaning_since.pop(job_id, None)
        if not waiting or clock() >= deadline:
            break
        sleep(POLL_S)
    notes = [(j, note_text(m)) for j, m in sorted(run.moves.items())]
    run.errors += [f"failover: {e}" for e in slurm.record_interruptions(notes)]


def _set_down_again(slurm: SlurmClient, run: FailoverRun, move: Failover) -> None:
    """Set the failed nodes of ``move`` DOWN again (:func:`nodes_to_set_down_again`), so
    that slurmctld lets its job out of ``Cleaning``; a refusal is one line in ``run.errors``
    (the reconciler's next cooldown pass does the same)."""
    try:
        nodes = slurm.nodes(move.failed_nodes, with_jobs=False)
    except SlurmCommandError as exc:
        run.errors.append(f"failover: reading the nodes of job {move.job_id}: {exc}")
        return
    reasons = {c.node_set: c.reason for c in run.cooldowns}
    for name, reason in nodes_to_set_down_again(move, nodes, reasons):
        try:
            slurm.set_state([name], "DOWN", reason)
        except SlurmCommandError as exc:
            run.errors.append(f"failover: job {move.job_id} pending with Reason=Cleaning: "
                              f"setting {name} DOWN again: {exc}")
        else:
            log.info("failover: job %s pending with Reason=Cleaning: %s set DOWN again",
                     move.job_id, name)


def _record_start(config: SpotConfig, move: Failover, job: Job, now: float) -> None:
    move.nodes = tuple(expand(job.nodes))
    found = config.node_set_of(move.nodes[0]) if move.nodes else None
    move.node_set = found.name if found is not None else None
    move.started_at = now
    events.emit(config.log_dir, events.Event(
        events.Action.FAILOVER_STARTED, "resume", reason=note_text(move), job_ids=(move.job_id,),
        extra={"from_node_set": move.from_node_set, "node_set": move.node_set,
               "nodes": list(move.nodes), "code": move.code,
               "seconds_from_error": round(now - move.error_at, 2)}))


def resume_and_fail_over(config: SpotConfig, hostlist: str, slurm: SlurmClient,
                         jobs: Mapping[int, Sequence[str]] | None) -> PowerResult:
    """ResumeProgram's work: :func:`slurm_spot.lifecycle.power.resume`, then :func:`fail_over` for
    the nodes that got no capacity; the failover's errors are added to the result's.

    Raises:
        HostlistError, UnknownNodeError: bad input; nothing was launched.
    """
    from slurm_spot.lifecycle import power

    result = power.resume(config, hostlist, slurm, jobs=jobs)
    if config.power.failover:
        result.errors += fail_over(config, slurm, result, jobs).errors
    return result
