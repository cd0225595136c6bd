"""``slurm-spot instances``: the cluster's instances at every provider."""

from __future__ import annotations

import click
from rich.table import Table

from slurm_spot.commands.common import AppContext, console, json_option, pass_app, print_json
from slurm_spot.providers import get_provider
from slurm_spot.providers.base import Instance


def list_all(app: AppContext, include_ended: bool) -> list[tuple[str, Instance]]:
    """``(provider name, instance)`` for every provider that has a node set."""
    config = app.config
    used = sorted({ns.provider for ns in config.node_sets})
    found = []
    for name in used:
        for inst in get_provider(config, name).list_instances():
            if include_ended or inst.state.is_alive:
                found.append((name, inst))
    return found


@click.command("instances")
@click.option("--all", "include_ended", is_flag=True, help="Include ended instances.")
@json_option
@pass_app
def instances_command(app: AppContext, include_ended: bool, as_json: bool) -> None:
    """List the cluster's instances: id, node, state, market, type, zone, launch time."""
    found = list_all(app, include_ended)
    if as_json:
        print_json([{"provider": p, **i.to_json()} for p, i in found])
        return
    table = Table("instance", "node", "state", "market", "type", "zone", "launched", "provider")
    for provider, inst in sorted(found, key=lambda pair: pair[1].node or ""):
        table.add_row(inst.instance_id, inst.node or "-", inst.state.value, inst.market,
                      inst.instance_type, inst.zone, f"{inst.launch_time:%Y-%m-%d %H:%M:%S}",
                      provider)
    console().print(table)


COMMANDS = [instances_command]
