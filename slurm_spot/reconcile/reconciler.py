"""The reconciler's pass (docs/DESIGN.md flow 6): snapshot the providers and Slurm once, classify
every node with the pure rules of :mod:`slurm_spot.reconcile.rules`, act per verdict through a
table, and isolate each action's failure. Every action is an event (source ``reconcile``) and
a metric. What happens to the jobs (elastic releases, requeues, expedites, held jobs) is
:mod:`slurm_spot.reconcile.job_actions`.

The Slurm transitions that carry out each verdict (verified on Slurm 22.05.8):

- ``RECLAIMED`` / ``BOOT_LOST``: ``state=DOWN reason=R`` (slurmctld requeues the node's jobs at
  once and stops waiting for the dead slurmd), then ``state=POWER_DOWN_FORCE reason=R``
  (SuspendProgram runs, the node returns to ``idle~`` after SuspendTimeout). POWER_DOWN_FORCE
  alone leaves the job COMPLETING until slurmctld gives up on the dead node (~100 s).
  An *elastic* job (``--no-kill``, one step per node) is not requeued: DOWN removes the node
  from it and ends its step there, the job goes on with its other nodes, and the pass records
  ``released`` for it, as the watcher does with notice (:mod:`slurm_spot.jobs.interruption.elastic_release`);
  unless its batch script ran on the lost node (then Slurm requeues it: the fallback).
- ``RESUME_FAILED`` / ``REENABLE``: ``state=IDLE`` turns ``down~`` into ``idle~`` at once and
  clears the reason (``state=RESUME`` adds NOT_RESPONDING; POWER_DOWN goes through
  SuspendProgram and keeps the reason); then NodeAddr/NodeHostName are reset to the node name,
  as slurmctld itself does after a power down.
- ``COOL``: ``state=DOWN reason="(Code:X)Temporarily disabled until T"`` on ``idle~`` gives
  ``down~``; on ``down~`` it only replaces the reason.
- ``BREAKER``: ``state=IDLE`` then ``state=DRAIN reason="slurm-spot:circuit-breaker..."``
  (``drain~``); an admin's ``state=RESUME`` re-enables the node.
- ``UNDRAIN``: ``state=RESUME`` on a powered-down node drained with one of our reasons.
- ``CLEAR_NOT_RESPONDING``: ``state=IDLE`` on ``idle~*`` (IDLE+CLOUD+POWERED_DOWN+
  NOT_RESPONDING, left by an admin's ``state=RESUME`` of a ``down~`` node: node_mgr.c
  update_node sets NO_RESPOND then) gives plain ``idle~``, the transition ``RESUME_FAILED``
  uses (22.05.8, as tests/fakes/fake_slurm.py models it; not yet checked on 23.02-26.05 by an
  end-to-end test); POWER_DOWN_FORCE does nothing on a powered-down node and RESUME keeps
  the flag. The address is reset to the node name as well.
- ``KILL_TASK_FAILED``: ``state=POWER_DOWN_FORCE reason=R`` on a node slurmctld drained
  ``Kill task failed``: SuspendProgram terminates the instance (and the unkillable step with
  it), the node stays drained with our reason (``drain~``) and ``UNDRAIN`` then returns it.
- ``LOW_REAL_MEMORY``: ``state=POWER_DOWN_FORCE reason=R`` on a node slurmctld drained
  ``Low RealMemory`` (its instance type has less memory than the node set's ``memory_mib``;
  render's margin covers catalogue types only): the instance is not billed idle, and R (not
  one of our reasons on purpose) keeps the node ``drain~`` and says what to do: powering it up
  again would only drain it again. One ``real_memory_low`` warning event.
- Duplicates (several alive instances for one up node): all but the kept one are terminated,
  with a ``duplicate_instance`` warning event naming both.

A pass holds no state of its own: Slurm and the providers are the record, and the few facts
they do not keep come back from the events file (:mod:`slurm_spot.reconcile.history`), so a
reconciler killed at any point and started again converges. The loop, the lock and config
reloads are in :mod:`slurm_spot.reconcile.loop`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from slurm_spot import events
from slurm_spot.config import SpotConfig
from slurm_spot.cost.prices import PriceOf
from slurm_spot.errors import PartialTerminationError, SlurmCommandError
from slurm_spot.events import Action
from slurm_spot.lifecycle.power import ProviderFactory, provider_cache
from slurm_spot.lifecycle.prewarm import restore_weights
from slurm_spot.providers import assign_listings, get_provider
from slurm_spot.providers.base import Instance
from slurm_spot.providers.events import ProviderEvent, ended_instances
from slurm_spot.reconcile.history import EventTail, build_history, history_keep_s
from slurm_spot.reconcile.job_actions import JobActions
from slurm_spot.reconcile.metrics import ReconcileMetrics
from slurm_spot.reconcile.rules import (
    History,
    NodeDecision,
    Plan,
    Settings,
    Termination,
    Verdict,
    missing_since,
    plan_pass,
)
from slurm_spot.slurm.client import Node, SlurmClient
from slurm_spot.slurm.reasons import low_memory_of, parse_interruption

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, aware UTC."""
    return datetime.now(timezone.utc)


