"""Where ``spot.yaml`` is and reading its bytes safely, without parsing them.

Where the file is looked for, first match wins (:func:`config_path`):

1. the ``--config`` option of the CLI;
2. the ``SLURM_SPOT_CONFIG`` environment variable;
3. ``spot.yaml`` beside the ``slurm.conf`` named by ``SLURM_CONF`` (slurmctld sets ``SLURM_CONF``
   for ResumeProgram/SuspendProgram and slurmd for Prolog/Epilog, whose environment is otherwise
   wiped);
4. ``/etc/slurm/spot.yaml``.

Imports neither YAML nor pydantic: the validated-config cache (:mod:`.cache`) reads the file
here and, when the cache holds these very bytes, a hook parses nothing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from slurm_spot.config.plain import DEFAULT_CONFIG_PATH
from slurm_spot.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024  # a real spot.yaml is a few KiB


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the configuration is read from (see the module docstring for the order)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("SLURM_SPOT_CONFIG")
    if env:
        return Path(env)
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf:
        beside = Path(slurm_conf).parent / "spot.yaml"
        if beside.exists():
            return beside
    return DEFAULT_CONFIG_PATH


@dataclass(frozen=True)
class ConfigBytes:
    """One read of the config file: its path, its bytes and the ``fstat`` of the descriptor
    they were read from (so the two describe the same file)."""

    path: Path
    raw: bytes
    info: os.stat_result


def read_config_bytes(file: Path) -> ConfigBytes:
    """Read ``file`` (a regular file of at most :data:`MAX_CONFIG_BYTES` bytes, writable by
    its owner only, owned by root when running as root: :func:`check_trusted_file`).

    Raises:
        ConfigError: naming the file: missing or unreadable, not a regular file (a named pipe
            is refused without waiting for a writer), too large, or not to be trusted.
    """
    try:
        # O_NONBLOCK: opening a named pipe must not wait for a writer; a non-regular file is
        # refused before anything is read from it (/dev/zero never ends).
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with open(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            kind = not_regular(info)
            if kind:
                raise ConfigError(str(file), [f"not a regular file ({kind}): give the path of "
                                              f"a spot.yaml file"])
            if info.st_size > MAX_CONFIG_BYTES:
                raise ConfigError(str(file), [
                    f"{info.st_size} bytes: a spot.yaml is a few KiB; files over "
                    f"{MAX_CONFIG_BYTES // 1024} KiB are refused"])
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(str(file), [f"cannot read the file: {exc.strerror}"]) from None
    if len(raw) > MAX_CONFIG_BYTES:  # grew while read
        raise ConfigError(str(file), [f"over {MAX_CONFIG_BYTES // 1024} KiB: refused"])
    untrusted = check_trusted_file(file, info, "config file")
    if untrusted:
        raise ConfigError(str(file), [untrusted])
    return ConfigBytes(file, raw, info)


def not_regular(info: os.stat_result) -> str | None:
    """What kind of file ``info`` (an ``os.stat`` result) is, when not a regular file."""
    mode = info.st_mode
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a file"


def check_trusted_file(path: Path, info: os.stat_result, what: str) -> str | None:
    """Why ``path`` (with ``os.stat``/``fstat`` result ``info``) cannot be trusted, or None.

    A file root acts on must not be writable by anyone but its owner, and, when slurm-spot
    runs as root, must be owned by root: otherwise whoever can write it can make root run
    their programs or use their credentials.
    """
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {path} is writable by {'others' if mode & stat.S_IWOTH else 'its group'}"
                f" (mode {mode:04o}); root runs programs and reads credentials named in it. "
                f"Fix: chmod go-w {path}")
    if os.geteuid() == 0 and info.st_uid != 0:
        return (f"{what} {path} is owned by uid {info.st_uid}, but slurm-spot runs as root "
                f"and acts on it. Fix: chown root:root {path} && chmod go-w {path}")
    return None
