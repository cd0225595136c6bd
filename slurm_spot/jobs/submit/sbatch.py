"""``slurm-spot sbatch``: sbatch, plus what a job needs to survive spot interruptions.

Pure functions: splitting a command line into sbatch options and the script, building the
final script and argv, and checking the per-job settings passed through the job's environment
(the ``#SBATCH`` reader is :mod:`slurm_spot.contract.directives`). The command in ``commands/sbatch.py``
only parses options and prints; the ``--torchrun`` scripts are
:mod:`slurm_spot.jobs.submit.torchrun_scripts`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_spot.config.plain import S3_ROOT_PATTERN
from slurm_spot.contract.directives import (
    has_flag,
    option_values,
    read_directives,
)
from slurm_spot.contract.jobenv import parse_signal
from slurm_spot.contract.names import (
    ENV_CHECKPOINT_ROOT,
    ENV_S3_ADDRESSING_STYLE,
    ENV_S3_ENDPOINT_URL,
)
from slurm_spot.contract.sbatch_options import (
    canonical_option,
    parse_command_line,
    split_clusters,
)
from slurm_spot.errors import BadInputError


def split_command_line(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Split ``[sbatch options] SCRIPT [ARGS]`` into (options, script, script args), knowing
    which of sbatch's options take a value (:mod:`slurm_spot.contract.sbatch_options`).

    Options keep their original form (``-N 2`` stays two words, ``--nodes=2`` one).
    ``script`` is None for ``--wrap`` jobs, which have no script file.

    Raises:
        BadInputError: an option that needs a value is last; an unknown or ambiguous option.
    """
    line = parse_command_line(argv)
    return line.options, line.script, line.script_args




@dataclass
class Submission:
    """What to submit: the final script text, the sbatch options (the user's, unchanged),
    the script's arguments, and warnings for the user."""

    script: str
    options: list[str]
    script_args: list[str]
    warnings: list[str] = field(default_factory=list)

    def argv(self, script_path: str, sbatch: str = "sbatch") -> list[str]:
        """``sbatch [options] SCRIPT_PATH [args]``."""
        return [sbatch, *self.options, script_path, *self.script_args]


def plan_submission(
    script_text: str,
    script_name: str,
    cli_options: Sequence[str],
    script_args: Sequence[str],
    signal: str,
    lead_s: int,
    env: Mapping[str, str] | None = None,
    expedite: bool = False,
) -> Submission:
    """Build what to submit: the script with slurm-spot's directives right after the shebang,
    and the user's options and arguments, passed through unchanged.

    Adds ``--requeue`` (``--requeue=expedite`` with ``expedite``, for Slurm 25.11+: the
    requeued job is eligible at once and runs first, see
    :attr:`~slurm_spot.slurm.version.SlurmVersion.expedited_requeue`), ``--open-mode=append``,
    ``--signal=<signal>@<lead_s>``, an explicit ``--nodes`` (1 unless given) and ``--job-name``
    (the script's name), each unless set. Directives in the script come before command-line
    options, so the user's still win.

    Raises:
        BadInputError: ``--no-requeue``; a script without ``#!``. A ``--signal`` of the job's
            own (another signal than ``signal``, or ``B:``) is kept, with a warning saying
            what slurm-spot's checkpoint library listens for.
    """
    if not is_script(script_text):
        raise BadInputError(f"{script_name!r}: a batch script must start with '#!' (sbatch(1))")
    directives = read_directives(script_text)
    options = [*directives.options(), *cli_options]
    warnings = [
        f"{script_name}:{d.line}: '#SBATCH {' '.join(d.options)}' comes after the first "
        "command; sbatch ignores it" for d in directives.ignored
    ]
    env = env or {}
    if has_flag(options, "--no-requeue") or "SBATCH_NO_REQUEUE" in env:
        raise BadInputError("--no-requeue (or SBATCH_NO_REQUEUE): jobs on spot nodes must be "
                            "requeueable; drop it")
    if env.get("SBATCH_SIGNAL"):
        options = [f"--signal={env['SBATCH_SIGNAL']}", *options]
    added = ["--requeue=expedite" if expedite else "--requeue", "--open-mode=append"]
    wanted = parse_signal(signal)
    given = option_values(options, "--signal")
    for value in given:
        spec = parse_signal(value)
        # The job's own choice is kept: the watcher reads it from the script's directives and
        # sends it to the processes that catch it (jobs/interruption/signal_choice.py), the batch shell
        # included for 'B:', so a job written for another framework (Lightning: SIGUSR1)
        # is submitted as its users wrote it. Only say what slurm-spot's library will do.
        if spec.number != wanted.number:
            warnings.append(
                f"--signal={value}: the job asks for SIG{spec.name}; on a notice the watcher "
                f"sends SIG{spec.name} to the processes that catch it. slurm-spot's checkpoint "
                f"library, if the job uses it, listens for SIG{wanted.name} "
                "(preemption.signal) and SIGTERM")
    if not given:
        added.append(f"--signal={wanted.name}@{lead_s}")
    if not option_values(options, "--nodes", "-N"):
        added.append("--nodes=1")
    if not option_values(options, "--job-name", "-J"):
        name = re.sub(r"[^A-Za-z0-9._+-]", "_", script_name.rsplit("/", 1)[-1]) or "job"
        added.append(f"--job-name={name}")
    final = insert_directives(script_text, added)
    # sbatch takes --signal from the command line first, then SBATCH_SIGNAL, then the script;
    # the watcher reads only the script (signal_choice.requested_signal, the last directive),
    # so one given outside it is written last in the script's header too: before, a job
    # submitted with `--signal=USR1@60` got spot.yaml's signal whenever it also caught that.
    outside = option_values(cli_options, "--signal") or (
        [env["SBATCH_SIGNAL"]] if env.get("SBATCH_SIGNAL") else [])
    if outside:
        final = append_directive(final, f"--signal={outside[-1]}")
    return Submission(final, list(cli_options), list(script_args), warnings)


