"""``slurm-spot watch``: run the node-side interruption watcher."""

from __future__ import annotations

import os
import socket

import click

from slurm_spot.commands.common import AppContext, json_option, pass_app, print_json
from slurm_spot.watch import Watcher, source_for


@click.command("watch")
@click.option("--node", default=None,
              help="This node's Slurm name (default: $SLURMD_NODENAME, else the hostname).")
@click.option("--instance-id", default=None, help="This instance's id (for events).")
@click.option("--once", is_flag=True, help="Poll once and exit (0 either way).")
@click.option("--margin", "margin_s", type=float, default=5.0, show_default=True,
              help="Seconds before the deadline by which the node is powered down.")
@json_option
@pass_app
def watch_command(app: AppContext, node: str | None, instance_id: str | None, once: bool,
                  margin_s: float, as_json: bool) -> None:
    """Watch for a spot interruption notice; drain, signal, requeue when one comes."""
    del instance_id
    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    config = app.config
    watcher = Watcher(config, name, app.slurm(), source_for(config, name), margin_s=margin_s)
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


COMMANDS = [watch_command]
