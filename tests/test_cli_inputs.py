"""Command-line inputs an admin or ML engineer types, as they type them (issue 16)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands.events import parse_since
from slurm_spot.events import Event, emit
from slurm_spot.jsonenvelope import read_envelope
from tests.test_reconcile_daemon import write_config


@pytest.mark.parametrize("text", ["2026-03-01T08:20:00Z", "2026-03-01T08:20:00z",
                                  "2026-03-01T08:20:00+00:00", "2026-03-01T08:20:00",
                                  "2026-03-01T09:20:00+01:00"])
def test_since_accepts_the_iso_forms_people_paste(text: str) -> None:
    assert parse_since(text) == datetime(2026, 3, 1, 8, 20, tzinfo=timezone.utc)


def test_events_since_with_z_filters(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    log_dir = tmp_path / "log"
    base = datetime(2026, 3, 1, 8, 20, tzinfo=timezone.utc)
    for action, offset in (("launched", -60), ("terminated", 60)):
        emit(log_dir, Event(action, "resume", node="spot-1",
                            time=(base + timedelta(seconds=offset)).isoformat()))
    result = CliRunner().invoke(cli, ["--config", str(path), "events", "--json",
                                      "--since", "2026-03-01T08:20:00Z"])
    assert result.exit_code == 0, result.output
    assert [e["action"] for e in read_envelope(result.stdout)] == ["terminated"]
    bad = CliRunner().invoke(cli, ["--config", str(path), "events", "--since", "08:20Zulu"])
    assert bad.exit_code == 2 and "--since" in bad.output


def test_local_commands_read_slurm_spot_config(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``$SLURM_SPOT_CONFIG`` names the config for 'local' as for every other command; an
    empty --conf-dir (no spot.yaml there) is then not consulted."""
    path = write_config(tmp_path)
    empty = tmp_path / "etc"
    empty.mkdir()
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(path))
    result = CliRunner().invoke(cli, ["local", "capacity", "spot", "1", "--conf-dir", str(empty),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "state" / "local" / "capacity.json").read_text()) == {"spot": 1}
    status = CliRunner().invoke(cli, ["local", "status", "--conf-dir", str(empty), "--json"])
    assert status.exit_code == 0, status.output
    assert read_envelope(status.stdout)["instances"] == []
    monkeypatch.delenv("SLURM_SPOT_CONFIG")
    without = CliRunner().invoke(cli, ["local", "status", "--conf-dir", str(empty)])
    assert without.exit_code == 2 and str(empty / "spot.yaml") in without.output


@pytest.mark.parametrize(("args", "says"), [
    (["render", "--output-dir", ""], "--output-dir"),
    (["render", "--hooks-dir", ""], "--hooks-dir"),
    (["render", "--slurm-version", ""], "'' is not a Slurm version"),
    (["render", "--slurm-version", " "], "is not a Slurm version"),
])
def test_render_refuses_empty_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     args: list[str], says: str) -> None:
    """An empty --output-dir used to write into the current directory, and an empty
    --slurm-version meant "the installed one"."""
    path = write_config(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    result = CliRunner().invoke(cli, ["--config", str(path), *args])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "empty path" in result.output or "Slurm version" in result.output
    assert list(work.iterdir()) == []  # nothing written anywhere


@pytest.mark.parametrize("args", [["spot", "-1"], ["spot", "-1", "--json"], ["spot", "--", "-3"]])
def test_local_capacity_answers_a_negative_count_as_a_count(tmp_path: Path,
                                                            args: list[str]) -> None:
    path = write_config(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(path), "local", "capacity", *args])
    assert result.exit_code == 2, result.output
    assert "count must be >= 0" in result.output and "No such option" not in result.output
    assert not (tmp_path / "state").exists()  # no limit was recorded


def test_local_capacity_still_takes_zero_and_options_after_the_count(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    result = CliRunner().invoke(cli, ["local", "capacity", "spot", "0", "--json",
                                      "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert read_envelope(result.stdout) == {"node_set": "spot", "limit": 0}
