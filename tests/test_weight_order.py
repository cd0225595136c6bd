"""Node set names against the cost order (issue 24, part 2): Slurm before 23.02 gives a job
the first powered-down node by name, not by Weight (tests/test_weight_order_e2e.py measures
it on the real slurmctld), so ``slurm-spot config check`` warns when a partition's node set
names sort against their cost order."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import SpotConfig
from slurm_spot.hostlist import natural_compare, slurm_node_order
from slurm_spot.lifecycle.weights import name_order_warnings, static_weights
from slurm_spot.slurm.version import SlurmVersion

OLD = SlurmVersion.parse("22.05.8")
NEW = SlurmVersion.parse("23.02.0")


def spot_yaml(tmp_path: Path, sets: dict[str, float]) -> Path:
    """One partition of local node sets (2 nodes each) priced by spot.yaml, in the order
    given: ``{name: USD per hour}``."""
    data = {
        "cluster": "test",
        "node_sets": [{"name": name, "provider": "local", "count": 2, "instance_types": [name]}
                      for name in sets],
        "partitions": [{"name": "spot", "node_sets": list(sets), "default": True}],
        "cost": {"spot_usd_per_hour": sets},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def config_of(tmp_path: Path, sets: dict[str, float]) -> SpotConfig:
    from slurm_spot.config import load_config

    return load_config(spot_yaml(tmp_path, sets))


def test_slurm_orders_node_names_naturally() -> None:
    # strnatcmp: digit runs as numbers, the rest by character (ASCII).
    assert slurm_node_order(["zeta-1", "alpha-2", "alpha-10", "alpha-1"]) == [
        "alpha-1", "alpha-2", "alpha-10", "zeta-1"]
    assert slurm_node_order(["n10-1", "n2-1"]) == ["n2-1", "n10-1"]
    assert natural_compare("a-1", "a-b-1") == -1  # '1' (0x31) before 'b' (0x62)
    assert natural_compare("Z-1", "a-1") == -1  # case-sensitive, as Slurm
    assert natural_compare("gpu-1", "gpu-1") == 0
    assert natural_compare("gpu-1", "gpu-1x") == -1


def test_names_against_the_cost_order_warn_before_23_02(tmp_path: Path) -> None:
    config = config_of(tmp_path, {"zeta": 0.20, "alpha": 0.50})
    assert static_weights(config) == {"zeta": 1, "alpha": 2}
    (warning,) = name_order_warnings(config, OLD)
    assert warning.startswith("partitions.0.node_sets: partition spot: node sets alpha, zeta ")
    assert "zeta (Weight 1), alpha (Weight 2)" in warning
    assert "Slurm 22.05.8 gives a job the first powered-down node by name (alpha-1)" in warning
    (unknown,) = name_order_warnings(config, None)
    assert "Slurm before 23.02 gives" in unknown


def test_no_warning_from_23_02_or_when_names_sort_in_the_cost_order(tmp_path: Path) -> None:
    against = config_of(tmp_path, {"zeta": 0.20, "alpha": 0.50})
    assert name_order_warnings(against, NEW) == []
    assert name_order_warnings(against, SlurmVersion.parse("24.11.5")) == []
    along = config_of(tmp_path, {"alpha": 0.20, "zeta": 0.50})
    assert name_order_warnings(along, OLD) == []
    # n2 before n10 as Slurm sorts (a plain string sort would put n10-1 first).
    natural = config_of(tmp_path, {"n2": 0.20, "n10": 0.50})
    assert name_order_warnings(natural, OLD) == []


def test_config_check_warns_and_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = spot_yaml(tmp_path, {"zeta": 0.20, "alpha": 0.50})
    monkeypatch.setattr("slurm_spot.commands.configure.slurm_version", lambda: OLD)
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert result.exit_code == 0, result.output
    warning = next(line for line in result.output.splitlines()
                   if line.startswith("slurm-spot: warning:"))
    assert f"{path}: line " in warning and "node sets alpha, zeta" in warning
    assert "OK (4 nodes in 2 node set(s), partitions: spot), 1 warning(s)" in result.output

    monkeypatch.setattr("slurm_spot.commands.configure.slurm_version", lambda: NEW)
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
