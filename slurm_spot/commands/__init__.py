"""CLI commands, one module per topic, each exposing ``COMMANDS``.

The group loads a command's module only when that command runs (:func:`load_command`), so
``slurm-spot task-prolog`` does not import rich, jinja2 or prometheus_client. A new command is
one module here plus one line per command name in :data:`COMMAND_MODULES`.
"""

from __future__ import annotations

import importlib

import click

from slurm_spot.commands.common import add_config_option

#: command name -> module of ``slurm_spot.commands`` that defines it.
COMMAND_MODULES: dict[str, str] = {
    "resume": "power",
    "suspend": "power",
    "resume-fail": "power",
    "config": "configure",
    "render": "configure",
    "local": "local",
    "watch": "watch",
    "node-name": "node",
    "events": "events",
    "prolog": "jobhooks",
    "task-prolog": "jobhooks",
    "epilog": "jobhooks",
    "instances": "instances",
    "reconcile": "reconcile",
    "status": "status",
    "sbatch": "sbatch",
    "demo": "demo",
}


def load_command(name: str) -> click.Command | None:
    """The command called ``name`` (None if there is none), importing its module now. It also
    takes ``--config`` after its own name (``slurm-spot render --config F``).

    Raises:
        LookupError: :data:`COMMAND_MODULES` names a module that does not define ``name``.
    """
    module_name = COMMAND_MODULES.get(name)
    if module_name is None:
        return None
    module = importlib.import_module(f"slurm_spot.commands.{module_name}")
    for command in module.COMMANDS:
        if command.name == name:
            add_config_option(command)
            return command
    raise LookupError(f"slurm_spot.commands.{module_name} defines no command {name!r}")


class LazyGroup(click.Group):
    """A click group whose commands are loaded on first use (:func:`load_command`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            command = load_command(cmd_name)
            if command is None:
                return None
            self.add_command(command)
        return self.commands.get(cmd_name)
