"""systemd's notification protocol for the daemons' ``Type=notify`` units, without a library.

sd_notify(3): a service started with ``Type=notify`` gets the socket in ``NOTIFY_SOCKET`` (a
path, or an abstract socket name written with a leading ``@``) and sends it datagrams of
newline-separated ``KEY=value`` lines: ``READY=1`` once it serves, ``WATCHDOG=1`` at least once
per ``WatchdogSec=`` (given to it as ``WATCHDOG_USEC`` microseconds, for the process
``WATCHDOG_PID`` if that is set), ``STATUS=...`` for ``systemctl status`` and ``STOPPING=1``
when it shuts down. Outside systemd (no ``NOTIFY_SOCKET``) every call does nothing.

The units (templates/slurm-spot-reconcile.service.j2, slurm-spot-watch.service.j2) set
``Type=notify`` and ``WatchdogSec=``; the reconciler's loop (:mod:`slurm_spot.reconcile.loop`)
and the watcher (:mod:`slurm_spot.lifecycle.watch`) call :meth:`Notifier.watchdog` between passes and
polls and while they wait, so a loop that hangs (a call with no timeout) is restarted.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify(3) messages to systemd, if it asked for them; never raises.

    Args:
        environ: where ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` are read
            (default: this process's environment).
        clock: monotonic seconds, for spacing watchdog pings.

    Attributes:
        address: the socket address (``\\0``-prefixed for an abstract one), or None when not
            run by systemd with ``Type=notify``.
        watchdog_s: ``WatchdogSec=`` in seconds, or None when the unit has no watchdog (or
            ``WATCHDOG_PID`` names another process).
    """

    def __init__(self, environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        self.watchdog_s = _watchdog_seconds(env)
        self._clock = clock
        self._last_ping = float("-inf")
        self._warned = False

    @property
    def ping_every_s(self) -> float | None:
        """How often :meth:`watchdog` must be called to keep the service alive (half of
        ``WatchdogSec=``, as sd_watchdog_enabled(3) advises), or None without a watchdog."""
        return None if self.watchdog_s is None else self.watchdog_s / 2

    def send(self, *fields: str) -> bool:
        """One datagram of ``fields`` (``"READY=1"``, ``"STATUS=..."``); False if not sent
        (not under systemd, or the socket refused it: logged once as a warning)."""
        if self.address is None:
            return False
        message = "\n".join(f.replace("\n", " ") for f in fields).encode("utf-8", "replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd at NOTIFY_SOCKET: %s", exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """``READY=1`` (and ``STATUS=status``): the daemon is up."""
        self._last_ping = self._clock()
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """``STATUS=text`` (one line, shown by ``systemctl status``)."""
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        """``STOPPING=1``: the daemon is shutting down."""
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        """``WATCHDOG=1`` if the unit has a watchdog and a quarter of its period has passed
        since the last ping (cheap to call in every loop turn); True if one was sent."""
        if self.watchdog_s is None:
            return False
        now = self._clock()
        if now - self._last_ping < self.watchdog_s / 4:
            return False
        self._last_ping = now
        return self.send("WATCHDOG=1")


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    """``WATCHDOG_USEC`` in seconds when it is meant for this process, else None."""
    pid = env.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None
