"""Log rotation keeps history: ``cost``/``events`` (read_events) and the reconciler's tail
(read_tail, EventTail) read the rotated copies the role's logrotate snippet leaves
(events.jsonl.1 plain, events.jsonl.N.gz), and the snippet rotates both logs that way."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_spot import events
from slurm_spot.events import EVENTS_FILE, Action, read_events, rotated_files
from slurm_spot.reconcile.history import EventTail, read_tail
from slurm_spot.resources import render_template

T0 = datetime(2026, 5, 1, tzinfo=timezone.utc)


def emit(log_dir: Path, job: int, when: datetime) -> None:
    events.emit(log_dir, events.Event(source="test", action=Action.REQUEUED, node=f"n-{job}",
                                      job_ids=(job,), time=when.isoformat()))


def rotate(log_dir: Path, when: datetime) -> None:
    """What logrotate does with the snippet's ``compress``, ``delaycompress`` and ``create``:
    .N.gz -> .N+1.gz, .1 -> .2.gz (gzip keeps the time), file -> .1."""
    for path in sorted(rotated_files(log_dir), key=lambda p: p.name, reverse=True):
        number = int(path.name.split(".")[2])
        target = log_dir / f"{EVENTS_FILE}.{number + 1}.gz"
        if path.name.endswith(".gz"):
            path.rename(target)
        else:
            with open(path, "rb") as src, gzip.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            stat = path.stat()
            os.utime(target, (stat.st_atime, stat.st_mtime))
            path.unlink()
    current = log_dir / EVENTS_FILE
    os.utime(current, (when.timestamp(), when.timestamp()))
    current.rename(log_dir / f"{EVENTS_FILE}.1")


def jobs(found: list[dict[str, object]]) -> list[object]:
    return [e["job_ids"][0] for e in found]  # type: ignore[index]


def test_history_survives_two_rotations(tmp_path: Path) -> None:
    emit(tmp_path, 1, T0)
    rotate(tmp_path, T0 + timedelta(hours=1))
    emit(tmp_path, 2, T0 + timedelta(days=7))
    rotate(tmp_path, T0 + timedelta(days=7, hours=1))
    emit(tmp_path, 3, T0 + timedelta(days=14))
    assert [p.name for p in rotated_files(tmp_path)] == ["events.jsonl.2.gz", "events.jsonl.1"]
    assert jobs(list(read_events(tmp_path))) == [1, 2, 3]
    # a copy last written before --since (minus the ordering slack) is not even opened
    assert jobs(list(read_events(tmp_path, T0 + timedelta(days=6)))) == [2, 3]
    assert jobs(list(read_events(tmp_path, T0 + timedelta(days=13)))) == [3]


def test_the_reconcilers_tail_reads_the_newest_rotated_copy(tmp_path: Path) -> None:
    emit(tmp_path, 1, T0)
    rotate(tmp_path, T0)
    emit(tmp_path, 2, T0 + timedelta(seconds=30))
    assert jobs(read_tail(tmp_path)) == [1, 2]
    tail = EventTail(tmp_path, keep_s=3600)
    assert jobs(tail.read(T0 + timedelta(minutes=1))) == [1, 2]
    rotate(tmp_path, T0 + timedelta(minutes=2))  # while it runs: follows the rename
    emit(tmp_path, 3, T0 + timedelta(minutes=3))
    assert jobs(tail.read(T0 + timedelta(minutes=4))) == [1, 2, 3]


def test_the_logrotate_snippet_rotates_both_logs_the_way_the_readers_expect() -> None:
    text = render_template(
        "slurm-spot.logrotate.j2", __slurm_spot_logrotate_header="Managed by test",
        __slurm_spot_log_dir="/var/log/slurm-spot", __slurm_spot_log_user="slurm",
        __slurm_spot_log_group="slurm", __slurm_spot_logrotate_frequency="weekly",
        __slurm_spot_logrotate_rotate=12, __slurm_spot_logrotate_maxsize="100M")
    assert text.startswith("# Managed by test\n")
    block = re.search(r"^(/\S+) (/\S+) \{\n(.*?)\n\}$", text, re.S | re.M)
    assert block is not None
    assert block.group(1, 2) == ("/var/log/slurm-spot/events.jsonl",
                                 "/var/log/slurm-spot/hooks.log")
    directives = [line.strip() for line in block.group(3).splitlines()]
    for needed in ("compress", "delaycompress", "nodateext", "create 0644 slurm slurm",
                   "su slurm slurm", "rotate 12", "maxsize 100M", "weekly", "missingok"):
        assert needed in directives
    assert "copytruncate" not in directives
