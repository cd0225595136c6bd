"""The events file under real-world input (issue 11, section 1): malformed and very long lines,
log rotation (rename and copytruncate), and a reconciler pass whose reading does not grow with
the file's length."""

from __future__ import annotations

import logging
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.events import EVENTS_FILE, Event, emit, read_events
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.reconcile.history import EventTail, read_tail
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm
from tests.test_reconcile_daemon import _patch, write_config

NOW = datetime.now(timezone.utc)


def _emit(log_dir: Path, action: str, node: str = "spot-1", ago_s: float = 0) -> None:
    emit(log_dir, Event(action, "resume", node=node,
                        time=(NOW - timedelta(seconds=ago_s)).isoformat()))


def _append(log_dir: Path, data: bytes) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / EVENTS_FILE, "ab") as fh:
        fh.write(data)


def _bad_lines(log_dir: Path) -> None:
    """What the field saw: a torn line, a non-object, binary junk and a 3 MB line."""
    _append(log_dir, b'{"action": "launched", "ti\n')
    _append(log_dir, b"[1, 2, 3]\n\xff\xfe\x00junk\n")
    _append(log_dir, b'{"action": "x", "reason": "' + b"A" * 3_000_000 + b'"}\n')
    _append(log_dir, b"[" * 30_000 + b"\n")  # json.loads: RecursionError, not ValueError


