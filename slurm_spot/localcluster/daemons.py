"""What the local cluster's daemons (munged, MariaDB, the chaos market, slurmctld, the
reconciler) have in common: where their files lie (:class:`Under`, the path attribute of
:class:`~slurm_spot.localcluster.cluster.LocalClusterPaths`,
:class:`~slurm_spot.localcluster.marketd.MarketPaths` and
:class:`~slurm_spot.localcluster.accounting.DbPaths`), whether one answers on its Unix socket
(:func:`socket_answers`) and how one is stopped (:func:`terminate`)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload


class Under:
    """A read-only attribute of a class of file paths: ``<its base attribute>/<name>``, joined
    when read (a :class:`~pathlib.Path`; nothing is created or checked).

    Args:
        base: the attribute of the instance that holds the directory (a ``Path``).
        name: the file's path relative to it (``"mysqld.sock"``, ``"local/cluster.json"``).

    Raises (when read):
        AttributeError: the instance has no attribute ``base``.
    """

    def __init__(self, base: str, name: str) -> None:
        self.base = base
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Under: ...

    @overload
    def __get__(self, instance: object, owner: type) -> Path: ...

    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        return Path(getattr(instance, self.base)) / self.name


def socket_answers(path: Path) -> bool:
    """True if a daemon accepts a connection on the Unix socket ``path``; False when none
    does (no such file, refused). Never raises."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def terminate(pid: int, alive: Callable[[], bool], timeout_s: float) -> None:
    """Stop process ``pid``: SIGTERM, then SIGKILL if ``alive()`` still holds after
    ``timeout_s`` seconds (polled every 0.1 s).

    Raises:
        ProcessLookupError: ``pid`` is gone before the SIGTERM (or, rarely, the SIGKILL).
        PermissionError: the process is another user's.
    """
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive():
        os.kill(pid, signal.SIGKILL)