def append_directive(script_text: str, option: str) -> str:
    """``script_text`` with ``#SBATCH <option>`` right after its last active directive (the
    end of the header sbatch reads, :func:`read_directives`), or after the shebang if it has
    none; a later directive of the same option would win, this one does not lose to any."""
    active = read_directives(script_text).active
    lines = script_text.splitlines(keepends=True)
    at = active[-1].line if active else (1 if script_text.startswith("#!") else 0)
    if at and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    return "".join([*lines[:at], f"#SBATCH {option}\n", *lines[at:]])


def insert_directives(script_text: str, options: Sequence[str]) -> str:
    """Put ``#SBATCH <option>`` lines right after the shebang (or at the top if none)."""
    block = "".join(f"#SBATCH {opt}\n" for opt in options)
    block = "# added by slurm-spot sbatch:\n" + block
    if script_text.startswith("#!"):
        first, _, rest = script_text.partition("\n")
        return f"{first}\n{block}{rest}"
    return "#!/bin/bash\n" + block + script_text


_SHEBANG = re.compile(r"^#!")


def is_script(text: str) -> bool:
    """sbatch requires a batch script to start with ``#!``."""
    return bool(_SHEBANG.match(text))


def take_option(options: Sequence[str], long: str, short: str) -> tuple[list[str], list[str]]:
    """Split ``options`` into the values of one option (``--partition=spot``, ``--partition
    spot``, ``--part spot``, ``-p spot``, ``-pspot``) and every other word, in order (pure).
    ``slurm-spot sbatch --coordinator-partition`` moves ``-p``/``-N`` from the command line
    into the workers' component: sbatch applies command-line options to every component of a
    heterogeneous job (seen with Slurm 22.05.8: ``sbatch -p spot`` put the coordinator's
    component on ``spot`` too)."""
    values: list[str] = []
    rest: list[str] = []
    options = split_clusters(options)  # -Hp spot: the -p inside a cluster too
    i = 0
    while i < len(options):
        word = options[i]
        full = canonical_option(word)
        if full.startswith(long + "="):
            values.append(full.split("=", 1)[1])
        elif full == long or word == short:
            if i + 1 < len(options):
                values.append(options[i + 1])
            i += 1
        elif word.startswith(short) and len(word) > len(short) and not word.startswith("--"):
            values.append(word[len(short):])
        else:
            rest.append(word)
        i += 1
    return values, rest


#: Per-job checkpoint settings, ``slurm-spot sbatch`` option -> the variable that carries it:
#: passed to the job in its environment (sbatch's default --export=ALL), read by the
#: TaskProlog (slurm_spot.jobs.node.prolog.checkpoint_root).
JOB_ENV_OPTIONS = {"--checkpoint-root": ENV_CHECKPOINT_ROOT,
                   "--s3-endpoint-url": ENV_S3_ENDPOINT_URL,
                   "--s3-addressing-style": ENV_S3_ADDRESSING_STYLE}


def check_job_environment(values: dict[str, str]) -> dict[str, str]:
    """``values`` (variable of :data:`JOB_ENV_OPTIONS` -> value), once each value is checked:
    one line; the checkpoint root an ``s3://bucket/prefix`` URL (directory roots are the
    admin's); the endpoint an ``http(s)://`` URL; the addressing style ``auto``, ``path`` or
    ``virtual``.

    Raises:
        BadInputError: a value is none of these (names the option).
    """
    names = {v: k for k, v in JOB_ENV_OPTIONS.items()}
    for var, value in values.items():
        option = names[var]
        if any(c in value for c in "\n\r"):
            raise BadInputError(f"{option}: the value must be one line")
        if var == ENV_CHECKPOINT_ROOT and not re.fullmatch(S3_ROOT_PATTERN, value):
            raise BadInputError(f"{option}={value!r}: expected s3://bucket/prefix (a job may "
                                "choose an S3 root; directory roots are the admin's)")
        if var == ENV_S3_ENDPOINT_URL and not re.fullmatch(r"https?://\S+", value):
            raise BadInputError(f"{option}={value!r}: expected an http(s):// URL")
        if var == ENV_S3_ADDRESSING_STYLE and value not in ("auto", "path", "virtual"):
            raise BadInputError(f"{option}={value!r}: expected auto, path or virtual")
    return values
