"""A discrete-event simulation of one multi-node job on spot instances under interruptions.

Events are interruptions (Poisson, ``spot_nodes * rate`` per hour of wall time, also during
checkpoints and recoveries, as in Daly 2006), checkpoint completions, recoveries and the job's
end. Four strategies (``STRATEGIES``):

- ``plain``: plain Slurm. Nothing acts on the notice; slurmctld notices the dead node after
  ``SlurmdTimeout``, requeues the job with its requeue delay (~121 s, docs/local-slurm.md), the
  replacement boots, the job restarts from its last periodic checkpoint.
- ``periodic``: periodic checkpoints with expedited requeue: the reconciler sees the reclaimed
  instance within ``detect_s`` and clears the delay; then boot, restart, last checkpoint.
- ``slurm-spot``: checkpoint on notice (when the notice is at least as long as a checkpoint),
  expedited requeue, the replacement powered up at the notice (its boot hides behind the
  notice), periodic checkpoints at Daly's interval for the rest.
- ``elastic``: survivors continue (data-parallel replicas hold the whole state, so one node's
  loss loses no work): a re-rendezvous pause of ``restart_s``, then ``(N-k)/N`` of the speed
  while ``k`` replacements boot, another pause when each joins.

Cost model: every node slot is paid for the whole wall time (the gap between a lost node and its
replacement is seconds to minutes; it is ignored), ``on_demand_nodes`` at the on-demand price and
never interrupted, the rest at the spot price. Goodput = useful node-seconds / paid node-seconds
= compute time / wall time. The on-demand baseline is the job's compute time on on-demand nodes
only (no interruptions, no checkpoint overhead): the "same hours on on-demand".
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

from slurm_spot.cost.planner import (
    NEVER_FINISHES_WASTE,
    daly_interval_s,
    expected_wall_s,
    job_mtbf_s,
)
from slurm_spot.errors import BadInputError

STRATEGIES = ("plain", "periodic", "slurm-spot", "elastic")
Z95 = 1.959964
EPS_S = 1e-6  # below float resolution of wall times of months: treat as zero
# Event-loop steps (interruptions, checkpoints, recoveries, joins) one simulate() call may
# take: a few seconds of CPU. Estimated before it starts, enforced while it runs.
MAX_STEPS = 3_000_000


class NoProgressError(BadInputError):
    """The simulated job cannot make progress (it would practically never finish), or the
    simulation would exceed its step budget; the message says which and why."""


class StepBudget:
    """Counts event-loop steps; :meth:`take` raises :class:`NoProgressError` past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> None:
        self.used += 1
        if self.used > self.limit:
            raise NoProgressError(
                f"the simulation passed its budget of {self.limit:,} events without the job "
                "finishing: it makes (almost) no progress at these settings; check `slurm-spot "
                "plan` with the same numbers, or lower --runs / --job-hours")


