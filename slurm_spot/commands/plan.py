"""``slurm-spot plan``: how often to checkpoint, what interruptions cost, which type is cheapest."""

from __future__ import annotations

import math
from typing import Any

import click

from slurm_spot.commands.common import (
    AppContext,
    json_option,
    optional_config,
    pass_app,
    print_json,
)
from slurm_spot.commands.model_options import (
    check_prices,
    interruption_options,
    node_rate_of,
    price_options,
)
from slurm_spot.config import SpotConfig
from slurm_spot.cost import plan, planner
from slurm_spot.cost.plan import (
    MAX_JOB_HOURS,
    MAX_NODES,
    MAX_SECONDS,
    MAX_STEPS,
    check_number,
    finite,
    unverified_line,
)
from slurm_spot.errors import BadInputError


@click.command("plan")
@click.option("--checkpoint-s", type=float, default=None,
              help="Seconds one checkpoint takes (C).")
@click.option("--checkpoint-dir", default=None,
              help="Instead of --checkpoint-s: a job's checkpoint directory (local, or "
                   "s3://bucket/prefix); C is the median save_s its checkpoints recorded.")
@click.option("--restart-s", type=float, default=300.0, show_default=True,
              help="Seconds from an interruption until the job computes again (R).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Spot nodes of the job (N).")
@click.option("--notice-s", type=float, default=120.0, show_default=True,
              help="Interruption notice (AWS: 120 s, GCP: 30 s).")
@interruption_options
@click.option("--job-hours", type=float, default=None, help="Compute hours of the job (L).")
@price_options
@click.option("--compare", is_flag=True, help="Rank --candidate types by expected cost to finish.")
@click.option("--work-steps", type=float, default=None, help="With --compare: the job's steps.")
@click.option("--candidate", "candidates", multiple=True,
              help="With --compare: TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H] (repeat); without "
                   "SPOT_USD_H the spot price is looked up.")
@click.option("--deadline-h", type=float, default=None, help="With --compare: wall-time limit.")
@json_option
@pass_app
def plan_command(app: AppContext, checkpoint_s: float | None, checkpoint_dir: str | None,
                 restart_s: float, nodes: int,
                 notice_s: float, band: str | None, rate: str | None, mtbf_h: float | None,
                 job_hours: float | None, instance_type: str | None, spot_usd_h: float | None,
                 on_demand_usd_h: float | None, compare: bool, work_steps: float | None,
                 candidates: tuple[str, ...], deadline_h: float | None, region: str | None,
                 as_json: bool) -> None:
    """Checkpoint interval (Young, Daly 2006), expected waste, run time and cost under spot
    interruptions. Assumes a constant interruption hazard per node (the output says so; the
    JSON's assumption field). C comes from --checkpoint-s or, with --checkpoint-dir, from the
    job's own recorded saves (the output says which checkpoints were read)."""
    check_number("--restart-s", restart_s, MAX_SECONDS, unit=" seconds")
    check_number("--notice-s", notice_s, MAX_SECONDS, unit=" seconds")
    check_number("--nodes", nodes, MAX_NODES, 1)
    check_number("--job-hours", job_hours, MAX_JOB_HOURS, low_ok=False, unit=" hours")
    check_prices(spot_usd_h, on_demand_usd_h)
    check_number("--work-steps", work_steps, MAX_STEPS, low_ok=False)
    check_number("--deadline-h", deadline_h, 1000 * MAX_JOB_HOURS, low_ok=False, unit=" hours")
    if not compare:
        given = [name for name, value in (("--candidate", candidates), ("--work-steps", work_steps),
                                          ("--deadline-h", deadline_h)) if value]
        if given:
            raise BadInputError(f"{', '.join(given)}: only with --compare (add --compare to "
                                "rank instance types)")
    else:
        given = [name for name, value in (("--instance-type", instance_type),
                                          ("--job-hours", job_hours), ("--spot-usd-h", spot_usd_h),
                                          ("--on-demand-usd-h", on_demand_usd_h))
                 if value is not None]
        if given:
            raise BadInputError(f"{', '.join(given)}: not with --compare (each --candidate "
                                "names its type, steps/s and spot price: "
                                "TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H]; --work-steps the job)")
    def site() -> SpotConfig | None:
        return optional_config(app)

    checkpoint_s, measured = plan.checkpoint_cost(site, checkpoint_s, checkpoint_dir)
    if compare:
        if work_steps is None:
            raise BadInputError("--compare needs --work-steps (the job's total steps)")
        default = node_rate_of(app, band, rate, mtbf_h) if (band or rate or mtbf_h) else None
        found = plan.compare_candidates(site, checkpoint_s, restart_s, nodes, default,
                                        work_steps, candidates, deadline_h, region)
        _print_comparison(found, as_json, measured)
        return
    rate_h = node_rate_of(app, band, rate, mtbf_h)
    data = plan.plan_figures(site, checkpoint_s, restart_s, nodes, notice_s, rate_h, job_hours,
                             instance_type, spot_usd_h, on_demand_usd_h, region, measured)
    config = optional_config(app)
    spares = plan.spares_of(config) if config is not None else []
    if spares:
        data["spares"] = spares
        data["spares_usd_per_h"] = (None if any(s["usd_per_h"] is None for s in spares)
                                    else sum(s["usd_per_h"] for s in spares))
    if as_json:
        print_json(finite(data))
        return
    _print_plan(data, nodes)


