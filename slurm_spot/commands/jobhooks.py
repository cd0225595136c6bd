"""``slurm-spot prolog|task-prolog|epilog``: run by slurmd with the job's environment."""

from __future__ import annotations

import os

import click

from slurm_spot.commands.common import AppContext, pass_app
from slurm_spot.errors import SlurmSpotError
from slurm_spot.jobs import prolog as job_prolog


@click.command("prolog")
@pass_app
def prolog_command(app: AppContext) -> None:
    """Prolog: create the job's checkpoint directory (as root, no symlinks followed)."""
    path = job_prolog.prepare_checkpoint_dir(app.config, os.environ)
    click.echo(f"checkpoint directory {path}")


@click.command("task-prolog")
@pass_app
def task_prolog_command(app: AppContext) -> None:
    """TaskProlog: print the 'export NAME=value' lines slurmd adds to each task."""
    for line in job_prolog.task_prolog_lines(app.config, os.environ):
        click.echo(line)


@click.command("epilog")
@pass_app
def epilog_command(app: AppContext) -> None:
    """Epilog: record the job's end on this node (checkpoints are kept). Always exits 0: a
    failing Epilog drains the node."""
    try:
        job_prolog.epilog(app.config, os.environ)
    except SlurmSpotError as exc:
        click.echo(f"slurm-spot epilog: {exc}", err=True)


COMMANDS = [prolog_command, task_prolog_command, epilog_command]
