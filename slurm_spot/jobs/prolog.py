"""Prolog, TaskProlog and Epilog: the job's checkpoint directory and environment.

- **Prolog** (slurmd, as root, on each node before the job's first step): creates
  ``<checkpoint root>/<user>/<job key>`` where the key is the job id, or
  ``<array job id>_<task id>`` for an array task, never the restart count, so a requeued job
  finds its checkpoints again. Created without following symlinks, component by component
  relative to open directory descriptors (no race between check and use), owned by the job
  user, mode 0700. A symlink anywhere below the root, or a key that would leave the root, is
  refused: the prolog fails and Slurm requeues the job held, with nothing written.
- **TaskProlog** (slurmd, as the job user, before each task): prints ``export NAME=value``
  lines, which slurmd adds to the task's environment (slurm.conf(5), TaskProlog):
  ``SLURM_SPOT_CHECKPOINT_DIR``, ``SLURM_SPOT_RESTART_COUNT``, ``SLURM_SPOT_PREEMPT_SIGNAL``,
  ``SLURM_SPOT_REQUEUE_EXIT_CODE``.
- **Epilog** (as root, after the job on each node): records the job's end as an event; it
  never deletes checkpoints (a requeued job needs them).
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from slurm_spot import events
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.jobenv import checkpoint_key, restart_count

_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$", re.IGNORECASE)
_KEY = re.compile(r"^\d+(_\d+)?$")


def checkpoint_dir(config: SpotConfig, env: Mapping[str, str]) -> Path:
    """``<root>/<user>/<key>`` for the job described by ``env`` (pure: touches nothing).

    Raises:
        BadInputError: missing job id or user, or a user/key that is not a plain name.
    """
    user = env.get("SLURM_JOB_USER", "")
    if not _USER.match(user):
        raise BadInputError(f"SLURM_JOB_USER {user!r} is not a valid user name")
    key = checkpoint_key(env)
    if not _KEY.match(key):
        raise BadInputError(f"checkpoint key {key!r} from the job environment is not a job id")
    return config.checkpoint.root / user / key


def _open_dir(name: str, parent_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)


def _ensure_child(parent_fd: int, name: str, uid: int, gid: int, where: Path) -> int:
    """Create (if needed) and open directory ``name`` under ``parent_fd`` without following a
    symlink; give it to uid:gid with mode 0700. Returns its fd."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = _open_dir(name, parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BadInputError(
                f"{where}: is a symlink or not a directory; refusing to use it as a "
                "checkpoint directory"
            ) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise BadInputError(f"{where}: not a directory")
    os.fchown(fd, uid, gid)
    os.fchmod(fd, 0o700)
    return fd


def prepare_checkpoint_dir(config: SpotConfig, env: Mapping[str, str]) -> Path:
    """Prolog: create the job's checkpoint directory safely (see the module docstring).

    Raises:
        BadInputError: bad job environment, an unknown user, or a symlink / non-directory on
            the way; nothing is created below a refused component.
    """
    path = checkpoint_dir(config, env)
    user = path.parent.name
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise BadInputError(f"user {user!r} of the job is unknown on this node") from None
    uid = int(env.get("SLURM_JOB_UID", account.pw_uid))
    gid = int(env.get("SLURM_JOB_GID", account.pw_gid))
    root = config.checkpoint.root
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    if root.is_symlink():
        raise BadInputError(f"{root}: the checkpoint root is a symlink; refusing")
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        user_fd = _ensure_child(root_fd, user, uid, gid, root / user)
        try:
            job_fd = _ensure_child(user_fd, path.name, uid, gid, path)
            os.close(job_fd)
        finally:
            os.close(user_fd)
    finally:
        os.close(root_fd)
    return path


def task_prolog_lines(config: SpotConfig, env: Mapping[str, str]) -> list[str]:
    """TaskProlog output: ``export NAME=value`` lines for the task environment."""
    return [
        f"export SLURM_SPOT_CHECKPOINT_DIR={checkpoint_dir(config, env)}",
        f"export SLURM_SPOT_RESTART_COUNT={restart_count(env)}",
        f"export SLURM_SPOT_PREEMPT_SIGNAL={config.preemption.signal}",
        f"export SLURM_SPOT_REQUEUE_EXIT_CODE={config.preemption.requeue_exit_code}",
    ]


def epilog(config: SpotConfig, env: Mapping[str, str]) -> None:
    """Epilog: record the job's end on this node as an event."""
    job = env.get("SLURM_JOB_ID", "")
    events.emit(config.log_dir, events.Event(
        "job_end", "epilog", node=env.get("SLURMD_NODENAME"),
        job_ids=(int(job),) if job.isdigit() else (),
        extra={"restarts": restart_count(env)}))
