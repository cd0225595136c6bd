"""Signals a daemon stops or reloads on, taken synchronously: its wait ends at once.

A Python signal handler runs only in the main thread, and only when the main thread runs Python
code. The kernel delivers a process-directed signal (``kill PID``, systemd's stop) to any thread
that does not block it; when that was a helper thread (the rendezvous store's accept loop), the
main thread slept on in ``Event.wait`` until its timeout (600 s) and systemd's stop ended in
SIGKILL. A handler that sets an :class:`threading.Event` can also deadlock: the main thread may
hold the event's lock at the moment the handler runs in it.

:class:`SignalWait` blocks the signals in the calling thread before any helper thread starts
(threads inherit the mask, see pthread_sigmask(3)), so each stays pending until the main thread
takes it in :meth:`SignalWait.wait` (sigtimedwait(2)): no handler, no lock, no lost signal.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from types import TracebackType

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class SignalWait:
    """Blocks ``numbers`` in the calling (main) thread, and in the threads it starts from now on,
    until :meth:`close`; :meth:`wait` takes one of them when it comes.

    Use it before starting helper threads, as a context manager::

        with SignalWait(STOP_SIGNALS) as signals:
            start_helpers()
            while signals.wait(60.0) is None:
                periodic_work()

    Raises:
        RuntimeError: when created outside the main thread (another thread's mask would leave
            the signal to the main thread's default action).
    """

    def __init__(self, numbers: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalWait belongs to the main thread")
        self.numbers = frozenset(numbers)
        self._previous: set[int | signal.Signals] | None = signal.pthread_sigmask(
            signal.SIG_BLOCK, self.numbers)

    def wait(self, timeout_s: float) -> signal.Signals | None:
        """The signal taken within ``timeout_s`` seconds (one pending already is taken at once),
        or None when none came."""
        info = signal.sigtimedwait(self.numbers, max(0.0, timeout_s))
        return None if info is None else signal.Signals(info.si_signo)

    def close(self) -> None:
        """Restores the thread's mask of before (a signal still pending is delivered then)."""
        if self._previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)
            self._previous = None

    def __enter__(self) -> SignalWait:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class StopWait:
    """A daemon's wait for its stop, in whichever thread it runs: made in the main thread, the
    stop signals (:data:`STOP_SIGNALS`, taken as :class:`SignalWait` takes them: blocked from
    now on, so make it before starting helper threads); made in another thread (a daemon run
    from a test or a library), ``stop`` being set. A context manager; :meth:`close` restores
    the signal mask.

    Args:
        stop: the event that stops a daemon outside the main thread (a new one if None: the
            daemon then runs until its process ends); the main thread waits for signals only.
    """

    def __init__(self, stop: threading.Event | None = None) -> None:
        self._signals = (SignalWait(STOP_SIGNALS)
                         if threading.current_thread() is threading.main_thread() else None)
        self._stop = stop or threading.Event()

    def wait(self, timeout_s: float) -> bool:
        """True as soon as the stop came (a stop signal taken, or ``stop`` set); False when
        ``timeout_s`` seconds passed without it."""
        if self._signals is None:
            return self._stop.wait(timeout_s)
        return self._signals.wait(timeout_s) is not None

    def close(self) -> None:
        """Restores the thread's signal mask of before (see :meth:`SignalWait.close`)."""
        if self._signals is not None:
            self._signals.close()

    def __enter__(self) -> StopWait:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
