"""``slurm-spot instances --json`` gives the same fields, with the same meaning, for an EC2
instance (moto in server mode) and a Compute Engine VM (the fake Compute API), listed by one
command from one config with both providers. No Slurm is needed."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from slurm_spot.config import load_config
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.providers import get_provider
from slurm_spot.providers.base import LaunchRequest
from tests.cloud_e2e import INSTANCE_FIELDS, no_aws_env
from tests.fakes.ec2 import REGION, TEMPLATE
from tests.fakes.ec2_proxy import MotoEc2
from tests.fakes.gce_api import FakeCompute

pytestmark = pytest.mark.e2e

SHAPE = {"cpus": 1, "memory_mib": 1000, "gpus": None}


def test_instances_json_has_the_same_fields_for_aws_and_gcp(tmp_path: Path) -> None:
    with MotoEc2() as moto, FakeCompute() as fake:
        data = {
            "cluster": "test",
            "providers": {
                "aws": {"type": "aws", "region": REGION, "endpoint_url": moto.proxy.url,
                        "credentials_file": moto.write_credentials(tmp_path / "credentials")},
                "gcp": {"type": "gcp", "project": fake.project, "region": "us-central1",
                        "api_endpoint": fake.endpoint},
            },
            "node_sets": [
                {"name": "ec2", "provider": "aws", "count": 2, "instance_types": ["g5.xlarge"],
                 **SHAPE, "aws": {"launch_template": TEMPLATE, "subnets": moto.world.subnets}},
                {"name": "gce", "provider": "gcp", "count": 2, **SHAPE,
                 "gcp": {"zones": ["us-central1-a"], "machine_type": "n1-standard-4",
                         "image": "projects/debian-cloud/global/images/family/debian-12"}},
            ],
            "partitions": [{"name": "cloud", "node_sets": ["ec2", "gce"]}],
            "state_dir": str(tmp_path / "state"),
            "log_dir": str(tmp_path / "log"),
        }
        path = tmp_path / "spot.yaml"
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        for ns in config.node_sets:
            result = get_provider(config, ns.provider).launch(
                LaunchRequest("test", ns, (f"{ns.name}-1",), "fields"))
            assert len(result.launched) == 1 and result.failed == ()
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_spot", "--config", str(path), "instances", "--json"],
            env=no_aws_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    entries = {e["provider"]: e for e in read_envelope(proc.stdout)}
    assert sorted(entries) == ["aws", "gcp"]
    assert set(entries["aws"]) == set(entries["gcp"]) == INSTANCE_FIELDS
    for provider, entry in entries.items():
        node_set = "ec2" if provider == "aws" else "gce"
        assert (entry["node"], entry["node_set"]) == (f"{node_set}-1", node_set)
        assert (entry["state"], entry["market"], entry["state_reason"]) == ("running", "spot", "")
        assert entry["instance_id"] and entry["instance_type"] and entry["zone"]
        assert datetime.fromisoformat(entry["launch_time"]).utcoffset() is not None
        assert ipaddress.ip_address(entry["private_ip"]).is_private
    assert entries["aws"]["instance_id"].startswith("i-")
    assert (entries["aws"]["instance_type"], entries["aws"]["zone"][:-1]) == ("g5.xlarge", REGION)
    assert entries["gcp"]["instance_id"] == "test-gce-1"
    assert (entries["gcp"]["instance_type"], entries["gcp"]["zone"]) == (
        "n1-standard-4", "us-central1-a")
