"""A discrete-event simulation of one multi-node job on spot instances under interruptions.

Events are interruptions (Poisson, ``spot_nodes * rate`` per hour of wall time, also during
checkpoints and recoveries, as in Daly 2006), checkpoint completions, recoveries and the job's
end. Like is compared with like: in one call of :func:`simulate`, run ``i`` of every strategy
sees the same interruption times (:class:`InterruptionTrace`, common random numbers), and every
strategy checkpoints at the same interval (:meth:`SimParams.interval_for`: Daly's for the job's
MTBF unless ``interval_s`` is given), so the rows differ only by how each strategy recovers.
Four strategies (``STRATEGIES``):

- ``plain``: plain Slurm. Nothing acts on the notice; slurmctld notices the dead node after
  ``SlurmdTimeout``, requeues the job with its requeue delay (~121 s, docs/local-slurm.md), the
  replacement boots, the job restarts from its last periodic checkpoint.
- ``periodic``: periodic checkpoints with expedited requeue: the reconciler sees the reclaimed
  instance within ``detect_s`` and clears the delay; then boot, restart, last checkpoint.
- ``slurm-spot``: checkpoint on notice (when the notice is at least as long as a checkpoint),
  expedited requeue, the replacement powered up at the notice (its boot hides behind the
  notice), periodic checkpoints for the rest.
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

    ``interval_s`` is the periodic checkpoint interval (compute seconds) of every strategy;
    None (the default) means Daly's interval for the job's MTBF (:meth:`interval_for`).
    """

    nodes: int
    job_hours: float
    checkpoint_s: float
    restart_s: float
    node_rate_per_h: float
    interval_s: float | None = None
    notice_s: float = 120.0
    boot_s: float = 120.0
    slurmd_timeout_s: float = 300.0
    requeue_delay_s: float = 121.0
    detect_s: float = 30.0
    on_demand_nodes: int = 0
    spot_usd_per_h: float = 0.0
    on_demand_usd_per_h: float = 0.0

    def check(self) -> None:
        """Raises BadInputError naming the first bad field."""
        if self.nodes < 1 or not 0 <= self.on_demand_nodes <= self.nodes:
            raise BadInputError("--nodes must be >= 1 and --on-demand-nodes in [0, nodes]")
        for name in ("job_hours", "checkpoint_s", "interval_s"):
            value = getattr(self, name)
            if value is None:
                continue
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
        """The periodic checkpoint interval (compute seconds) ``strategy`` uses: ``interval_s``
        when given, else Daly's optimum (:func:`slurm_spot.cost.planner.daly_interval_s`) for
        the job's MTBF, which every strategy shares (the same spot nodes and hazard); a job
        without spot nodes is never interrupted and checkpoints never (one segment).
        ``strategy`` is kept so a per-strategy failure model can differ here, in one place."""
        del strategy  # every strategy has the same failure model in this simulator
        if self.interval_s is not None:
            return self.interval_s
        if math.isinf(self.job_mtbf_s):
            return self.job_hours * 3600.0
        return daly_interval_s(self.checkpoint_s, self.job_mtbf_s)

    def interval_policy(self) -> str:
        """How :meth:`interval_for` picks the interval, as one sentence for the output."""
        tau = self.interval_for("plain")
        if self.interval_s is not None:
            return f"every strategy checkpoints every {tau / 60:.1f} min (--interval-s)"
        if math.isinf(self.job_mtbf_s):
            return "no spot nodes: no interruptions and no periodic checkpoints"
        return (f"every strategy checkpoints at Daly's interval for the job's MTBF "
                f"({tau / 60:.1f} min)")

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
    def spot_rate_per_s(self) -> float:
        """Interruptions of the job per wall second (all its spot nodes)."""
        return self.spot_nodes * self.node_rate_per_h / 3600.0

    @property
    def cost_per_wall_h(self) -> float:
        return self.spot_nodes * self.spot_usd_per_h + self.on_demand_nodes * self.on_demand_usd_per_h


class InterruptionTrace:
    """The interruption times (wall seconds from the job's start) of one simulated run: a
    Poisson process of ``rate_per_s``, drawn lazily from ``rng`` and kept, so that
    :meth:`replay` gives every strategy of the run the same times (common random numbers).

    Each strategy run reads it through its own cursor (:meth:`replay`); the times are cumulative
    exponential gaps, which is what a strategy drawing a fresh gap at each interruption would
    see too (the process is memoryless)."""

    def __init__(self, rate_per_s: float, rng: random.Random) -> None:
        self.rate_per_s = rate_per_s
        self.rng = rng
        self.times: list[float] = []

    def at(self, k: int) -> float:
        """The ``k``-th interruption time (0-based); ``inf`` when the rate is 0."""
        if self.rate_per_s <= 0:
            return math.inf
        while len(self.times) <= k:
            last = self.times[-1] if self.times else 0.0
            self.times.append(last + self.rng.expovariate(self.rate_per_s))
        return self.times[k]

    def replay(self) -> TraceCursor:
        """A cursor at the first interruption."""
        return TraceCursor(self)


