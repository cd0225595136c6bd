"""``slurm-spot local up|down|status|launch|preempt|capacity``: the local spot cluster
(``local market``: :mod:`slurm_spot.commands.market`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_spot.commands.common import (
    AppContext,
    json_option,
    pass_app,
    print_json,
    require_dir,
)
from slurm_spot.commands.completion import complete_nodes
from slurm_spot.commands.progress import waiting
from slurm_spot.commands.tables import Field, is_terminal, print_table, table_options
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError
from slurm_spot.localcluster import cluster as localcluster
from slurm_spot.providers.base import LaunchRequest
from slurm_spot.providers.local.provider import LocalProvider, provider_for_node


def _default_conf_dir() -> Path:
    """The folder of ``$SLURM_CONF`` when it is set (what 'local up --conf-dir' told the user
    to export), else /etc/slurm."""
    slurm_conf = os.environ.get("SLURM_CONF")
    return Path(slurm_conf).parent if slurm_conf else Path("/etc/slurm")


_conf_dir_option = click.option(
    "--conf-dir", type=click.Path(file_okay=False, path_type=Path), default=_default_conf_dir,
    show_default="folder of $SLURM_CONF, else /etc/slurm",
    help="Where slurm.conf, slurm-spot.conf, gres.conf and spot.yaml go.")


def _local_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What a command on the local cluster takes last: ``--conf-dir`` (``conf_dir``), ``--json``
    (``as_json``) and, as its first argument, the app context."""
    return _conf_dir_option(json_option(pass_app(func)))


def _local_provider(config: SpotConfig, node: str) -> LocalProvider:
    return provider_for_node(config, node)


def _given_config(app: AppContext) -> str | None:
    """The config the user named: ``--config``, else ``$SLURM_SPOT_CONFIG`` (as for every
    other command, :func:`slurm_spot.config.config_path`); None when neither is set."""
    return app.config_path or os.environ.get("SLURM_SPOT_CONFIG") or None


def _config(app: AppContext, conf_dir: Path) -> SpotConfig:
    """The config for a command that only reads: --config or $SLURM_SPOT_CONFIG if given,
    else the local cluster's ``<conf_dir>/spot.yaml``. Never writes anything."""
    if app._config is None:
        app._config = localcluster.load_config(_given_config(app) or conf_dir / "spot.yaml")
    return app._config


@click.group("local")
def local_group() -> None:
    """A real Slurm on this machine whose cloud nodes are local slurmd 'instances'."""


@local_group.command("up")
@_conf_dir_option
@click.option("--keep-state", is_flag=True, help="Keep slurmctld's saved jobs and nodes.")
@click.option("--no-reconcile", is_flag=True, help="Do not start the reconciler.")
@click.option("--accounting/--no-accounting", default=None,
              help="Run MariaDB + slurmdbd so sacct works (default: if they are installed).")
@json_option
@pass_app
def up_command(app: AppContext, conf_dir: Path, keep_state: bool, no_reconcile: bool,
               accounting: bool | None, as_json: bool) -> None:
    """Start munge, (MariaDB and slurmdbd,) slurmctld and the reconciler for the local spot
    cluster. Its spot.yaml: --config or $SLURM_SPOT_CONFIG, copied to CONF_DIR/spot.yaml
    (where the hooks read it); without either, the existing or the default one there."""
    config = localcluster.prepare_config(_given_config(app), conf_dir)
    with waiting("local up: starting") as progress:  # a spinner on stderr at a terminal
        record = localcluster.up(config, conf_dir, keep_state=keep_state,
                                 reconcile=not no_reconcile, accounting=accounting,
                                 on_step=lambda step: progress.step(f"local up: {step}"))
    if as_json:
        print_json(record)
        return
    parts = ", ".join(f"{p.name} ({', '.join(p.node_sets)})" for p in config.partitions)
    click.echo(f"local spot cluster {config.cluster!r} is up: partitions {parts}")
    if conf_dir != Path("/etc/slurm"):
        click.echo(f"export SLURM_CONF={conf_dir / 'slurm.conf'}")
    click.echo("try: sbatch --wait -p "
               f"{config.partitions[0].name} -N 2 --wrap hostname")


@local_group.command("down")
@_local_options
def down_command(app: AppContext, conf_dir: Path, as_json: bool) -> None:
    """Stop every instance, the reconciler, slurmctld and munged (if 'up' started it)."""
    stopped = localcluster.down(_config(app, conf_dir))
    if as_json:
        print_json({"stopped": stopped})
    else:
        click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


