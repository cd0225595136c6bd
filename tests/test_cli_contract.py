"""What every command shares, walked over all of them: the --json envelope and the help texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot import __version__
from slurm_spot.cli import cli
from slurm_spot.jsonenvelope import JSON_SCHEMA, read_envelope
from tests.test_reconcile_daemon import write_config


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.mark.parametrize(("argv", "command", "kind"), [
    (["plan", "--checkpoint-s", "60", "--mtbf-h", "24"], "plan", dict),
    (["plan", "--compare", "--checkpoint-s", "60", "--work-steps", "1000",
      "--candidate", "g5.xlarge:1:<5%:0.5"], "plan", list),
    (["simulate", "--job-hours", "2", "--checkpoint-s", "60", "--mtbf-h", "50", "--runs", "3"],
     "simulate", dict),
])
def test_every_json_output_has_the_one_envelope(argv: list[str], command: str, kind: type) -> None:
    result = CliRunner().invoke(cli, [*argv, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["meta"] == {"schema": JSON_SCHEMA, "version": __version__, "command": command}
    assert set(doc) == {"meta", "data"} and isinstance(doc["data"], kind)
    assert read_envelope(result.stdout, command) == doc["data"]


def test_a_subcommand_of_a_group_is_named_whole(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(write_config(tmp_path)))
    empty = tmp_path / "conf"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["local", "status", "--conf-dir", str(empty), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["meta"]["command"] == "local status"
    with pytest.raises(ValueError, match="output of 'local status', expected 'status'"):
        read_envelope(result.stdout, "status")
    with pytest.raises(ValueError, match="not a slurm-spot --json envelope"):
        read_envelope("[1, 2]")
