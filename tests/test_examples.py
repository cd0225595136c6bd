"""The example configurations the README points to pass `config check` and render."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["spot-cloud.yaml", "spot-local.yaml"])
def test_example_config_is_valid_and_renders(name: str) -> None:
    path = EXAMPLES / name
    check = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert check.exit_code == 0, check.output
    assert "warning" not in check.output  # e.g. node set names out of cost order on 22.05
    render = CliRunner().invoke(cli, ["--config", str(path), "render", "--slurm-version", "22.05"])
    assert render.exit_code == 0, render.output
    assert "State=CLOUD" in render.output


def test_readme_example_is_the_example_file() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block in (EXAMPLES / "spot-cloud.yaml").read_text()
