"""End to end on a real local slurmctld whose node sets are EC2 spot instances in moto.

moto runs in server mode in this process, behind :class:`tests.fakes.ec2_proxy.Ec2Proxy`
(counts CreateFleet calls, injects EC2's capacity errors); the config's
``providers.aws.endpoint_url`` points at the proxy and ``credentials_file`` at dummy keys, so
the hooks slurmctld runs with an empty environment reach it too. A
:class:`tests.fakes.boot_simulator.BootSimulator` boots a local slurmd for a moto instance so a
real job runs on an "AWS" node, and :class:`tests.fakes.imds.FakeImds` drives the watcher.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from slurm_spot.config import load_config
from slurm_spot.providers.aws.fleet import TAG_LAUNCH, decode_node
from slurm_spot.providers.aws.provider import AwsProvider
from slurm_spot.providers.base import TAG_CLUSTER, TAG_MARKET, TAG_NODE_SET
from tests.cloud_e2e import (
    INSTANCE_FIELDS,
    cancel_all,
    cloud_config,
    forget_addresses,
    log_tail,
    run_job,
    running_cluster,
    spot,
    spot_json,
    wait_failed_node_powered_down,
    wait_node_set_cooled,
)
from tests.cluster import Cluster, wait_for
from tests.fakes.boot_simulator import BootSimulator
from tests.fakes.ec2 import REGION, TEMPLATE
from tests.fakes.ec2_proxy import MotoEc2
from tests.fakes.imds import ACTION, FakeImds

pytestmark = pytest.mark.e2e


@dataclass
class AwsCloud:
    """The module's world: the cluster, moto + proxy, and the boot simulator."""

    cluster: Cluster
    moto: MotoEc2
    sim: BootSimulator

    @property
    def fleets(self) -> int:
        return self.moto.proxy.count("CreateFleet")

    def by_node(self, *states: str) -> dict[str, list[dict[str, Any]]]:
        """node -> moto records (in ``states``, all if none), straight from moto."""
        found: dict[str, list[dict[str, Any]]] = {}
        for record in self.moto.records(*states):
            tags = {t["Key"]: t["Value"] for t in record.get("Tags") or []}
            found.setdefault(decode_node(tags) or "?", []).append(record)
        return found


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsCloud]:
    root = tmp_path_factory.mktemp("aws-e2e")
    with MotoEc2() as moto:
        world = moto.world
        creds = moto.write_credentials(root / "aws-credentials")
        aws_opts = {"launch_template": TEMPLATE, "subnets": world.subnets,
                    "subnet_zones": world.zones}
        # A node as small as this machine (not the instance type's shape): its slurmd runs here.
        shape = {"cpus": 1, "memory_mib": 1000, "gpus": None}
        config = cloud_config(
            root,
            providers={"aws": {"type": "aws", "region": REGION, "endpoint_url": moto.proxy.url,
                               "credentials_file": creds}},
            node_sets=[
                {"name": "gpu", "provider": "aws", "count": 4, **shape,
                 "instance_types": ["g5.xlarge", "g6.xlarge"], "fallback": "on-demand",
                 "aws": aws_opts},
                {"name": "cpu", "provider": "aws", "count": 2, **shape,
                 "instance_types": ["g4dn.xlarge"], "aws": aws_opts},
            ],
            partitions=[{"name": "aws", "node_sets": ["gpu"], "default": True},
                        {"name": "awscpu", "node_sets": ["cpu"]}],
        )
        with running_cluster(root, config) as cluster:
            spot_config = load_config(cluster.spot_yaml)
            settings = spot_config.providers["aws"]
            assert settings.type == "aws"
            provider = AwsProvider(spot_config, "aws", settings)
            with BootSimulator(provider.list_instances, cluster.conf_dir / "slurm.conf",
                               cluster.log_dir) as sim:
                yield AwsCloud(cluster, moto, sim)
                assert sim.errors == []