@dataclass(frozen=True)
class SimParams:
    """One simulated setup. Seconds, USD per node-hour, interruptions per spot node-hour.

    ``interval_s`` is the periodic checkpoint interval (compute seconds) of ``plain`` and
    ``periodic``; ``slurm-spot`` and ``elastic`` use Daly's interval unless ``daly`` is False.
    """

    nodes: int
    job_hours: float
    checkpoint_s: float
    restart_s: float
    node_rate_per_h: float
    interval_s: float = 1200.0
    notice_s: float = 120.0
    boot_s: float = 120.0
    slurmd_timeout_s: float = 300.0
    requeue_delay_s: float = 121.0
    detect_s: float = 30.0
    on_demand_nodes: int = 0
    spot_usd_per_h: float = 0.0
    on_demand_usd_per_h: float = 0.0
    daly: bool = True

    def check(self) -> None:
        """Raises BadInputError naming the first bad field."""
        if self.nodes < 1 or not 0 <= self.on_demand_nodes <= self.nodes:
            raise BadInputError("--nodes must be >= 1 and --on-demand-nodes in [0, nodes]")
        for name in ("job_hours", "checkpoint_s", "interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise BadInputError(f"{name.replace('_', '-')} {value!r}: must be > 0")
        for name in ("restart_s", "notice_s", "boot_s", "slurmd_timeout_s", "requeue_delay_s",
                     "detect_s", "node_rate_per_h", "spot_usd_per_h", "on_demand_usd_per_h"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise BadInputError(f"{name.replace('_', '-')} {value!r}: must be >= 0")

    @property
    def spot_nodes(self) -> int:
        return self.nodes - self.on_demand_nodes

    @property
    def job_mtbf_s(self) -> float:
        """Mean wall seconds between interruptions of the job (its spot nodes)."""
        return math.inf if self.spot_nodes == 0 else job_mtbf_s(self.node_rate_per_h, self.spot_nodes)

    def interval_for(self, strategy: str) -> float:
        """The periodic checkpoint interval (compute seconds) ``strategy`` uses."""
        if strategy in ("slurm-spot", "elastic") and self.daly and math.isfinite(self.job_mtbf_s):
            return daly_interval_s(self.checkpoint_s, self.job_mtbf_s)
        return self.interval_s

    def downtime_s(self, strategy: str) -> float:
        """Wall seconds from an interruption (without a usable notice) until the job computes
        again, for the requeueing strategies."""
        if strategy == "plain":
            return self.slurmd_timeout_s + self.requeue_delay_s + self.boot_s + self.restart_s
        if strategy == "slurm-spot":
            return max(self.notice_s, self.boot_s) + self.restart_s
        return self.detect_s + self.boot_s + self.restart_s

    def expected_wall_s(self, strategy: str) -> float:
        """An analytic estimate of the expected wall seconds of ``strategy`` (``inf``: never
        finishes), used to refuse hopeless or too long simulations before running them.
        ``plain``/``periodic``/``slurm-spot`` without notice checkpoint: Daly's complete model
        (:func:`slurm_spot.cost.planner.expected_wall_s`) with the strategy's downtime as R.
        ``slurm-spot`` with notice checkpoints: nothing is recomputed; a recovery of ``r``
        seconds that restarts on each interruption takes ``M (e^(r/M) - 1)`` on average, so
        useful time is a share ``e^(-r/M)``. ``elastic``: each interruption pauses the job
        ``2 restart_s`` (the failure and the join) and costs ``(boot - notice) / N`` of speed."""
        job_s = self.job_hours * 3600.0
        mtbf = self.job_mtbf_s
        tau = self.interval_for(strategy)
        stretch = 1 + self.checkpoint_s / tau
        if math.isinf(mtbf):
            return job_s * stretch
        if strategy == "elastic":
            lost = (2 * self.restart_s + max(0.0, self.boot_s - self.notice_s) / self.nodes) / mtbf
            return math.inf if lost >= 1 else job_s * stretch / (1 - lost)
        if strategy == "slurm-spot" and self.notice_s >= self.checkpoint_s:
            recovery = max(self.checkpoint_s, self.boot_s) + self.restart_s
            try:
                return job_s * stretch * math.exp(recovery / mtbf)
            except OverflowError:
                return math.inf
        return expected_wall_s(job_s, tau, self.checkpoint_s, self.downtime_s(strategy), mtbf)

    def expected_steps(self, strategy: str) -> float:
        """Expected event-loop steps of one run: its checkpoints plus a few per interruption."""
        wall = self.expected_wall_s(strategy)
        return self.job_hours * 3600.0 / self.interval_for(strategy) + 3 * wall / self.job_mtbf_s

    @property
    def cost_per_wall_h(self) -> float:
        return self.spot_nodes * self.spot_usd_per_h + self.on_demand_nodes * self.on_demand_usd_per_h


@dataclass
class RunResult:
    """One simulated run: wall seconds, interruptions, and a timeline of
    ``(wall s, kind)`` marks (``interrupt``, ``resume``) for plots."""

    wall_s: float
    interruptions: int
    marks: list[tuple[float, str]] = field(default_factory=list)


def simulate_run(p: SimParams, strategy: str, rng: random.Random,
                 budget: StepBudget | None = None, keep_marks: bool = True) -> RunResult:
    """Simulate ``strategy`` once; ``budget`` (default: :data:`MAX_STEPS`) bounds its steps;
    ``keep_marks`` False leaves ``marks`` empty (memory stays flat however many
    interruptions).

    Raises:
        BadInputError: unknown strategy.
        NoProgressError: the budget ran out before the job finished.
    """
    if strategy not in STRATEGIES:
        raise BadInputError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    budget = budget or StepBudget(MAX_STEPS)
    result = RunResult(0.0, 0)
    if not keep_marks:
        result.marks = _Discard()
    if strategy == "elastic":
        return _run_elastic(p, rng, budget, result)
    return _run_requeue(p, strategy, rng, budget, result)


class _Discard(list[tuple[float, str]]):
    """A ``marks`` list that keeps nothing."""

    def append(self, item: tuple[float, str]) -> None:
        pass


def _next_gap(p: SimParams, rng: random.Random) -> float:
    rate = p.spot_nodes * p.node_rate_per_h / 3600.0
    return math.inf if rate <= 0 else rng.expovariate(rate)


def _run_requeue(p: SimParams, strategy: str, rng: random.Random, budget: StepBudget,
                 result: RunResult) -> RunResult:
    """plain / periodic / slurm-spot: the whole job stops and restarts on each interruption."""
    job_s = p.job_hours * 3600.0
    tau = p.interval_for(strategy)
    notice_ckpt = strategy == "slurm-spot" and p.notice_s >= p.checkpoint_s
    down = p.downtime_s(strategy)
    t, saved = 0.0, 0.0
    nxt = _next_gap(p, rng)
    while True:
        budget.take()
        seg = min(tau, job_s - saved)
        last = saved + seg >= job_s - 1e-9
        need = seg + (0.0 if last else p.checkpoint_s)
        if t + need <= nxt:
            t += need
            saved += seg
            if last:
                result.wall_s = t
                return result
            continue
        # interrupted at nxt (a notice time when one is given)
        progress = nxt - t
        t = nxt
        result.interruptions += 1
        result.marks.append((t, "interrupt"))
        if notice_ckpt:
            saved += min(progress, seg)  # the notice checkpoint keeps the work done so far
            if saved >= job_s - 1e-9:
                result.wall_s = t
                return result
            # the save runs inside the notice; the replacement boots meanwhile
            recovery = max(p.checkpoint_s, p.boot_s) + p.restart_s
        else:
            recovery = down
        # recover; another interruption during recovery starts it again (Daly's model)
        while True:
            budget.take()
            nxt = t + _next_gap(p, rng)
            if nxt >= t + recovery:
                t += recovery
                break
            t = nxt
            result.interruptions += 1
            result.marks.append((t, "interrupt"))
            recovery = down
        result.marks.append((t, "resume"))


def _run_elastic(p: SimParams, rng: random.Random, budget: StepBudget,
                 result: RunResult) -> RunResult:
    """Survivors continue at reduced speed; replacements join after their boot."""
    job_s = p.job_hours * 3600.0
    tau = p.interval_for("elastic")
    t, done, since_ckpt = 0.0, 0.0, 0.0
    joins: list[float] = []  # wall times replacements join
    pause_until = 0.0
    nxt = _next_gap(p, rng)
    ckpt_left = 0.0
    while done < job_s - EPS_S:
        budget.take()
        speed = (p.nodes - len(joins)) / p.nodes
        horizon = min(nxt, min(joins, default=math.inf))
        if t < pause_until or speed <= 0:
            t = min(pause_until, horizon) if t < pause_until else horizon
        elif ckpt_left > EPS_S:
            step_end = min(t + ckpt_left, horizon)
            ckpt_left -= step_end - t
            t = step_end
        else:
            to_ckpt = (tau - since_ckpt) / speed
            to_end = (job_s - done) / speed
            step_end = min(t + to_ckpt, t + to_end, horizon)
            gained = (step_end - t) * speed
            done += gained
            since_ckpt += gained
            t = step_end
            if done >= job_s - EPS_S:
                break
            if since_ckpt >= tau - EPS_S:
                since_ckpt, ckpt_left = 0.0, p.checkpoint_s
        if t >= nxt:
            result.interruptions += 1
            result.marks.append((t, "interrupt"))
            joins.append(t + max(0.0, p.boot_s - p.notice_s))
            pause_until = max(pause_until, t) + p.restart_s
            nxt = t + _next_gap(p, rng)
        while joins and t >= min(joins):
            joins.remove(min(joins))
            pause_until = max(pause_until, t) + p.restart_s
            result.marks.append((t, "resume"))
    result.wall_s = t
    return result


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95 % confidence half-width (normal approximation over runs)."""

    mean: float
    ci95: float

    @classmethod
    def of(cls, values: list[float]) -> Estimate:
        if len(values) < 2:
            return cls(values[0] if values else math.nan, math.nan)
        return cls(statistics.fmean(values), Z95 * statistics.stdev(values) / math.sqrt(len(values)))


@dataclass(frozen=True)
class StrategyResult:
    """Aggregates of ``runs`` runs of one strategy. Hours, USD, fractions."""

    strategy: str
    interval_s: float
    wall_h: Estimate
    cost_usd: Estimate
    goodput: Estimate
    interruptions: Estimate
    saving_vs_on_demand: float
    extra_wall_vs_on_demand: float


@dataclass(frozen=True)
class Baseline:
    """The same compute hours on on-demand nodes only (no interruptions, no checkpoints)."""

    wall_h: float
    cost_usd: float


def on_demand_baseline(p: SimParams) -> Baseline:
    """Wall time and cost of the job's compute hours on on-demand nodes."""
    return Baseline(p.job_hours, p.job_hours * p.nodes * p.on_demand_usd_per_h)


def simulate(p: SimParams, strategies: tuple[str, ...] = STRATEGIES, runs: int = 200,
             seed: int = 0) -> tuple[Baseline, list[StrategyResult]]:
    """Run each strategy ``runs`` times with its own ``random.Random(seed)`` stream (the same
    seed gives the same numbers).

    Raises:
        BadInputError: bad parameters, unknown strategy, ``runs < 2``, or an estimated
            (:meth:`SimParams.expected_steps`) total over :data:`MAX_STEPS` events.
        NoProgressError: a strategy's expected waste is ~100 % (analytic estimate,
            :meth:`SimParams.expected_wall_s`), or the runs passed :data:`MAX_STEPS` steps.
    """
    p.check()
    if runs < 2:
        raise BadInputError(f"--runs {runs}: at least 2 (confidence intervals need them)")
    job_s = p.job_hours * 3600.0
    hopeless = [st for st in strategies
                if p.expected_wall_s(st) * (1 - NEVER_FINISHES_WASTE) >= job_s]
    if hopeless:
        raise NoProgressError(
            f"the job never finishes in practice with {', '.join(hopeless)}: a checkpoint "
            f"({p.checkpoint_s:g} s) and recovery cost about as much as, or more than, the "
            f"{p.spot_nodes}-spot-node job's MTBF ({p.job_mtbf_s:.3g} s), so expected waste is "
            f"~100 % (`slurm-spot plan` gives the same); use fewer nodes, a less interrupted "
            "type or a faster checkpoint, or leave those out with --strategy")
    steps = runs * sum(p.expected_steps(st) for st in strategies)
    if steps > MAX_STEPS:
        fit = int(runs * MAX_STEPS / steps)
        fix = (f"lower --runs (to about {fit}) or --job-hours, or raise --interval-s" if fit >= 2
               else "even 2 runs exceed it: lower --job-hours or raise --interval-s")
        raise BadInputError(f"this simulation would take ~{steps:,.0f} events "
                            f"(limit {MAX_STEPS:,}): {fix}")
    budget = StepBudget(MAX_STEPS)
    base = on_demand_baseline(p)
    out = []
    for strategy in strategies:
        rng = random.Random(f"{seed}:{strategy}")
        walls, counts = [], []
        for _ in range(runs):
            r = simulate_run(p, strategy, rng, budget, keep_marks=False)
            walls.append(r.wall_s)
            counts.append(float(r.interruptions))
        wall = Estimate.of([w / 3600 for w in walls])
        cost = Estimate.of([w / 3600 * p.cost_per_wall_h for w in walls])
        out.append(StrategyResult(
            strategy=strategy, interval_s=p.interval_for(strategy), wall_h=wall, cost_usd=cost,
            goodput=Estimate.of([job_s / w for w in walls]),
            interruptions=Estimate.of(counts),
            saving_vs_on_demand=(1 - cost.mean / base.cost_usd) if base.cost_usd > 0 else math.nan,
            extra_wall_vs_on_demand=wall.mean / base.wall_h - 1,
        ))
    return base, out
