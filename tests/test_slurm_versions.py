"""What changes with the Slurm release: version parsing and features, rendering, the client's
version-dependent calls (on the fake Slurm answering as 22.05.8, 24.11.5 and 26.05.5), the
reconciler's instance matching, and the local cluster's per-version state directory.
The real releases are exercised by tests/test_slurm_matrix.py."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import load_config
from slurm_spot.errors import BadInputError
from slurm_spot.localcluster.cluster import state_save_dir
from slurm_spot.providers import pick_kept
from slurm_spot.render import render
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.states import parse_node_state
from slurm_spot.slurm.version import SlurmVersion
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(("text", "expected"), [
    ("slurm-wlm 22.05.8", "22.05.8"), ("slurm 24.11.5\n", "24.11.5"), ("26.05", "26.05"),
    ("slurm 25.11.0-0rc1", "25.11.0"), ("  23.02.7-1 ", "23.02.7"),
])
def test_parse_versions_as_the_tools_print_them(text: str, expected: str) -> None:
    assert str(SlurmVersion.parse(text)) == expected


@pytest.mark.parametrize("text", ["", "slurm", "2.6", "24", "version 1.2.3"])
def test_not_a_version_is_bad_input_naming_it(text: str) -> None:
    with pytest.raises(BadInputError, match="not a Slurm version"):
        SlurmVersion.parse(text)


def test_features_follow_the_release_notes() -> None:
    table = {v: SlurmVersion.parse(v).features() for v in ("22.05", "23.11", "24.05", "24.11",
                                                            "25.11", "26.05")}
    assert [v for v, f in table.items() if f["addr_cache_options"]] == ["22.05"]
    assert [v for v, f in table.items() if f["instance_fields"]] == [
        "23.11", "24.05", "24.11", "25.11", "26.05"]
    assert [v for v, f in table.items() if f["power_down_force_command"]] == [
        "24.05", "24.11", "25.11", "26.05"]
    assert [v for v, f in table.items() if f["expedited_requeue"]] == ["25.11", "26.05"]
    assert SlurmVersion.parse("22.05.8").data_parser == "v0.0.38"
    assert SlurmVersion.parse("24.11.5").data_parser == "v0.0.42"
    assert SlurmVersion.parse("26.05.5").data_parser == "v0.0.45"
    assert SlurmVersion.parse("22.05.8") < SlurmVersion.parse("24.11") < SlurmVersion.parse("26.05.5")


def _config(tmp_path: Path):  # type: ignore[no-untyped-def]
    source = tmp_path / "spot.yaml"
    shutil.copy(DATA / "render-gpu.yaml", source)
    return load_config(source)


@pytest.mark.parametrize(("version", "defunct"), [("22.05", True), ("23.02", True),
                                                   ("23.11", False), ("24.11", False),
                                                   ("26.05", False)])
def test_fragment_has_the_address_options_only_where_slurm_knows_them(
        tmp_path: Path, version: str, defunct: bool) -> None:
    text = render(_config(tmp_path), version=version).files["slurm-spot.conf"]
    assert f"# For Slurm {version}" in text
    assert ("CommunicationParameters=NoAddrCache" in text) is defunct
    assert ("cloud_reg_addrs" in text) is defunct
    assert "SlurmctldParameters=idle_on_node_suspend" in text


def test_unknown_version_renders_for_the_oldest_and_says_so(tmp_path: Path) -> None:
    text = render(_config(tmp_path), version=None).files["slurm-spot.conf"]
    assert "Slurm version unknown here: rendered for Slurm 22.05" in text
    assert "--slurm-version" in text and "NoAddrCache" in text


def test_render_cli_for_another_controller(tmp_path: Path) -> None:
    source = tmp_path / "spot.yaml"
    shutil.copy(DATA / "render-gpu.yaml", source)
    ok = CliRunner().invoke(cli, ["--config", str(source), "render", "--slurm-version", "24.11.5"])
    assert ok.exit_code == 0, ok.output
    assert "# For Slurm 24.11.5" in ok.output and "NoAddrCache" not in ok.output
    bad = CliRunner().invoke(cli, ["--config", str(source), "render", "--slurm-version", "new"])
    assert bad.exit_code == 2 and "--slurm-version" in bad.output and "'new'" in bad.output


def _fake(version: str) -> FakeSlurm:
    slurm = FakeSlurm(version)
    for i in (1, 2):
        slurm.add_node(f"spot-{i}", "MIXED+CLOUD")
    slurm.add_job(7, ["spot-1", "spot-2"])
    return slurm


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5", "26.05.5"])
def test_power_down_force_requeues_and_keeps_the_reason_on_every_release(version: str) -> None:
    slurm = _fake(version)
    client = slurm.client()
    client.power_down_force(["spot-1"], "spot-interruption:terminate@2026-03-01T11:00:00Z")
    node = client.nodes(["spot-1"])[0]
    assert node.state.is_powering_down and node.reason.startswith("spot-interruption:")
    assert slurm.jobs[7].state == "PENDING" and slurm.jobs[7].restarts == 1
    assert str(client.version) == version


@pytest.mark.parametrize(("version", "recorded"), [("22.05.8", False), ("23.11.10", True),
                                                   ("26.05.5", True)])
def test_instance_id_and_type_are_recorded_where_slurm_has_them(version: str,
                                                                recorded: bool) -> None:
    slurm = _fake(version)
    client = slurm.client()
    assert client.set_instances({"spot-1": ("i-0abc", "g5.xlarge"),
                                 "spot-2": ("i-0def", "g5.2xlarge")}) is recorded
    nodes = {n.name: n for n in client.nodes()}
    if recorded:
        assert (nodes["spot-1"].instance_id, nodes["spot-1"].instance_type) == ("i-0abc", "g5.xlarge")
        assert nodes["spot-2"].instance_id == "i-0def"
    else:
        assert nodes["spot-1"].instance_id == "" and nodes["spot-1"].instance_type == ""


def test_requeued_job_is_expedited_with_start_time_where_no_expedite_is_set() -> None:
    slurm = _fake("26.05.5")
    client = slurm.client()
    client.power_down_force(["spot-1"], "slurm-spot:x")
    assert client.expedite(7) == "start_time"  # Reason=BeginTime: submitted without expedite
    assert slurm.jobs[7].reason == "None" and slurm.expedited == [7]
    assert client.expedite(7) == "expedited"  # eligible already: nothing more to do
    assert slurm.expedited == [7]


def test_reconciler_keeps_the_instance_slurm_names_over_an_address_match() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)
    cloud = FakeProvider()
    recycled = cloud.add("spot-1", 300, now, instance_id="i-old", ip="10.0.0.5")
    real = cloud.add("spot-1", 200, now, instance_id="i-new", ip="10.0.0.9")
    state = parse_node_state("ALLOCATED+CLOUD")
    by_addr = Node("spot-1", state, addr="10.0.0.5")
    assert pick_kept(by_addr, [recycled, real]) is recycled  # 22.05: the address decides
    by_id = Node("spot-1", state, addr="10.0.0.5", instance_id="i-new")
    assert pick_kept(by_id, [recycled, real]) is real  # 23.11+: the id Slurm holds decides


def test_local_cluster_state_is_kept_per_slurm_series(tmp_path: Path) -> None:
    config = _config(tmp_path)
    old = state_save_dir(config, SlurmVersion.parse("22.05.8"))
    new = state_save_dir(config, SlurmVersion.parse("24.11.5"))
    assert old != new and old.name == "slurmctld-22.05" and new.name == "slurmctld-24.11"
    assert state_save_dir(config, SlurmVersion.parse("24.11.2")) == new


@pytest.mark.parametrize(("version", "flag"), [("24.11.5", "--requeue"),
                                               ("25.11.0", "--requeue=expedite")])
def test_sbatch_asks_for_expedited_requeue_where_slurm_has_it(version: str, flag: str) -> None:
    from slurm_spot.jobs.submit.sbatch import plan_submission

    slurm = SlurmVersion.parse(version)
    plan = plan_submission("#!/bin/bash\nsrun train\n", "train.sh", [], [], "USR2", 90,
                           expedite=slurm.expedited_requeue)
    assert f"#SBATCH {flag}\n" in plan.script
