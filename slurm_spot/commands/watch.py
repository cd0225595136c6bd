"""``slurm-spot watch``: run the node-side interruption watcher."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import click

from slurm_spot import __version__
from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.commands.completion import complete_nodes
from slurm_spot.lifecycle.node_identity import resolve_node_name
from slurm_spot.lifecycle.watch import Watcher, source_for


@click.command("watch")
@click.option("--node", default=None, shell_complete=complete_nodes,
              help="This node's Slurm name (default: as 'slurm-spot node-name' finds it: "
                   "$SLURMD_NODENAME, the hostname, or the node with this host's address).")
@click.option("--wait", "wait_s", type=float, default=300, show_default=True,
              help="Without --node: seconds to wait for this host's address to be recorded.")
@click.option("--instance-id", default=None,
              help="This instance's provider id (i-..., a GCE instance name): recorded in each "
                   "of the watcher's events, so 'slurm-spot events' ties a notice to its "
                   "instance.")
@click.option("--once", is_flag=True,
              help="Poll once and exit (0 either way); without --node, finding the node may "
                   "wait first (--wait).")
@click.option("--margin", "margin_s", type=float, default=5.0, show_default=True,
              help="Seconds before the deadline by which the node is powered down.")
@click.option("--systemd-unit", is_flag=True,
              help="Print the systemd unit that runs this watcher on a compute node, and exit.")
@json_option
@pass_app
def watch_command(app: AppContext, node: str | None, wait_s: float, instance_id: str | None,
                  once: bool, margin_s: float, systemd_unit: bool, as_json: bool) -> None:
    """Watch for a spot interruption notice; drain, signal, requeue when one comes."""
    if systemd_unit:
        config = app.config
        click.echo(render_unit(config.source_path, node,
                               write_paths=[config.state_dir, config.log_dir]), nl=False)
        return
    config = app.config
    name = resolve_node_name(config, app.slurm(), explicit=node, wait_s=wait_s)
    watcher = Watcher(config, name, app.slurm(), source_for(config, name), margin_s=margin_s,
                      instance_id=instance_id)
    outcome = watcher.run(once=once)
    if outcome is None:
        if as_json:
            print_json({"node": name, "notice": None})
        return
    result = {
        "node": name,
        "notice": {"action": outcome.notice.action, "deadline": outcome.notice.deadline,
                   "source": outcome.notice.source},
        "jobs": outcome.jobs,
        "requeued": outcome.requeued,
        "errors": outcome.errors,
    }
    if as_json:
        print_json(result)
    else:
        click.echo(f"{name}: {outcome.notice.reason}; jobs {outcome.jobs}, requeued "
                   f"{outcome.requeued}")
        for error in outcome.errors:
            click.echo(f"slurm-spot: error: {error}", err=True)


def render_unit(config_path: Path, node: str | None = None, user: str = "root",
                write_paths: Sequence[Path] = ()) -> str:
    """The systemd unit for the watcher (templates/slurm-spot-watch.service.j2, which the
    Ansible role renders too; pure). Without ``node`` the watcher uses the host name, as on a
    cloud node named after its Slurm node. ``write_paths``: the directories it may write
    (state_dir, log_dir)."""
    from slurm_spot.render import systemd_unit

    slurm_conf = os.environ.get("SLURM_CONF", "")
    executable = Path(sysconfig.get_path("scripts")) / "slurm-spot"
    return systemd_unit(
        "slurm-spot-watch",
        header=f"Managed by slurm-spot ({__version__}): the node-side watcher for {config_path}.\n"
               "Install as /etc/systemd/system/slurm-spot-watch.service on every compute node "
               "(or in its image),\nthen  systemctl daemon-reload && systemctl enable --now "
               "slurm-spot-watch\nThe Ansible role (ansible/roles/slurm_spot) writes this unit "
               "for the compute group.",
        exec_start=f"{executable} --config {config_path} watch" + (f" --node {node}" if node else ""),
        user=user, environment={"SLURM_CONF": slurm_conf} if slurm_conf else {},
        write_paths=write_paths)


COMMANDS = [watch_command]
