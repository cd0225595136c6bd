"""``slurm-spot status [--json]``: one row per cloud node: Slurm state, the instance behind it
(id, market, type, zone, uptime) and its current job; plus alive instances no node knows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

import click
from rich.table import Table

from slurm_spot.commands.common import AppContext, console, json_option, pass_app, print_json
from slurm_spot.config import SpotConfig
from slurm_spot.power import ProviderFactory
from slurm_spot.providers import get_provider
from slurm_spot.providers.base import Instance
from slurm_spot.reconcile.reasons import short_state
from slurm_spot.reconcile.rules import pick_kept
from slurm_spot.slurm.client import Node, SlurmClient

COLUMNS = ("node", "state", "instance", "market", "type", "zone", "uptime", "job", "reason")


def format_uptime(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``2d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _row(node: Node | None, name: str, node_set: str | None, alive: Sequence[Instance],
         provider: dict[str, str], now: datetime) -> dict[str, object]:
    inst = (pick_kept(node, alive) if node else alive[0]) if alive else None
    return {
        "node": name,
        "node_set": node_set,
        "state": short_state(node.state) if node else "(not in Slurm)",
        "slurm_state": str(node.state) if node else None,
        "reason": node.reason if node else "",
        "instance": inst.instance_id if inst else None,
        "provider": provider.get(inst.instance_id) if inst else None,
        "instance_state": inst.state.value if inst else None,
        "market": inst.market if inst else None,
        "type": inst.instance_type if inst else None,
        "zone": inst.zone if inst else None,
        "uptime_s": round(inst.age_s(now), 1) if inst else None,
        "extra_instances": [i.instance_id for i in alive if i is not inst],
        "jobs": list(node.jobs) if node else [],
    }


def status_rows(
    config: SpotConfig,
    slurm: SlurmClient,
    providers: ProviderFactory = get_provider,
    now: datetime | None = None,
) -> tuple[list[dict[str, object]], list[str]]:
    """Rows for every node of every node set, then for alive instances of unknown nodes;
    and one error line per provider that could not be listed.

    Raises:
        SlurmCommandError: Slurm's nodes cannot be read.
    """
    now = now or datetime.now(timezone.utc)
    alive: dict[str, list[Instance]] = {}
    provider_of: dict[str, str] = {}
    errors = []
    for name in sorted({ns.provider for ns in config.node_sets}):
        try:
            listed = providers(config, name).list_instances()
        except Exception as exc:  # any SDK error: show the rest
            errors.append(f"provider {name}: {exc}")
            continue
        for inst in listed:
            if inst.state.is_alive:
                alive.setdefault(inst.node or "?", []).append(inst)
                provider_of[inst.instance_id] = name
    set_of = {n: ns.name for ns in config.node_sets for n in ns.node_names}
    nodes = {n.name: n for n in slurm.nodes() if n.name in set_of}
    rows = [_row(nodes[n], n, set_of[n], alive.get(n, []), provider_of, now)
            for n in set_of if n in nodes]
    for name in sorted(set(alive) - set(nodes)):
        rows.append(_row(None, name, set_of.get(name), alive[name], provider_of, now))
    return rows, errors


def _table(rows: list[dict[str, object]]) -> Table:
    table = Table(*COLUMNS)
    for r in rows:
        jobs = ",".join(str(j) for j in r["jobs"]) or "-"  # type: ignore[attr-defined]
        instance = str(r["instance"] or "-")
        if r["extra_instances"]:
            instance += f" (+{len(r['extra_instances'])})"  # type: ignore[arg-type]
        table.add_row(str(r["node"]), str(r["state"]), instance, str(r["market"] or "-"),
                      str(r["type"] or "-"), str(r["zone"] or "-"),
                      format_uptime(r["uptime_s"]), jobs,  # type: ignore[arg-type]
                      str(r["reason"] or ""))
    return table


@click.command("status")
@json_option
@pass_app
def status_command(app: AppContext, as_json: bool) -> None:
    """Show every cloud node: Slurm state, instance (market, type, zone, uptime), job."""
    rows, errors = status_rows(app.config, app.slurm(), providers=get_provider)
    if as_json:
        print_json({"nodes": rows, "errors": errors})
    else:
        console().print(_table(rows))
    for error in errors:
        click.echo(f"slurm-spot: error: {error}", err=True)
    if errors:
        raise SystemExit(1)


COMMANDS = [status_command]
