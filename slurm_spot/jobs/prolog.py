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
import logging
import os
import pwd
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from slurm_spot import events
from slurm_spot.config import SpotConfig
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.jobenv import checkpoint_key, restart_count

_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?", re.IGNORECASE | re.ASCII)
_KEY = re.compile(r"[0-9]+(_[0-9]+)?")
log = logging.getLogger(__name__)


def checkpoint_dir(config: SpotConfig, env: Mapping[str, str]) -> Path:
    """``<root>/<user>/<key>`` for the job described by ``env`` (pure: touches nothing).

    Raises:
        BadInputError: missing job id or user, or a user/key that is not a plain name.
    """
    user = env.get("SLURM_JOB_USER", "")
    if not _USER.fullmatch(user):
        raise BadInputError(f"SLURM_JOB_USER {user!r} is not a valid user name")
    key = checkpoint_key(env)
    if not _KEY.fullmatch(key):
        raise BadInputError(f"checkpoint key {key!r} from the job environment is not a job id")
    return config.checkpoint.root / user / key


def _open_dir(name: str, parent_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)


def _ensure_child(parent_fd: int, name: str, uid: int, gid: int, where: Path,
                  move_aside: bool = False) -> int:
    """Create (if needed) and open directory ``name`` under ``parent_fd`` without following a
    symlink; give it to uid:gid with mode 0700. Returns its fd.

    An existing entry that is a symlink, not a directory, or owned by someone else than the
    user or root is refused, or with ``move_aside`` renamed to ``<name>.refused-<time>``
    (rename never follows a symlink) and replaced by a fresh directory.
    """
    for _ in range(2):
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        problem = _entry_problem(parent_fd, name, uid)
        if not problem:
            fd = _open_dir(name, parent_fd)
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)
            return fd
        if not move_aside:
            break
        aside = f"{name}.refused-{int(time.time())}"
        os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        log.warning("%s: %s; moved it aside to %s", where, problem, aside)
    raise BadInputError(f"{where}: {problem}; refusing to use it as a checkpoint directory")


def _entry_problem(parent_fd: int, name: str, uid: int) -> str:
    info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid not in (0, uid):
        return f"is owned by uid {info.st_uid}, not the job's user"
    return ""


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
    try:
        uid = int(env.get("SLURM_JOB_UID", account.pw_uid))
        gid = int(env.get("SLURM_JOB_GID", account.pw_gid))
    except ValueError:
        raise BadInputError("SLURM_JOB_UID/SLURM_JOB_GID are not numbers") from None
    root_fd = _open_root(config.checkpoint.root)
    root = config.checkpoint.root
    try:
        user_fd = _ensure_child(root_fd, user, uid, gid, root / user)
        try:
            job_fd = _ensure_child(user_fd, path.name, uid, gid, path, move_aside=True)
            os.close(job_fd)
        finally:
            os.close(user_fd)
    finally:
        os.close(root_fd)
    return path


def _open_root(root: Path) -> int:
    """Open the checkpoint root (created 0755 if missing). It must be a real directory that
    only root can write: in a group- or world-writable root, another user could plant a
    directory (and checkpoints) for someone else's job.

    Raises:
        BadInputError: a symlink, not a directory, or writable by others than root.
    """
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        reason = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise BadInputError(f"checkpoint root {root}: {reason}; refusing") from None
    info = os.fstat(fd)
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise BadInputError(
            f"checkpoint root {root}: must be owned by root and writable by root only "
            f"(mode {stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid})")
    return fd


def task_prolog_lines(config: SpotConfig, env: Mapping[str, str]) -> list[str]:
    """TaskProlog output: ``export NAME=value`` lines for the task environment."""
    return [
        f"export SLURM_SPOT_CHECKPOINT_DIR={checkpoint_dir(config, env)}",
        f"export SLURM_SPOT_RESTART_COUNT={restart_count(env)}",
        f"export SLURM_SPOT_PREEMPT_SIGNAL={config.preemption.signal}",
        f"export SLURM_SPOT_REQUEUE_EXIT_CODE={config.preemption.requeue_exit_code}",
    ]


def epilog(config: SpotConfig, env: Mapping[str, str]) -> None:
    """Epilog: record the job's end on this node as an event. Never raises: a failing
    Epilog would drain the node (slurm.conf(5)), for nothing a job needs."""
    job = env.get("SLURM_JOB_ID", "")
    try:
        restarts: int | str = restart_count(env)
    except BadInputError:
        restarts = env.get("SLURM_RESTART_COUNT", "")
    events.emit(config.log_dir, events.Event(
        events.Action.JOB_END, "epilog", node=env.get("SLURMD_NODENAME"),
        job_ids=(int(job),) if job.isascii() and job.isdigit() else (),
        extra={"restarts": restarts}))
