"""Shell completion of node names and job ids, from Slurm itself.

click completes commands and options by itself once the shell is set up (README, "Shell
completion": ``eval "$(_SLURM_SPOT_COMPLETE=bash_source slurm-spot)"``); the callbacks here add
the values: node names from ``sinfo -h -N -o %N``, job ids from ``squeue -h -o %A`` and from
slurm-spot's events
(sinfo(1), squeue(1) of Slurm 22.05: ``-N`` one line per node, ``%N`` node name, ``%A`` job id).
A Slurm that does not answer within 3 seconds, or answers an error, gives no completions
and no message: completion must never print into the user's command line.
"""

from __future__ import annotations

import shutil

import click
from click.shell_completion import CompletionItem

_TIMEOUT_S = 3.0


def _slurm_lines(program: str, *args: str) -> list[str]:
    """The output lines of a Slurm command found on PATH (else /usr/bin); [] on any failure."""
    from slurm_spot.errors import SlurmSpotError
    from slurm_spot.slurm.client import run_command

    path = shutil.which(program) or f"/usr/bin/{program}"
    try:
        result = run_command([path, *args], _TIMEOUT_S)
    except SlurmSpotError:
        return []
    if result.returncode != 0:
        return []
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def complete_nodes(_ctx: click.Context, _param: click.Parameter,
                   incomplete: str) -> list[CompletionItem]:
    """Slurm's node names that start with ``incomplete`` (sorted, each once)."""
    names = sorted(set(_slurm_lines("sinfo", "-h", "-N", "-o", "%N")))
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def _event_jobs(ctx: click.Context) -> set[str]:
    """Job ids in slurm-spot's events file (jobs that ended are no longer in squeue), from the
    config given to the command line or found as usual; none if it cannot be read."""
    from slurm_spot.config import load_config
    from slurm_spot.events import read_events

    try:
        config = load_config(ctx.find_root().params.get("config_path"))
        found = set()
        for event in read_events(config.log_dir):
            job_ids = event.get("job_ids")
            if isinstance(job_ids, list):
                found |= {str(j) for j in job_ids if isinstance(j, int)}
        return found
    except Exception:  # completion is silent: any unreadable config or file means none
        return set()


def complete_jobs(ctx: click.Context, _param: click.Parameter,
                  incomplete: str) -> list[CompletionItem]:
    """Ids of the jobs squeue shows and of those in slurm-spot's events, that start with
    ``incomplete`` (numeric order)."""
    ids = {line for line in _slurm_lines("squeue", "-h", "-o", "%A") if line.isdigit()}
    ids |= _event_jobs(ctx)
    return [CompletionItem(j) for j in sorted(ids, key=int) if j.startswith(incomplete)]
