"""The ``local`` provider's own news of an instance's end: its equivalent of EC2's instance
state-change notifications (:mod:`slurm_spot.providers.aws.events`).

Whenever the local provider ends an instance (a reclaim by the simulated spot market, with
or without notice, ``slurm-spot local preempt``; a termination by slurm-spot) it appends one
JSON line to ``<state_dir>/local/events.jsonl``, under the provider's lock and before the
instance's processes are killed::

    {"time": "<ISO 8601 UTC>", "instance_id": "loc-...", "node": "spot-1",
     "state": "terminated", "reason": "Server.SpotInstanceTermination: ..."}

:class:`LocalEventSource` follows that file from where it stood when the source was opened
(as an SQS queue's consumer reads what arrives after it starts) and can *wait* for a line:
it checks the file's size every :data:`POLL_S` seconds within the reconciler's step, so a
kill is read within about 0.1 s. A line it cannot read is skipped; a file that shrank (it is
started afresh at :data:`MAX_BYTES`) is read again from its start. Every decision stays the
reconciler's pass's; a lost line is found by the next pass's listing (the fallback).

An instance process that dies outside the provider (a crash) writes no line: the passes'
listings find it, as they find an EC2 instance whose event was lost.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from datetime import datetime, timezone
from pathlib import Path

from slurm_spot.providers.base import InstanceState
from slurm_spot.providers.events import ProviderEvent, event_time

log = logging.getLogger(__name__)

EVENTS_NAME = "events.jsonl"
POLL_S = 0.1  # how often a waiting source looks at the file's size (seconds)
MAX_BYTES = 1 << 20  # the file is started afresh beyond this (about 5000 events)
#: The most one look at the file reads (bytes): a file grown by far more between two looks
#: (written by something else) is read in such steps, never whole into memory.
MAX_READ_BYTES = 2 * MAX_BYTES


def events_path(state_dir: Path) -> Path:
    """``<state_dir>/local/events.jsonl``: where the local provider publishes its events."""
    return state_dir / "local" / EVENTS_NAME


def publish(path: Path, instance_id: str, node: str, state: InstanceState, reason: str,
            now: datetime | None = None) -> None:
    """Append one event line to ``path`` (the caller holds the provider's lock, so lines of
    two writers never interleave). A file beyond :data:`MAX_BYTES` is started afresh.

    The provider runs as root: the file is opened as the controller's events file is
    (:func:`slurm_spot.events.open_for_append`), so a symlink or hard link planted at
    ``path`` (a state dir another account can write) is refused, never followed; before,
    root appended the line to whatever file the link named.

    Raises:
        OSError: the file cannot be written, or is refused
            (:class:`~slurm_spot.events.UnsafeEventsFile`, naming why); the caller logs it:
            the passes still list.
    """
    from slurm_spot.events import open_for_append

    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": (now or datetime.now(timezone.utc)).isoformat(),
                       "instance_id": instance_id, "node": node, "state": state.value,
                       "reason": reason}, sort_keys=True) + "\n"
    try:
        if path.lstat().st_size > MAX_BYTES:
            path.unlink()  # a link itself is removed, never what it names
    except FileNotFoundError:
        pass
    fd = open_for_append(path.parent, path.name)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def parse_line(provider: str, line: bytes) -> ProviderEvent | None:
    """The :class:`ProviderEvent` of one line of the events file, or None for a line that is
    not one (half-written, not JSON, an unknown state)."""
    try:
        data = json.loads(line)
        state = InstanceState(data["state"])
        instance = str(data["instance_id"])
    except (ValueError, KeyError, TypeError):
        return None
    detail = f"{state.value} ({data.get('reason') or 'no reason given'})"
    return ProviderEvent(provider, instance, "state-change", state, event_time(data.get("time")),
                         detail)


class LocalEventSource:
    """Follows one local provider's events file (see the module docstring).

    Args:
        name: the provider's name in spot.yaml.
        path: its events file (:func:`events_path`).
        poll_s: seconds between looks at the file while waiting.
    """

    #: the file is the cluster's own (in its state dir): every event is about its instances,
    #: so the reconciler acts on one launched since its last pass too
    #: (:class:`~slurm_spot.providers.events.EventSource`)
    cluster_only = True

    def __init__(self, name: str, path: Path, poll_s: float = POLL_S) -> None:
        self.provider = name
        self.path = path
        self.poll_s = poll_s
        self._offset = self._size()

    def _size(self) -> int:
        try:
            return os.lstat(self.path).st_size  # a link's own size: its target is not read
        except OSError:
            return 0

    def receive(self, wait_s: float) -> list[ProviderEvent]:
        """The events written since the last call, waiting up to ``wait_s`` seconds for the
        first one. Never raises (an unreadable file is logged and gives no events)."""
        end = time.monotonic() + max(0.0, wait_s)
        while True:
            found = self._read_new()
            left = end - time.monotonic()
            if found or left <= 0:
                return found
            time.sleep(min(self.poll_s, left))

    def _read_new(self) -> list[ProviderEvent]:
        size = self._size()
        if size < self._offset:  # started afresh: read it from its start
            self._offset = 0
        if size == self._offset:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC)  # NONBLOCK: a FIFO planted there does not hang
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise OSError(f"{self.path} is not a regular file")
                fh.seek(self._offset)
                data = fh.read(min(size - self._offset, MAX_READ_BYTES))
        except OSError as exc:  # a symlink (ELOOP), a FIFO, permissions: skip what is there
            log.warning("provider %s: reading %s failed: %s", self.provider, self.path, exc)
            self._offset = size  # warned once, not at every poll; the listings still find it
            return []
        if len(data) >= MAX_READ_BYTES and b"\n" not in data:
            self._offset += len(data)  # one line longer than a read: not an event, skip it
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        self._offset += len(complete)
        events = []
        for line in complete.splitlines():
            event = parse_line(self.provider, line)
            if event is None:
                log.debug("provider %s: ignored event line %r", self.provider, line[:200])
            else:
                events.append(event)
        return events

    def close(self) -> None:
        """Nothing to release: the file is opened per read."""