def test_events_command_skips_bad_lines_with_a_warning(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _emit(log_dir, "launched", ago_s=20)
    _bad_lines(log_dir)
    _emit(log_dir, "terminated", ago_s=10)
    result = CliRunner().invoke(cli, ["--config", str(path), "events", "--json"])
    assert result.exit_code == 0, result.output
    assert [e["action"] for e in read_envelope(result.stdout)] == ["launched", "terminated"]
    with caplog.at_level(logging.WARNING):
        assert len(list(read_events(log_dir))) == 2
    assert "skipped 5 line(s)" in caplog.text


def test_reconciler_pass_survives_bad_lines(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _bad_lines(log_dir)
    slurm, provider = FakeSlurm(), FakeProvider()
    slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    slurm.add_node("spot-2")
    _patch(monkeypatch, slurm, provider)
    for _ in range(2):
        result = CliRunner().invoke(cli, ["--config", str(path), "reconcile", "--once", "--json"])
        assert result.exit_code == 0, result.output
    assert slurm.nodes["spot-1"].state == "IDLE+CLOUD+POWERED_DOWN"
    assert [e["action"] for e in read_tail(log_dir)] == ["resume_failed"]


def test_tail_reads_only_what_was_appended(tmp_path: Path) -> None:
    """The second read parses only the new lines, however long the file already is."""
    log_dir = tmp_path
    for i in range(20_000):  # ~3 MB of old events
        _emit(log_dir, "launched", node=f"spot-{i}", ago_s=100_000)
    _emit(log_dir, "launched", node="recent", ago_s=5)
    tail = EventTail(log_dir, keep_s=3600, first_read_bytes=512 * 1024)
    first = tail.read(NOW)
    assert tail.bytes_read <= 512 * 1024
    assert [e["node"] for e in first] == ["recent"]  # old ones are outside keep_s
    size = (log_dir / EVENTS_FILE).stat().st_size
    _emit(log_dir, "terminated", node="recent")
    again = tail.read(NOW)
    assert tail.bytes_read == (log_dir / EVENTS_FILE).stat().st_size - size
    assert [e["action"] for e in again] == ["launched", "terminated"]
    assert tail.read(NOW) == again and tail.bytes_read == 0


def test_tail_follows_a_rename_rotation(tmp_path: Path) -> None:
    """logrotate's default (create): the file is renamed, a new one appears."""
    tail = EventTail(tmp_path, keep_s=3600)
    _emit(tmp_path, "a")
    assert [e["action"] for e in tail.read(NOW)] == ["a"]
    _emit(tmp_path, "b")  # written after the last pass, before the rotation
    os.rename(tmp_path / EVENTS_FILE, tmp_path / (EVENTS_FILE + ".1"))
    _emit(tmp_path, "c")  # the next writer creates a new file
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b", "c"]
    _emit(tmp_path, "d")
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b", "c", "d"]


def test_tail_follows_copytruncate(tmp_path: Path) -> None:
    tail = EventTail(tmp_path, keep_s=3600)
    for action in ("a", "b", "c"):
        _emit(tmp_path, action)
    assert len(tail.read(NOW)) == 3
    shutil.copy(tmp_path / EVENTS_FILE, tmp_path / (EVENTS_FILE + ".1"))
    os.truncate(tmp_path / EVENTS_FILE, 0)
    _emit(tmp_path, "d")
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b", "c", "d"]


def test_tail_waits_for_a_line_being_written_and_a_missing_file(tmp_path: Path) -> None:
    tail = EventTail(tmp_path, keep_s=3600)
    assert tail.read(NOW) == []  # no file yet
    _emit(tmp_path, "a")
    line = Event("b", "resume", time=NOW.isoformat()).to_json().encode()
    _append(tmp_path, line[:10])  # a writer half-way through its line
    assert [e["action"] for e in tail.read(NOW)] == ["a"]
    _append(tmp_path, line[10:] + b"\n")
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b"]
    (tmp_path / EVENTS_FILE).unlink()  # removed (rotation with no new writer yet)
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b"]
    _emit(tmp_path, "c")
    assert [e["action"] for e in tail.read(NOW)] == ["a", "b", "c"]


def test_tail_forgets_events_older_than_it_needs(tmp_path: Path) -> None:
    tail = EventTail(tmp_path, keep_s=60)
    _emit(tmp_path, "old", ago_s=30)
    assert len(tail.read(NOW)) == 1
    assert tail.read(NOW + timedelta(seconds=31)) == []


SHAPES = [b'{"action": 1, "time": "2026-03-01T00:00:00+00:00"}\n',  # showed as "None None 1 - -"
          b'{"time": null, "source": null, "action": null}\n',
          b'{"action": "notice", "node": 5}\n',
          b'{"action": "notice", "job_ids": "12"}\n',
          b'{"action": "notice", "job_ids": [true]}\n',
          b'{"action": "launched", "extra": ["market", "spot"]}\n',
          b'{}\n']


def test_json_lines_of_another_shape_are_skipped_like_malformed_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _emit(log_dir, "launched", ago_s=20)
    for line in SHAPES:
        _append(log_dir, line)
    _emit(log_dir, "terminated", ago_s=10)
    result = CliRunner().invoke(cli, ["--config", str(path), "events", "--noheader"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.strip()]
    assert [row.split()[2] for row in rows] == ["launched", "terminated"]
    assert "None" not in result.stdout
    with caplog.at_level(logging.WARNING):
        assert len(list(read_events(log_dir))) == 2
    assert f"skipped {len(SHAPES)} line(s)" in caplog.text


@pytest.mark.parametrize("broken", ["log_dir_file", "log_dir_under_file", "events_dir"])
def test_events_when_the_log_is_not_where_a_directory_or_file_should_be(
        tmp_path: Path, broken: str) -> None:
    """Before, 'events' printed nothing and exited 0: as if nothing had happened."""
    log_dir = tmp_path / "log"
    if broken == "log_dir_file":
        log_dir.write_text("oops")
        path, expect = write_config(tmp_path), f"log_dir {log_dir} (set in "
    elif broken == "log_dir_under_file":
        (tmp_path / "f").write_text("oops")
        log_dir = tmp_path / "f" / "log"
        path = write_config(tmp_path, log_dir=str(log_dir))
        expect = f"log_dir {log_dir} (set in "
    else:
        (log_dir / EVENTS_FILE).mkdir(parents=True)
        path, expect = write_config(tmp_path), f"events file {log_dir / EVENTS_FILE} is not a " \
                                               "regular file"
    for args in (["events"], ["events", "--json"],
                 ["plan", "--checkpoint-s", "60", "--interruption-rate", "observed"]):
        result = CliRunner().invoke(cli, ["--config", str(path), *args])
        assert result.exit_code == 2, (args, result.output)
        assert expect in result.output, (args, result.output)


def test_instances_and_local_status_refuse_a_state_dir_that_is_a_file(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    (tmp_path / "state").write_text("oops")
    for args in (["instances"], ["instances", "--json"], ["local", "status"],
                 ["local", "status", "--json"]):
        result = CliRunner().invoke(cli, ["--config", str(path), *args])
        assert result.exit_code == 2, (args, result.output)
        assert f"state_dir {tmp_path / 'state'} (set in {path}) is not a directory" \
            in result.output, (args, result.output)