def settings_of(config: SpotConfig) -> Settings:
    """The rules' settings from ``reconcile:`` and ``power:`` of the config."""
    rc = config.reconcile
    return Settings(orphan_grace_s=rc.orphan_grace_s, cooldown_s=rc.cooldown_s,
                    quota_backoff_s=rc.quota_backoff_s,
                    max_resume_failures=rc.max_resume_failures,
                    failure_window_s=rc.failure_window_s,
                    resume_timeout_s=float(config.power.resume_timeout_s),
                    missing_grace_s=rc.missing_grace_s)


@dataclass(frozen=True)
class Snapshot:
    """One pass's view: instances (listed first), then Slurm's nodes and the facts from events.

    ``provider_of`` maps instance id -> provider name; ``unavailable_sets`` are node sets whose
    provider could not be listed; ``held_jobs`` are PENDING jobs with Reason=BeginTime.
    """

    now: datetime
    nodes: tuple[Node, ...]
    instances: tuple[Instance, ...]
    provider_of: Mapping[str, str]
    unavailable_sets: frozenset[str]
    history: History
    held_jobs: tuple[int, ...] = ()
    events: tuple[Mapping[str, object], ...] = ()


@dataclass
class PassResult:
    """What one pass did: ``actions`` (one dict per action, as its event), ``errors``
    (one line per failed listing or action), ``verdicts`` (count per verdict)."""

    started: datetime
    duration_s: float = 0.0
    actions: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The pass as printed by ``slurm-spot reconcile --once --json``."""
        return {"started": self.started.isoformat(), "duration_s": round(self.duration_s, 3),
                "verdicts": self.verdicts, "actions": self.actions, "errors": self.errors}


class Reconciler:
    """Runs passes for one configuration.

    Args:
        config: the site config (node sets, providers, ``reconcile:``, log dir).
        slurm: the Slurm client (all Slurm access goes through it).
        providers: builds a provider by name (default :func:`get_provider`).
        metrics: where to count (default: a private registry).
        clock: aware-UTC time source; sleep: seconds -> None (both injectable for tests).
        expedite_wait_s: how long a pass waits for requeued jobs to become PENDING before it
            clears their requeue delay (the next pass catches later ones).
    """

    def __init__(
        self,
        config: SpotConfig,
        slurm: SlurmClient,
        providers: ProviderFactory = get_provider,
        metrics: ReconcileMetrics | None = None,
        clock: Clock = utc_now,
        sleep: Callable[[float], None] = time.sleep,
        expedite_wait_s: float = 10.0,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.providers = providers
        self.metrics = metrics or ReconcileMetrics()
        self.clock = clock
        self.settings = settings_of(config)
        self.node_set_of = {n: ns.name for ns in config.node_sets for n in ns.node_names}
        self._failures_seen_after = clock()
        # The fast-requeue cap counts expedites over its own window, which may be longer.
        self._tail = EventTail(config.log_dir, max(history_keep_s(self.settings),
                                                   config.reconcile.fast_requeue_window_s))
        # node -> first pass that found it up with no instance listed (see missing_since)
        self._missing_since: dict[str, datetime] = {}
        self._notes: list[tuple[int, str]] = []
        # the cost order's price lookup (built at the first pass) and the last price of each
        # node set, kept for passes whose lookup fails (slurm_spot.cost.prices.price_lookup)
        self._price_of: PriceOf | None = None
        self._prices: dict[str, float] = {}
        #: alive instances of the last pass: the provider events worth an early pass
        self.known_instances: set[str] = set()
        self._reported: set[str] = set()  # instances this pass took as ended from an event
        #: the job side of the pass: elastic releases, requeues, expedites, held jobs
        self.jobs = JobActions(config, slurm, self.metrics, self._emit, sleep, expedite_wait_s)
        # the pass's providers: each built once per pass (one cloud session and client)
        self._providers: ProviderFactory = provider_cache(providers)
        # verdict -> (Slurm updates for nodes that share a reason, what to record per node)
        self._handlers: dict[Verdict, tuple[Callable[[list[str], str], None],
                                            Callable[[NodeDecision, PassResult], None]]] = {
            Verdict.RECLAIMED: (self._power_down_lost, self._record_lost),
            Verdict.BOOT_LOST: (self._power_down_lost, self._record_lost),
            Verdict.RESUME_FAILED: (self._return_to_idle, self._record_idle),
            Verdict.REENABLE: (self._return_to_idle, self._record_idle),
            Verdict.BREAKER: (self._trip_breaker, self._record_breaker),
            Verdict.COOL: (self._cool, self._record_cool),
            Verdict.UNDRAIN: (self._undrain, self._record_undrain),
            Verdict.CLEAR_NOT_RESPONDING: (self._return_to_idle, self._record_responding),
            Verdict.KILL_TASK_FAILED: (self._power_down_drained, self._record_unkillable),
            Verdict.LOW_REAL_MEMORY: (self._power_down_drained, self._record_low_memory),
        }

    # -- snapshot -------------------------------------------------------------------------
    def snapshot(self, result: PassResult, reported: Sequence[ProviderEvent] = ()) -> Snapshot:
        """List every provider once, then read Slurm's nodes and the events' facts.

        A provider that fails to list is logged and its node sets are left alone this pass.
        An instance that ``reported`` (the providers' own events, :mod:`slurm_spot.providers.
        events`) says has ended is taken as ended even if the listing, eventually consistent,
        still shows it alive: its state and reason become the event's.

        Raises:
            SlurmCommandError: Slurm's nodes cannot be read, or the listing holds none of the
                configured nodes (nothing is decided then).
        """
        instances: list[Instance] = []
        provider_of: dict[str, str] = {}
        unavailable: set[str] = set()
        listings: dict[str, list[Instance]] = {}
        for name in sorted({ns.provider for ns in self.config.node_sets}):
            try:
                listings[name] = list(self._providers(self.config, name).list_instances())
            except Exception as exc:  # any SDK error: skip this provider
                log.error("provider %s: listing failed: %s", name, exc)
                result.errors.append(f"provider {name}: listing failed: {exc}")
                unavailable.update(ns.name for ns in self.config.node_sets if ns.provider == name)
        ended = ended_instances(reported)
        for name, listed in sorted(assign_listings(self.config, listings).items()):
            listed = [_as_reported(i, ended.get((name, i.instance_id))) for i in listed]
            instances.extend(listed)
            provider_of.update((i.instance_id, name) for i in listed)
        nodes = tuple(self.slurm.nodes())
        if self.node_set_of and not any(n.name in self.node_set_of for n in nodes):
            # Slurm always lists every node slurm.conf defines, powered down or not: none of
            # ours is a listing that went wrong, and deciding on it would end every instance.
            raise SlurmCommandError(
                ["scontrol", "show", "node"], 0,
                f"Slurm listed none of the {len(self.node_set_of)} nodes spot.yaml configures "
                f"({len(nodes)} others); nothing is decided on such a listing")
        now = self.clock()
        tail = self._tail.read(now)
        history = build_history(tail, self.node_set_of, now, self.settings)
        return Snapshot(now, nodes, tuple(instances), provider_of, frozenset(unavailable),
                        history, self.jobs.held_jobs(history, result), tuple(tail))

    # -- the pass -------------------------------------------------------------------------
    def run_pass(self, reported: Sequence[ProviderEvent] = ()) -> PassResult:
        """Snapshot, plan, act, expedite; then metrics (and the textfile, if configured).

        Args:
            reported: provider events that started this pass early (see :meth:`snapshot`);
                each one about an instance of this cluster is recorded (``provider_event``).

        Raises:
            SlurmCommandError: Slurm's nodes cannot be read.
        """
        started = time.monotonic()
        result = PassResult(self.clock())
        self._providers = provider_cache(self.providers)
        snap = self.snapshot(result, reported)
        self.known_instances = {i.instance_id for i in snap.instances if i.state.is_alive}
        ours = {i.instance_id: i.node for i in snap.instances}
        self._reported = {e.instance_id for e in reported if e.ended}
        for event in reported:
            if event.instance_id in ours:
                self._emit(result, Action.PROVIDER_EVENT, node=ours[event.instance_id],
                           instance=event.instance_id, extra=event.to_json())
        self._missing_since = missing_since(
            snap.nodes, snap.instances, self.node_set_of, snap.unavailable_sets, snap.now,
            self._missing_since)
        plan = plan_pass(snap.nodes, snap.instances, self.node_set_of, snap.now, self.settings,
                         snap.history, snap.unavailable_sets, snap.held_jobs,
                         self._missing_since)
        for decision in plan.nodes:
            name = decision.verdict.value
            result.verdicts[name] = result.verdicts.get(name, 0) + 1
        for inst in plan.unlisted:
            log.error("instance %s of node %s: Slurm's listing left the node out; the instance "
                      "is left alone", inst.instance_id, inst.node)
            result.errors.append(f"{inst.node}: not in Slurm's node listing; instance "
                                 f"{inst.instance_id} left alone")
        vetoed = self._recheck(plan)
        acting = [d for d in plan.nodes if d.node not in vetoed]
        failed = self._terminate_all([t for d in acting for t in d.terminate], plan.orphans,
                                     snap, result)
        requeued = self._act_all(acting, failed, snap, result)
        # the more precise reason first; a job withheld there is not expedited as "safety net"
        done = self.jobs.expedite_requeue_exits(result, requeued, snap)
        self.jobs.expedite(requeued, [j for j in plan.expedite if j not in done], result)
        self.jobs.stuck_jobs(snap, result)
        self._keep_spares(snap, result)
        # A watcher restores its replacement's Weight itself unless its node went first.
        for node in restore_weights(self.config, self.slurm, snap.nodes):
            self._emit(result, Action.WEIGHT_RESTORED, node=node)
        if self.config.power.order == "cost":
            self._order_weights(snap, result)
        self._observe(snap, result, time.monotonic() - started)
        return result

    def _keep_spares(self, snap: Snapshot, result: PassResult) -> None:
        """Power nodes up so that each node set with ``spares`` has that many idle nodes up
        or booting (:func:`slurm_spot.lifecycle.spares.spares_to_power_up`); slurm.conf's
        SuspendExcNodes keeps them up once idle (on Slurm 24.05+, whose count includes busy
        nodes, set each pass to spares + busy: :func:`slurm_spot.lifecycle.spares.suspend_exc_value`).
        One ``spares_powered_up`` event per node set that got some; a refused power-up is an
        error of the pass."""
        from slurm_spot.lifecycle.spares import spares_to_power_up, suspend_exc_value

        if not any(ns.spares for ns in self.config.node_sets):
            return
        try:
            if self.slurm.version.suspend_exc_counts_busy:
                # 24.05+ counts busy nodes among SuspendExcNodes' N: N + busy keeps N idle
                value = suspend_exc_value(self.config, snap.nodes, counts_busy=True)
                if value is not None:
                    self.slurm.set_suspend_exc_nodes(value)
        except SlurmCommandError as exc:
            result.errors.append(f"SuspendExcNodes not updated: {exc}")
        for short in spares_to_power_up(self.config, snap.nodes, snap.now, snap.unavailable_sets):
            if not short.power_up:
                continue
            if not self.metrics.slurm_action(
                    "spares", result.errors, f"node set {short.node_set}: spares not powered up",
                    self.slurm.power_up, short.power_up):
                continue
            self._emit(result, Action.SPARES, node=",".join(short.power_up),
                       reason=f"{short.node_set} keeps {short.wanted} hot spare(s), had "
                              f"{short.have}",
                       extra={"node_set": short.node_set, "wanted": short.wanted,
                              "had": short.have, "nodes": list(short.power_up)})

    def _order_weights(self, snap: Snapshot, result: PassResult) -> None:
        """Keep Slurm's node Weights in the cost order (:mod:`slurm_spot.lifecycle.weights`): prices
        (live where the provider gives them, the last known one when a lookup fails) and
        cooldowns of this pass; one ``weights_ordered`` event when a Weight changed."""
        from slurm_spot.cost.prices import price_lookup
        from slurm_spot.lifecycle.weights import live_weights, sync_weights

        if self._price_of is None:
            self._price_of = price_lookup(self.config, live=True, known=self._prices)
        weights = live_weights(self.config, snap.nodes, snap.now, self._price_of)
        done = sync_weights(self.config, self.slurm, weights, snap.nodes)
        for error in done.errors:
            result.errors.append(error)
            self.metrics.action("order_weights", ok=False)
        if done.changed:
            self.metrics.action("order_weights", ok=True)
            order = sorted(weights, key=lambda n: weights[n])
            self._emit(result, Action.WEIGHTS_ORDERED,
                       reason=f"node sets tried in the order {', '.join(order)}",
                       extra={"weights": weights,
                              "changed": {str(w): names for w, names in done.changed.items()},
                              "usd_per_h": {n: self._prices.get(n) for n in order}})

    def _act_all(self, decisions: Sequence[NodeDecision], failed: Mapping[str, str],
                 snap: Snapshot, result: PassResult) -> list[int]:
        """Carry out the verdicts: one Slurm update per verdict and reason for all its nodes
        (``scontrol update nodename=<hostlist>``), one node at a time only if that batch is
        refused, so one node's refusal never stops the others. A node whose instance could
        not be terminated (``failed``: instance id -> error) is left for the next pass.
        Returns the jobs to expedite."""
        groups: dict[tuple[Verdict, str], list[NodeDecision]] = {}
        for d in decisions:
            bad = [failed[t.instance.instance_id] for t in d.terminate
                   if t.instance.instance_id in failed]
            if bad:
                self._failed(d, bad[0], result)
            elif d.verdict in self._handlers:
                groups.setdefault((d.verdict, d.reason), []).append(d)
        requeued: list[int] = []
        self._notes = []  # AdminComment notes, written at the end
        self.jobs.new_pass()  # every job read once if a lost node needs them; which are elastic
        for (verdict, reason), members in groups.items():
            update, record = self._handlers[verdict]
            for d in self._update_batched(update, reason, members, result):
                released: list[int] = []
                if d.verdict in (Verdict.RECLAIMED, Verdict.BOOT_LOST) and d.jobs:
                    released = self.jobs.release_elastic(d, result)
                    d = replace(d, jobs=tuple(j for j in d.jobs if j not in released))
                try:
                    record(d, result)
                except Exception as exc:  # isolate one node's failure
                    self._failed(d, exc, result)
                    continue
                self.metrics.action(d.verdict.value, ok=True)
                if d.verdict in (Verdict.RECLAIMED, Verdict.BOOT_LOST):
                    requeued += list(d.jobs) + self.jobs.requeue_ended(d, snap, result)
        result.errors += self.slurm.record_interruptions(self._notes)
        return requeued

    def _update_batched(self, update: Callable[[list[str], str], None], reason: str,
                        members: list[NodeDecision], result: PassResult) -> list[NodeDecision]:
        """``update`` for all members at once; if refused, for each alone. Returns the
        members whose update went through."""
        try:
            update([d.node for d in members], reason)
            return members
        except Exception as exc:  # one node may spoil the batch: retry each alone
            if len(members) == 1:
                self._failed(members[0], exc, result)
                return []
            log.warning("batched %s of %d nodes refused (%s); one node at a time",
                        members[0].verdict.value, len(members), exc)
        done = []
        for d in members:
            try:
                update([d.node], reason)
            except Exception as exc:  # isolate one node's failure
                self._failed(d, exc, result)
                continue
            done.append(d)
        return done

    def _failed(self, d: NodeDecision, exc: object, result: PassResult) -> None:
        log.error("%s: %s failed: %s", d.node, d.verdict.value, exc)
        result.errors.append(f"{d.node}: {d.verdict.value}: {exc}")
        self.metrics.action(d.verdict.value, ok=False)

    def _recheck(self, plan: Plan) -> set[str]:
        """Nodes whose terminations must not happen: re-read the nodes behind orphan and
        leftover terminations just before acting, and veto any that Slurm is bringing up
        since the snapshot (or all of them if Slurm cannot be read)."""
        names = sorted({d.node for d in plan.nodes
                        if any(t.why != "duplicate" for t in d.terminate)})
        if not names:
            return set()
        try:
            fresh = {n.name: n for n in self.slurm.nodes(names, with_jobs=False)}
        except SlurmCommandError as exc:
            log.error("re-reading %s before terminating: %s", ",".join(names), exc)
            return set(names)
        return {n for n in names if n not in fresh or not fresh[n].state.is_powered_down}

    # -- handlers (per verdict: Slurm updates for a batch of nodes, then one record each) --
    def _power_down_lost(self, nodes: list[str], reason: str) -> None:
        """DOWN (requeues the jobs at once), then POWER_DOWN_FORCE (back to idle~)."""
        self.slurm.set_state(nodes, "DOWN", reason)
        self.slurm.power_down_force(nodes, reason)

    def _record_lost(self, d: NodeDecision, result: PassResult) -> None:
        reclaimed = parse_interruption(d.reason) is not None
        if reclaimed:
            self.metrics.interruptions.labels(self.node_set_of[d.node]).inc()
        action = Action.RECLAIMED if d.verdict is Verdict.RECLAIMED else Action.BOOT_LOST
        detected = "provider event" if d.instance in self._reported else "listing"
        self._record(result, action, d, extra={"reclaimed": reclaimed, "instance_state": d.why,
                                               "detected_by": detected})
        self._notes += [(job, f"requeued: {d.reason} ({d.node})")
                        for job in (d.jobs if reclaimed else ())]

    def _return_to_idle(self, nodes: list[str], reason: str) -> None:
        """``state=IDLE`` turns down~ into idle~ and clears the reason; reset the address."""
        self.slurm.set_state(nodes, "IDLE")
        self.slurm.set_addresses({n: (n, n) for n in nodes})

    def _record_idle(self, d: NodeDecision, result: PassResult) -> None:
        action = Action.RESUME_FAILED if d.verdict is Verdict.RESUME_FAILED else Action.COOLDOWN_END
        self._record(result, action, d, reason=d.why)

    def _trip_breaker(self, nodes: list[str], reason: str) -> None:
        self._return_to_idle(nodes, reason)
        self.slurm.set_state(nodes, "DRAIN", reason)

    def _record_breaker(self, d: NodeDecision, result: PassResult) -> None:
        self._record(result, Action.BREAKER, d)

    def _cool(self, nodes: list[str], reason: str) -> None:
        self.slurm.set_state(nodes, "DOWN", reason)

    def _record_cool(self, d: NodeDecision, result: PassResult) -> None:
        self._record(result, Action.COOLDOWN, d, extra={"node_set": self.node_set_of[d.node],
                                                   "previous_reason": d.why})

    def _undrain(self, nodes: list[str], reason: str) -> None:
        self.slurm.set_state(nodes, "RESUME")

    def _record_undrain(self, d: NodeDecision, result: PassResult) -> None:
        self._record(result, Action.UNDRAINED, d, reason=d.why)

    def _record_responding(self, d: NodeDecision, result: PassResult) -> None:
        self._record(result, Action.NOT_RESPONDING_CLEARED, d, reason=d.why)

    def _power_down_drained(self, nodes: list[str], reason: str) -> None:
        """POWER_DOWN_FORCE: SuspendProgram terminates the instance (and an unkillable step
        with it); the node keeps its DRAIN flag and gets ``reason``."""
        self.slurm.power_down_force(nodes, reason)

    def _record_unkillable(self, d: NodeDecision, result: PassResult) -> None:
        self._record(result, Action.KILL_TASK_FAILED, d, extra={"previous_reason": d.why})

    def _record_low_memory(self, d: NodeDecision, result: PassResult) -> None:
        node_set = self.config.node_set(self.node_set_of[d.node])
        reported, configured = low_memory_of(d.why) or (None, None)
        log.warning("%s: %s; %s", d.node, d.why, d.reason)
        self._record(result, Action.REAL_MEMORY_LOW, d, extra={
            "level": "warning", "node_set": node_set.name, "reported_mib": reported,
            "configured_mib": configured, "memory_mib": node_set.memory_mib,
            "previous_reason": d.why})

    # -- instances ------------------------------------------------------------------------
    def _terminate_all(self, for_nodes: Sequence[Termination], orphans: Sequence[Termination],
                       snap: Snapshot, result: PassResult) -> dict[str, str]:
        """Terminate every instance of the pass: one ``terminate_instances`` call per
        provider (EC2 takes 1000 ids per TerminateInstances), one instance at a time only if
        that call fails, so one bad instance never stops the others. Returns instance id ->
        error for those that could not be terminated."""
        by_provider: dict[str, list[Termination]] = {}
        for term in (*for_nodes, *orphans):
            by_provider.setdefault(snap.provider_of[term.instance.instance_id], []).append(term)
        failed: dict[str, str] = {}
        for name, terms in by_provider.items():
            provider = self._providers(self.config, name)
            try:
                provider.terminate_instances([t.instance.instance_id for t in terms])
                done = terms
            except PartialTerminationError as exc:  # the provider isolated the bad ones
                failed.update({t.instance.instance_id: exc.failed[t.instance.instance_id]
                               for t in terms if t.instance.instance_id in exc.failed})
                done = [t for t in terms if t.instance.instance_id not in exc.failed]
            except Exception as exc:  # one instance may spoil the batch: retry each alone
                log.warning("terminating %d instances at %s failed (%s); one at a time",
                            len(terms), name, exc)
                done = []
                for term in terms:
                    try:
                        provider.terminate_instances([term.instance.instance_id])
                    except Exception as one_exc:  # isolate one instance's failure
                        failed[term.instance.instance_id] = str(one_exc)
                        continue
                    done.append(term)
            for term in done:
                self._terminated(term, name, snap, result)
        for term in orphans:
            if term.instance.instance_id in failed:
                error = failed[term.instance.instance_id]
                log.error("terminating orphan %s failed: %s", term.instance.instance_id, error)
                result.errors.append(f"{term.instance.instance_id}: terminate: {error}")
                self.metrics.action("terminate-orphan", ok=False)
        return failed

    def _terminated(self, term: Termination, provider: str, snap: Snapshot,
                    result: PassResult) -> None:
        inst = term.instance
        if term.why == "orphan":
            self.metrics.orphans.labels(provider).inc()
        self.metrics.action(f"terminate-{term.why}", ok=True)
        self._emit(result, Action.TERMINATED, node=inst.node, instance=inst.instance_id,
                   reason=term.why, extra={"provider": provider,
                                           "age_s": round(inst.age_s(snap.now), 1)})
        if term.why == "duplicate":
            log.warning("%s had several instances: kept %s, terminated duplicate %s",
                        inst.node, term.kept, inst.instance_id)
            self._emit(result, Action.DUPLICATE_INSTANCE, node=inst.node,
                       instance=inst.instance_id,
                       reason=(f"duplicate instance {inst.instance_id} terminated; "
                               f"kept {term.kept}"),
                       extra={"level": "warning", "kept": term.kept,
                              "terminated": inst.instance_id, "provider": provider})

    # -- events and metrics ---------------------------------------------------------------
    def _record(self, result: PassResult, action: Action, d: NodeDecision, reason: str | None = None,
                extra: dict[str, object] | None = None) -> None:
        self._emit(result, action, node=d.node, instance=d.instance,
                   reason=d.reason if reason is None else reason, job_ids=d.jobs,
                   extra=extra or {})

    def _emit(self, result: PassResult, action: Action, **fields: object) -> None:
        fields = events.with_job_refs(
            fields, self.slurm.known_refs(fields.get("job_ids") or ()))  # type: ignore[arg-type]
        event = events.Event(action, "reconcile", time=self.clock().isoformat(),
                             **fields)  # type: ignore[arg-type]
        events.emit(self.config.log_dir, event)
        result.actions.append({k: v for k, v in event.__dict__.items() if v not in (None, (), {})})
        jobs = ",".join(str(j) for j in fields.get("job_ids") or ())  # type: ignore[attr-defined]
        log.info("%s node=%s instance=%s jobs=%s %s", action, fields.get("node") or "-",
                 fields.get("instance") or "-", jobs or "-", fields.get("reason") or "")

    def _observe(self, snap: Snapshot, result: PassResult, duration_s: float) -> None:
        result.duration_s = duration_s
        m = self.metrics
        m.observe_snapshot(
            ((self.node_set_of[n.name], n) for n in snap.nodes if n.name in self.node_set_of),
            ((snap.provider_of[i.instance_id], i) for i in snap.instances))
        for event in snap.events:
            try:
                when = datetime.fromisoformat(str(event.get("time")))
            except ValueError:
                continue
            if when.tzinfo is None or when <= self._failures_seen_after:
                continue
            m.events.labels(str(event.get("source")), str(event.get("action"))).inc()
            extra = event.get("extra")
            if event.get("action") == Action.LAUNCH_FAILED and isinstance(extra, dict):
                node_set = self.node_set_of.get(str(event.get("node")), "unknown")
                m.launch_failures.labels(node_set, str(extra.get("code"))).inc()
            if event.get("action") == Action.FAILOVER and isinstance(extra, dict):
                m.failovers.labels(str(extra.get("from_node_set") or "unknown"),
                                   str(extra.get("code") or "unknown")).inc()
        self._failures_seen_after = snap.now
        try:  # one squeue per pass: submit/start times for the latency histograms
            jobs = self.slurm.jobs()
        except SlurmCommandError as exc:
            log.warning("latency metrics skipped this pass: %s", exc)
        else:
            m.observe(m.latency.observe(snap.events, snap.nodes, jobs, self.node_set_of,
                                        [p.name for p in self.config.partitions],
                                        snap.now.timestamp()))
        m.pass_duration.observe(duration_s)
        m.last_pass.set(time.time())
        if self.config.reconcile.metrics_file is not None:
            try:
                m.write_textfile(self.config.reconcile.metrics_file)
            except OSError as exc:
                log.error("cannot write %s: %s", self.config.reconcile.metrics_file, exc)
                result.errors.append(f"metrics file: {exc}")


def _as_reported(instance: Instance, event: ProviderEvent | None) -> Instance:
    """``instance`` as ``event`` (its provider's news that it ended) has it, when the listing
    still shows it alive; else as listed."""
    if event is None or event.state is None or not instance.state.is_alive:
        return instance
    return replace(instance, state=event.state, state_reason=event.reason)
