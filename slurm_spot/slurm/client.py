"""The only code that runs Slurm commands (``scontrol``, ``sinfo``, ``squeue``, ``sbatch``).

Every call is an argv list with a timeout, through one :class:`CommandRunner`, so tests can
substitute a fake runner. A failing command raises :class:`~slurm_spot.errors.SlurmCommandError`
carrying its stderr; nothing is swallowed.

:class:`SlurmClient` is the one entry point. Its parts: :mod:`.runner` (running a command),
:mod:`.queries` (reads and the records they give), :mod:`.actions` (calls that change a node or
a job). The records and the runner are importable from here too.
"""

from __future__ import annotations

from slurm_spot.slurm.actions import SlurmActions
from slurm_spot.slurm.queries import Job, JobRecord, Node, parse_job_json, parse_job_record
from slurm_spot.slurm.runner import DEFAULT_TIMEOUT_S, CommandResult, CommandRunner, run_command

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CommandResult",
    "CommandRunner",
    "Job",
    "JobRecord",
    "Node",
    "SlurmClient",
    "parse_job_json",
    "parse_job_record",
    "run_command",
]


class SlurmClient(SlurmActions):
    """Access to a Slurm cluster through its command-line tools.

    Args:
        bin_dir: directory of scontrol/sinfo/squeue/sbatch (absolute: hooks run with no PATH).
        runner: how to run a command (default: :func:`run_command`).
        timeout_s: per-command timeout in seconds.
        version: the Slurm release this talks to; None: asked once from ``scontrol -V``
            (which needs no slurmctld) when a version-dependent call first needs it.
    """
