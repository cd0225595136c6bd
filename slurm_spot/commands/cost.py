"""``slurm-spot cost``: what recorded jobs used and cost, against on-demand."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.commands.completion import complete_jobs
from slurm_spot.commands.events import parse_since
from slurm_spot.cost.accounting import CostReport
from slurm_spot.cost.plan import UNVERIFIED_HINT, finite
from slurm_spot.cost.report import job_reports
from slurm_spot.errors import BadInputError


@click.command("cost")
@click.option("--job", "job_id", type=int, default=None, shell_complete=complete_jobs,
              help="Only this job (default: all in the events).")
@click.option("--since", default=None, help="Only jobs with events after this (10m, 2h, 1d, ISO).")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The job's checkpoint directory (storage and lost steps); with --job. "
                   "Without it (and no checkpoint.root copy), lost compute is an upper bound.")
@click.option("--plot", "plot_path", default=None, help="With --job: write its timeline as a PNG.")
@json_option
@pass_app
def cost_command(app: AppContext, job_id: int | None, since: str | None,
                 checkpoint_dir: Path | None, plot_path: str | None, as_json: bool) -> None:
    """Per job: node-hours by market and instance type, cost, the same hours on-demand,
    savings, interruptions, compute lost to them, checkpoint storage and egress."""
    if (plot_path or checkpoint_dir) and job_id is None:
        raise BadInputError("--plot and --checkpoint-dir need --job ID")
    out = None
    if plot_path is not None:
        from slurm_spot.cost.plots import check_png_path, require_matplotlib

        out = check_png_path(plot_path)
        require_matplotlib()
    config = app.config
    now = datetime.now(timezone.utc)
    after = parse_since(since) if since else None
    usages, reports = job_reports(config, app.slurm(), job_id, after, checkpoint_dir, now)
    if out is not None:
        from slurm_spot.cost.plots import job_figure, save_png

        save_png(job_figure(usages[0], reports[0]), out)
    if as_json:
        print_json(finite([asdict(r) for r in reports]))
        return
    if not reports:
        click.echo("no jobs in slurm-spot's events" + (f" since {since}" if since else ""))
    for r in reports:
        _print_report(r)


def _print_report(r: CostReport) -> None:
    echo = click.echo
    saving = f"{r.saving_percent:.1f} % saved" if r.saving_percent is not None else "no saving known"
    echo(f"job {r.job_id} (from {r.source}): ${r.total_usd:,.2f} total, compute "
         f"${r.compute_usd:,.2f} vs ${r.on_demand_usd:,.2f} on-demand ({saving})")
    for ln in r.lines:
        echo(f"  {ln.node_hours:8.2f} node-h {ln.market:9} {ln.instance_type:16} "
             f"{ln.zone or '-':12} ${ln.usd_per_h:.4f}/h = ${ln.cost_usd:,.2f} ({ln.price_source})")
    steps = f", ~{r.recomputed_steps} steps recomputed" if r.recomputed_steps is not None else ""
    bound = "at most " if r.lost_compute_upper_bound else ""
    echo(f"  interruptions: {r.interruptions}; lost compute {bound}{r.lost_compute_node_h:.2f} "
         f"node-h{steps}; restarts took {r.restart_h:.2f} h")
    if r.lost_compute_upper_bound:
        echo("  note: lost compute is an upper bound: no checkpoint of the job was read, so each "
             "interruption counts everything since its run started; give --checkpoint-dir DIR "
             "(the job's checkpoints) for the compute actually lost")
    echo(f"  checkpoints: {r.checkpoint_bytes / 1e9:.3f} GB kept, storage ${r.storage_usd:,.4f}, "
         f"egress ${r.egress_usd:,.4f}")
    for note in r.notes:
        echo(f"  note: {note}")
    if r.unverified_prices:
        echo(f"  warning: catalogue price(s) {'; '.join(r.unverified_prices)} {UNVERIFIED_HINT}")
    for warning in r.price_warnings:
        echo(f"  warning: {warning}")


COMMANDS = [cost_command]
