"""What every command shares, walked over all of them: the --json envelope and the help texts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
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


def _all_commands() -> list[tuple[str, click.Command]]:
    """Every command and group subcommand, by its full name (``local status``)."""
    ctx = click.Context(cli)
    found = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None, name
        found.append((name, command))
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", command.commands[sub]) for sub in command.commands]
    return found


RAW_MARKUP = re.compile(r"``|:(?:func|class|meth|mod|data|attr):|\*\*|^\s*(?:Args|Raises|Returns):",
                        re.M)


def _cut(text: str) -> str | None:
    """Why ``text`` reads as cut off, or None: unbalanced brackets or quotes, or no full stop
    or closing bracket at its end."""
    if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
        return "unbalanced brackets"
    if text.count("'") % 2 and "'s" not in text and "s'" not in text:
        return "unbalanced quotes"
    return None


@pytest.mark.parametrize(("name", "command"), _all_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_help_text_is_whole_plain_and_not_empty(name: str, command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert not RAW_MARKUP.search(result.output), f"{name} --help shows markup:\n{result.output}"
    short = command.get_short_help_str(limit=1000)
    assert short and _cut(short) is None, f"{name}: short help {short!r} is {_cut(short)}"
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        text = (param.help or "").strip()
        assert text, f"{name} {'/'.join(param.opts)} has no help text"
        assert not RAW_MARKUP.search(text), f"{name} {param.opts}: {text!r}"
        assert _cut(text) is None, f"{name} {param.opts}: {text!r} is {_cut(text)}"


def test_verbose_is_taken_after_the_command_too(tmp_path: Path) -> None:
    args = ["plan", "--checkpoint-s", "60", "--mtbf-h", "24"]
    for argv in ([*args, "-v"], ["-v", *args], [*args, "-vv"], ["-v", *args, "--verbose"]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0, (argv, result.output)
        assert "checkpoint every: Young" in result.output
    # sbatch passes -v on to Slurm's sbatch, as before
    sbatch = cli.get_command(click.Context(cli), "sbatch")
    assert sbatch is not None and not any("-v" in p.opts for p in sbatch.params)
