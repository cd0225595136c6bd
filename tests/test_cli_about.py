"""``slurm-spot --version``: what an admin pastes into a bug report (issue 16)."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from slurm_spot import __version__
from slurm_spot.cli import cli
from slurm_spot.slurm.version import SlurmVersion


def test_version_names_slurm_and_each_extra() -> None:
    proc = subprocess.run([sys.executable, "-m", "slurm_spot", "--version"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"slurm-spot {__version__}"
    found = SlurmVersion.detect()
    assert lines[2] == (f"Slurm {found}" if found else
                        "Slurm: not found (no slurmctld, scontrol or sinfo answered)")
    # The test venv has every extra (Makefile: .[aws,gcp,train,dev,plot]); dev is not shown.
    extras = {m.group(1): m.group(2) for m in map(re.compile(r"extra (\w+): (.*)").match, lines)
              if m}
    assert set(extras) >= {"aws", "gcp", "train", "plot"} and "dev" not in extras
    assert extras["aws"] == f"installed (boto3 {metadata.version('boto3')})"


def test_a_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version

    def version(name: str) -> str:
        if name == "matplotlib":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert ("extra plot: not installed (missing matplotlib; pip install 'slurm-spot[plot]')"
            in result.output.splitlines())


def test_help_groups_the_hooks_apart_and_they_stay_callable() -> None:
    from slurm_spot.commands import COMMAND_MODULES

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    text = result.output
    typed, daemons, hooks = (text.index("\nCommands:"), text.index("\nDaemons"),
                             text.index("\nSlurm hooks"))
    assert typed < daemons < hooks

    def names(part: str) -> set[str]:
        return {line.split()[0] for line in part.splitlines()[2:] if line.startswith("  ")}

    assert names(text[hooks:]) == {"resume", "suspend", "resume-fail", "prolog", "task-prolog",
                                   "epilog", "prolog-slurmctld"}
    assert names(text[daemons:hooks]) == {"reconcile", "watch"}
    assert names(text[typed:daemons]) | names(text[daemons:]) == set(COMMAND_MODULES)
    for hook in ("resume", "task-prolog"):
        assert CliRunner().invoke(cli, [hook, "--help"]).exit_code == 0
