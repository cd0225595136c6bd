"""spot.yaml validation and `slurm-spot config check`: errors name the file, field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import config_path, load_config
from slurm_spot.jsonenvelope import read_envelope

GOOD = {
    "cluster": "demo",
    "providers": {"local": {"type": "local"}},
    "node_sets": [
        {"name": "gpu", "provider": "local", "count": 4, "cpus": 8, "memory_mib": 30000,
         "gpus": {"type": "a10g", "count": 1}, "features": ["a10g"]},
        {"name": "cpu", "provider": "local", "count": 2},
    ],
    "partitions": [{"name": "spot", "node_sets": ["gpu", "cpu"], "default": True}],
}


def write(tmp_path: Path, data: object, name: str = "spot.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def check(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    return result.exit_code, result.output


def test_good_config_passes(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    code, out = check(path)
    assert code == 0, out
    assert "6 nodes" in out
    config = load_config(path)
    assert config.node_set("gpu").node_names == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert config.node_set_of("gpu-3").name == "gpu"  # type: ignore[union-attr]
    assert config.node_set_of("gpu-5") is None
    assert config.node_set_of("gpu-03") is None
    assert config.preemption.signal == "USR2"


def _broken(**changes: object) -> dict:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    for dotted, value in changes.items():
        target = data
        keys = dotted.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = keys[-1]
        target[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        (_broken(node_sets__0__colour="blue"), "node_sets.0.colour", "unknown key"),
        (_broken(node_sets__1__count=0), "node_sets.1.count", "greater than or equal to 1"),
        (_broken(partitions__0__node_sets=["gpu", "tpu"]), "partitions.0.node_sets.1",
         "'tpu' is referenced but not defined"),
        (_broken(node_sets__1__name="gpu"), "node_sets.1.name", "'gpu' is defined twice"),
        (_broken(node_sets__0__provider="aws"), "node_sets.0.provider", "'aws' is not defined"),
        (_broken(preemption={"signal": "USR9"}), "preemption.signal", "unknown signal"),
        (_broken(node_sets__0__market="cheap"), "node_sets.0.market", "'spot' or 'on-demand'"),
    ],
)
def test_bad_config_exits_2_naming_file_field_reason(tmp_path: Path, data: dict, field: str,
                                                     reason: str) -> None:
    path = write(tmp_path, data)
    code, out = check(path)
    assert code == 2
    assert str(path) in out
    line = next(line for line in out.splitlines() if field in line)
    assert reason in line


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster: demo\nnode_sets:\n  - name: [gpu\n")
    code, out = check(path)
    assert code == 2
    assert "line 4" in out or "line 3" in out


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    code, out = check(tmp_path / "nope.yaml")
    assert code == 2
    assert "nope.yaml" in out and "No such file" in out


def test_config_is_found_beside_slurm_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, GOOD)
    monkeypatch.delenv("SLURM_SPOT_CONFIG", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert config_path() == tmp_path / "spot.yaml"
    monkeypatch.setenv("SLURM_SPOT_CONFIG", "/elsewhere/spot.yaml")
    assert config_path() == Path("/elsewhere/spot.yaml")
    assert config_path("/explicit.yaml") == Path("/explicit.yaml")


def test_config_option_works_after_the_command_name_too(tmp_path: Path) -> None:
    """`slurm-spot render --config F` and `config check --config F`, as the README and admins
    write them; the later --config wins over the one before the command name."""
    good = write(tmp_path, GOOD)
    bad = write(tmp_path, _broken(node_sets__0__count=0), name="bad.yaml")
    runner = CliRunner()
    result = runner.invoke(cli, ["config", "check", "--config", str(good)])
    assert result.exit_code == 0 and "6 nodes" in result.output
    result = runner.invoke(cli, ["--config", str(good), "config", "check", "--config", str(bad)])
    assert result.exit_code == 2 and "bad.yaml" in result.output
    result = runner.invoke(cli, ["config", "--config", str(good), "check"])  # on the group
    assert result.exit_code == 0 and "6 nodes" in result.output
    out_dir = tmp_path / "rendered"
    result = runner.invoke(cli, ["render", "--config", str(good), "--output-dir", str(out_dir)])
    assert result.exit_code == 0, result.output
    assert "Nodes=cpu-[1-2],gpu-[1-4]" in (out_dir / "slurm-spot.conf").read_text()



def test_sbatch_leaves_config_after_the_script_to_the_script(tmp_path: Path) -> None:
    """`slurm-spot sbatch train.py --config x.yaml`: that --config is the training script's."""

    config = write(tmp_path, GOOD)
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun", "--dry-run",
                                      "--json", "-N", "1", str(train), "--config", "x.yaml"])
    assert result.exit_code == 0, result.output
    assert f"{train} --config x.yaml" in read_envelope(result.output)["script"]


@pytest.mark.parametrize("argv", [["--config=", "config", "check"], ["config", "check", "--config="]])
def test_an_empty_config_path_is_an_error_not_the_default_file(argv: list[str]) -> None:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2
    assert "'--config': empty path" in result.output