def test_resume_cli_launches_one_fleet_per_node_set_and_records_addresses(aws: AwsCloud) -> None:
    cluster = aws.cluster
    before = aws.fleets
    result = spot_json(cluster, "resume", "gpu-[2-3],cpu-1")
    try:
        assert result["failed"] == [] and result["errors"] == []
        assert aws.fleets - before == 2  # one CreateFleet per node set, not per node
        running = aws.by_node("pending", "running")
        assert {n: len(r) for n, r in running.items()} == {"gpu-2": 1, "gpu-3": 1, "cpu-1": 1}
        launches = set()
        for node, (record,) in running.items():
            tags = {t["Key"]: t["Value"] for t in record["Tags"]}
            launches.add(tags[TAG_LAUNCH])
            assert tags[TAG_CLUSTER] == "test"
            assert tags[TAG_NODE_SET] == node.split("-")[0]
            assert tags[TAG_MARKET] == "spot" and record["InstanceLifecycle"] == "spot"
            fields = cluster.node(node)
            assert fields["NodeAddr"] == record["PrivateIpAddress"]
            assert fields["NodeHostName"] == record["PrivateDnsName"].split(".")[0]
        assert len(launches) == 2  # the instances came from two launches: one per node set
        for call in aws.moto.proxy.fleets[before:]:
            assert call.market == "spot" and call.forwarded
        listed = spot_json(cluster, "instances")
        assert {i["node"] for i in listed} == {"gpu-2", "gpu-3", "cpu-1"}
        for entry in listed:
            assert set(entry) == INSTANCE_FIELDS
            assert entry["provider"] == "aws" and entry["state"] in ("pending", "running")
            assert entry["market"] == "spot" and entry["zone"].startswith(REGION)
            assert entry["private_ip"] == cluster.node(entry["node"])["NodeAddr"]
    finally:
        suspended = spot_json(cluster, "suspend", "gpu-[2-3],cpu-1")
        forget_addresses(cluster, "gpu-2", "gpu-3", "cpu-1")
    assert len(suspended["terminated"]) == 3
    assert aws.by_node("pending", "running") == {}
    assert spot_json(cluster, "instances") == []


def test_rerun_launches_nothing_new_and_suspend_is_idempotent(aws: AwsCloud) -> None:
    cluster = aws.cluster
    first = spot_json(cluster, "resume", "gpu-4")
    try:
        fleets = aws.fleets
        second = spot_json(cluster, "resume", "gpu-4")
        assert aws.fleets == fleets  # the lookup by tag found the instance: no CreateFleet
        ids = [i["instance_id"] for i in first["launched"]]
        assert len(ids) == 1 and [i["instance_id"] for i in second["launched"]] == ids
        assert [r["InstanceId"] for r in aws.by_node("pending", "running")["gpu-4"]] == ids
    finally:
        spot(cluster, "suspend", "gpu-4")
        forget_addresses(cluster, "gpu-4")
    assert aws.by_node("pending", "running") == {}
    again = spot_json(cluster, "suspend", "gpu-4")
    assert again["terminated"] == [] and again["errors"] == []


def test_capacity_error_falls_over_to_next_type_then_to_on_demand(aws: AwsCloud) -> None:
    cluster, proxy = aws.cluster, aws.moto.proxy
    try:
        proxy.fail_pools("InsufficientInstanceCapacity", instance_type="g5.xlarge", market="spot")
        before = len(proxy.fleets)
        next_type = spot_json(cluster, "resume", "gpu-2")
        (launched,) = next_type["launched"]
        assert (launched["instance_type"], launched["market"]) == ("g6.xlarge", "spot")
        (call,) = proxy.fleets[before:]  # EC2 Fleet moves to the next pool in the same call
        assert [t for t, _ in call.pools] == ["g5.xlarge"] * 2 + ["g6.xlarge"] * 2
        assert {(t, c) for t, _, c in call.errors} == {("g5.xlarge", "InsufficientInstanceCapacity")}

        proxy.fail_pools("InsufficientInstanceCapacity", market="spot")
        before = len(proxy.fleets)
        on_demand = spot_json(cluster, "resume", "gpu-3")
        (launched,) = on_demand["launched"]
        assert launched["market"] == "on-demand" and launched["instance_type"] == "g5.xlarge"
        assert [(c.market, c.forwarded) for c in proxy.fleets[before:]] == [
            ("spot", False), ("on-demand", True)]
        (record,) = aws.by_node("pending", "running")["gpu-3"]
        assert "InstanceLifecycle" not in record  # on-demand in EC2's own terms
        assert cluster.node("gpu-3")["NodeAddr"] == record["PrivateIpAddress"]
    finally:
        proxy.clear()
        spot(cluster, "suspend", "gpu-[2-3]")
        forget_addresses(cluster, "gpu-2", "gpu-3")
    assert aws.by_node("pending", "running") == {}


