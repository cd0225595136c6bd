"""The reconciler as a daemon: one instance at a time, a pass every ``reconcile.interval_s``,
config reloads that keep the last good config, and a clean stop on SIGTERM/SIGINT.

Safe to kill at any point (SIGKILL included): the lock is an ``flock`` that the kernel drops
with the process, every action is idempotent, and the next pass re-reads Slurm and the
providers (see :mod:`slurm_spot.reconcile.reconciler`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.errors import SlurmSpotError
from slurm_spot.reconcile.reconciler import PassResult, Reconciler
from slurm_spot.sdnotify import Notifier
from slurm_spot.stopsignals import STOP_SIGNALS, SignalWait

log = logging.getLogger(__name__)
LOCK_NAME = "reconcile.lock"


class AlreadyRunning(SlurmSpotError):
    """Another ``slurm-spot reconcile`` holds the lock (exit code 1)."""


@contextlib.contextmanager
def single_instance(state_dir: Path) -> Iterator[Path]:
    """Hold ``<state_dir>/reconcile.lock`` (``flock``, released by the kernel when the process
    dies) and write our pid into it.

    Raises:
        AlreadyRunning: another process holds it; the message names its pid and the file.
        OSError: the state dir cannot be created.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            raise AlreadyRunning(
                f"another 'slurm-spot reconcile' is running (pid {holder}; lock {path}); "
                "stop it first, or let it do the work") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)


class ConfigSource:
    """The config file, reloaded when it changes; a bad file keeps the last good config.

    Args:
        config: the config already loaded (its ``source_path`` is watched).
        loader: reads a path (default :func:`load_config`).
    """

    def __init__(self, config: SpotConfig,
                 loader: Callable[[Path], SpotConfig] = load_config) -> None:
        self.config = config
        self.loader = loader
        self.path = config.source_path
        self._stamp = self._read()

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except OSError:
            return None

    def reload(self, force: bool = False) -> bool:
        """Reload if the file's content changed (or ``force``). True if a new config is in
        use; a bad file is logged and the last good config stays."""
        stamp = self._read()
        if not force and stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            new = self.loader(self.path)
        except SlurmSpotError as exc:
            log.error("keeping the last good configuration: %s", exc)
            return False
        self.config = new
        log.info("configuration reloaded from %s", self.path)
        return True


def summarize(result: PassResult) -> str:
    """One line per pass for the log: verdict counts, actions, errors, duration."""
    verdicts = " ".join(f"{k}={v}" for k, v in sorted(result.verdicts.items()))
    return (f"pass: {verdicts or 'no nodes'}; {len(result.actions)} action(s), "
            f"{len(result.errors)} error(s) in {result.duration_s:.2f} s")


class Loop:
    """Runs :class:`Reconciler` passes until stopped.

    Args:
        source: the config and its reloads.
        make: builds a reconciler for a config (called again after each reload).
        stop: set to end the loop (SIGTERM/SIGINT set it, see :meth:`install_signals`).
        notifier: systemd's ``Type=notify`` socket (:mod:`slurm_spot.sdnotify`): ``READY=1``
            when the loop starts, a ``STATUS=`` line after each pass, ``WATCHDOG=1`` before and
            after each pass and while waiting (at least every half ``WatchdogSec=``), and
            ``STOPPING=1`` at the end. Default: from this process's environment (does nothing
            outside systemd).
    """

    def __init__(self, source: ConfigSource, make: Callable[[SpotConfig], Reconciler],
                 stop: threading.Event | None = None, notifier: Notifier | None = None) -> None:
        self.source = source
        self.make = make
        self.stop = stop or threading.Event()
        self.notifier = notifier or Notifier()
        self._reload_requested = False
        self._signals: SignalWait | None = None

    def install_signals(self) -> None:
        """SIGTERM/SIGINT: stop after the current pass (at once while waiting); SIGHUP: reload
        the config after the next pass. Call it in the main thread, before any other thread
        starts: the signals are taken synchronously (:mod:`slurm_spot.stopsignals`)."""
        self._signals = SignalWait((*STOP_SIGNALS, signal.SIGHUP))

    def run(self, max_passes: int | None = None) -> int:
        """Pass, reload if needed, wait out the interval; returns the number of passes."""
        reconciler = self.make(self.source.config)
        passes = 0
        self.notifier.ready(f"reconciling every {self.source.config.reconcile.interval_s:g} s")
        while not self.stop.is_set() and (max_passes is None or passes < max_passes):
            started = time.monotonic()
            self.notifier.watchdog()
            result = self.one_pass(reconciler)
            passes += 1
            self.notifier.watchdog()
            self.notifier.status(summarize(result) if result is not None else "last pass failed")
            if self.source.reload(force=self._reload_requested):
                reconciler = self.make(self.source.config)
            self._reload_requested = False
            interval = self.source.config.reconcile.interval_s
            if max_passes is None or passes < max_passes:
                self._wait_until(started + interval)
        self.notifier.stopping()
        return passes

    def _wait_until(self, deadline: float) -> None:
        """Sleeps until ``deadline`` (time.monotonic) or a stop; a SIGHUP asks for a reload.
        Wakes at least every half watchdog period to ping systemd's watchdog."""
        ping_every = self.notifier.ping_every_s
        while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
            self.notifier.watchdog()
            if ping_every is not None:
                left = min(left, ping_every)
            if self._signals is None:
                self.stop.wait(left)
                continue
            taken = self._signals.wait(left)
            if taken == signal.SIGHUP:
                self._reload_requested = True
            elif taken is not None:
                self.stop.set()

    def one_pass(self, reconciler: Reconciler) -> PassResult | None:
        """One pass; any failure is logged and the loop goes on."""
        try:
            result = reconciler.run_pass()
        except SlurmSpotError as exc:
            log.error("pass failed: %s", exc)
            return None
        except Exception:  # a daemon outlives a bug in one pass
            log.exception("pass failed unexpectedly")
            return None
        log.log(logging.INFO if result.actions or result.errors else logging.DEBUG,
                "%s", summarize(result))
        return result
