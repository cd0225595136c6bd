"""``slurm-spot events --follow --job N`` against a live events file (a real process reading it
while it grows, is rotated and truncated), ``--job``, and Slurm's ``now-1hour`` time form."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands.events import parse_since
from slurm_spot.events import EVENTS_FILE, Event, emit
from slurm_spot.jsonenvelope import read_envelope
from tests.test_reconcile_daemon import write_config

ROOT = Path(__file__).resolve().parent.parent


def _emit(log_dir: Path, action: str, jobs: list[int], node: str = "spot-1",
          ago_s: float = 0, refs: dict[str, str] | None = None) -> None:
    emit(log_dir, Event(action, "watch", node=node, job_ids=jobs,
                        time=(datetime.now(timezone.utc) - timedelta(seconds=ago_s)).isoformat(),
                        extra={"job_refs": refs} if refs else {}))


class Follower:
    """``slurm-spot events --follow ...`` as a process; :meth:`lines` reads what it printed."""

    def __init__(self, config: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_spot", "--config", str(config), "events", "--follow",
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""

    def lines(self, count: int, timeout_s: float = 20.0) -> list[str]:
        """The next ``count`` lines it prints (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.buffer.count(b"\n") < count:
            left = deadline - time.monotonic()
            assert left > 0, f"printed only {self.buffer!r}; stderr: {self._stderr()}"
            if self.selector.select(min(left, 0.5)):
                assert self.proc.stdout is not None
                self.buffer += self.proc.stdout.read() or b""
        *taken, rest = self.buffer.split(b"\n", count)
        self.buffer = rest
        return [t.decode() for t in taken]

    def quiet(self, wait_s: float = 1.5) -> bool:
        """True if it prints nothing more within ``wait_s``."""
        if self.selector.select(wait_s):
            assert self.proc.stdout is not None
            self.buffer += self.proc.stdout.read() or b""
        return not self.buffer

    def _stderr(self) -> str:
        self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_follow_prints_one_jobs_new_events_across_rotation_and_truncation(
        tmp_path: Path) -> None:
    config = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _emit(log_dir, "launched", [7], ago_s=30)
    _emit(log_dir, "launched", [8], ago_s=20)
    follower = Follower(config, "--job", "7", "--json")
    try:
        (first,) = follower.lines(1)  # what was there: job 7's only
        assert read_envelope(first, "events")["action"] == "launched"
        _emit(log_dir, "notice", [8])
        _emit(log_dir, "notice", [7])
        (second,) = follower.lines(1)
        assert read_envelope(second)["action"] == "notice"
        assert read_envelope(second)["job_ids"] == [7]
        # logrotate 'create': renamed away, a new file in its place
        _emit(log_dir, "signalled", [7])
        os.rename(log_dir / EVENTS_FILE, log_dir / f"{EVENTS_FILE}.1")
        _emit(log_dir, "requeued", [7])
        assert [read_envelope(x)["action"] for x in follower.lines(2)] == ["signalled",
                                                                          "requeued"]
        # logrotate 'copytruncate': the same file emptied, then written again
        os.truncate(log_dir / EVENTS_FILE, 0)
        time.sleep(1.0)  # the follower sees the shorter file before it grows again
        _emit(log_dir, "expedited", [7])
        assert read_envelope(follower.lines(1)[0])["action"] == "expedited"
        _emit(log_dir, "launched", [9])
        assert follower.quiet()  # another job's event: not shown
    finally:
        follower.stop()


def test_follow_as_columns_has_one_header(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    log_dir = tmp_path / "log"
    follower = Follower(config, "--format", "action,jobs")
    try:
        time.sleep(0.5)  # no file yet: it waits for one
        _emit(log_dir, "launched", [7])
        _emit(log_dir, "notice", [7])
        lines = follower.lines(3)
        assert lines[0].split() == ["action", "jobs"]
        assert [ln.split() for ln in lines[1:]] == [["launched", "7"], ["notice", "7"]]
    finally:
        follower.stop()


def test_job_takes_an_array_jobs_tasks_or_one_task(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _emit(log_dir, "notice", [12], refs={"12": "11_1"})
    _emit(log_dir, "notice", [13], refs={"13": "11_2"})
    _emit(log_dir, "notice", [111])

    def jobs(*args: str) -> list[list[int]]:
        result = CliRunner().invoke(cli, ["--config", str(config), "events", "--json", *args])
        assert result.exit_code == 0, result.output
        return [e["job_ids"] for e in read_envelope(result.stdout, "events")]

    assert jobs("--job", "11") == [[12], [13]]
    assert jobs("--job", "11_2") == [[13]]
    assert jobs("--job", "111") == [[111]]
    bad = CliRunner().invoke(cli, ["--config", str(config), "events", "--job", "x7"])
    assert bad.exit_code == 2 and "--job" in bad.output and "a job id (12)" in bad.output


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("text", "ago"), [
    ("now", timedelta(0)), ("now-1hour", timedelta(hours=1)), ("now-90", timedelta(seconds=90)),
    ("NOW-2days", timedelta(days=2)), ("now-3weeks", timedelta(weeks=3)),
    ("now-5minutes", timedelta(minutes=5)), ("now+30seconds", -timedelta(seconds=30)),
    ("10m", timedelta(minutes=10)),
])
def test_slurms_now_form_is_taken(text: str, ago: timedelta) -> None:
    assert parse_since(text, NOW) == NOW - ago


@pytest.mark.parametrize("text", ["now-", "now-1fortnight", "now-1.5hours", "now1hour"])
def test_a_malformed_now_form_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(click.BadParameter, match="now-1hour"):
        parse_since(text, NOW)


def test_since_now_minus_one_hour_from_the_command_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    log_dir = tmp_path / "log"
    _emit(log_dir, "launched", [7], ago_s=2 * 3600)
    _emit(log_dir, "notice", [7], ago_s=600)
    result = CliRunner().invoke(cli, ["--config", str(config), "events", "--json", "--since",
                                      "now-1hour"])
    assert [e["action"] for e in read_envelope(result.stdout)] == ["notice"]
    # cost takes the same forms: nothing happened in the hour to come
    result = CliRunner().invoke(cli, ["--config", str(config), "cost", "--since", "now+1hour"])
    assert result.exit_code == 0, result.output
    assert "no jobs in slurm-spot's events since now+1hour" in result.output
