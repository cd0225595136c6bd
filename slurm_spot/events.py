"""Decisions as events: one JSON object per line in ``<log_dir>/events.jsonl``.

Every action slurm-spot takes on a node or an instance (launch, terminate, drain, requeue,
cooldown, ...) is appended here by the process that took it, so ``slurm-spot events`` shows
one timeline across hooks, the reconciler and the watchers. Appends are single ``write()``
calls on an ``O_APPEND`` file, so concurrent writers never interleave within a line.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from slurm_spot.rawtext import escaped_all

EVENTS_FILE = "events.jsonl"
log = logging.getLogger(__name__)


class Action(str, enum.Enum):
    """Every event name slurm-spot writes (the ``action`` field), and reads back: the
    reconciler's history and metrics match on these, never on a string written elsewhere.
    A member compares equal to its value, so events read from the file (plain strings) match.
    """

    # power hooks (source resume, suspend, resume-fail)
    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch_failed"
    TERMINATED = "terminated"  # also the reconciler (orphans, lost instances)
    # resume, where slurm-spot orders a node set's pools itself (providers.pool_order)
    LAUNCH_ORDER = "launch_order"  # extra.order: pools asked, best first; extra.skipped
    PRICE_UNKNOWN = "price_unknown"  # a candidate type without a price: tried last
    # the watcher on a compute node (source watch)
    NOTICE = "notice"
    REQUEUED = "requeued"  # also the reconciler, after a reclaim
    POWERED_DOWN = "powered_down"  # a notice on a node that ran no job
    # an elastic job's step on the node ended: the node is released from the job, which goes
    # on with the other nodes (extra.remaining: its nodes now)
    RELEASED = "released"
    # a job got its preemption signal: reason and extra say which, why, to whom; extra.when
    # why now (replacement up, checkpoint deadline, ...), extra.prewarmed/replacements
    SIGNALLED = "signalled"
    SIGNAL_WITHHELD = "signal_withheld"  # nothing of the job catches one yet
    # scancel could not signal a step (reason: its error); extra.fallback_pids got kill(2)
    SIGNAL_FAILED = "signal_failed"
    REQUEUE_ENDED = "requeue_ended"  # also the reconciler: a job ended during an interruption
    NOT_REQUEUED = "not_requeued"  # ... and why it was left as it ended
    REBALANCE = "rebalance_recommendation"
    PREWARM = "prewarm"  # replacements chosen and powered up for a node's jobs
    # the reconciler powered nodes up to keep a node set's hot spares (node_sets[].spares);
    # extra.node_set, extra.wanted, extra.had, extra.nodes
    SPARES = "spares_powered_up"
    SIGNAL_PLAN = "signal_plan"  # a job's latest signal time from its checkpoint history
    # the reconciler (source reconcile), one per verdict of reconcile.rules
    RECLAIMED = "reclaimed"
    # a provider's own event about an instance of the cluster (EventBridge, GCE operation)
    PROVIDER_EVENT = "provider_event"
    BOOT_LOST = "boot_lost"
    RESUME_FAILED = "resume_failed"
    COOLDOWN = "cooldown"
    COOLDOWN_END = "cooldown_end"
    BREAKER = "breaker"
    UNDRAINED = "undrained"
    # an idle~ node flagged NOT_RESPONDING with no instance, returned to plain idle~
    NOT_RESPONDING_CLEARED = "not_responding_cleared"
    # a node drained "Kill task failed" powered down so that its instance is replaced
    KILL_TASK_FAILED = "kill_task_failed"
    # warning: a node registered less memory than RealMemory (memory_mib of its node set):
    # powered down, left drained with a reason saying what to do; extra.node_set,
    # extra.reported_mib, extra.configured_mib
    REAL_MEMORY_LOW = "real_memory_low"
    # warning: a node had several alive instances; extra.kept and extra.terminated name them
    DUPLICATE_INSTANCE = "duplicate_instance"
    EXPEDITED = "expedited"
    # the resume hook's worker (slurm_spot.lifecycle.failover): a job whose nodes got no capacity had
    # its requeue hold cleared (extra.expedited) so that it runs on another node set of its
    # partition (extra.candidates) while extra.from_node_set cools down; reason says why
    FAILOVER = "failover"
    # ... and where it started: extra.node_set, extra.nodes, extra.seconds_from_error
    FAILOVER_STARTED = "failover_started"
    # a job requeued by the requeue exit code too often (reconcile.max_fast_requeues within
    # reconcile.fast_requeue_window_s): left to Slurm's requeue hold; extra.restarts
    EXPEDITE_WITHHELD = "expedite_withheld"
    # a job requeued held after a failed launch (launch_failed_requeued_held) released;
    # extra.restarts. Capped like expedites (reconcile.max_fast_requeues): then
    # release_withheld, once per requeue, its reason saying what to do
    JOB_RELEASED = "job_released"
    RELEASE_WITHHELD = "release_withheld"
    # a job of ours pending on BadConstraints: reason names the job, its constraint and what
    # to do (also noted in its AdminComment); extra.constraint, extra.restarts
    BAD_CONSTRAINTS = "bad_constraints"
    WEIGHT_RESTORED = "weight_restored"  # a prewarmed replacement's Weight back to its set's
    # the cost order of the node sets changed (prices, cooldowns): Weights updated in Slurm;
    # extra.weights (node set -> Weight), extra.changed (Weight -> nodes), extra.usd_per_h
    WEIGHTS_ORDERED = "weights_ordered"
    # job hooks (source epilog)
    JOB_END = "job_end"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


@dataclass(frozen=True)
class Event:
    """One decision. ``time`` is ISO 8601 UTC; ``source`` is the component (resume, suspend,
    resume-fail, reconcile, watch, preempt). ``job_ids`` are squeue's unique ids (``%A``);
    where a job is an array task, ``extra.job_refs`` maps its id to Slurm's name for it
    (``{"12": "11_1"}``, :func:`with_job_refs`)."""

    action: Action
    source: str
    node: str | None = None
    instance: str | None = None
    reason: str | None = None
    job_ids: tuple[int, ...] = ()
    time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        """The event as one line of JSON, valid UTF-8 whatever it holds: text read from
        Slurm with an undecodable byte (a node reason, a process name) is written escaped
        (``bad\\xff``, :func:`slurm_spot.rawtext.escaped`)."""
        data = asdict(self)
        data["job_ids"] = list(self.job_ids)
        if not data["extra"]:
            data.pop("extra")
        return json.dumps(escaped_all(data), sort_keys=True)


def with_job_refs(fields: dict[str, object], refs: dict[str, str]) -> dict[str, object]:
    """``fields`` (an :class:`Event`'s keyword arguments) with ``extra.job_refs`` set to
    ``refs`` (``{"12": "11_1"}``: job id -> Slurm's name of an array task) when there are any,
    so ``slurm-spot events`` shows the job as squeue/sacct do."""
    if not refs:
        return fields
    extra = dict(fields.get("extra") or {})  # type: ignore[call-overload]
    extra["job_refs"] = refs
    return {**fields, "extra": extra}


def job_labels(event: dict[str, object]) -> list[str]:
    """An event's jobs as Slurm names them: ``11_1`` for an array task whose event recorded
    ``extra.job_refs``, else the job id."""
    job_ids = event.get("job_ids") or []
    extra = event.get("extra")
    refs = extra.get("job_refs") if isinstance(extra, dict) else None
    refs = refs if isinstance(refs, dict) else {}
    labels = []
    for job in job_ids if isinstance(job_ids, list) else []:
        ref = refs.get(str(job))
        labels.append(ref if isinstance(ref, str) and ref else str(job))
    return labels


class UnsafeEventsFile(OSError):
    """The events file or its directory is one slurm-spot refuses to write (a symlink, a
    hard link, a file another account owns, a world-writable directory): writing there as
    root would let that account choose which file root appends to."""


def open_for_append(directory: Path, name: str = EVENTS_FILE) -> int:
    """A write-only ``O_APPEND`` descriptor on ``directory/name`` (created 0644 if missing),
    opened without following any link at either step (the directory, then the file through
    the directory's descriptor) and without a controlling terminal: how root appends to a
    file in a directory another account may write (the events file; the local provider's
    ``events.jsonl``, :mod:`slurm_spot.providers.local.events`).

    Raises:
        UnsafeEventsFile: ``directory`` is a symlink or world-writable; the file is a symlink,
            not a regular file, has other hard links, or is owned by neither this process's
            user nor the directory's owner.
        OSError: anything else the kernel says (missing directory, permissions).
    """
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeEventsFile(f"{directory} is a symlink or not a directory") from None
        raise
    try:
        dir_stat = os.fstat(dir_fd)
        if dir_stat.st_mode & stat.S_IWOTH:
            raise UnsafeEventsFile(f"{directory} is writable by every account "
                                   f"(mode {stat.S_IMODE(dir_stat.st_mode):04o})")
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:  # O_EXCL: a link planted meanwhile fails, never followed
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeEventsFile(f"{directory / name} is a symlink") from None
            raise
    finally:
        os.close(dir_fd)
    file_stat = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(file_stat.st_mode):
        problem = "is not a regular file"
    elif file_stat.st_nlink != 1:
        problem = f"has {file_stat.st_nlink} hard links"
    elif file_stat.st_uid not in (os.geteuid(), dir_stat.st_uid):
        problem = f"is owned by uid {file_stat.st_uid}, neither this process's nor the directory's"
    if problem:
        os.close(fd)
        raise UnsafeEventsFile(f"{directory / name} {problem}")
    return fd


def emit(log_dir: Path, event: Event) -> None:
    """Append ``event`` to the log dir's events file (created with mode 0644).

    Safe as root in a directory another account owns (the Epilog's, owned by SlurmUser):
    no link is followed and a file that is not the events file is refused
    (:func:`open_for_append`), so a planted symlink or hard link never makes root write
    elsewhere.

    Never raises: if the file cannot be written, or is refused, the event goes to the log
    (a warning naming the file and why) instead."""
    line = (event.to_json() + "\n").encode()
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        fd = open_for_append(log_dir)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except UnsafeEventsFile as exc:
        log.warning("refusing to append to %s: %s; event was %s", log_dir / EVENTS_FILE, exc,
                    line.decode().strip())
    except OSError as exc:
        # Recording a decision must never stop the decision itself (a hook, a pass).
        log.warning("cannot append to %s: %s; event was %s", log_dir / EVENTS_FILE, exc,
                    line.decode().strip())


def record(
    log_dir: Path,
    source: str,
    action: Action,
    nodes: Sequence[str | None] = (None,),
    **fields: object,
) -> None:
    """Emit one event per node with the same ``action`` and fields."""
    for node in nodes:
        emit(log_dir, Event(action=action, source=source, node=node, **fields))  # type: ignore[arg-type]


MAX_LINE_BYTES = 64 * 1024  # an event line is well under 4 KiB; longer is not ours


def read_lines(fh: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES,
               whole_only: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """Lines of a binary file from its current position: ``(offset after the line, line)``.

    A line longer than ``max_line_bytes`` is consumed in bounded chunks and given as ``None``
    (never held in memory whole). With ``whole_only``, a last line without its newline (a
    write still in progress) is not given: the caller reads it again from the offset it has.
    """
    while True:
        line = fh.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            while True:  # skip the rest of an over-long line
                chunk = fh.readline(max_line_bytes)
                if not chunk or chunk.endswith(b"\n"):
                    break
            if whole_only and not chunk:
                return
            yield fh.tell(), None
            continue
        if whole_only and not line.endswith(b"\n"):
            return
        yield fh.tell(), line


_TEXT_FIELDS = ("time", "source", "node", "instance", "reason")


def is_event(data: object) -> bool:
    """True if ``data`` has the shape :meth:`Event.to_json` writes: an object whose
    ``action`` is a non-empty string; ``time``, ``source``, ``node``, ``instance`` and
    ``reason``, where present, strings or null; ``job_ids`` a list of integers; ``extra`` an
    object. Valid JSON of another shape (``{"action": 1}``, ``{"job_ids": "12"}``) is not an
    event of ours and must not be shown or counted as one."""
    if not isinstance(data, dict):
        return False
    if not isinstance(data.get("action"), str) or not data["action"]:
        return False
    if any(not isinstance(data.get(k), (str, type(None))) for k in _TEXT_FIELDS):
        return False
    job_ids = data.get("job_ids", [])
    if not isinstance(job_ids, list) or any(
            isinstance(j, bool) or not isinstance(j, int) for j in job_ids):
        return False
    return isinstance(data.get("extra", {}), dict)


def parse_line(line: bytes | None) -> dict[str, object] | None:
    """One events-file line as an event dict, or None (not JSON, not of an event's shape
    (:func:`is_event`), too long)."""
    if line is None or not line.strip():
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the limit
        return None
    return data if is_event(data) else None


# Writers stamp an event when they decide, then append: lines are in time order only up to
# this much (a hook's event may land after a later one of the reconciler's).
ORDER_SLACK_S = 600.0


def rotated_files(log_dir: Path) -> list[Path]:
    """The rotated copies of the events file, oldest first: ``events.jsonl.N`` and
    ``events.jsonl.N.gz`` as logrotate names them without ``dateext`` (the Ansible role's
    snippet, templates/slurm-spot.logrotate.j2: ``.1`` is the newest and stays uncompressed
    with ``delaycompress``). Other names beside it are ignored."""
    found: list[tuple[int, Path]] = []
    try:
        entries = list(log_dir.iterdir())
    except OSError:
        return []
    for path in entries:
        suffix = path.name.removeprefix(EVENTS_FILE + ".")
        number = suffix.removesuffix(".gz")
        if path.name.startswith(EVENTS_FILE + ".") and number.isdigit() and path.is_file():
            found.append((int(number), path))
    return [path for _, path in sorted(found, reverse=True)]


def _open_events(path: Path) -> BinaryIO:
    """``path`` for reading, decompressed if it ends in ``.gz``."""
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def read_events(log_dir: Path, since: datetime | None = None) -> Iterator[dict[str, object]]:
    """Events from the file and its rotated copies (:func:`rotated_files`), oldest first, so
    history survives log rotation.

    With ``since``, a rotated copy last written before ``since`` minus :data:`ORDER_SLACK_S`
    is skipped whole (its modification time: logrotate renames, and gzip keeps the time), and
    reading of a plain file starts near its end: :func:`start_offset` seeks backwards to the
    first line older than ``since`` minus :data:`ORDER_SLACK_S`, so the cost follows the
    events asked for, not the files' length.

    Lines that are not events (not JSON, or JSON of another shape: :func:`is_event`), longer
    than :data:`MAX_LINE_BYTES`, or whose time cannot be read when ``since`` is given, are
    skipped; how many is logged as one warning at the end. A missing or unreadable file reads
    as no events (the commands check it first: ``commands.common.require_events_file``).
    """
    skipped = 0
    for path in [*rotated_files(log_dir), log_dir / EVENTS_FILE]:
        try:
            if since is not None and path.name != EVENTS_FILE and \
                    path.stat().st_mtime < since.timestamp() - ORDER_SLACK_S:
                continue
            fh = _open_events(path)
        except OSError:
            continue
        with fh:
            if since is not None and not path.name.endswith(".gz"):
                fh.seek(start_offset(fh, since.timestamp() - ORDER_SLACK_S))
            for _, line in read_lines(fh):
                data = parse_line(line)
                if data is None:
                    skipped += 1 if line is None or line.strip() else 0
                    continue
                if since is not None:
                    when = event_time(data)
                    if when is None:
                        skipped += 1
                        continue
                    if when < since:
                        continue
                yield data
    if skipped:
        log.warning("%s: skipped %d line(s) that are not events (malformed, not of an event's "
                    "shape, or longer than %d bytes)", log_dir / EVENTS_FILE, skipped,
                    MAX_LINE_BYTES)


def event_time(data: dict[str, object]) -> datetime | None:
    """An event's ``time`` as an aware datetime (UTC if it has no zone), or None."""
    try:
        when = datetime.fromisoformat(str(data.get("time")))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def start_offset(fh: BinaryIO, before: float, block: int = 64 * 1024) -> int:
    """Offset of a line start in ``fh`` at or before every event newer than ``before``
    (epoch seconds), found from the end of the file: probe the first whole event line of
    each window of ``block``, ``2 x block``, ... bytes before the end, until one is older than
    ``before`` (or the start of the file is reached). Reads about twice the bytes that follow
    the offset, never the whole of a long file. 0 if the file is short or has no older event.
    """
    size = fh.seek(0, os.SEEK_END)
    end = size
    while end > 0:
        start = max(0, end - block)
        fh.seek(start)
        if start > 0:
            fh.readline(MAX_LINE_BYTES + 1)  # the rest of the line the window starts in
        for offset, line in read_lines(fh):
            line_start = offset - len(line or b"")
            if line_start >= end:
                break
            data = parse_line(line)
            when = event_time(data) if data is not None else None
            if when is None:
                continue
            if when.timestamp() < before:
                return line_start if line is not None else 0
            break  # this window's first event is new enough: look further back
        end = start
        block *= 2
    return 0
