"""``slurm-spot config iam``: the policies cover every call slurm-spot makes.

The AWS check runs the AWS and S3 test files with tests/fakes/record_aws_calls.py, which
records each botocore call made from slurm-spot's own code, and requires every recorded
call to be in slurm_spot/providers/aws/iam.py with its actions granted by the policy
``config iam --json`` prints. The GCP check does the same with the methods the GCE fake is
called with while the provider launches, lists, deletes and checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.providers.aws import iam as aws_iam
from slurm_spot.providers.gcp import iam as gcp_iam

ROOT = Path(__file__).resolve().parent.parent
# The test files whose AWS calls are recorded (in-process moto: subprocess calls of the
# e2e files are not seen).
AWS_TEST_FILES = ["tests/test_aws_provider.py", "tests/test_aws_fleet.py",
                  "tests/test_aws_catalog.py", "tests/test_aws_errors.py",
                  "tests/test_checkpoint_s3.py", "tests/test_checkpoint_s3_faults.py",
                  "tests/test_cost_prices.py", "tests/test_config_online_aws.py",
                  "tests/test_provider_events.py", "tests/test_aws_credentials_file.py",
                  "tests/test_cost_regions.py"]


def iam_json(tmp_path: Path, root: str = "s3://ckpt-bucket/runs", *args: str) -> Any:
    path = tmp_path / "spot.yaml"
    path.write_text(
        "cluster: c1\n"
        "providers:\n  aws: {type: aws, region: us-east-1}\n"
        "  g: {type: gcp, project: p1, region: us-central1}\n"
        f"checkpoint: {{root: '{root}'}}\n"
        "node_sets: [{name: gpu, provider: aws, count: 2, instance_types: [g5.xlarge],\n"
        "             aws: {launch_template: t, subnets: [subnet-1]}}]\n"
        "partitions: [{name: gpu, node_sets: [gpu]}]\n")
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "iam", "--json", *args])
    assert result.exit_code == 0, result.output
    return read_envelope(result.stdout, "config iam")


def granted(printed: dict[str, Any]) -> list[str]:
    return [a for entry in printed.values() if entry.get("policy")
            for a in aws_iam.policy_actions(entry["policy"])]


def test_json_has_the_controller_and_store_policies_and_the_gcp_role(tmp_path) -> None:
    data = iam_json(tmp_path)
    assert set(data) == {"aws", "g"}
    controller = data["aws"]["controller"]["policy"]
    assert controller["Version"] == "2012-10-17"
    assert "ec2:CreateFleet" in aws_iam.policy_actions(controller)
    store = data["aws"]["checkpoint_store"]["policy"]["Statement"]
    assert store[0]["Resource"] == ["arn:aws:s3:::ckpt-bucket"]
    assert store[0]["Condition"] == {"StringLike": {"s3:prefix": ["runs/*"]}}
    assert store[1]["Resource"] == ["arn:aws:s3:::ckpt-bucket/runs/*"]
    assert data["aws"]["nodes"]["policy"] is None
    assert "compute.instances.create" in data["g"]["controller"]["permissions"]
    assert data["g"]["controller"]["custom_role"]["includedPermissions"] == \
        data["g"]["controller"]["permissions"]
    only = iam_json(tmp_path, "s3://ckpt-bucket/runs", "--provider", "g")
    assert set(only) == {"g"}


def test_unknown_provider_is_exit_2_naming_the_known_ones(tmp_path) -> None:
    iam_json(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(tmp_path / "spot.yaml"), "config", "iam",
                                      "--provider", "nope"])
    assert result.exit_code == 2
    assert "--provider nope: not a provider of" in result.stderr
    assert "(it has: aws, g)" in result.stderr


def test_every_aws_table_entry_is_in_the_printed_policies(tmp_path) -> None:
    printed = granted(iam_json(tmp_path)["aws"])
    for entry in aws_iam.CALLS:
        assert aws_iam.covers(printed, entry.actions) == [], entry


@pytest.mark.e2e
def test_every_aws_call_the_tests_record_is_covered_by_config_iam(tmp_path) -> None:
    out = tmp_path / "calls.json"
    env = {**os.environ, "SLURM_SPOT_RECORD_AWS_CALLS": str(out),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "tests.fakes.record_aws_calls", "-m", "not e2e", *AWS_TEST_FILES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recorded = {tuple(c) for c in json.loads(out.read_text())}
    # the recording saw the launch path and the checkpoint store, not nothing
    assert {("ec2", "CreateFleet"), ("ec2", "TerminateInstances"), ("s3", "PutObject"),
            ("s3", "ListObjectsV2")} <= recorded
    printed = granted(iam_json(tmp_path)["aws"])
    for service, operation in sorted(recorded):
        entry = aws_iam.call(service, operation)
        assert entry is not None, f"{service}:{operation} is not in providers/aws/iam.py"
        assert aws_iam.covers(printed, entry.actions) == [], (service, operation)


def test_every_gce_method_the_provider_calls_is_covered(tmp_path) -> None:
    from slurm_spot.providers import check_online, get_provider
    from slurm_spot.providers.base import LaunchRequest
    from tests.fakes.gce_api import FakeCompute, gcp_config

    # fake route name -> the API method (instances.* and regionInstances.* share routes)
    def api_method(request: dict[str, Any]) -> str:
        name = request["method"]
        if name == "bulkInsert":
            return ("regionInstances" if "/regions/" in request["path"] else "instances") \
                + ".bulkInsert"
        if name in ("wait", "getOperation"):
            scope = "regionOperations" if "/regions/" in request["path"] else "zoneOperations"
            return f"{scope}.{'wait' if name == 'wait' else 'get'}"
        if name in ("aggregatedList", "delete", "get", "list", "insert"):
            return f"instances.{name}"
        if name == "listOperations":
            return "zoneOperations.list"
        return name

    with FakeCompute() as fake:
        zonal = {"name": "gpu", "count": 2, "gcp": {"zones": ["us-central1-a"],
                 "machine_type": "n1-standard-8", "image": "slurm-node"}}
        regional = {"name": "cpu", "count": 2, "gcp": {"zones": ["us-central1-a", "us-central1-b"],
                    "machine_type": "n1-standard-8", "image": "slurm-node"}}
        config = gcp_config(fake, [zonal, regional])
        provider = get_provider(config, "gcp")
        for ns in config.node_sets:
            provider.launch(LaunchRequest("demo", ns, tuple(ns.node_names), "t"))
        provider.list_instances()
        provider.terminate(config.all_nodes())
        check_online(config)
        from slurm_spot.providers.events import event_sources

        for source in event_sources(config):  # the reconciler's preemption operations
            source.receive(0)
        methods = {api_method(r) for r in fake.requests}
    assert {"instances.bulkInsert", "instances.aggregatedList", "instances.delete",
            "zones.get", "projects.testIamPermissions", "zoneOperations.list"} <= methods
    printed = set(iam_json(tmp_path)["g"]["controller"]["permissions"])
    for method in sorted(methods):
        entry = gcp_iam.call(method)
        assert entry is not None, f"{method} is not in providers/gcp/iam.py"
        assert set(entry.permissions) <= printed, method


def test_a_local_provider_needs_no_permissions(tmp_path) -> None:
    """``--provider`` naming the local provider printed GCP's role for it (every type that
    was not aws was taken for gcp); the provider's own package now says it needs none."""
    path = tmp_path / "spot.yaml"
    path.write_text("cluster: c1\nproviders:\n  here: {type: local}\n"
                    "  aws: {type: aws, region: us-east-1}\n"
                    "node_sets: [{name: n, provider: here, count: 1}]\n"
                    "partitions: [{name: p, node_sets: [n]}]\n")
    run = CliRunner().invoke
    result = run(cli, ["--config", str(path), "config", "iam", "--json", "--provider", "here"])
    assert result.exit_code == 0, result.output
    assert read_envelope(result.stdout, "config iam") == {}
    result = run(cli, ["--config", str(path), "config", "iam", "--provider", "here"])
    assert result.exit_code == 0 and "no provider that needs cloud permissions" in result.stdout
    result = run(cli, ["--config", str(path), "config", "iam", "--json"])
    assert set(read_envelope(result.stdout, "config iam")) == {"aws"}
