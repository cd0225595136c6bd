"""``slurm-spot config check --online`` against the GCE fake (tests/fakes/gce_api.py), through
the real google-cloud-compute client: zones, machine and accelerator types per zone, image,
network and subnetwork, instance template, regional quotas (Spot VMs: the preemptible ones)
and testIamPermissions, each finding with its spot.yaml line; exit 2 on an error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import SLURM_COMMANDS
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.providers.gcp.shapes import catalogue
from tests.fakes.gce_api import FakeCompute


@pytest.fixture
def gce() -> Iterator[FakeCompute]:
    with FakeCompute() as fake:
        fake.subnetworks.add(("us-central1", "cluster-subnet"))
        yield fake


def write(tmp_path: Path, fake: FakeCompute, *, zones: tuple[str, ...] = ("us-central1-a",
          "us-central1-b"), machine: str = "n1-standard-8", image: str = "slurm-node",
          subnetwork: str = "cluster-subnet", gpu: str = "t4", count: int = 4) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for command in SLURM_COMMANDS:
        (bin_dir / command).write_text("#!/bin/sh\n")
        (bin_dir / command).chmod(0o755)
    zone_lines = "".join(f"        - {z}\n" for z in zones)
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: demo\n"                                                   # 1
        f"state_dir: {tmp_path}/state\nlog_dir: {tmp_path}/log\n"           # 2, 3
        f"slurm_bin_dir: {bin_dir}\n"                                       # 4
        "providers:\n"                                                      # 5
        f"  gcp: {{type: gcp, project: {fake.project}, region: us-central1, "
        f"api_endpoint: '{fake.endpoint}'}}\n"                              # 6
        "node_sets:\n"                                                      # 7
        "  - name: gpu\n"                                                   # 8
        "    provider: gcp\n"                                               # 9
        f"    count: {count}\n"                                             # 10
        f"    gpus: {{type: {gpu}, count: 1}}\n"                            # 11
        "    gcp:\n"                                                        # 12
        f"      machine_type: {machine}\n"                                  # 13
        f"      image: {image}\n"                                           # 14
        f"      subnetwork: {subnetwork}\n"                                 # 15
        "      zones:\n"                                                    # 16
        + zone_lines                                                        # 17, 18
        # a machine type outside the shipped catalogue needs its shape written (after the
        # lines the tests name)
        + ("" if machine in catalogue() else "    cpus: 8\n    memory_mib: 30000\n")
        + "partitions: [{name: gpu, node_sets: [gpu]}]\n")
    return path


def check(path: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["--config", str(path), "config", "check", "--online", *extra])


def test_a_correct_setup_passes(gce, tmp_path) -> None:
    result = check(write(tmp_path, gce), "--json")
    assert result.exit_code == 0, result.output
    data = read_envelope(result.stdout, "config check")
    assert data["ok"] is True and data["warnings"] == []
    asked = {r["method"] for r in gce.requests}
    assert {"regions.get", "zones.get", "machineTypes.get", "acceleratorTypes.get",
            "images.get", "networks.get", "subnetworks.get",
            "projects.testIamPermissions"} <= asked
    assert not asked & {"bulkInsert", "insert", "delete"}  # read-only


def test_a_public_image_family_is_found_in_its_project(gce, tmp_path) -> None:
    result = check(write(tmp_path, gce, image="projects/debian-cloud/global/images/family/debian-12"))
    assert result.exit_code == 0, result.output
    result = check(write(tmp_path, gce, image="projects/debian-cloud/global/images/family/nope"))
    assert result.exit_code == 2
    assert ("line 14: node_sets.0.gcp.image: image 'projects/debian-cloud/global/images/family/"
            "nope' does not exist (project debian-cloud)") in result.stderr


def test_missing_zone_machine_type_image_and_subnetwork_are_named_with_their_lines(
        gce, tmp_path) -> None:
    result = check(write(tmp_path, gce, zones=("us-central1-a", "us-central1-q"),
                         machine="n9-nothing-8", image="no-image", subnetwork="no-subnet"))
    assert result.exit_code == 2
    err = result.stderr
    assert "line 18: node_sets.0.gcp.zones.1: zone 'us-central1-q' does not exist" in err
    assert ("line 13: node_sets.0.gcp.machine_type: machine type 'n9-nothing-8' is not offered "
            "in any of the node set's zones (us-central1-a)") in err
    assert "line 14: node_sets.0.gcp.image: image 'no-image' does not exist" in err
    assert ("line 15: node_sets.0.gcp.subnetwork: subnetwork 'no-subnet' does not exist in "
            "region us-central1") in err


def test_a_type_missing_from_one_zone_is_a_warning_from_all_an_error(gce, tmp_path) -> None:
    gce.unoffer("nvidia-tesla-t4", "us-central1-b")
    result = check(write(tmp_path, gce))
    assert result.exit_code == 0, result.output
    assert ("line 11: node_sets.0.gpus.type: accelerator type 'nvidia-tesla-t4' (for "
            "n1-standard-8) is not offered in us-central1-b: those zones are skipped") \
        in result.stderr
    gce.unoffer("nvidia-tesla-t4", "us-central1-a")
    result = check(write(tmp_path, gce))
    assert result.exit_code == 2
    assert ("line 11: node_sets.0.gpus.type: accelerator type 'nvidia-tesla-t4' (for "
            "n1-standard-8) is not offered in any of the node set's zones") in result.stderr


def test_preemptible_gpu_quota_below_one_node_fails_below_all_warns(gce, tmp_path) -> None:
    quotas = {q["metric"]: q for q in gce.quotas["us-central1"]}
    quotas["PREEMPTIBLE_NVIDIA_T4_GPUS"]["limit"] = 0.5
    result = check(write(tmp_path, gce))
    assert result.exit_code == 2
    assert ("line 11: node_sets.0.gpus: the spot quota PREEMPTIBLE_NVIDIA_T4_GPUS of region "
            "us-central1 is 0.5, below one node (1)") in result.stderr
    quotas["PREEMPTIBLE_NVIDIA_T4_GPUS"].update(limit=4.0, usage=2.0)
    result = check(write(tmp_path, gce))
    assert result.exit_code == 0, result.output
    assert ("line 10: node_sets.0.count: the spot quota PREEMPTIBLE_NVIDIA_T4_GPUS of region "
            "us-central1 has 2 free (4 - 2 used): 2 of the 4 nodes fit at once") in result.stderr


def test_missing_permissions_fail_an_untestable_set_warns(gce, tmp_path) -> None:
    from slurm_spot.providers.gcp.iam import permissions

    gce.granted = set(permissions()) - {"compute.instances.delete"}
    result = check(write(tmp_path, gce))
    assert result.exit_code == 2
    assert ("line 6: providers.gcp: the credentials lack compute.instances.delete on project "
            "test-project") in result.stderr
    gce.granted = None
    gce.fail_http("projects.testIamPermissions", 403, "forbidden")
    result = check(write(tmp_path, gce))
    assert result.exit_code == 0, result.output
    assert "line 6: providers.gcp: cannot test the credentials' permissions" in result.stderr


def test_an_unreachable_api_stops_at_once(gce, tmp_path) -> None:
    path = write(tmp_path, gce)
    path.write_text(path.read_text().replace(gce.endpoint, "http://127.0.0.1:9"))
    result = check(path)
    assert result.exit_code == 2
    assert "line 6: providers.gcp: cannot read region us-central1 of project test-project" \
        in result.stderr


def test_no_credentials_is_a_finding_with_exit_2_not_a_traceback(gce, tmp_path,
                                                                 monkeypatch) -> None:
    """A new admin without Application Default Credentials: google.auth's
    DefaultCredentialsError went up as a traceback (exit 1); it is the provider's finding."""
    path = write(tmp_path, gce)
    path.write_text(path.read_text().replace(f", api_endpoint: '{gce.endpoint}'", ""))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server either
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    result = check(path)
    assert result.exit_code == 2, result.output
    assert "line 6: providers.gcp: cannot read region us-central1" in result.output
    assert "nothing else was checked" in result.output and "Traceback" not in result.output
