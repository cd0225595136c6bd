"""Listing commands in a pipe and at a terminal: plain columns, --noheader, --format,
``status --watch`` (issue 16)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands import status as status_module
from slurm_spot.commands.tables import Field, plain_lines
from slurm_spot.events import Event, emit
from slurm_spot.jsonenvelope import read_envelope
from tests.terminal import run_in_terminal
from tests.test_reconcile_daemon import write_config
from tests.test_status import _invoke, world  # noqa: F401 - the fixture

BOX = set("┃━│─┏┓┗┛╇╈┡┩")


def test_piped_status_is_plain_columns_awk_can_split(world: tuple,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    result = _invoke(world, monkeypatch)
    assert result.exit_code == 0, result.output
    assert not BOX & set(result.output)
    lines = result.output.splitlines()
    assert lines[0].split() == ["node", "state", "instance", "market", "type", "zone", "uptime",
                                "job", "reason"]
    by_node = {line.split()[0]: line.split() for line in lines[1:]}
    assert by_node["spot-1"][:6] == ["spot-1", "alloc", "i-0001", "on-demand", "g5.xlarge",
                                     "us-east-1a"]
    assert by_node["spot-1"][7] == "42"  # $7 is the uptime, counted to now
    assert by_node["spot-2"][1:8] == ["idle~", "-", "-", "-", "-", "-", "-"]  # awk's $8 is job
    assert by_node["spot-3"][8:] == ["ResumeTimeout", "reached"]  # the free text is last


def test_noheader_and_format(world: tuple, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    result = _invoke(world, monkeypatch, "--noheader", "--format", "NODE,state,Job")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["spot-1  alloc           42", "spot-2  idle~           -",
                                          "spot-3  down~           -",
                                          "spot-9  (not in Slurm)  -"]
    short = _invoke(world, monkeypatch, "-n", "-o", "node%4,reason%6")
    assert short.output.splitlines()[2] == "spot  Resume"


@pytest.mark.parametrize("command", [["status"], ["events"], ["instances"], ["local", "status"]])
def test_an_unknown_field_is_exit_2_naming_it(tmp_path: Path, command: list[str]) -> None:
    path = write_config(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(path), *command, "--format", "node,bogus"])
    assert result.exit_code == 2, result.output
    assert "unknown field 'bogus'; fields: " in result.output
    bad = CliRunner().invoke(cli, ["--config", str(path), *command, "-o", "node%x"])
    assert bad.exit_code == 2 and "the width after '%' must be a positive integer" in bad.output


def test_json_is_unchanged_by_the_table_options(world: tuple,  # noqa: F811
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def without_uptime(text: str) -> dict:  # uptime_s counts on between the two calls
        data = read_envelope(text)
        for row in data["nodes"]:
            row.pop("uptime_s")
        return data

    plain = without_uptime(_invoke(world, monkeypatch, "--json").output)
    formatted = without_uptime(_invoke(world, monkeypatch, "--json", "-n", "-o", "node").output)
    assert formatted == plain and set(plain) == {"nodes", "node_sets", "failovers", "errors"}


def test_plain_lines_pad_without_trailing_blanks() -> None:
    rows = [{"a": "x", "b": ""}, {"a": "longer", "b": "y"}]
    assert plain_lines(rows, [Field("a"), Field("b")]) == ["a       b", "x       -",
                                                           "longer  y"]


def _events_file(tmp_path: Path) -> Path:
    path = write_config(tmp_path)
    emit(tmp_path / "log", Event("launched", "resume", node="spot-1", instance="loc-1",
                                 reason="spot", job_ids=(7,),
                                 time=datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc).isoformat()))
    return path


def test_events_at_a_terminal_get_a_table_and_in_a_pipe_plain_lines(tmp_path: Path) -> None:
    path = _events_file(tmp_path)
    argv = [sys.executable, "-m", "slurm_spot", "--config", str(path), "events"]
    env = {**os.environ, "COLUMNS": "160", "LINES": "40", "TERM": "xterm"}
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.splitlines() == [
        "time                       source  action    node    instance  jobs  reason",
        "2026-03-01T08:00:00+00:00  resume  launched  spot-1  loc-1     7     spot"]
    code, text, err = run_in_terminal(argv, on_terminal=("stdout",))
    assert code == 0, err
    assert BOX & set(text) and "loc-1" in text and "launched" in text


def test_status_watch_refreshes_until_ctrl_c(world: tuple,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_module.time, "sleep", sleep)
    result = _invoke(world, monkeypatch, "--watch", "5", "-n", "-o", "node")
    assert result.exit_code == 0, result.output
    assert naps == [5.0, 5.0, 5.0]
    assert result.output.count("spot-1\n") == 3 and result.output.count("Ctrl-C to stop") == 3
    naps.clear()
    default = _invoke(world, monkeypatch, "--json", "--watch")
    assert default.exit_code == 0 and naps == [2.0, 2.0, 2.0]
    documents = [read_envelope(line) for line in default.output.splitlines()]  # JSON Lines
    assert len(documents) == 3 and {r["node"] for r in documents[0]["nodes"]} >= {"spot-1"}


def test_status_watch_survives_slurm_errors_and_exits_0_on_sigint(tmp_path: Path) -> None:
    """As a user runs it: Slurm is unreachable (no scontrol there), each refresh says so on
    stderr, and Ctrl-C (SIGINT) ends it with exit 0."""
    path = write_config(tmp_path, slurm_bin_dir=str(tmp_path / "no-slurm"))
    # As at a terminal: SIGINT at its default, even when this test runs under a shell that
    # started it in the background (which ignores SIGINT, and Python then installs no
    # KeyboardInterrupt handler: the watch would never see the Ctrl-C).
    proc = subprocess.Popen([sys.executable, "-m", "slurm_spot", "--config", str(path),
                             "status", "--watch", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Ctrl-C once two refreshes have failed (however slowly this machine starts Python).
    seen: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while sum("slurm-spot: error:" in line for line in seen) < 2:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        line = proc.stderr.readline() if ready else ""
        if not line:
            proc.kill()
            pytest.fail(f"status --watch gave no second error line: {''.join(seen)}")
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    try:
        out, rest = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("status --watch did not stop on SIGINT")
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert out.count("Ctrl-C to stop") >= 2 and err.count("slurm-spot: error:") >= 2


def test_a_terminal_table_shows_brackets_and_colons_as_written(tmp_path: Path) -> None:
    """An admin's reason '[jdoe] disk' lost its '[jdoe]' at a terminal (rich read it as a
    style), and a reason or job name holding '[/]' stopped `events`/`status` with rich's
    MarkupError traceback; ':x:' became an emoji."""
    path = write_config(tmp_path)
    reason = "[jdoe] disk [/] bad :x: [bold]"
    emit(tmp_path / "log", Event("drained", "reconcile", node="spot-1", reason=reason,
                                 time=datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc).isoformat()))
    argv = [sys.executable, "-m", "slurm_spot", "--config", str(path), "events",
            "--format", "node,reason"]
    code, text, err = run_in_terminal(argv, on_terminal=("stdout",))
    assert code == 0, text + err
    assert BOX & set(text) and reason in text