def spares_lines(spares: list[dict[str, Any]]) -> list[str]:
    """One line per node set with spares: ``hot spares: gpu 2 x $1.20/h = $2.40/h around
    the clock ($1,752.00/month)``."""
    lines = []
    for s in spares:
        if s["usd_per_h"] is None:
            cost = (f"{s['spares']} node(s), price unknown: no {s['market']} price for its "
                    f"instance types in the catalogue or spot.yaml (set cost."
                    f"{'spot' if s['market'] == 'spot' else 'on_demand'}_usd_per_hour)")
        else:
            cost = (f"{s['spares']} x {_usd(s['usd_per_node_h'])}/h = {_usd(s['usd_per_h'])}/h "
                    f"around the clock ({_usd(s['usd_per_month'])}/month)")
        lines.append(f"hot spares: {s['node_set']} ({s['market']}) {cost}, whether or not a "
                     "job runs")
    return lines


def _measured_line(measured: dict[str, Any]) -> str:
    steps = ", ".join(str(c["step"]) for c in measured["checkpoints"])
    count = len(measured["checkpoints"])
    return (f"checkpoint cost: {measured['median_save_s']:.3g} s, the median save_s of {count} "
            f"checkpoint(s) in {measured['location']} (steps {steps})")


def _hours(h: float) -> str:
    return f"{h:.2f} h" if math.isfinite(h) else "never (infinite)"


def _usd(usd: float) -> str:
    return f"${usd:,.2f}" if math.isfinite(usd) else "unbounded (never finishes)"


def _print_plan(d: dict[str, Any], nodes: int) -> None:
    echo = click.echo
    if d.get("checkpoint_source"):
        echo(_measured_line(d["checkpoint_source"]))
    echo(f"interruptions: {d['node_rate_per_h']:.3g} per node-hour ({d['assumption']})")
    echo(f"MTBF: one node {d['mtbf_node_h']:.1f} h, the {nodes}-node job {d['mtbf_job_h']:.1f} h")
    echo(f"checkpoint every: Young {d['young_interval_s'] / 60:.1f} min, "
         f"Daly {d['daly_interval_s'] / 60:.1f} min (use Daly's)")
    echo(f"expected waste at Daly's interval, no notice: {d['waste_fraction']:.2%}")
    if d["notice_checkpoint"]:
        gain = d["waste_fraction"] - d["waste_fraction_with_notice"]
        effect = (f"saves {gain:.2%} of wall time" if gain >= 0 else
                  f"costs {-gain:.2%} more wall time: the save at each notice costs more than "
                  "the recomputation it avoids")
        echo(f"with a checkpoint at each notice: {d['waste_fraction_with_notice']:.2%} ({effect})")
    else:
        echo("the notice is shorter than a checkpoint: no notice-time checkpoint")
    if d.get("never_finishes"):
        echo(f"the job never finishes in practice: a checkpoint ({d['checkpoint_s']:g} s) and "
             f"restart ({d['restart_s']:g} s) cost about as much as, or more than, the "
             f"{nodes}-node job's MTBF ({d['mtbf_job_h'] * 3600:.3g} s), so under "
             f"{1 - planner.NEVER_FINISHES_WASTE:.1%} of wall time is useful compute; use fewer "
             "nodes, a less interrupted type or a faster checkpoint")
    if d.get("expected_wall_h") is not None:
        echo(f"expected wall time: {_hours(d['expected_wall_h'])} without notice"
             + (f", {_hours(d['expected_wall_h_with_notice'])} with notice checkpoints"
                if d.get("expected_wall_h_with_notice") is not None else ""))
    if "expected_spot_cost_usd" in d:
        pct = d["saving_percent"]
        if pct is None:
            saving = "no saving known: on-demand price 0"
        elif not math.isfinite(pct):
            saving = "the job never finishes on spot"
        elif pct >= 0:
            saving = f"{pct:.1f} % saved"
        else:
            saving = f"spot costs {-pct:.1f} % more"
        echo(f"cost on {d['instance_type']}: spot {_usd(d['expected_spot_cost_usd'])} vs "
             f"on-demand {_usd(d['on_demand_cost_usd'])} ({saving}; {d['price_source']})")
    if d.get("unverified_prices"):
        echo(unverified_line(d["unverified_prices"]))
    for warning in d.get("price_warnings", []):
        echo(f"warning: {warning}")
    for line in spares_lines(d.get("spares", [])):
        echo(line)


def _print_comparison(found: plan.Comparison, as_json: bool,
                      measured: dict[str, Any] | None) -> None:
    if as_json:
        print_json(found.to_json())
        return
    ranked, unverified, warnings = found.ranked, found.unverified, found.warnings
    flagged = [u for r in ranked for u in unverified.get(r.instance_type, [])]
    if flagged:
        click.echo(unverified_line(flagged))
    for r in ranked:
        for warning in warnings.get(r.instance_type, []):
            click.echo(f"warning: {warning}")
    if measured is not None:
        click.echo(_measured_line(measured))
    for i, r in enumerate(ranked, 1):
        late = "" if r.meets_deadline is not False else "  (misses the deadline)"
        if not math.isfinite(r.expected_wall_h):
            click.echo(f"{i}. {r.instance_type}: never finishes on spot (checkpoint and restart "
                       f"cost about as much as its MTBF; {r.compute_h:.2f} h compute), on-demand "
                       f"{_usd(r.on_demand_cost_usd)}{late}")
            continue
        click.echo(f"{i}. {r.instance_type}: {_usd(r.expected_cost_usd)} expected on spot, "
                   f"{r.expected_wall_h:.2f} h wall ({r.compute_h:.2f} h compute), on-demand "
                   f"{_usd(r.on_demand_cost_usd)}{late}")


COMMANDS = [plan_command]
