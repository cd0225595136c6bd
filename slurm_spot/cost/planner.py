"""Checkpoint-interval and waste formulas for a job under spot interruptions (pure functions).

Model (the one Young 1974 and Daly 2006 use): interruptions of one node arrive as a Poisson
process with a constant rate, independent across nodes, so an ``N``-node job is interrupted at
``N`` times that rate, and its mean time between interruptions is ``M = M_node / N``. A job of
``T_s`` seconds of compute checkpoints every ``tau`` seconds of compute, each checkpoint costing
``C`` seconds; after an interruption it spends ``R`` seconds (requeue, boot, restart) before
computing again from the last checkpoint.

- Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
  ``tau = sqrt(2 C M)``.
- Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps", Future
  Generation Computer Systems 22(3), 2006 (eq. 37 and 20): for ``C < 2M``,
  ``tau = sqrt(2 C M) [1 + 1/3 sqrt(C / 2M) + 1/9 (C / 2M)] - C``, else ``tau = M``; the
  expected wall time is ``T_w = M e^(R/M) (e^((tau + C)/M) - 1) T_s / tau``.

AWS Spot Advisor publishes a "frequency of interruption" band per instance type and region: the
share of that type's spot instances AWS interrupted over the last month. Assumption stated here
and in the CLI: that share is ``1 - exp(-lambda * 730 h)`` for a constant hazard ``lambda``, so
``lambda = -ln(1 - p) / 730 h`` (730 h = one average month), and a band stands for its midpoint
(``>20%`` for 25 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_spot.errors import BadInputError

HOURS_PER_MONTH = 730.0
# Waste at or above this (wall time >= 1000 x the compute time) reads "never finishes".
NEVER_FINISHES_WASTE = 0.999  # 365 days * 24 h / 12
def rate_from_monthly_fraction(fraction: float) -> float:
    """Interruptions per node-hour for a monthly interruption fraction ``0 <= p < 1`` under a
    constant hazard: ``-ln(1 - p) / 730``.

    Raises:
        BadInputError: ``p`` outside ``[0, 1)`` or not finite.
    """
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise BadInputError(f"interruption rate {fraction!r}: a fraction per month in [0, 1)")
    return -math.log1p(-fraction) / HOURS_PER_MONTH


def job_mtbf_s(node_rate_per_h: float, nodes: int) -> float:
    """Mean seconds between interruptions of a job on ``nodes`` spot nodes, each interrupted at
    ``node_rate_per_h`` per hour (independent, constant hazard): ``3600 / (N * rate)``;
    ``inf`` at rate 0."""
    if nodes < 1:
        raise BadInputError(f"nodes {nodes}: at least 1")
    if node_rate_per_h <= 0:
        return math.inf
    return 3600.0 / (nodes * node_rate_per_h)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum compute time between checkpoints, ``sqrt(2 C M)`` (seconds)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's (2006, eq. 37) higher-order optimum compute time between checkpoints (seconds):
    ``sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for ``C < 2M``, else ``M``."""
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def segment_wall_s(work_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected wall seconds to get one segment of ``work_s`` compute plus its ``checkpoint_s``
    save done when every interruption (during work, save or restart) costs ``restart_s`` and
    the segment's progress: ``M e^(R/M) (e^((w + C)/M) - 1)`` (Daly 2006, eq. 20 per segment).
    ``inf`` where that exceeds a float (the segment practically never completes: ``w + C + R``
    is hundreds of MTBFs), never an ``OverflowError``."""
    if math.isinf(mtbf_s):
        return work_s + checkpoint_s
    try:
        return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((work_s + checkpoint_s) / mtbf_s)
    except OverflowError:
        return math.inf


def expected_wall_s(
    job_s: float, interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float
) -> float:
    """Expected wall seconds of a job of ``job_s`` compute seconds that checkpoints every
    ``interval_s`` of compute (the last, shorter segment ends the job without a checkpoint).

    Raises:
        BadInputError: a non-positive or non-finite interval, job length or cost.

    ``inf`` when the job practically never finishes (see :func:`segment_wall_s`).
    """
    if not all(math.isfinite(v) for v in (job_s, interval_s, checkpoint_s, restart_s)) or (
            interval_s <= 0 or job_s <= 0 or checkpoint_s < 0 or restart_s < 0):
        raise BadInputError("job length and interval must be finite and > 0, checkpoint and "
                            "restart finite and >= 0")
    full = math.floor(job_s / interval_s + 1e-9)
    rest = job_s - full * interval_s
    if rest <= 1e-9 and full > 0:
        full, rest = full - 1, interval_s
    wall = segment_wall_s(rest, 0.0, restart_s, mtbf_s)
    if full > 0:  # (0 * inf would be NaN)
        wall += full * segment_wall_s(interval_s, checkpoint_s, restart_s, mtbf_s)
    return wall


def waste_fraction(interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected share of wall time that is not useful compute (checkpoints, lost work,
    restarts) in steady state: ``1 - tau / (M e^(R/M) (e^((tau + C)/M) - 1))``; 1.0 when that
    denominator exceeds a float."""
    return 1.0 - interval_s / segment_wall_s(interval_s, checkpoint_s, restart_s, mtbf_s)


def notice_waste_fraction(
    interval_s: float, checkpoint_s: float, restart_s: float, mtbf_s: float
) -> float:
    """Waste when every interruption gives a notice long enough to save in: nothing is
    recomputed; each interruption costs one save and one restart, ``(C + R)`` per ``M`` of wall
    time, on top of the periodic saves: ``1 - 1 / ((1 + C/tau) / (1 - (C + R)/M))``, or 1 when
    interruptions come faster than ``C + R``."""
    lost = (checkpoint_s + restart_s) / mtbf_s
    if lost >= 1:
        return 1.0
    stretch = (1 + checkpoint_s / interval_s) / (1 - lost)
    return 1.0 - 1.0 / stretch


@dataclass(frozen=True)
class PlanInput:
    """What ``slurm-spot plan`` is given. Seconds and per-node-hour rates."""

    checkpoint_s: float
    restart_s: float
    nodes: int
    notice_s: float
    node_rate_per_h: float
    rate_source: str
    job_hours: float | None = None


@dataclass(frozen=True)
class Plan:
    """The planner's answer (what ``plan --json`` prints, plus prices when known)."""

    node_rate_per_h: float
    mtbf_node_h: float
    mtbf_job_h: float
    young_interval_s: float
    daly_interval_s: float
    waste_fraction: float
    notice_checkpoint: bool
    waste_fraction_with_notice: float | None
    expected_wall_h: float | None
    expected_wall_h_with_notice: float | None
    assumption: str
    never_finishes: bool = False


def plan(inp: PlanInput) -> Plan:
    """Intervals, waste and (with ``job_hours``) expected wall time for ``inp``.

    The waste is Daly's complete model at Daly's interval (no notice). When ``notice_s`` is at
    least ``checkpoint_s`` a notice-time checkpoint is possible and the ``*_with_notice`` figures
    assume one is taken at every interruption.

    Raises:
        BadInputError: negative or non-finite costs, ``checkpoint_s <= 0`` or fewer than one
            node.

    ``never_finishes`` is True when even the better of the two wastes is at least
    :data:`NEVER_FINISHES_WASTE` (the checkpoint and restart cost about as much as, or more
    than, the job's MTBF); the wall times are then huge or ``inf``.
    """
    if not all(math.isfinite(v) for v in (inp.checkpoint_s, inp.restart_s, inp.notice_s)) or (
            inp.checkpoint_s <= 0 or inp.restart_s < 0 or inp.notice_s < 0):
        raise BadInputError("--checkpoint-s must be > 0; --restart-s and --notice-s >= 0 "
                            "(all finite)")
    mtbf = job_mtbf_s(inp.node_rate_per_h, inp.nodes)
    if math.isinf(mtbf):
        young = daly = math.inf
        waste = 0.0
    else:
        young = young_interval_s(inp.checkpoint_s, mtbf)
        daly = daly_interval_s(inp.checkpoint_s, mtbf)
        waste = waste_fraction(daly, inp.checkpoint_s, inp.restart_s, mtbf)
    notice_ok = inp.notice_s >= inp.checkpoint_s and not math.isinf(mtbf)
    waste_notice = (notice_waste_fraction(daly, inp.checkpoint_s, inp.restart_s, mtbf)
                    if notice_ok else None)
    wall = wall_notice = None
    if inp.job_hours is not None:
        job_s = inp.job_hours * 3600
        wall = (job_s if math.isinf(mtbf) else
                expected_wall_s(job_s, daly, inp.checkpoint_s, inp.restart_s, mtbf)) / 3600
        if waste_notice is not None:
            wall_notice = inp.job_hours / (1 - waste_notice) if waste_notice < 1 else math.inf
    node_mtbf_h = math.inf if inp.node_rate_per_h <= 0 else 1 / inp.node_rate_per_h
    return Plan(
        node_rate_per_h=inp.node_rate_per_h, mtbf_node_h=node_mtbf_h, mtbf_job_h=mtbf / 3600,
        young_interval_s=young, daly_interval_s=daly, waste_fraction=waste,
        notice_checkpoint=notice_ok, waste_fraction_with_notice=waste_notice,
        expected_wall_h=wall, expected_wall_h_with_notice=wall_notice,
        assumption=f"{inp.rate_source}; constant hazard per node, independent nodes "
                   f"(monthly fraction p -> rate -ln(1-p)/{HOURS_PER_MONTH:g} h)",
        never_finishes=min(waste, 1.0 if waste_notice is None else waste_notice)
        >= NEVER_FINISHES_WASTE,
    )


@dataclass(frozen=True)
class Candidate:
    """One instance type in ``plan --compare``: its throughput (steps per second of one job on
    ``nodes`` of them), prices (USD per node-hour) and interruption rate (per node-hour)."""

    instance_type: str
    steps_per_s: float
    spot_usd_per_h: float
    on_demand_usd_per_h: float
    node_rate_per_h: float


@dataclass(frozen=True)
class Ranked:
    """A candidate's expected outcome; ``meets_deadline`` is None without a deadline; an
    ``expected_wall_h`` (and cost) of ``inf`` means the job practically never finishes."""

    instance_type: str
    compute_h: float
    expected_wall_h: float
    expected_cost_usd: float
    on_demand_cost_usd: float
    daly_interval_s: float
    meets_deadline: bool | None


def compare(
    candidates: list[Candidate], work_steps: float, nodes: int, checkpoint_s: float,
    restart_s: float, deadline_h: float | None = None,
) -> list[Ranked]:
    """Rank candidate instance types by expected spot cost to finish ``work_steps`` (cheapest
    first; those missing ``deadline_h`` after those meeting it), each at its own interruption
    rate and price, checkpointing at its own Daly interval.

    Raises:
        BadInputError: no candidates, work or throughput not positive.
    """
    if not candidates:
        raise BadInputError("--compare needs at least one --candidate TYPE:STEPS_PER_S")
    if not (math.isfinite(work_steps) and work_steps > 0):
        raise BadInputError(f"--work-steps {work_steps}: must be a finite number > 0")
    ranked = []
    for c in candidates:
        if not (math.isfinite(c.steps_per_s) and c.steps_per_s > 0):
            raise BadInputError(f"candidate {c.instance_type}: steps/s must be > 0")
        job_s = work_steps / c.steps_per_s
        mtbf = job_mtbf_s(c.node_rate_per_h, nodes)
        interval = job_s if math.isinf(mtbf) else daly_interval_s(checkpoint_s, mtbf)
        wall_s = expected_wall_s(job_s, interval, checkpoint_s, restart_s, mtbf)
        wall_h = wall_s / 3600
        ranked.append(Ranked(
            instance_type=c.instance_type, compute_h=job_s / 3600, expected_wall_h=wall_h,
            expected_cost_usd=wall_h * nodes * c.spot_usd_per_h,
            on_demand_cost_usd=job_s / 3600 * nodes * c.on_demand_usd_per_h,
            daly_interval_s=interval,
            meets_deadline=None if deadline_h is None else wall_h <= deadline_h,
        ))
    return sorted(ranked, key=lambda r: (r.meets_deadline is False, r.expected_cost_usd))
