"""The reconciler as a daemon: one instance at a time, a pass every ``reconcile.interval_s``,
config reloads that keep the last good config, and a clean stop on SIGTERM/SIGINT.

Between passes the loop reads the providers' own events (:mod:`slurm_spot.providers.events`:
EC2 EventBridge events through SQS, GCE preemption operations) in steps of
``reconcile.events_poll_s``; an event about an instance the last pass saw alive starts the
next pass at once, with the event, so a node lost without notice is handled within a step,
not at the next interval. An SQS long poll *is* the step's wait (signals taken at its end); a
source that cannot wait is read and the rest of the step waits on the signals.

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.errors import SlurmSpotError
from slurm_spot.providers.events import EventSource, ProviderEvent
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
        events: builds the providers' event sources for a config (called again after each
            reload), e.g. :func:`slurm_spot.providers.events.event_sources`; None: passes only.
    """

    def __init__(self, source: ConfigSource, make: Callable[[SpotConfig], Reconciler],
                 stop: threading.Event | None = None, notifier: Notifier | None = None,
                 events: Callable[[SpotConfig], list[EventSource]] | None = None) -> None:
        self.source = source
        self.make = make
        self.stop = stop or threading.Event()
        self.notifier = notifier or Notifier()
        self.events = events
        self._sources: list[EventSource] = []
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
        self._open_sources()
        passes = 0
        reported: list[ProviderEvent] = []
        self.notifier.ready(f"reconciling every {self.source.config.reconcile.interval_s:g} s")
        try:
            while not self.stop.is_set() and (max_passes is None or passes < max_passes):
                started = time.monotonic()
                self.notifier.watchdog()
                result = self.one_pass(reconciler, reported)
                passes += 1
                self.notifier.watchdog()
                self.notifier.status(summarize(result) if result is not None
                                     else "last pass failed")
                if self.source.reload(force=self._reload_requested):
                    reconciler = self.make(self.source.config)
                    self._open_sources()
                self._reload_requested = False
                interval = self.source.config.reconcile.interval_s
                reported = []
                if max_passes is None or passes < max_passes:
                    reported = self._wait_until(started + interval,
                                                getattr(reconciler, "known_instances", set()))
        finally:
            self._close_sources()
        self.notifier.stopping()
        return passes

    def _open_sources(self) -> None:
        self._close_sources()
        if self.events is not None:
            self._sources = self.events(self.source.config)
            for src in self._sources:
                log.info("reading provider %s's events between passes", src.provider)

    def _close_sources(self) -> None:
        for src in self._sources:
            try:
                src.close()
            except Exception as exc:  # closing is best effort
                log.debug("closing %s's event source: %s", src.provider, exc)
        self._sources = []

    def _wait_until(self, deadline: float, known: set[str] | frozenset[str] = frozenset()
                    ) -> list[ProviderEvent]:
        """Sleeps until ``deadline`` (time.monotonic) or a stop; a SIGHUP asks for a reload.
        Wakes at least every half watchdog period to ping systemd's watchdog. With event
        sources, reads them every ``reconcile.events_poll_s`` and returns early with the
        events about instances in ``known`` (the last pass's alive instances); [] otherwise."""
        ping_every = self.notifier.ping_every_s
        while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
            self.notifier.watchdog()
            if ping_every is not None:
                left = min(left, ping_every)
            if self._sources:
                left = min(left, self.source.config.reconcile.events_poll_s)
                step_end = time.monotonic() + left
                found = self._receive(left, known)
                if found:
                    return found
                left = max(0.0, step_end - time.monotonic())
            if self._signals is None:
                self.stop.wait(left)
                continue
            taken = self._signals.wait(left)
            if taken == signal.SIGHUP:
                self._reload_requested = True
            elif taken is not None:
                self.stop.set()
        return []

    def _receive(self, wait_s: float, known: set[str] | frozenset[str]) -> list[ProviderEvent]:
        """One read of every source within ``wait_s`` seconds: the events about ``known``
        instances (others are not this cluster's, or are news the last pass already had), and
        every end from a source whose ``cluster_only`` is true (it names only this cluster's
        instances, so one launched since the last pass counts too)."""
        end = time.monotonic() + wait_s
        found: list[ProviderEvent] = []
        for src in self._sources:
            # a source that carries only this cluster's instances (the local provider's file)
            # is believed about an instance launched since the last pass too
            own = bool(getattr(src, "cluster_only", False))
            for event in src.receive(max(0.0, end - time.monotonic())):
                if event.instance_id in known or (own and event.ended):
                    log.info("provider %s: %s %s (%s): pass now", event.provider, event.kind,
                             event.instance_id, event.detail)
                    found.append(event)
                else:
                    log.debug("provider %s: %s %s: not an instance of the last pass",
                              event.provider, event.kind, event.instance_id)
        return found

    def one_pass(self, reconciler: Reconciler,
                 reported: Sequence[ProviderEvent] = ()) -> PassResult | None:
        """One pass (given the provider events that started it early, if any); any failure
        is logged and the loop goes on."""
        try:
            result = reconciler.run_pass(reported) if reported else reconciler.run_pass()
        except SlurmSpotError as exc:
            log.error("pass failed: %s", exc)
            return None
        except Exception:  # a daemon outlives a bug in one pass
            log.exception("pass failed unexpectedly")
            return None
        log.log(logging.INFO if result.actions or result.errors else logging.DEBUG,
                "%s", summarize(result))
        return result
