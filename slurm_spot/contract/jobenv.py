"""What a job derives from its Slurm environment: pure functions over an env mapping.

Every function takes the environment as an explicit mapping (``os.environ`` in production, a
plain ``dict`` in tests) and never reads or changes the process environment itself.

Variables read:

- ``SLURM_JOB_ID``, ``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``: set by Slurm in every job;
- ``SLURM_RESTART_COUNT``: set by Slurm from the first requeue on (unset on the first run);
- ``SLURM_SPOT_PREEMPT_SIGNAL``: the signal ``slurm-spot sbatch`` told Slurm to send, in any form
  sbatch's ``--signal`` accepts (``USR2``, ``SIGUSR2``, ``12``, ``B:USR2@90``, ``R:SIGUSR2@120``);
- ``SLURM_SPOT_REQUEUE_EXIT_CODE``: the exit code that asks for a requeue (default 85);
- ``SLURM_SPOT_CHECKPOINT_DIR``: the job's checkpoint directory, exported by the TaskProlog.

``TORCHELASTIC_RESTART_COUNT`` is deliberately ignored: it counts torchrun's local restarts of
the workers on one node and says nothing about how often Slurm requeued the job.
"""

from __future__ import annotations

import os
import re
import shutil
import signal as _signal
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_spot.contract.location import Location, as_location, local_path
from slurm_spot.contract.names import (  # the names, re-exported for the checkpoint library
    ENV_CHECKPOINT_DIR,
    ENV_FT_CHECKPOINT_KEY,
    ENV_PREEMPT_SIGNAL,
    ENV_REQUEUE_EXIT_CODE,
    ENV_SLURM_BIN_DIR,
)
from slurm_spot.errors import BadInputError

DEFAULT_PREEMPT_SIGNAL = "USR2"
DEFAULT_REQUEUE_EXIT_CODE = 85
#: Exit code of an elastic job's worker that stops only because the world changes (another
#: node leaves or joins): torchrun's agent restarts it after a new rendezvous round. The
#: elastic agent (:mod:`slurm_spot.jobs.injob.torchrun_agent`) counts it, like the requeue code, as
#: an interruption, not a crash.
REJOIN_EXIT_CODE = 86

def find_scontrol(env: Mapping[str, str]) -> str | None:
    """The ``scontrol`` a job's rank 0 runs to requeue the job: the one on the job's ``PATH``
    (``env["PATH"]``; none when unset), else ``$SLURM_SPOT_SLURM_BIN_DIR/scontrol`` (exported
    by the TaskProlog) when it is an executable file; None when neither is."""
    found = shutil.which("scontrol", path=env.get("PATH", ""))
    if found:
        return found
    bin_dir = env.get(ENV_SLURM_BIN_DIR, "").strip()
    candidate = os.path.join(bin_dir, "scontrol") if bin_dir else ""
    if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    return None


# The names Slurm's sig_name2num() knows (src/common/proc_args.c); sbatch rejects any other name.
SLURM_SIGNAL_NAMES = (
    "HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP",
    "TSTP", "TTIN", "TTOU", "XCPU",
)
_FLAG_WORDS = {"B": "batch_only", "R": "reservation_overlap"}
_SPEC = re.compile(r"^(?:(?P<flags>[A-Za-z]{1,2}):)?(?P<sig>[A-Za-z0-9]+)(?:@(?P<lead>.*))?$")

Env = Mapping[str, str]


class JobEnvError(BadInputError, ValueError):
    """A job variable (or a signal given in code) is malformed; the message names it.

    A :class:`ValueError` as well as a :class:`~slurm_spot.errors.BadInputError`.
    """