_STATUS_COLUMNS = ("instance", "node", "state", "market", "launched")


@local_group.command("status")
@_conf_dir_option
@json_option
@table_options(_STATUS_COLUMNS)
@pass_app
def status_command(app: AppContext, conf_dir: Path, as_json: bool, fields: list[Field],
                   noheader: bool) -> None:
    """Show what runs: daemons (on stderr when stdout is not a terminal, so the table alone
    goes down a pipe) and instances."""
    config = _config(app, conf_dir)
    require_dir(config, "state_dir")  # where up's record and the instances are
    info = localcluster.status(config)
    if as_json:
        print_json(info)
        return
    click.echo(f"slurmctld: {'up' if info['slurmctld'] else 'down'}   reconciler: "
               f"{'up' if info['reconciler'] else 'down'}   market: "
               f"{'up' if info['market'] else 'down'}   munge: "
               f"{'up' if info['munge'] else 'down'}", err=not is_terminal())
    rows = [{"instance": inst["instance_id"], "node": inst["node"], "state": inst["state"],
             "market": inst["market"], "launched": inst["launch_time"]}
            for inst in info["instances"]]  # type: ignore[attr-defined]
    print_table(rows, fields, header=not noheader)


@local_group.command("launch")
@click.argument("node", shell_complete=complete_nodes)
@_local_options
def launch_command(app: AppContext, node: str, conf_dir: Path, as_json: bool) -> None:
    """Start an instance for NODE that Slurm did not ask for (chaos testing)."""
    config = _config(app, conf_dir)
    provider = _local_provider(config, node)
    node_set = config.node_set_of(node)
    assert node_set is not None
    result = provider.launch(LaunchRequest(config.cluster, node_set, (node,)))
    inst = result.launched[0]
    if as_json:
        print_json(inst.to_json())
    else:
        click.echo(f"launched {inst.instance_id} for {node}")


@local_group.command("preempt")
@click.argument("node", shell_complete=complete_nodes)
@click.option("--notice", "notice_s", type=float, default=30.0, show_default=True,
              help="Seconds of notice before the instance is killed (0: no notice).")
@_local_options
def preempt_command(app: AppContext, node: str, notice_s: float, conf_dir: Path,
                    as_json: bool) -> None:
    """Publish an interruption notice for NODE, then kill its instance when it runs out."""
    if not 0 <= notice_s <= 86400:  # also refuses nan and inf
        raise click.BadParameter("must be between 0 and 86400 seconds", param_hint="--notice")
    config = _config(app, conf_dir)
    deadline = _local_provider(config, node).preempt(node, notice_s)
    if as_json:
        print_json({"node": node, "notice_s": notice_s, "deadline": deadline.isoformat()})
    elif notice_s:
        click.echo(f"notice published for {node}; its instance is killed at {deadline:%H:%M:%S}")
    else:
        click.echo(f"killed the instance of {node} without notice")


class _CountCommand(click.Command):
    """A command whose arguments are counts: ``-1`` is answered as a count below 0, not as
    click's "No such option '-1'" (a negative number looks like a short option to click)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            if arg == "--":
                break
            if re.fullmatch(r"-\d+", arg):
                raise click.BadParameter(f"{arg}: count must be >= 0", ctx=ctx,
                                         param_hint="'LIMIT'")
        return super().parse_args(ctx, args)


def _count(_ctx: click.Context, _param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise click.BadParameter(f"{value}: count must be >= 0")
    return value


@local_group.command("capacity", cls=_CountCommand)
@click.argument("node_set")
@click.argument("limit", required=False, type=int, callback=_count)
@_local_options
def capacity_command(app: AppContext, node_set: str, limit: int | None, conf_dir: Path,
                     as_json: bool) -> None:
    """Limit NODE_SET to LIMIT alive instances in the simulated spot market (no LIMIT: lift
    the limit). Launches beyond it fail with InsufficientInstanceCapacity."""
    config = _config(app, conf_dir)
    try:
        ns = config.node_set(node_set)
    except KeyError:
        raise BadInputError(f"node set {node_set!r} is not defined in {config.source_path}") from None
    provider = _local_provider(config, ns.node_names[0])
    provider.set_capacity(node_set, limit)
    if as_json:
        print_json({"node_set": node_set, "limit": limit})
    else:
        click.echo(f"{node_set}: " + ("no limit" if limit is None else f"at most {limit} instance(s)"))


def _add_market() -> None:
    from slurm_spot.commands.market import market_group

    local_group.add_command(market_group)


_add_market()
COMMANDS = [local_group]
