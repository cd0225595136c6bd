"""The reconciler's small memory, rebuilt from slurm-spot's own events on every pass.

Slurm and the provider are the state of record; the events file (``<log_dir>/events.jsonl``)
only adds what neither keeps: how often a node failed to resume, which capacity failures a
cooldown already covered, which dead instances were already acted on, which jobs were
requeued by an interruption. A restarted reconciler reads the same facts back.

The reconciler reads the file with :class:`EventTail`: the last :data:`TAIL_BYTES` once, then
only what was appended, so a pass stays cheap as the file grows; it survives log rotation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from slurm_spot.events import EVENTS_FILE, Action, parse_line, read_lines
from slurm_spot.providers import capacity_codes
from slurm_spot.providers.base import normalize_code
from slurm_spot.reconcile.rules import History, Settings

TAIL_BYTES = 8 * 1024 * 1024
INTERRUPTION_MEMORY_S = 900.0  # a requeued job waits ~121 s; keep its id well beyond that
# Codes that mean "no capacity" even before any event says so: the CAPACITY rows of every
# provider's error table (providers/<type>/errors.py), so the two never disagree.
KNOWN_CAPACITY_CODES = capacity_codes()
FAILURE_ACTIONS = (Action.RESUME_FAILED, Action.BOOT_LOST)
# jobs of these events that still pend on BeginTime get their requeue hold cleared (safety net)
INTERRUPTION_ACTIONS = (Action.RECLAIMED, Action.BOOT_LOST, Action.REQUEUED, Action.NOTICE,
                        Action.FAILOVER)


def read_tail(log_dir: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, object]]:
    """The last ``max_bytes`` of the events, oldest first: of the events file, and of its
    newest rotated copy (``events.jsonl.1``, kept uncompressed by the role's logrotate
    snippet) when the file is shorter, so a rotation just before a restart loses no history.

    A partial first line, lines that are not JSON objects and lines longer than
    :data:`~slurm_spot.events.MAX_LINE_BYTES` are skipped; a missing file gives no events.
    """
    try:
        with open(log_dir / EVENTS_FILE, "rb") as fh:
            current = [e for _, e in _read_from(fh, max_bytes)]
            left = max_bytes - os.fstat(fh.fileno()).st_size
    except OSError:
        current, left = [], max_bytes
    return _rotated_tail(log_dir, left) + current


def _rotated_tail(log_dir: Path, max_bytes: int) -> list[dict[str, object]]:
    """Events of the last ``max_bytes`` of ``events.jsonl.1`` (none if 0 or absent)."""
    if max_bytes <= 0:
        return []
    try:
        with open(log_dir / f"{EVENTS_FILE}.1", "rb") as fh:
            return [e for _, e in _read_from(fh, max_bytes)]
    except OSError:
        return []


def _read_from(fh: BinaryIO, max_bytes: int) -> list[tuple[int, dict[str, object]]]:
    """Events of the last ``max_bytes`` of ``fh`` (whole lines only), with their end offsets."""
    size = os.fstat(fh.fileno()).st_size
    start = max(0, size - max_bytes)
    fh.seek(start)
    lines = read_lines(fh, whole_only=True)
    if start > 0:
        next(lines, None)  # the partial first line
    return [(end, e) for end, line in lines if (e := parse_line(line)) is not None]


class EventTail:
    """The reconciler's own view of the events file, kept between passes (``tail -F``).

    The first :meth:`read` parses the last ``first_read_bytes`` of the file; each later one
    only what was appended since, so a pass's cost does not grow with the file's length.
    Events are kept in memory for ``keep_s`` seconds (their ``time``), at most ``max_events``.

    Safe under log rotation: when the file is renamed away (logrotate ``create``), the rest of
    the old file is read through the descriptor still open, then the new file from its start;
    when it is truncated in place (``copytruncate``), reading starts again at offset 0.
    Malformed and over-long lines are skipped (:func:`~slurm_spot.events.read_lines`).
    """

    def __init__(self, log_dir: Path, keep_s: float, first_read_bytes: int = TAIL_BYTES,
                 max_events: int = 200_000) -> None:
        self.path = log_dir / EVENTS_FILE
        self.keep_s = keep_s
        self.first_read_bytes = first_read_bytes
        self.max_events = max_events
        self._fh: BinaryIO | None = None
        self._offset = 0
        self._events: list[tuple[datetime, dict[str, object]]] = []
        self.bytes_read = 0  # parsed by the last read (for tests and benchmarks)

    def read(self, now: datetime) -> list[dict[str, object]]:
        """Every kept event, oldest first, after reading what was appended since last time."""
        self.bytes_read = 0
        try:
            current = os.stat(self.path)
        except OSError:
            current = None
        if self._fh is not None:
            opened = os.fstat(self._fh.fileno())
            if current is None or (opened.st_dev, opened.st_ino) != (current.st_dev,
                                                                      current.st_ino):
                self._consume(self._fh)  # rotated away: finish the old file first
                self._fh.close()
                self._fh, self._offset = None, 0
                if current is not None:
                    self._open(from_start=True)
            else:
                if opened.st_size < self._offset:  # copytruncate
                    self._offset = 0
                self._consume(self._fh)
        elif current is not None:
            self._open(from_start=False)
        self._prune(now)
        return [e for _, e in self._events]

    def close(self) -> None:
        """Close the events file (a later :meth:`read` reopens it)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self, from_start: bool) -> None:
        try:
            fh = open(self.path, "rb")
        except OSError:
            return
        self._fh = fh
        if from_start:
            self._offset = 0
            self._consume(fh)
        else:
            size = os.fstat(fh.fileno()).st_size
            found = _read_from(fh, self.first_read_bytes)
            self.bytes_read += min(size, self.first_read_bytes)
            self._offset = found[-1][0] if found else fh.tell()
            self._add(_rotated_tail(self.path.parent, self.first_read_bytes - size))
            self._add(e for _, e in found)

    def _consume(self, fh: BinaryIO) -> None:
        fh.seek(self._offset)
        new = []
        for end, line in read_lines(fh, whole_only=True):
            self.bytes_read += end - self._offset
            self._offset = end
            event = parse_line(line)
            if event is not None:
                new.append(event)
        self._add(new)

    def _add(self, found: Iterable[dict[str, object]]) -> None:
        for event in found:
            when = event_time(event)
            if when is not None:
                self._events.append((when, event))

    def _prune(self, now: datetime) -> None:
        oldest = now - timedelta(seconds=self.keep_s)
        self._events = [(w, e) for w, e in self._events if w >= oldest][-self.max_events:]


