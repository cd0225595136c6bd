"""CLI commands, one module per topic; :func:`register` adds them all to the group."""

from __future__ import annotations

import importlib

import click

_MODULES = (
    "power",
    "configure",
    "local",
    "watch",
    "events",
    "jobhooks",
    "instances",
    "reconcile",
    "status",
    "sbatch",
    "demo",
)


def register(group: click.Group) -> None:
    """Add every command of every module in ``_MODULES`` (each exposes ``COMMANDS``)."""
    for name in _MODULES:
        module = importlib.import_module(f"slurm_spot.commands.{name}")
        for command in module.COMMANDS:
            group.add_command(command)
