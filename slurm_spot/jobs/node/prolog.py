"""Prolog, TaskProlog and Epilog: the job's checkpoint directory and environment.

- **Prolog** (slurmd, as root, on each node before the job's first step): creates
  ``<checkpoint root>/<user>/<job key>`` where the key is the job id, or
  ``<array job id>_<task id>`` for an array task, never the restart count, so a requeued job
  finds its checkpoints again. Created without following symlinks, component by component
  relative to open directory descriptors (no race between check and use), owned by the job
  user, mode 0700. A symlink at the root or the user directory (both held by root), or a key
  that would leave the root, is refused: the prolog fails and Slurm requeues the job held, with
  nothing written. The job directory's entry is the user's: whatever the user puts there, even
  while the prolog runs (nothing, a directory, a symlink, a file), is never followed and never
  fails the prolog (a failing prolog drains the node for everyone).
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
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_spot import events
from slurm_spot.config.plain import S3_ROOT_PATTERN  # pydantic-free: hooks use the cache
from slurm_spot.contract.jobenv import checkpoint_key, find_scontrol, restart_count
from slurm_spot.contract.location import is_s3, job_directory, local_path
from slurm_spot.contract.names import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_ROOT,
    ENV_PREEMPT_SIGNAL,
    ENV_REQUEUE_EXIT_CODE,
    ENV_RESTART_COUNT,
    ENV_S3_ADDRESSING_STYLE,
    ENV_S3_ENDPOINT_URL,
    ENV_SLURM_BIN_DIR,
)
from slurm_spot.errors import BadInputError

if TYPE_CHECKING:
    from slurm_spot.config import SpotConfig

_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?", re.IGNORECASE | re.ASCII)
_KEY = re.compile(r"[0-9]+(_[0-9]+)?")
log = logging.getLogger(__name__)



def checkpoint_root(config: SpotConfig, env: Mapping[str, str]) -> Path | str:
    """The job's checkpoint root: an ``s3://`` URL the job chose (``SLURM_SPOT_CHECKPOINT_ROOT``,
    set by ``slurm-spot sbatch --checkpoint-root``), else ``checkpoint.root``. A job may pick
    an S3 root only: a directory root stays the admin's (the prolog creates it as root).

    Raises:
        BadInputError: the job's root is not an ``s3://bucket/prefix`` URL.
    """
    raw = env.get(ENV_CHECKPOINT_ROOT, "").strip()
    if not raw:
        return config.checkpoint.root
    if not re.fullmatch(S3_ROOT_PATTERN, raw) or any(c in raw for c in "\n\r\"'`$\\"):
        raise BadInputError(f"{ENV_CHECKPOINT_ROOT}={raw!r}: a job may only choose an "
                            "s3://bucket/prefix root (no quotes, $ or backslashes)")
    return raw


def checkpoint_dir(config: SpotConfig, env: Mapping[str, str]) -> Path | str:
    """``<root>/<user>/<key>`` for the job described by ``env`` (pure: touches nothing); a
    ``s3://bucket/prefix/<user>/<key>`` URL for an S3 root.

    Raises:
        BadInputError: missing job id or user, or a user/key that is not a plain name.
    """
    user = env.get("SLURM_JOB_USER", "")
    if not _USER.fullmatch(user):
        raise BadInputError(f"SLURM_JOB_USER {user!r} is not a valid user name")
    key = checkpoint_key(env)
    if not _KEY.fullmatch(key):
        raise BadInputError(f"checkpoint key {key!r} from the job environment is not a job id")
    return job_directory(checkpoint_root(config, env), user, key)


def _open_dir(name: str, parent_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)


def _ensure_child(parent_fd: int, name: str, uid: int, gid: int, where: Path) -> int:
    """Create (if needed) and open directory ``name`` under ``parent_fd`` (a root-held
    directory) without following a symlink; give it to uid:gid with mode 0700. Returns its fd.

    Raises:
        BadInputError: the entry is a symlink, not a directory, or owned by someone else than
            the user or root.
    """
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    problem = _entry_problem(parent_fd, name, uid)
    if not problem:
        try:
            fd = _open_dir(name, parent_fd)
        except OSError as exc:
            problem = exc.strerror or str(exc)
        else:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o700)
            return fd
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


# How often the prolog retries while the user keeps changing their job directory entry.
USER_RACE_ATTEMPTS = 20


def _ensure_job_dir(user_fd: int, name: str, uid: int, gid: int, where: Path) -> bool:
    """Create/open the job directory ``name`` in the user's directory, which its user controls.

    Every outcome of a concurrent change by the user is handled: each step works on the
    directory descriptor (``mkdir``/``open``/``rename`` with ``dir_fd``, ``O_NOFOLLOW``,
    ``fstat``/``fchown``/``fchmod`` on the opened descriptor, never on a path), so a symlink
    swapped in is never followed; an entry that is a symlink, a file or a directory of another
    owner is renamed aside (``<name>.refused-<ns>-<pid>``); an entry that vanishes or changes
    between two steps makes the loop start again. Never raises for such a conflict.

    Returns:
        True if the directory exists, owned by uid:gid with mode 0700; False if the user kept
        changing the entry for :data:`USER_RACE_ATTEMPTS` rounds (logged; the job still runs).
    """
    for _ in range(USER_RACE_ATTEMPTS):
        try:
            os.mkdir(name, 0o700, dir_fd=user_fd)
        except FileExistsError:
            pass
        except FileNotFoundError:  # pragma: no cover - the user dir itself is root-held
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=user_fd)
        except FileNotFoundError:
            continue  # removed after our mkdir: again
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _move_aside(user_fd, name, where, "is a symlink" if exc.errno == errno.ELOOP
                        else "is not a directory")
            continue
        try:
            owner = os.fstat(fd).st_uid
            if owner in (0, uid):
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
                return True
        finally:
            os.close(fd)
        _move_aside(user_fd, name, where, f"is owned by uid {owner}, not the job's user")
    log.warning("%s: the entry kept changing during %d attempts; the job runs without a "
                "checkpoint directory prepared by the prolog", where, USER_RACE_ATTEMPTS)
    return False


def _move_aside(parent_fd: int, name: str, where: Path, problem: str) -> None:
    """Rename ``name`` to a fresh ``<name>.refused-<ns>-<pid>`` (rename never follows a
    symlink); an entry already gone is fine."""
    aside = f"{name}.refused-{time.time_ns()}-{os.getpid()}"
    try:
        os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except FileNotFoundError:
        return
    except OSError as exc:  # e.g. the user made the new name first: try again next round
        log.warning("%s: %s; cannot move it aside: %s", where, problem, exc.strerror)
        return
    log.warning("%s: %s; moved it aside to %s", where, problem, aside)


def prepare_checkpoint_dir(config: SpotConfig, env: Mapping[str, str]) -> Path | str:
    """Prolog: create the job's checkpoint directory safely (see the module docstring). For an
    S3 root nothing is created (the first save writes the first object); the URL is returned.

    What the job's user controls (the entries in ``<root>/<user>/``) never makes this fail:
    see :func:`_ensure_job_dir`. What only root or the admin controls does.

    Raises:
        BadInputError: bad job environment, an unknown user, or a symlink / non-directory /
            foreign owner at the root or the user directory (both held by root); nothing is
            created below a refused component.
    """
    target = checkpoint_dir(config, env)
    path = local_path(target)
    if path is None:  # a store's URL: the job's own processes create what they write there
        return target
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
    root = path.parent.parent
    root_fd = _open_root(root)
    try:
        user_fd = _ensure_child(root_fd, user, uid, gid, root / user)
        try:
            _ensure_job_dir(user_fd, path.name, uid, gid, path)
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


def _one_line(value: str | None) -> str | None:
    if value and any(c in value for c in "\n\r"):
        raise BadInputError(f"{value!r}: a value exported by the TaskProlog must be one line")
    return value or None


def task_prolog_lines(config: SpotConfig, env: Mapping[str, str]) -> list[str]:
    """TaskProlog output: ``export NAME=value`` lines for the task environment. For an S3
    root also the endpoint and addressing style (``SLURM_SPOT_S3_ENDPOINT_URL``,
    ``SLURM_SPOT_S3_ADDRESSING_STYLE``) unless the job set its own; never credentials."""
    target = checkpoint_dir(config, env)
    s3_lines = []
    if is_s3(target):
        s3 = config.checkpoint.s3
        # slurmd takes the text after "NAME=" literally (no shell quoting): no newlines here
        endpoint = _one_line(env.get(ENV_S3_ENDPOINT_URL)) or s3.endpoint_url
        style = _one_line(env.get(ENV_S3_ADDRESSING_STYLE)) or s3.addressing_style
        if endpoint:
            s3_lines.append(f"export {ENV_S3_ENDPOINT_URL}={endpoint}")
        s3_lines.append(f"export {ENV_S3_ADDRESSING_STYLE}={style}")
    notice = scontrol_notice(config, env)
    return [
        f"export {ENV_CHECKPOINT_DIR}={target}",
        *s3_lines,
        f"export {ENV_RESTART_COUNT}={restart_count(env)}",
        f"export {ENV_PREEMPT_SIGNAL}={config.preemption.signal}",
        f"export {ENV_REQUEUE_EXIT_CODE}={config.preemption.requeue_exit_code}",
        f"export {ENV_SLURM_BIN_DIR}={config.slurm_bin_dir}",
        *([f"print {notice}"] if notice else []),
    ]


def scontrol_notice(config: SpotConfig, env: Mapping[str, str]) -> str | None:
    """What the job's output should say when ``scontrol`` is not on the job's ``PATH``
    (``env``): rank 0 needs it to requeue the job on preemption, and without this check the
    job found out only then. The TaskProlog prints it (a ``print`` line goes to the task's
    stdout, slurm.conf(5) TaskProlog, 22.05-26.05). None when ``scontrol`` is on ``PATH``."""
    if shutil.which("scontrol", path=env.get("PATH", "")):
        return None
    fallback = find_scontrol({ENV_SLURM_BIN_DIR: str(config.slurm_bin_dir)})
    if fallback:
        return (f"slurm-spot: scontrol is not on this job's PATH; a requeue on preemption "
                f"will use {fallback} (slurm_bin_dir in spot.yaml)")
    return (f"slurm-spot: WARNING: scontrol is neither on this job's PATH nor in slurm_bin_dir "
            f"{config.slurm_bin_dir} (spot.yaml): this job cannot requeue itself on "
            f"preemption; add Slurm's bin directory to PATH or fix slurm_bin_dir")


def epilog(config: SpotConfig, env: Mapping[str, str]) -> None:
    """Epilog: record the job's end on this node as an event. Never raises: a failing
    Epilog would drain the node (slurm.conf(5)), for nothing a job needs."""
    job = env.get("SLURM_JOB_ID", "")
    try:
        restarts: int | str = restart_count(env)
    except BadInputError:
        restarts = env.get("SLURM_RESTART_COUNT", "")
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    valid = job.isascii() and job.isdigit()
    refs = {job: f"{array}_{task}"} if valid and array.isdigit() and task.isdigit() else {}
    events.emit(config.log_dir, events.Event(
        events.Action.JOB_END, "epilog", node=env.get("SLURMD_NODENAME"),
        job_ids=(int(job),) if valid else (),
        extra={"restarts": restarts, **({"job_refs": refs} if refs else {})}))