def test_no_capacity_anywhere_sets_code_reason_then_powers_down(aws: AwsCloud) -> None:
    cluster, proxy = aws.cluster, aws.moto.proxy
    proxy.fail_pools("InsufficientInstanceCapacity")  # spot and on-demand, every pool
    try:
        job = cluster.sbatch("-p", "aws", "-w", "gpu-4", "-N", "1", "--requeue",
                             "-o", "/dev/null", "--wrap", "true")
        wait_for(lambda: cluster.job(job).get("Restarts", "0") != "0", timeout=40,
                 what=f"job {job} requeued after the failed resume\n"
                 + log_tail(cluster.log_dir / "hooks.log"))
        reason = cluster.node("gpu-4")["Reason"]
        assert reason.startswith("(Code:InsufficientInstanceCapacity)"), reason
        wait_failed_node_powered_down(cluster, "gpu-4", "InsufficientInstanceCapacity")
        assert "gpu-4" not in aws.by_node("pending", "running")
        wait_node_set_cooled(cluster, "gpu-4", ["gpu-1", "gpu-2", "gpu-3"],
                             "InsufficientInstanceCapacity")
    finally:
        cancel_all(cluster)
        proxy.clear()
        cluster.end_cooldowns()  # capacity is back: as an admin would (docs/admin.md)


def test_slurmctld_resumes_aws_node_and_a_job_runs_there(aws: AwsCloud) -> None:
    cluster = aws.cluster
    aws.sim.allow("gpu-1")
    before = aws.fleets
    out = cluster.root / "hostname.out"
    started = time.monotonic()
    job = run_job(cluster, "-p", "aws", "-w", "gpu-1", "-N", "1", "-o", str(out),
                  "--wrap", "hostname")
    elapsed = time.monotonic() - started
    assert job["JobState"] == "COMPLETED", job
    (record,) = aws.by_node("pending", "running")["gpu-1"]
    assert out.read_text().split() == [record["PrivateDnsName"].split(".")[0]], (
        f"{out.read_text()}\n{log_tail(cluster.log_dir / 'hooks.log')}")
    assert aws.fleets - before == 1  # the ResumeProgram hook, with an empty environment
    assert aws.sim.running() == {"gpu-1": record["InstanceId"]}
    node = cluster.node("gpu-1")
    assert node["NodeHostName"] == record["PrivateDnsName"].split(".")[0]
    assert node["NodeAddr"] == "127.0.0.1"  # set by the boot simulator / registration
    print(f"job on gpu-1 done {elapsed:.1f} s after sbatch")


def test_imds_notice_drains_node_and_requeues_its_job(aws: AwsCloud) -> None:
    cluster = aws.cluster
    aws.sim.allow("gpu-1")
    job = cluster.sbatch("-p", "aws", "-w", "gpu-1", "-N", "1", "--requeue", "-o", "/dev/null",
                         "--wrap", "sleep 600")
    try:
        wait_for(lambda: cluster.job(job).get("JobState") == "RUNNING", timeout=120,
                 what=f"job {job} running on gpu-1")
        (record,) = aws.by_node("pending", "running")["gpu-1"]
        deadline = datetime.now(timezone.utc) + timedelta(seconds=8)
        with FakeImds(instance_id=record["InstanceId"]) as imds:
            imds.set_instance_action(200, json.dumps(
                {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}))
            outcome = spot_json(cluster, "watch", "--node", "gpu-1", "--once", "--margin", "3",
                                env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url})
            assert imds.count("PUT", "/latest/api/token", 200) >= 1
            assert imds.count("GET", ACTION, 200) >= 1
        assert outcome["notice"]["action"] == "terminate"
        assert outcome["jobs"] == [job] and outcome["requeued"] == [job], outcome
        assert outcome["errors"] == []
        assert cluster.node("gpu-1")["Reason"].startswith("spot-interruption:terminate@")
        fields = cluster.job(job)
        assert fields["Restarts"] == "1" and fields["JobState"] in ("PENDING", "CONFIGURING",
                                                                    "RUNNING"), fields
        cancel_all(cluster)  # before slurmctld resumes gpu-1 again for it
        # POWER_DOWN_FORCE ran SuspendProgram: the instance is terminated, its slurmd gone.
        wait_for(lambda: "gpu-1" not in aws.by_node("pending", "running"), timeout=30,
                 what="gpu-1's instance terminated")
        wait_for(lambda: "gpu-1" not in aws.sim.running(), timeout=10, what="slurmd gone")
    finally:
        aws.sim.disallow("gpu-1")
        cancel_all(cluster)
