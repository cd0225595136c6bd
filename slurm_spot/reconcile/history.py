"""The reconciler's small memory, rebuilt from slurm-spot's own events on every pass.

Slurm and the provider are the state of record; the events file (``<log_dir>/events.jsonl``)
only adds what neither keeps: how often a node failed to resume, which capacity failures a
cooldown already covered, which dead instances were already acted on, which jobs were
requeued by an interruption. A restarted reconciler reads the same facts back.

Only the tail of the file is read (:data:`TAIL_BYTES`), so a pass stays cheap as the file grows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

from slurm_spot.events import EVENTS_FILE, Action
from slurm_spot.providers import capacity_codes
from slurm_spot.providers.base import normalize_code
from slurm_spot.reconcile.rules import History, Settings

TAIL_BYTES = 8 * 1024 * 1024
INTERRUPTION_MEMORY_S = 900.0  # a requeued job waits ~121 s; keep its id well beyond that
# Codes that mean "no capacity" even before any event says so: the CAPACITY rows of every
# provider's error table (providers/<type>/errors.py), so the two never disagree.
KNOWN_CAPACITY_CODES = capacity_codes()
FAILURE_ACTIONS = (Action.RESUME_FAILED, Action.BOOT_LOST)
INTERRUPTION_ACTIONS = (Action.RECLAIMED, Action.BOOT_LOST, Action.REQUEUED, Action.NOTICE)


def read_tail(log_dir: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, object]]:
    """The last ``max_bytes`` of the events file as parsed events, oldest first.

    A partial first line and lines that are not JSON objects are skipped; a missing file
    gives no events.
    """
    path = log_dir / EVENTS_FILE
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            found.append(event)
    return found


def _when(event: Mapping[str, object]) -> datetime | None:
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
        self.codes = set(KNOWN_CAPACITY_CODES)
        self.handled: set[str] = set()
        self.jobs: set[int] = set()

    def add(self, event: Mapping[str, object], when: datetime) -> None:
        action, node, extra = event.get("action"), str(event.get("node") or ""), _extra(event)
        if event.get("source") == "reconcile":
            if action in FAILURE_ACTIONS and not extra.get("reclaimed"):
                self.failures.setdefault(node, []).append(when)
            elif action == Action.BREAKER:
                self.last_breaker[node] = when
            elif action == Action.COOLDOWN and extra.get("node_set"):
                self.last_cooldown[str(extra["node_set"])] = when
        if action == Action.LAUNCH_FAILED and extra.get("class") == "capacity":
            self._capacity(node, str(extra.get("code") or ""), when)
        elif action == Action.LAUNCH_FAILED and event.get("source") == "resume":
            self.failures.setdefault(node, []).append(when)
        if action in (Action.RECLAIMED, Action.BOOT_LOST) and event.get("instance"):
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
            capacity_codes=frozenset(self.codes),
            handled_instances=frozenset(self.handled),
            interrupted_jobs=frozenset(self.jobs),
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
      ``cooldown_s`` and newer than the node set's last ``cooldown`` event;
    - capacity codes: :data:`KNOWN_CAPACITY_CODES` plus every code an event classed capacity;
    - handled instances: instances named by ``reclaimed``/``boot_lost`` events;
    - interrupted jobs: job ids of interruption events within :data:`INTERRUPTION_MEMORY_S`.
    """
    facts = _Facts(node_set_of, now, settings)
    for event in events:
        when = _when(event)
        if when is not None:
            facts.add(event, when)
    return facts.history()
