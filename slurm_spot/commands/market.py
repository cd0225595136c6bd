"""``slurm-spot local market start|stop|plan|report``: the chaos market on the local cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_spot.commands.common import AppContext, print_json
from slurm_spot.localcluster import market as mk
from slurm_spot.localcluster import market_report, marketd

_NODE_SET_HELP = ("NODE_SET:key=value,... (repeat for each node set): rate (interruptions per "
                  "node-hour), notice (share with notice, 0-1 or %), notice_s (seconds), "
                  "up/down (seconds capacity is there / gone), start (up|down), "
                  "cycle (fixed|random). E.g. cheap:rate=10,notice=0.5,up=300,down=60")


def _markets(_ctx: click.Context, _param: click.Parameter,
             value: tuple[str, ...]) -> list[mk.NodeSetMarket]:
    return [mk.parse_market(spec) for spec in value]


def _market_options(func):
    for option in reversed([
        click.option("--node-set", "markets", multiple=True, required=True,
                     callback=_markets, metavar="SPEC", help=_NODE_SET_HELP),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="The same seed gives the same events."),
        click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True),
                     default=None, help="Seconds the market runs [default: until stopped]; "
                     "then capacity is restored and no more interruptions come."),
    ]):
        func = option(func)
    return func


def _local_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`slurm_spot.commands.local._local_options`, imported when first used (that
    module imports this one)."""
    from slurm_spot.commands.local import _local_options as options

    return options(func)


@click.group("market")
def market_group() -> None:
    """A seeded spot market on the local cluster: capacity that comes and goes, and
    interruptions with and without notice, per node set (docs/admin.md, "Chaos market")."""


@market_group.command("start")
@_market_options
@_local_options
def start_command(app: AppContext, markets: list[mk.NodeSetMarket], seed: int,
                  duration_s: float | None, conf_dir: Path, as_json: bool) -> None:
    """Start the market's daemon on the running local cluster (stopped by 'local market
    stop' or 'local down')."""
    from slurm_spot.commands.local import _config

    config = _config(app, conf_dir)
    plan = marketd.start(config, markets, seed, duration_s, conf_dir / "slurm.conf")
    if as_json:
        print_json(plan)
        return
    length = "until stopped" if duration_s is None else f"for {duration_s:g} s"
    click.echo(f"market started (pid {plan['pid']}, seed {seed}) {length} on "
               + ", ".join(m.node_set for m in markets))
    click.echo("see what it did: slurm-spot local market report")


@market_group.command("plan")
@_market_options
@_local_options
def plan_command(app: AppContext, markets: list[mk.NodeSetMarket], seed: int,
                 duration_s: float | None, conf_dir: Path, as_json: bool) -> None:
    """Print the events a market would apply (default: its first hour), changing nothing."""
    from slurm_spot.commands.local import _config

    config = _config(app, conf_dir)
    nodes = {ns.name: ns.node_names for ns in config.node_sets}
    events = mk.schedule(markets, nodes, seed, 3600.0 if duration_s is None else duration_s)
    if as_json:
        print_json([e.to_json() for e in events])
        return
    for e in events:
        if e.kind == mk.CAPACITY:
            what = f"capacity {'back' if e.available else 'gone'} on {e.node_set}"
        else:
            what = (f"interrupt {e.node} with {e.notice_s:g} s notice" if e.notice_s
                    else f"interrupt {e.node} without notice")
        click.echo(f"{e.at_s:9.1f} s  {what}")


@market_group.command("stop")
@_local_options
def stop_command(app: AppContext, conf_dir: Path, as_json: bool) -> None:
    """Stop the market's daemon and restore the node sets' capacity."""
    from slurm_spot.commands.local import _config

    stopped = marketd.stop(_config(app, conf_dir))
    if as_json:
        print_json({"stopped": stopped})
    else:
        click.echo("market stopped" if stopped else "no market was running (capacity restored)")


@market_group.command("report")
@click.option("--job", "job_ids", type=int, multiple=True,
              help="Report this job (repeat) [default: every job the market hit].")
@click.option("--compute-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The job's compute seconds without interruptions: adds its measured "
                   "goodput and simulate's prediction (needs one --job).")
@click.option("--checkpoint-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Prediction: seconds one checkpoint takes [default: 1].")
@click.option("--interval-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Prediction: checkpoint interval, compute seconds [default: Daly's].")
@click.option("--restart-s", type=click.FloatRange(min=0), default=None,
              help="Prediction: seconds from a node ready to the job computing [default: 15].")
@_local_options
def report_command(app: AppContext, job_ids: tuple[int, ...], compute_s: float | None,
                   checkpoint_s: float | None, interval_s: float | None,
                   restart_s: float | None, conf_dir: Path, as_json: bool) -> None:
    """What the market did and what the jobs went through (interruptions with and without
    notice, capacity errors, failovers, requeues); with --compute-s, the job's goodput
    measured next to 'slurm-spot simulate's prediction for the same settings."""
    from slurm_spot.commands.local import _config

    config = _config(app, conf_dir)
    inputs = None
    if compute_s is not None and len(job_ids) == 1:
        inputs = market_report.default_inputs(
            config, compute_s, market_report.job_nodes(config, job_ids[0]),
            checkpoint_s=checkpoint_s, interval_s=interval_s, restart_s=restart_s)
    data = market_report.report(config, job_ids or None, compute_s, inputs)
    if as_json:
        print_json(data)
        return
    for line in market_report.summary_lines(data):
        click.echo(line)
