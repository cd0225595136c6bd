"""`slurm-spot render`: golden files, and a real slurmctld accepts what it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import load_config
from slurm_spot.errors import BadInputError
from slurm_spot.render import render
from tests.cluster import Cluster

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden"


def rendered(tmp_path: Path) -> dict[str, str]:
    source = tmp_path / "spot.yaml"
    shutil.copy(DATA / "render-gpu.yaml", source)
    files = render(load_config(source), hooks_dir=Path("/opt/slurm-spot/bin"), version=(22, 5))
    return {name: text.replace(str(source), "<config>") for name, text in files.files.items()}


@pytest.mark.parametrize("name", ["slurm-spot.conf", "gres.conf"])
def test_matches_golden_file(tmp_path: Path, name: str) -> None:
    # To update after an intended change: write rendered(...)[name] to tests/data/golden/.
    assert rendered(tmp_path)[name] == (GOLDEN / name).read_text()


def test_node_shape_comes_from_the_instance_type(tmp_path: Path) -> None:
    text = rendered(tmp_path)["slurm-spot.conf"]
    assert ("NodeName=g5-[1-8] CPUs=48 RealMemory=186777 Gres=gpu:a10g:4 Feature=g5,spot "
            "Weight=1 State=CLOUD") in text
    assert "ResumeProgram=/opt/slurm-spot/bin/slurm-spot-resume" in text
    assert "Prolog=/opt/slurm-spot/bin/slurm-spot-prolog" in text
    assert "RequeueExit=85" in text


def test_partition_timers_need_slurm_23_02(tmp_path: Path) -> None:
    data = yaml.safe_load((DATA / "render-gpu.yaml").read_text())
    data["partitions"][1]["suspend_time_s"] = 60
    source = tmp_path / "spot.yaml"
    source.write_text(yaml.safe_dump(data))
    config = load_config(source)
    with pytest.raises(BadInputError, match=r"needs Slurm 23\.02"):
        render(config, version=(22, 5))
    text = render(config, version=(23, 11)).files["slurm-spot.conf"]
    assert "PartitionName=dev Nodes=dev-[1-2] MaxTime=INFINITE State=UP SuspendTime=60" in text


def test_cli_writes_files(tmp_path: Path) -> None:
    source = tmp_path / "spot.yaml"
    shutil.copy(DATA / "render-gpu.yaml", source)
    result = CliRunner().invoke(cli, ["--config", str(source), "render", "--output-dir",
                                      str(tmp_path / "out"), "--slurm-version", "22.05"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "gres.conf").read_text().count("Name=gpu") == 3
    bad = CliRunner().invoke(cli, ["--config", str(source), "render", "--slurm-version", "x"])
    assert bad.exit_code == 2 and "--slurm-version" in bad.output


@pytest.mark.e2e
def test_real_slurmctld_accepts_the_rendered_gpu_config(tmp_path: Path) -> None:
    data = yaml.safe_load((DATA / "render-gpu.yaml").read_text())
    data.update(state_dir=str(tmp_path / "state"), log_dir=str(tmp_path / "log"))
    cluster = Cluster(tmp_path, data)
    cluster.start()
    try:
        nodes = cluster.slurm("sinfo", "-h", "-N", "-o", "%N %t %G %f %P").split("\n")
        by_name = {line.split()[0]: line.split()[1:] for line in nodes if line.strip()}
        assert len(by_name) == 12
        assert by_name["g5-3"][:2] == ["idle~", "gpu:a10g:4"]
        assert by_name["p4-1"][1:3] == ["gpu:a100:8", "p4,on-demand,nvlink"]
        assert by_name["dev-2"][0] == "idle~"
        node = cluster.node("p4-2")
        assert node["CPUTot"] == "96" and node["RealMemory"] == "1120665"
    finally:
        cluster.stop()
