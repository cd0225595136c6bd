"""``slurm-spot simulate``: one job under interruptions, four recovery strategies compared."""

from __future__ import annotations

import math

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
from slurm_spot.cost.plan import (
    MAX_JOB_HOURS,
    MAX_NODES,
    MAX_SECONDS,
    SAME_TRACE,
    check_number,
    simulation,
)
from slurm_spot.cost.simulator import STRATEGIES, SimParams

MAX_RUNS = 100_000


@click.command("simulate")
@click.option("--nodes", type=int, default=8, show_default=True, help="Nodes of the job.")
@click.option("--on-demand-nodes", type=int, default=0, show_default=True,
              help="Of those, on-demand nodes (never interrupted), e.g. a coordinator.")
@click.option("--job-hours", type=float, required=True,
              help="Compute hours of the job (wall time without interruptions or checkpoints).")
@click.option("--checkpoint-s", type=float, required=True, help="Seconds one checkpoint takes.")
@click.option("--restart-s", type=float, default=120.0, show_default=True,
              help="Seconds from a node being ready to the job computing (load checkpoint).")
@click.option("--interval-s", type=float, default=None,
              help="Checkpoint interval of every strategy, in compute seconds (default: Daly's "
                   "interval for the job's MTBF, the same for every strategy).")
@click.option("--notice-s", type=float, default=120.0, show_default=True,
              help="Seconds of interruption notice (AWS: 120, GCP: 30).")
@click.option("--boot-s", type=float, default=120.0, show_default=True,
              help="Seconds from launch to a node accepting the job.")
@click.option("--slurmd-timeout-s", type=float, default=300.0, show_default=True,
              help="Plain Slurm: seconds until slurmctld declares a silent node dead "
                   "(SlurmdTimeout).")
@click.option("--requeue-delay-s", type=float, default=121.0, show_default=True,
              help="Plain Slurm: seconds a requeued job is held before it may start again.")
@interruption_options
@price_options
@click.option("--strategy", "strategies", multiple=True, type=click.Choice(STRATEGIES),
              help="Only these strategies (repeat; default all).")
@click.option("--runs", type=int, default=200, show_default=True,
              help="Simulated runs per strategy (each run's interruptions are shared by all "
                   "strategies).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Random seed: the same seed gives the same figures.")
@click.option("--plot", "plot_path", default=None,
              help="Write a PNG of goodput and cost (needs the plot extra: matplotlib).")
@json_option
@pass_app
def simulate_command(app: AppContext, nodes: int, on_demand_nodes: int, job_hours: float,
                     checkpoint_s: float, restart_s: float, interval_s: float | None,
                     notice_s: float,
                     boot_s: float, slurmd_timeout_s: float, requeue_delay_s: float,
                     band: str | None, rate: str | None, mtbf_h: float | None,
                     instance_type: str | None, spot_usd_h: float | None,
                     on_demand_usd_h: float | None, region: str | None,
                     strategies: tuple[str, ...], runs: int,
                     seed: int, plot_path: str | None, as_json: bool) -> None:
    """Simulate plain Slurm, periodic checkpoints + expedited requeue, slurm-spot (notice
    checkpoint, prewarmed replacement) and elastic training; report completion time, cost and
    goodput with 95 % confidence intervals. Every strategy checkpoints at the same interval
    and each run's interruptions are the same for every strategy, so the rows compare
    recovery alone."""
    check_number("--nodes", nodes, MAX_NODES, 1)
    check_number("--on-demand-nodes", on_demand_nodes, nodes)
    check_number("--job-hours", job_hours, MAX_JOB_HOURS, low_ok=False, unit=" hours")
    for option, seconds in (("--checkpoint-s", checkpoint_s), ("--interval-s", interval_s)):
        if seconds is None:
            continue
        check_number(option, seconds, MAX_SECONDS, low_ok=False, unit=" seconds")
    for option, seconds in (("--restart-s", restart_s), ("--notice-s", notice_s),
                            ("--boot-s", boot_s), ("--slurmd-timeout-s", slurmd_timeout_s),
                            ("--requeue-delay-s", requeue_delay_s)):
        check_number(option, seconds, MAX_SECONDS, unit=" seconds")
    check_prices(spot_usd_h, on_demand_usd_h)
    check_number("--runs", runs, MAX_RUNS, 2)
    out = None
    if plot_path is not None:
        from slurm_spot.cost.plots import check_png_path, require_matplotlib

        out = check_png_path(plot_path)
        require_matplotlib()
    node_rate_h, source = node_rate_of(app, band, rate, mtbf_h)
    params = SimParams(nodes=nodes, on_demand_nodes=on_demand_nodes, job_hours=job_hours,
                       checkpoint_s=checkpoint_s, restart_s=restart_s, interval_s=interval_s,
                       notice_s=notice_s, boot_s=boot_s, slurmd_timeout_s=slurmd_timeout_s,
                       requeue_delay_s=requeue_delay_s, node_rate_per_h=node_rate_h)
    run = simulation(lambda: optional_config(app), params, source, instance_type, spot_usd_h,
                     on_demand_usd_h, region, strategies, runs, seed)
    params, base, results = run.params, run.base, run.results
    spot_known, od_known, price_source = run.spot_known, run.od_known, run.price_source
    price_warnings = run.price_warnings
    if out is not None:
        from slurm_spot.cost.plots import save_png, simulation_figure

        save_png(simulation_figure(base, results, f"{nodes} nodes, {job_hours:g} h, {source}\n"
                                                  f"{params.interval_policy()}; {SAME_TRACE}"),
                 out)
    if as_json:
        print_json(run.to_json())
        return
    click.echo(f"{nodes} nodes ({on_demand_nodes} on-demand), {job_hours:g} h of compute; "
               f"{source}; {price_source}; {runs} runs, seed {seed}")
    click.echo(f"compared like with like: {params.interval_policy()}; {SAME_TRACE}")
    for warning in price_warnings:
        click.echo(f"warning: {warning}")
    od_cost = f"${base.cost_usd:,.2f}" if od_known else "price unknown"
    click.echo(f"on-demand: {base.wall_h:.2f} h, {od_cost}")
    for r in results:
        saved = ("" if math.isnan(r.saving_vs_on_demand) or not spot_known
                 else f"{r.saving_vs_on_demand:.1%} saved, ")
        cost = (f"cost ${r.cost_usd.mean:,.2f} ± {r.cost_usd.ci95:,.2f}" if spot_known
                else "cost unknown (no spot price)")
        click.echo(f"{r.strategy:>10}: wall {r.wall_h.mean:.2f} ± {r.wall_h.ci95:.2f} h, "
                   f"{cost}, goodput "
                   f"{r.goodput.mean:.4f} ± {r.goodput.ci95:.4f}, "
                   f"{r.interruptions.mean:.2f} interruptions, checkpoint every "
                   f"{r.interval_s / 60:.1f} min; vs on-demand: {saved}"
                   f"{r.extra_wall_vs_on_demand:+.1%} wall")


COMMANDS = [simulate_command]
