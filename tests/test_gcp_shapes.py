"""A Compute Engine node set written with only its machine type renders the machine's real
CPUs, memory and GPUs (issue 43): the shipped catalogue, the shared shape rule
(slurm_spot/providers/shapes.py), and what `render` and `config check` make of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.errors import ConfigError
from slurm_spot.providers.gcp.shapes import catalogue, gce_machine_shape
from slurm_spot.render import node_lines, render


def config(**node_set: Any) -> SpotConfig:
    gcp = {"zones": ["us-central1-a"], "image": "projects/p/global/images/i"}
    gcp.update(node_set.pop("gcp", {}))
    spec = {"name": "gpu", "provider": "gce", "count": 2, "gcp": gcp, **node_set}
    return parse_config({
        "cluster": "c1", "providers": {"gce": {"type": "gcp", "project": "p", "region": "us-central1"}},
        "node_sets": [spec], "partitions": [{"name": "p", "node_sets": ["gpu"]}]})


@pytest.mark.parametrize(("machine", "line"), [
    ("a2-highgpu-1g", f"CPUs=12 RealMemory={int(85 * 1024 * 0.95)} Gres=gpu:a100:1"),
    ("a2-ultragpu-8g", f"CPUs=96 RealMemory={int(1360 * 1024 * 0.95)} Gres=gpu:a100_80gb:8"),
    ("a3-highgpu-8g", f"CPUs=208 RealMemory={int(1872 * 1024 * 0.95)} Gres=gpu:h100:8"),
    ("g2-standard-24", f"CPUs=24 RealMemory={int(96 * 1024 * 0.95)} Gres=gpu:l4:2"),
])
def test_a_gpu_machine_type_alone_renders_its_cpus_memory_and_gpus(machine: str, line: str) -> None:
    [rendered] = node_lines(config(gcp={"machine_type": machine}))
    assert line in rendered


def test_an_n1_node_set_takes_cpus_and_memory_from_the_type_and_gpus_as_attached() -> None:
    [rendered] = node_lines(config(gcp={"machine_type": "n1-standard-8"},
                                   gpus={"type": "t4", "count": 1}))
    assert f"CPUs=8 RealMemory={int(30 * 1024 * 0.95)} Gres=gpu:t4:1" in rendered
    [plain] = node_lines(config(gcp={"machine_type": "n1-highmem-4"}))
    assert f"CPUs=4 RealMemory={int(26 * 1024 * 0.95)}" in plain and "Gres=" not in plain


def test_a_written_shape_beyond_the_machine_type_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as err:
        node_lines(config(gcp={"machine_type": "a2-highgpu-1g"}, gpus={"type": "a100", "count": 4}))
    assert err.value.problems == [
        "node_sets.0.gpus: 4 GPUs are more than a2-highgpu-1g (12 CPUs, 87040 MiB, 1 a100) has"]


def test_machine_types_of_different_shapes_are_refused() -> None:
    with pytest.raises(ConfigError) as err:
        node_lines(config(gcp={"machine_type": "a2-highgpu-1g"}, instance_types=["a2-highgpu-2g"]))
    assert [p.split(":")[0] for p in err.value.problems] == [
        "node_sets.0.cpus", "node_sets.0.memory_mib", "node_sets.0.gpus"]


def test_a_machine_type_outside_the_catalogue_needs_a_written_shape() -> None:
    with pytest.raises(ConfigError) as err:
        node_lines(config(gcp={"machine_type": "c3-standard-8"}))
    assert "Compute Engine machine type 'c3-standard-8' is not in the shipped catalogue" in \
        err.value.problems[0]
    [rendered] = node_lines(config(gcp={"machine_type": "c3-standard-8"}, cpus=8, memory_mib=30000))
    assert "CPUs=8 RealMemory=30000" in rendered


def test_an_instance_template_alone_renders_the_node_set_as_written() -> None:
    [rendered] = node_lines(config(gcp={"instance_template": "t", "image": None}, cpus=4))
    assert "CPUs=4" in rendered


def test_the_catalogue_agrees_with_what_the_names_say() -> None:
    """The GPU count (a2/a3 in the name, g2 by size) and the vCPUs of N1 names that the pool
    order reads from the name are the catalogue's too."""
    for name, shape in catalogue().items():
        gpus, vcpus = gce_machine_shape(name)
        if gpus is not None:
            assert gpus == shape.gpu_count, name
        if vcpus is not None:
            assert vcpus == shape.vcpus, name


def test_config_check_refuses_a_node_set_whose_written_gpus_exceed_the_machine(tmp_path: Path) -> None:
    spot = tmp_path / "spot.yaml"
    spot.write_text(yaml.safe_dump({
        "cluster": "c1", "providers": {"gce": {"type": "gcp", "project": "p", "region": "us-central1"}},
        "node_sets": [{"name": "gpu", "provider": "gce", "count": 2, "gpus": {"type": "l4", "count": 8},
                       "gcp": {"zones": ["us-central1-a"], "machine_type": "g2-standard-4",
                               "image": "projects/p/global/images/i"}}],
        "partitions": [{"name": "p", "node_sets": ["gpu"]}]}))
    result = CliRunner().invoke(cli, ["--config", str(spot), "render", "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "node_sets.0.gpus: 8 GPUs are more than g2-standard-4" in result.output
    assert render(config(gcp={"machine_type": "g2-standard-4"})) is not None
