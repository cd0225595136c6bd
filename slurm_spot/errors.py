"""The exception tree of slurm-spot.

Every error the package raises on purpose derives from :class:`SlurmSpotError`. The CLI maps
:class:`BadInputError` (and its children) to exit code 2 and every other ``SlurmSpotError`` to
exit code 1, printing the message, which always names what is wrong and where.
"""

from __future__ import annotations

from typing import Any


class SlurmSpotError(Exception):
    """Root of every error slurm-spot raises on purpose."""


class BadInputError(SlurmSpotError):
    """Input from a person or a file is wrong (exit code 2 on the CLI)."""


class PortTakenError(BadInputError):
    """A TCP port cannot be bound because another socket holds it (``EADDRINUSE``): a caller
    with other candidate ports tries the next."""


class ConfigError(BadInputError):
    """``spot.yaml`` is unreadable or invalid.

    Attributes:
        path: the file that was read.
        problems: one line per problem, each naming the field (dotted path) and the reason.
    """

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: invalid configuration:\n{lines}")


class HostlistError(BadInputError):
    """A hostlist expression cannot be expanded; the message names the bad part."""


class UnknownNodeError(BadInputError):
    """A node name is not part of any configured node set."""


class SlurmCommandError(SlurmSpotError):
    """A Slurm command failed or timed out.

    Attributes:
        argv: the command line that was run.
        returncode: its exit status (``None`` when it timed out or could not start).
        stderr: what it printed on standard error (stripped).
    """

    def __init__(self, argv: list[str], returncode: int | None, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr.strip()
        status = "did not finish" if returncode is None else f"exited {returncode}"
        super().__init__(f"{' '.join(argv)} {status}: {self.stderr or '(no error output)'}")


class SlurmOutputError(SlurmCommandError):
    """A Slurm command ran, but what it printed cannot be read without trusting a user's
    text (a job name that copies Slurm's own fields): callers skip what it was about, as
    for any failed read (``stderr`` says why)."""


class ProviderError(SlurmSpotError):
    """A cloud provider call failed.

    Attributes:
        code: the provider's error code as it sent it (``InsufficientInstanceCapacity``,
            ``ZONE_RESOURCE_POOL_EXHAUSTED``), or ``"Unknown"``.
        error_class: the :class:`~slurm_spot.providers.base.ErrorClass` value it maps to.
    """

    def __init__(self, code: str, message: str, error_class: str = "unknown") -> None:
        self.code = code
        self.error_class = error_class
        super().__init__(f"{code}: {message}")


class PartialTerminationError(ProviderError):
    """Some instances of a termination could not be terminated; every other one was.

    Attributes:
        failed: instance id -> the provider's error for it (``"OperationNotPermitted: ..."``).
        terminated: what was terminated (instance ids, or the provider's instance records when
            the caller asked by node), so a caller can record those and report the rest.
    """

    def __init__(self, failed: dict[str, str], terminated: list[Any], total: int,
                 names: dict[str, str] | None = None) -> None:
        self.failed = dict(failed)
        self.terminated = list(terminated)
        names = names or {}
        listed = "; ".join(
            f"{iid}{f' ({names[iid]})' if iid in names else ''}: {why}"
            for iid, why in sorted(self.failed.items()))
        first = next(iter(self.failed.values()), "Unknown: ").split(":", 1)[0]
        super().__init__(first, f"could not terminate {len(self.failed)} of {total} instances "
                                f"(the others were terminated): {listed}")


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message names the path and the reason.
    Exported as :class:`slurm_spot.checkpoint.CheckpointError` for training code; here so that
    the job contract (:mod:`slurm_spot.contract.location`) can raise it too."""