@dataclass(frozen=True)
class SignalSpec:
    """A parsed sbatch ``--signal`` value.

    Attributes:
        number: the signal number on this system (SIGUSR2 is 12 on Linux x86-64 and arm64).
        name: Slurm's name without ``SIG`` (``"USR2"``), or the number as text for a signal
            without a name (real-time signals).
        lead_s: seconds before the time limit at which Slurm sends it; ``None`` when the
            value had no ``@`` part (sbatch then uses 60).
        flags: ``"B"`` (signal the batch shell only) and/or ``"R"`` (allow reservation
            overlap), as given.
    """

    number: int
    name: str
    lead_s: int | None = None
    flags: frozenset[str] = frozenset()

    @property
    def batch_only(self) -> bool:
        """True with the ``B:`` flag: only the batch shell gets the signal, not the steps."""
        return "B" in self.flags

    def sbatch_value(self, lead_s: int | None = None) -> str:
        """The value for ``sbatch --signal=`` (``"B:USR2@90"``); ``lead_s`` overrides ours."""
        flags = "".join(f for f in "RB" if f in self.flags)
        lead = self.lead_s if lead_s is None else lead_s
        text = f"{flags}:{self.name}" if flags else self.name
        return f"{text}@{lead}" if lead is not None else text


def parse_signal(value: str | int) -> SignalSpec:
    """Parse a signal as sbatch ``--signal`` accepts it.

    Accepted: a name with or without ``SIG`` in any case (``USR2``, ``sigusr2``), a number
    (``12``), each optionally prefixed by flags ``B:``, ``R:``, ``RB:``/``BR:`` and followed by
    ``@<seconds>`` (0..65535). Stricter than sbatch only where sbatch's reading is surprising
    (a bare ``@``, repeated flags, numbers that are no signal on this system).

    Raises:
        JobEnvError: naming the bad part (unknown name, bad flag, bad lead time, no such signal).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return SignalSpec(_check_number(value, str(value)), _name_of(value))
    text = str(value).strip()
    match = _SPEC.fullmatch(text)
    if not text or match is None:
        raise JobEnvError(
            f"bad signal {value!r}: expected [B:|R:|RB:]NAME_OR_NUMBER[@SECONDS], e.g. 'B:USR2@90'"
        )
    flags = frozenset(match["flags"].upper()) if match["flags"] else frozenset()
    if match["flags"] and (
        len(flags) != len(match["flags"]) or not flags <= set(_FLAG_WORDS)
    ):
        raise JobEnvError(f"bad signal {value!r}: flags before ':' may be B, R or both, once each")
    number, name = _signal_of(match["sig"], value)
    lead_s: int | None = None
    if match["lead"] is not None:
        lead = match["lead"]
        if not lead.isdigit() or int(lead) > 0xFFFF:
            raise JobEnvError(
                f"bad signal {value!r}: the lead time after '@' must be 0..65535 seconds, "
                f"got {lead!r}"
            )
        lead_s = int(lead)
    return SignalSpec(number, name, lead_s, flags)


def _signal_of(word: str, original: object) -> tuple[int, str]:
    if word.isdigit():
        number = _check_number(int(word), original)
        return number, _name_of(number)
    name = word.upper().removeprefix("SIG")
    if name not in SLURM_SIGNAL_NAMES:
        raise JobEnvError(
            f"bad signal {original!r}: unknown signal name {word!r}; "
            f"Slurm knows {', '.join(SLURM_SIGNAL_NAMES)}"
        )
    return int(_signal.Signals[f"SIG{name}"]), name


def _check_number(number: int, original: object) -> int:
    if number not in {int(s) for s in _signal.valid_signals()}:
        raise JobEnvError(
            f"bad signal {original!r}: {number} is not a signal number on this system"
        )
    return number


def _name_of(number: int) -> str:
    try:
        name = _signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)
    return name if name in SLURM_SIGNAL_NAMES else str(number)


def preemption_signal(env: Env, default: str | int = DEFAULT_PREEMPT_SIGNAL) -> SignalSpec:
    """The preemption signal the job was told about: ``SLURM_SPOT_PREEMPT_SIGNAL`` or ``default``.

    Raises:
        JobEnvError: the variable (or ``default``) is not a valid signal; the message names it.
    """
    raw = env.get(ENV_PREEMPT_SIGNAL, "").strip()
    if not raw:
        return parse_signal(default)
    try:
        return parse_signal(raw)
    except JobEnvError as exc:
        raise JobEnvError(f"{ENV_PREEMPT_SIGNAL}: {exc}") from None


def restart_count(env: Env) -> int:
    """How often Slurm restarted (requeued) this job: ``SLURM_RESTART_COUNT``, 0 if unset/empty.

    Never uses ``TORCHELASTIC_RESTART_COUNT`` (local to one node's torchrun agent).

    Raises:
        JobEnvError: the variable is set but is not a non-negative integer.
    """
    raw = env.get("SLURM_RESTART_COUNT", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise JobEnvError(f"SLURM_RESTART_COUNT={raw!r} is not a non-negative integer")
    return int(raw)


def is_slurm_job(env: Env) -> bool:
    """True inside a Slurm job (``SLURM_JOB_ID`` is set and not empty)."""
    return bool(env.get("SLURM_JOB_ID", "").strip())


def _job_id(env: Env) -> str:
    raw = env.get("SLURM_JOB_ID", "").strip()
    if not raw:
        raise JobEnvError("not inside a Slurm job: SLURM_JOB_ID is not set")
    if not raw.isdigit():
        raise JobEnvError(f"SLURM_JOB_ID={raw!r} is not a job id (digits expected)")
    return raw


def _array_ids(env: Env) -> tuple[str, str] | None:
    array_job = env.get("SLURM_ARRAY_JOB_ID", "").strip()
    task = env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if not array_job and not task:
        return None
    if not (array_job.isdigit() and task.isdigit()):
        raise JobEnvError(
            f"SLURM_ARRAY_JOB_ID={array_job!r} and SLURM_ARRAY_TASK_ID={task!r} must both be "
            "set to digits in an array task"
        )
    return array_job, task


def requeue_target(env: Env) -> str:
    """What ``scontrol requeue`` must be given: ``"1234_2"`` for an array task, else the job id.

    Raises:
        JobEnvError: ``SLURM_JOB_ID`` is missing or malformed, or only half of the array
            variables are set.
    """
    job_id = _job_id(env)
    array = _array_ids(env)
    return f"{array[0]}_{array[1]}" if array else job_id


def checkpoint_key(env: Env) -> str:
    """A name for the job's checkpoint directory that stays the same across requeues.

    The job id, or ``"<array job id>_<task id>"`` for an array task (a requeued array task keeps
    both). Never includes the restart count.

    Raises:
        JobEnvError: as :func:`requeue_target`.
    """
    return requeue_target(env)


def requeue_exit_code(env: Env, default: int = DEFAULT_REQUEUE_EXIT_CODE) -> int:
    """The exit code that asks for a requeue: ``SLURM_SPOT_REQUEUE_EXIT_CODE`` or ``default``.

    Raises:
        JobEnvError: the variable is not an integer in 0..255.
    """
    raw = env.get(ENV_REQUEUE_EXIT_CODE, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > 255:
        raise JobEnvError(f"{ENV_REQUEUE_EXIT_CODE}={raw!r} is not an exit code (0..255)")
    return int(raw)


def ft_checkpoint_dir(env: Env) -> Location | None:
    """The checkpoint directory the replica groups of a fault-tolerant job share: the
    TaskProlog's ``SLURM_SPOT_CHECKPOINT_DIR`` (``<root>/<user>/<this group's job id>``) with
    its last part replaced by ``SLURM_SPOT_FT_CHECKPOINT_KEY`` (the lighthouse job's id, set by
    the group's batch script); without that key, :func:`checkpoint_dir`.

    Raises:
        JobEnvError: the key is set but is not a job id.
    """
    own = checkpoint_dir(env)
    key = env.get(ENV_FT_CHECKPOINT_KEY, "").strip()
    if not key or own is None:
        return own
    if not (key.isascii() and key.isdigit()):
        raise JobEnvError(f"{ENV_FT_CHECKPOINT_KEY}={key!r} is not a job id")
    path = local_path(own)
    if path is None:  # a store's URL: <root>/<user>/<key> joined with "/"
        return f"{str(own).rstrip('/').rsplit('/', 1)[0]}/{key}"
    return path.parent / key


def checkpoint_dir(env: Env) -> Location | None:
    """The job's checkpoint directory from ``SLURM_SPOT_CHECKPOINT_DIR``, or None if unset; an
    ``s3://bucket/prefix`` URL is returned as the string it is (a Path would fold its ``//``)."""
    raw = env.get(ENV_CHECKPOINT_DIR, "").strip()
    return as_location(raw) if raw else None
