"""``slurm-spot prolog|task-prolog|epilog``: run by slurmd with the job's environment (the
work is in :func:`slurm_spot.hooks.job_hook_lines`, shared with the light hook executables);
``slurm-spot prolog-slurmctld``: run by slurmctld at allocation (:mod:`slurm_spot.lifecycle.bootwait`)."""

from __future__ import annotations

import os

import click

from slurm_spot.commands.common import AppContext, pass_app
from slurm_spot.hooks import job_hook_lines


@click.command("prolog")
@pass_app
def prolog_command(app: AppContext) -> None:
    """Prolog: create the job's checkpoint directory (as root, no symlinks followed)."""
    for line in job_hook_lines("prolog", app.config, os.environ):
        click.echo(line)


@click.command("task-prolog")
@pass_app
def task_prolog_command(app: AppContext) -> None:
    """TaskProlog: print the 'export NAME=value' lines slurmd adds to each task."""
    for line in job_hook_lines("task-prolog", app.config, os.environ):
        click.echo(line)


@click.command("epilog")
@pass_app
def epilog_command(app: AppContext) -> None:
    """Epilog: record the job's end on this node (checkpoints are kept). Always exits 0: a
    failing Epilog drains the node."""
    job_hook_lines("epilog", app.config, os.environ)


@click.command("prolog-slurmctld")
def prolog_slurmctld_command() -> None:
    """PrologSlurmctld: wait until the job's powered-up nodes registered, so slurmctld
    launches it at once (slurm_spot/lifecycle/bootwait.py). Always exits 0."""
    from slurm_spot.lifecycle import bootwait

    bootwait.main()


COMMANDS = [prolog_command, task_prolog_command, epilog_command, prolog_slurmctld_command]