def history_keep_s(settings: Settings) -> float:
    """How long (seconds) the reconciler keeps events in memory: the longest window any fact
    of :func:`build_history` looks back over, and at least 2 hours (a terminated instance
    stays in EC2/GCE listings about an hour, and must stay "handled" as long)."""
    return max(settings.failure_window_s, settings.cooldown_s, settings.quota_backoff_s,
               INTERRUPTION_MEMORY_S, 7200.0)


def event_time(event: Mapping[str, object]) -> datetime | None:
    """An event's ``time`` (ISO 8601, as :mod:`slurm_spot.events` writes it) as an aware
    datetime; None when it is missing, malformed or has no time zone."""
    try:
        when = datetime.fromisoformat(str(event.get("time")))
    except ValueError:
        return None
    return when if when.tzinfo else None


def _extra(event: Mapping[str, object]) -> Mapping[str, object]:
    extra = event.get("extra")
    return extra if isinstance(extra, dict) else {}


class _Facts:
    """Accumulates facts event by event (see :func:`build_history`)."""

    def __init__(self, node_set_of: Mapping[str, str], now: datetime, settings: Settings) -> None:
        self.node_set_of = node_set_of
        self.cooldown_start = now - timedelta(seconds=settings.cooldown_s)
        self.jobs_start = now - timedelta(seconds=INTERRUPTION_MEMORY_S)
        self.window_start = now - timedelta(seconds=settings.failure_window_s)
        self.failures: dict[str, list[datetime]] = {}
        self.last_breaker: dict[str, datetime] = {}
        self.last_cooldown: dict[str, datetime] = {}
        self.capacity: dict[str, tuple[str, datetime]] = {}
        self.quota: dict[str, tuple[str, datetime]] = {}
        self.quota_start = now - timedelta(seconds=settings.quota_backoff_s)
        self.codes = set(KNOWN_CAPACITY_CODES)
        self.handled: set[str] = set()
        self.jobs: set[int] = set()
        self.responding_tried: set[str] = set()

    def add(self, event: Mapping[str, object], when: datetime) -> None:
        action, node, extra = event.get("action"), str(event.get("node") or ""), _extra(event)
        if action == Action.NOT_RESPONDING_CLEARED and event.get("source") == "reconcile":
            self.responding_tried.add(node)
        else:
            self.responding_tried.discard(node)
        if event.get("source") == "reconcile":
            if action in FAILURE_ACTIONS and not extra.get("reclaimed"):
                self.failures.setdefault(node, []).append(when)
            elif action == Action.BREAKER:
                self.last_breaker[node] = when
        if action == Action.COOLDOWN and extra.get("node_set"):
            # The reconciler's or the resume hook's (failover: slurm_spot.lifecycle.failover): either
            # answers the capacity failures before it. Counting only the reconciler's, a
            # cooldown an admin ended (state=RESUME) was started again at the next pass.
            self.last_cooldown[str(extra["node_set"])] = when
        if action == Action.LAUNCH_FAILED and extra.get("class") == "capacity":
            self._capacity(node, str(extra.get("code") or ""), when)
        elif action == Action.LAUNCH_FAILED and extra.get("class") == "quota":
            set_name = self.node_set_of.get(node)
            code = str(extra.get("code") or "")
            if set_name and code and when > self.quota_start and (
                    set_name not in self.quota or when > self.quota[set_name][1]):
                self.quota[set_name] = (code, when)
        elif action == Action.LAUNCH_FAILED and event.get("source") == "resume":
            self.failures.setdefault(node, []).append(when)
        # TERMINATED: an instance slurm-spot itself ended (the suspend hook, orphans,
        # duplicates) is never a lost boot of the node's next power-up (seen in the failover
        # e2e: a node powered down between tests, its BootTime gone, powered up again; the
        # pass before the resume hook launched read the old instance as this boot's, lost).
        if action in (Action.RECLAIMED, Action.BOOT_LOST, Action.TERMINATED) and \
                event.get("instance"):
            self.handled.add(str(event["instance"]))
        job_ids = event.get("job_ids")
        if action in INTERRUPTION_ACTIONS and when > self.jobs_start and isinstance(job_ids, list):
            self.jobs.update(j for j in job_ids if isinstance(j, int))

    def _capacity(self, node: str, code: str, when: datetime) -> None:
        if not code:
            return
        self.codes.add(normalize_code(code))
        set_name = self.node_set_of.get(node)
        if set_name and when > self.cooldown_start:
            if set_name not in self.capacity or when > self.capacity[set_name][1]:
                self.capacity[set_name] = (code, when)

    def history(self) -> History:
        counts = {}
        for node, times in self.failures.items():
            after = self.last_breaker.get(node)
            counts[node] = sum(1 for t in times
                               if t > self.window_start and (after is None or t > after))
        new_capacity = {
            s: found for s, found in self.capacity.items()
            if s not in self.last_cooldown or found[1] > self.last_cooldown[s]
        }
        return History(
            failures={n: c for n, c in counts.items() if c},
            new_capacity=new_capacity,
            new_quota={s: found for s, found in self.quota.items()
                       if s not in self.last_cooldown or found[1] > self.last_cooldown[s]},
            capacity_codes=frozenset(self.codes),
            handled_instances=frozenset(self.handled),
            interrupted_jobs=frozenset(self.jobs),
            responding_tried=frozenset(self.responding_tried),
        )


