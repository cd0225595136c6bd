"""``slurm-spot node-name`` and the watcher's default node: a cloud instance finds its Slurm
node by name, by its GCE instance name, or by the NodeAddr the resume hook recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.commands.common import AppContext
from slurm_spot.config import SpotConfig, load_config
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.lifecycle.node_identity import resolve_node_name
from slurm_spot.slurm.client import SlurmClient
from tests.fakes.fake_slurm import FakeSlurm


@pytest.fixture
def config(tmp_path: Path) -> SpotConfig:
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "hpc",
        "node_sets": [{"name": "gpu", "provider": "local", "count": 4}],
        "partitions": [{"name": "spot", "node_sets": ["gpu"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }))
    return load_config(path)


@pytest.fixture
def slurm() -> FakeSlurm:
    fake = FakeSlurm()
    fake.add_node("gpu-1", "ALLOCATED+CLOUD", addr="10.0.1.23", hostname="ip-10-0-1-23")
    fake.add_node("gpu-2", "IDLE+CLOUD", addr="10.0.2.7", hostname="ip-10-0-2-7")
    fake.add_node("gpu-3", "IDLE+CLOUD+POWERING_UP")  # being resumed: no address recorded yet
    fake.add_node("gpu-4")  # powered down
    fake.add_node("login-1", "IDLE", addr="10.0.9.9")  # not a node of the config
    return fake


def resolve(config: SpotConfig, slurm: FakeSlurm, **kw: object) -> str:
    kw.setdefault("env", {})
    kw.setdefault("hostname", "ip-10-0-2-7.ec2.internal")
    return resolve_node_name(config, slurm.client(), **kw)  # type: ignore[arg-type]


def test_ec2_instance_finds_its_node_by_the_recorded_address(config, slurm) -> None:
    assert resolve(config, slurm, addresses={"10.0.2.7", "172.17.0.1"}) == "gpu-2"


def test_gce_instance_name_is_cluster_dash_node(config, slurm) -> None:
    assert resolve(config, slurm, hostname="hpc-gpu-3.c.project.internal", addresses=set()) == "gpu-3"


def test_given_name_and_slurmd_nodename_come_first_and_are_checked(config, slurm) -> None:
    assert resolve(config, slurm, explicit="gpu-4", addresses={"10.0.2.7"}) == "gpu-4"
    assert resolve(config, slurm, env={"SLURMD_NODENAME": "gpu-1"}, addresses=set()) == "gpu-1"
    with pytest.raises(BadInputError, match="'gpu-9' belongs to no node set"):
        resolve(config, slurm, explicit="gpu-9")


def test_hostnames_compare_without_case_and_two_readings_are_ambiguous(tmp_path, slurm) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "hpc",
        "node_sets": [{"name": "gpu", "provider": "local", "count": 2},
                      {"name": "hpc-gpu", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["gpu", "hpc-gpu"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }))
    two = load_config(path)
    assert resolve(two, slurm, hostname="GPU-2.example.org", addresses=set()) == "gpu-2"
    with pytest.raises(BadInputError, match=r"names two nodes \(gpu-1, hpc-gpu-1\)"):
        resolve(two, slurm, hostname="hpc-gpu-1", addresses=set())


def test_addresses_compare_as_addresses(config, slurm) -> None:
    slurm.nodes["gpu-2"].addr = "FD00:0:0:0::2"
    assert resolve(config, slurm, addresses={"fd00::2"}) == "gpu-2"


def test_a_powered_down_node_keeps_a_stale_address_that_never_matches(config, slurm) -> None:
    """EC2 may give a reclaimed instance's address to the next one: the old node, powering
    down or powered down with that NodeAddr still set, is not this host."""
    for state in ({"CLOUD", "POWERING_DOWN"}, {"CLOUD", "POWERED_DOWN"}):
        slurm.nodes["gpu-2"].flags = state
        with pytest.raises(BadInputError, match="is no node"):
            resolve(config, slurm, addresses={"10.0.2.7"})


@pytest.mark.parametrize("wait", [float("nan"), float("inf"), -1.0])
def test_wait_must_be_finite_and_not_negative(config, slurm, wait: float) -> None:
    with pytest.raises(BadInputError, match=r"--wait: .* is not a number of seconds >= 0"):
        resolve(config, slurm, addresses={"10.0.7.7"}, wait_s=wait)


def test_an_empty_node_name_is_an_error(config, slurm) -> None:
    with pytest.raises(BadInputError, match="--node: empty node name"):
        resolve(config, slurm, explicit="")


def test_slurmctld_never_answering_is_a_failure_not_bad_input(config) -> None:
    """scontrol missing or failing: exit 1 with Slurm's error, not 'this host is no node'."""
    broken = SlurmClient("/nonexistent/bin")
    with pytest.raises(SlurmCommandError, match="cannot run /nonexistent/bin/scontrol"):
        resolve_node_name(config, broken, env={}, hostname="ip-10-0-2-7",
                          addresses={"10.0.2.7"})


