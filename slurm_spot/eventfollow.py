"""``slurm-spot events --follow``: the events file read as it grows (``tail -F``).

:class:`EventFollower` reads ``<log_dir>/events.jsonl`` from the first event at or after
``since`` (the whole file without it), then on each :meth:`~EventFollower.poll` what was
appended since. Like the reconciler's :class:`slurm_spot.reconcile.history.EventTail` it
survives log rotation: a file renamed away (logrotate ``create``) is read to its end through
the descriptor still open, then the new file from its start; a file truncated in place
(``copytruncate``) is read again from offset 0. A file that does not exist yet is waited for.
Only whole lines are read (a write in progress is read on the next poll); lines that are not
events are skipped (:func:`slurm_spot.events.parse_line`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from slurm_spot.events import (
    EVENTS_FILE,
    ORDER_SLACK_S,
    event_time,
    parse_line,
    read_lines,
    start_offset,
)


class EventFollower:
    """New events of one events file, oldest first, poll after poll.

    Args:
        log_dir: the directory holding ``events.jsonl`` (``log_dir`` of spot.yaml).
        since: only events whose ``time`` is at or after this (aware datetime), or None.
    """

    def __init__(self, log_dir: Path, since: datetime | None = None) -> None:
        self.path = log_dir / EVENTS_FILE
        self.since = since
        self._fh: BinaryIO | None = None
        self._offset = 0
        self._first = True

    def poll(self) -> list[dict[str, object]]:
        """The events appended since the last poll (on the first: those already there)."""
        try:
            current = os.stat(self.path)
        except OSError:
            current = None
        found: list[dict[str, object]] = []
        if self._fh is not None:
            opened = os.fstat(self._fh.fileno())
            if current is None or (opened.st_dev, opened.st_ino) != (current.st_dev,
                                                                      current.st_ino):
                found += self._consume()  # rotated away: finish the old file first
                self._fh.close()
                self._fh, self._offset = None, 0
            elif opened.st_size < self._offset:  # truncated in place (copytruncate)
                self._offset = 0
        if self._fh is None and current is not None:
            try:
                self._fh = open(self.path, "rb")
            except OSError:
                return found
            if self._first and self.since is not None:
                self._offset = start_offset(self._fh, self.since.timestamp() - ORDER_SLACK_S)
            self._first = False
        if self._fh is not None:
            found += self._consume()
        return found

    def _consume(self) -> list[dict[str, object]]:
        assert self._fh is not None
        self._fh.seek(self._offset)
        new = []
        for end, line in read_lines(self._fh, whole_only=True):
            self._offset = end
            event = parse_line(line)
            if event is None:
                continue
            if self.since is not None:
                when = event_time(event)
                if when is None or when < self.since:
                    continue
            new.append(event)
        return new

    def close(self) -> None:
        """Close the file (a later :meth:`poll` opens it again from the start)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def follow(self, poll_s: float = 0.5,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[dict[str, object]]:
        """Every event, forever: :meth:`poll`, then ``sleep(poll_s)`` when nothing was new."""
        while True:
            new = self.poll()
            yield from new
            if not new:
                sleep(poll_s)