def build_history(
    events: Iterable[Mapping[str, object]],
    node_set_of: Mapping[str, str],
    now: datetime,
    settings: Settings,
) -> History:
    """Facts for :func:`~slurm_spot.reconcile.rules.plan_pass` from events, oldest first (pure).

    - failures: per node within ``failure_window_s`` and after its last ``breaker`` event: the
      reconciler's ``resume_failed`` and ``boot_lost`` (not reclaimed) events, and resume's
      ``launch_failed`` events of any class but capacity (those nodes never show ``down~``:
      resume powers them down itself);
    - new capacity failures: ``launch_failed`` events with class ``capacity`` within
      ``cooldown_s`` and newer than the node set's last ``cooldown`` event (the reconciler's
      or the resume hook's failover);
    - capacity codes: :data:`KNOWN_CAPACITY_CODES` plus every code an event classed capacity;
    - handled instances: instances named by ``reclaimed``/``boot_lost``/``terminated``
      events;
    - interrupted jobs: job ids of interruption events within :data:`INTERRUPTION_MEMORY_S`;
    - responding tried: nodes whose newest event (of those kept, :func:`history_keep_s`) is
      the reconciler's ``not_responding_cleared``: the clear is not repeated until something
      else happens to the node (a launch, a termination, a reclaim) or the event ages out.
    """
    facts = _Facts(node_set_of, now, settings)
    for event in events:
        when = event_time(event)
        if when is not None:
            facts.add(event, when)
    return facts.history()