def test_a_node_outside_the_config_never_matches(config, slurm) -> None:
    with pytest.raises(BadInputError, match=r"addresses 10\.0\.9\.9\)"):
        resolve(config, slurm, addresses={"10.0.9.9"})


def test_two_nodes_with_one_address_is_an_error_not_a_guess(config, slurm) -> None:
    slurm.nodes["gpu-3"].addr = "10.0.2.7"
    with pytest.raises(BadInputError, match="gpu-2, gpu-3; pass --node"):
        resolve(config, slurm, addresses={"10.0.2.7"})


def test_waits_until_the_resume_hook_records_the_address(config, slurm) -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds
        if clock[0] >= 10:  # the resume hook's scontrol update lands after 10 s
            slurm.nodes["gpu-3"].addr = "10.0.4.4"

    name = resolve(config, slurm, addresses={"10.0.4.4"}, wait_s=60, poll_s=5, sleep=sleep,
                   clock=lambda: clock[0])
    assert name == "gpu-3" and slept == [5, 5]


def test_gives_up_after_the_wait_naming_what_it_tried(config, slurm) -> None:
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    with pytest.raises(BadInputError) as err:
        resolve(config, slurm, addresses={"10.0.7.7"}, wait_s=12, poll_s=5, sleep=sleep,
                clock=lambda: clock[0])
    assert "hostname 'ip-10-0-2-7.ec2.internal', addresses 10.0.7.7" in str(err.value)
    assert "after 12 s; pass --node" in str(err.value)
    assert clock[0] == 12


