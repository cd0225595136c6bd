"""Entry point of the executables in ``resume_scripts/`` that slurm.conf points at.

slurmctld (power saving) and slurmd (Prolog/Epilog/TaskProlog) run them with an almost empty
environment, so each is installed with an absolute interpreter path, and the config is found
through ``SLURM_CONF`` (see :func:`slurm_spot.config.config_path`).
"""

from __future__ import annotations

import sys

from slurm_spot.cli import main as cli_main

_DETACHED = {"resume", "suspend", "resume-fail"}


def main(name: str, argv: list[str] | None = None) -> int:
    """Run hook ``name`` with the process arguments; power hooks detach. Returns exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = [name, *args]
    if name in _DETACHED:
        command.append("--detach")
    try:
        cli_main(command)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0
