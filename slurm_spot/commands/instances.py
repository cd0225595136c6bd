"""``slurm-spot instances``: the cluster's instances at every provider."""

from __future__ import annotations

import click

from slurm_spot.commands.common import (
    AppContext,
    json_option,
    pass_app,
    print_json,
    require_dir,
)
from slurm_spot.commands.tables import Field, print_table, table_options
from slurm_spot.providers import assign_listings, get_provider
from slurm_spot.providers.base import Instance


def list_all(app: AppContext, include_ended: bool) -> list[tuple[str, Instance]]:
    """``(provider name, instance)`` for every provider that has a node set."""
    config = app.config
    used = sorted({ns.provider for ns in config.node_sets})
    if any(config.providers[name].type == "local" for name in used):
        require_dir(config, "state_dir")  # where local instances are recorded
    listings = {name: list(get_provider(config, name).list_instances()) for name in used}
    assigned = assign_listings(config, listings)  # an instance two providers see: once
    return [(name, inst) for name in used for inst in assigned[name]
            if include_ended or inst.state.is_alive]


COLUMNS = ("instance", "node", "state", "market", "type", "zone", "launched", "provider")


@click.command("instances")
@click.option("--all", "include_ended", is_flag=True, help="Include ended instances.")
@json_option
@table_options(COLUMNS)
@pass_app
def instances_command(app: AppContext, include_ended: bool, as_json: bool,
                      fields: list[Field], noheader: bool) -> None:
    """List the cluster's instances: id, node, state, market, type, zone, launch time.
    Plain columns when stdout is not a terminal; --json for scripts."""
    found = list_all(app, include_ended)
    if as_json:
        print_json([{"provider": p, **i.to_json()} for p, i in found])
        return
    rows = [{"instance": inst.instance_id, "node": inst.node or "-", "state": inst.state.value,
             "market": inst.market, "type": inst.instance_type, "zone": inst.zone,
             "launched": f"{inst.launch_time:%Y-%m-%d %H:%M:%S}", "provider": provider}
            for provider, inst in sorted(found, key=lambda pair: pair[1].node or "")]
    print_table(rows, fields, header=not noheader)


COMMANDS = [instances_command]
