"""CLI commands, one module per topic; :func:`register` adds them all to the group."""

from __future__ import annotations

import importlib

import click

from slurm_spot.commands.common import add_config_option

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
    "plan",
    "cost",
    "simulate",
)


def register(group: click.Group) -> None:
    """Add every command of every module in ``_MODULES`` (each exposes ``COMMANDS``), each
    also taking ``--config`` after its own name (``slurm-spot render --config F``)."""
    for name in _MODULES:
        module = importlib.import_module(f"slurm_spot.commands.{name}")
        for command in module.COMMANDS:
            add_config_option(command)
            group.add_command(command)