class TraceCursor:
    """One strategy's reading position in an :class:`InterruptionTrace`."""

    def __init__(self, trace: InterruptionTrace) -> None:
        self.trace = trace
        self.k = 0

    def next(self) -> float:
        """The next interruption's wall time (seconds), advancing the cursor."""
        when = self.trace.at(self.k)
        self.k += 1
        return when


@dataclass
class RunResult:
    """One simulated run: wall seconds, interruptions, and a timeline of
    ``(wall s, kind)`` marks (``interrupt``, ``resume``) for plots."""

    wall_s: float
    interruptions: int
    marks: list[tuple[float, str]] = field(default_factory=list)


def simulate_run(p: SimParams, strategy: str, trace: InterruptionTrace | random.Random,
                 budget: StepBudget | None = None, keep_marks: bool = True) -> RunResult:
    """Simulate ``strategy`` once under ``trace``'s interruptions (a ``random.Random``: a new
    trace drawn from it); ``budget`` (default: :data:`MAX_STEPS`) bounds its steps;
    ``keep_marks`` False leaves ``marks`` empty (memory stays flat however many
    interruptions).

    Raises:
        BadInputError: unknown strategy.
        NoProgressError: the budget ran out before the job finished.
    """
    if strategy not in STRATEGIES:
        raise BadInputError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    budget = budget or StepBudget(MAX_STEPS)
    if isinstance(trace, random.Random):
        trace = InterruptionTrace(p.spot_rate_per_s, trace)
    result = RunResult(0.0, 0)
    if not keep_marks:
        result.marks = _Discard()
    if strategy == "elastic":
        return _run_elastic(p, trace.replay(), budget, result)
    return _run_requeue(p, strategy, trace.replay(), budget, result)


class _Discard(list[tuple[float, str]]):
    """A ``marks`` list that keeps nothing."""

    def append(self, item: tuple[float, str]) -> None:
        pass


def _run_requeue(p: SimParams, strategy: str, trace: TraceCursor, budget: StepBudget,
                 result: RunResult) -> RunResult:
    """plain / periodic / slurm-spot: the whole job stops and restarts on each interruption."""
    job_s = p.job_hours * 3600.0
    tau = p.interval_for(strategy)
    notice_ckpt = strategy == "slurm-spot" and p.notice_s >= p.checkpoint_s
    down = p.downtime_s(strategy)
    t, saved = 0.0, 0.0
    nxt = trace.next()
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
            nxt = trace.next()
            if nxt >= t + recovery:
                t += recovery
                break
            t = nxt
            result.interruptions += 1
            result.marks.append((t, "interrupt"))
            recovery = down
        result.marks.append((t, "resume"))


def _run_elastic(p: SimParams, trace: TraceCursor, budget: StepBudget,
                 result: RunResult) -> RunResult:
    """Survivors continue at reduced speed; replacements join after their boot."""
    job_s = p.job_hours * 3600.0
    tau = p.interval_for("elastic")
    t, done, since_ckpt = 0.0, 0.0, 0.0
    joins: list[float] = []  # wall times replacements join
    pause_until = 0.0
    nxt = trace.next()
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
            nxt = trace.next()
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
    """Run each strategy ``runs`` times; run ``i`` of every strategy sees the same interruption
    times (one :class:`InterruptionTrace` per run, drawn from ``random.Random(f"{seed}:run{i}")``:
    the same seed gives the same numbers, and the strategies differ only by how they recover).

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
    walls: dict[str, list[float]] = {st: [] for st in strategies}
    counts: dict[str, list[float]] = {st: [] for st in strategies}
    for i in range(runs):
        trace = InterruptionTrace(p.spot_rate_per_s, random.Random(f"{seed}:run{i}"))
        for strategy in strategies:
            r = simulate_run(p, strategy, trace, budget, keep_marks=False)
            walls[strategy].append(r.wall_s)
            counts[strategy].append(float(r.interruptions))
    out = []
    for strategy in strategies:
        wall = Estimate.of([w / 3600 for w in walls[strategy]])
        cost = Estimate.of([w / 3600 * p.cost_per_wall_h for w in walls[strategy]])
        out.append(StrategyResult(
            strategy=strategy, interval_s=p.interval_for(strategy), wall_h=wall, cost_usd=cost,
            goodput=Estimate.of([job_s / w for w in walls[strategy]]),
            interruptions=Estimate.of(counts[strategy]),
            saving_vs_on_demand=(1 - cost.mean / base.cost_usd) if base.cost_usd > 0 else math.nan,
            extra_wall_vs_on_demand=wall.mean / base.wall_h - 1,
        ))
    return base, out