def test_cli_prints_the_name_and_writes_the_env_file(config, slurm, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    monkeypatch.setattr("socket.gethostname", lambda: "hpc-gpu-2")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    env_file = tmp_path / "run" / "slurm-spot" / "node.env"
    result = CliRunner().invoke(cli, ["--config", str(config.source_path), "node-name",
                                      "--env-file", str(env_file)])
    assert result.exit_code == 0, result.output
    assert result.output == "gpu-2\n"
    assert env_file.read_text() == "SLURM_SPOT_NODE=gpu-2\n"


@pytest.mark.parametrize("where", ["", "dir", "under-a-file"])
def test_cli_env_file_that_cannot_be_written_is_exit_2(config, slurm, tmp_path, monkeypatch,
                                                       where: str) -> None:
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    monkeypatch.chdir(tmp_path)
    target = {"": "", "dir": str(tmp_path), "under-a-file": str(config.source_path) + "/x.env"}[where]
    result = CliRunner().invoke(cli, ["--config", str(config.source_path), "node-name", "--node",
                                      "gpu-1", "--env-file", target])
    assert result.exit_code == 2, result.output
    assert "--env-file" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spot.yaml"]  # no temp file left


def test_cli_exit_2_when_this_host_is_no_node(config, slurm, monkeypatch) -> None:
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    monkeypatch.setattr("socket.gethostname", lambda: "build-box")
    monkeypatch.setattr("slurm_spot.lifecycle.node_identity.host_addresses", lambda: {"192.168.5.5"})
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    for command in (["node-name"], ["watch", "--once", "--wait", "0"]):
        result = CliRunner().invoke(cli, ["--config", str(config.source_path), *command])
        assert result.exit_code == 2, result.output
        assert "this host (hostname 'build-box', addresses 192.168.5.5) is no node" in result.output


# ---- slurmd's --instance-id/--instance-type (issue 15; the drop-in: tests/test_ansible.py) ----

def _slurmd(tmp_path: Path, release: str) -> str:
    path = tmp_path / f"slurmd-{release}"
    path.write_text(f"#!/bin/sh\necho 'slurm {release}'\n")
    path.chmod(0o755)
    return str(path)


def _gcp_config(tmp_path: Path) -> SpotConfig:
    path = tmp_path / "gcp.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "demo", "providers": {"gcp": {"type": "gcp", "project": "p",
                                                 "region": "us-central1"}},
        "node_sets": [{"name": "gpu", "provider": "gcp", "count": 2, "gcp": {
            "zones": ["us-central1-a"], "machine_type": "a2-highgpu-1g", "image": "debian-12"}}],
        "partitions": [{"name": "spot", "node_sets": ["gpu"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")}))
    return load_config(path)


def test_gce_instance_gives_slurmd_its_name_and_machine_type(tmp_path, monkeypatch) -> None:
    """slurm-spot's GCE instance id is the instance name (what the resume hook records)."""
    from slurm_spot.lifecycle.node_identity import slurmd_instance_args
    from tests.fakes.gce_metadata import FakeMetadata

    with FakeMetadata() as metadata:
        metadata.set("instance/machine-type", "projects/123456/machineTypes/a2-highgpu-1g")
        monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
        args = slurmd_instance_args(_gcp_config(tmp_path), "gpu-1", _slurmd(tmp_path, "26.05.5"))
    assert args == ["--instance-id", "demo-gpu-1", "--instance-type", "a2-highgpu-1g"]


def test_no_instance_args_when_they_cannot_be_known(tmp_path, monkeypatch, caplog) -> None:
    """slurmd must start anyway: an unreachable metadata server, a slurmd that does not answer
    -V, an old slurmd: no arguments, each reason logged (a local node: the CLI test below)."""
    from slurm_spot.lifecycle.node_identity import slurmd_instance_args

    config = _gcp_config(tmp_path)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # nothing listens on the discard port
    assert slurmd_instance_args(config, "gpu-1", _slurmd(tmp_path, "24.11.5")) == []
    assert "slurmd starts without --instance-id" in caplog.text
    assert slurmd_instance_args(config, "gpu-1", str(tmp_path / "no-slurmd")) == []
    assert slurmd_instance_args(config, "gpu-1", _slurmd(tmp_path, "23.02.7")) == []


def test_cli_slurmd_needs_env_file(config, slurm, monkeypatch) -> None:
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    result = CliRunner().invoke(cli, ["--config", str(config.source_path), "node-name",
                                      "--node", "gpu-1", "--slurmd", "/usr/sbin/slurmd"])
    assert result.exit_code == 2 and "--slurmd needs --env-file" in result.output


def test_cli_local_node_writes_empty_slurmd_args(config, slurm, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(AppContext, "slurm", lambda self: slurm.client())
    env_file = tmp_path / "node.env"
    result = CliRunner().invoke(cli, ["--config", str(config.source_path), "node-name", "--node",
                                      "gpu-1", "--env-file", str(env_file),
                                      "--slurmd", _slurmd(tmp_path, "24.11.5")])
    assert result.exit_code == 0, result.output
    assert env_file.read_text() == "SLURM_SPOT_NODE=gpu-1\nSLURM_SPOT_SLURMD_ARGS=\n"
