"""CLI commands, one module per topic; :func:`register` adds them all to the group."""

from __future__ import annotations

import importlib

import click

_MODULES = (
    "power",
    "configure",
    "local",
    "watch",
    "node",
    "events",
    "jobhooks",
    "instances",
    "reconcile",
    "status",
    "sbatch",
    "demo",
)


def register(group: click.Group) -> None:
    """Add every command of every module in ``_MODULES`` (each exposes ``COMMANDS``), each
    also taking ``--config`` after its own name (``slurm-spot render --config F``)."""
    for name in _MODULES:
        module = importlib.import_module(f"slurm_spot.commands.{name}")
        for command in module.COMMANDS:
            _add_config_option(command)
            group.add_command(command)


def check_config_path(value: str | None) -> str | None:
    """``--config`` must name a file: an empty value would silently mean the default one.

    Raises:
        click.BadParameter: ``value`` is empty (exit 2).
    """
    if value is not None and not value.strip():
        raise click.BadParameter("empty path (leave --config out for the default file)")
    return value


def _set_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if check_config_path(value) is not None:
        from slurm_spot.commands.common import AppContext

        app = ctx.find_object(AppContext)
        if app is not None:
            app.use_config(value)  # type: ignore[arg-type]


def _add_config_option(command: click.Command) -> None:
    """``--config F`` on ``command`` (a group too) and its subcommands, same meaning as before
    the command name (the later one wins). Not on commands that pass unknown options through (``sbatch``:
    ``--config`` after the script belongs to the training script)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_config_option(sub)
    if command.context_settings.get("ignore_unknown_options"):
        return
    if any("--config" in param.opts for param in command.params):
        return
    command.params.append(click.Option(
        ["--config"], type=click.Path(dir_okay=False), expose_value=False, is_eager=True,
        callback=_set_config, allow_from_autoenv=False,
        help="spot.yaml to use (same as 'slurm-spot --config F COMMAND')."))
