"""The one runner of every command slurm-spot runs to completion: an argv list with a timeout,
no shell, stdin closed. :class:`~slurm_spot.slurm.client.SlurmClient` takes any
:class:`CommandRunner`, so tests can substitute a fake one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from slurm_spot.errors import SlurmCommandError
from slurm_spot.rawtext import DECODE_ERRORS

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and returned. ``stdout``/``stderr`` are UTF-8 text in which a
    byte that is not UTF-8 (a user's job name, comment, batch script) is kept as a surrogate
    (:data:`slurm_spot.rawtext.DECODE_ERRORS`); :func:`slurm_spot.rawtext.escaped` shows it."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one argv list; raises SlurmCommandError on timeout or a missing program."""

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult: ...


def run_command(argv: list[str], timeout_s: float,
                env: Mapping[str, str] | None = None) -> CommandResult:
    """Run ``argv`` (no shell, stdin closed), capture its output: the one runner of every
    command slurm-spot runs to completion (Slurm's, ``sbatch``, ``slurmctld -V``, ``ip``, the
    demo's own CLI calls). Output is read as UTF-8 whatever bytes it holds: an invalid byte is
    kept, not an error (:mod:`slurm_spot.rawtext`). ``env`` replaces the environment when
    given. (Daemons that outlive the call, the local provider's instances and the local
    slurmctld's reconciler, are started detached with ``subprocess.Popen`` where they are managed.)

    Raises:
        SlurmCommandError: no answer within ``timeout_s`` seconds, or the program cannot run
            (missing, not executable). A non-zero exit is returned, not raised.
    """
    try:
        proc = subprocess.run(  # noqa: S603 - argv list, no shell
            argv, capture_output=True, encoding="utf-8", errors=DECODE_ERRORS, timeout=timeout_s, check=False,
            stdin=subprocess.DEVNULL, env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(argv, None, f"no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise SlurmCommandError(argv, None, f"cannot run {argv[0]}: {exc.strerror}") from exc
    return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)
