"""Failover across regions and clouds (issue 24, part 4) on a real slurmctld: one cluster whose
node sets are EC2 spot instances in two regions of moto (``use1``: us-east-1, ``usw2``:
us-west-2) and Compute Engine Spot VMs of the fake Compute API (``gce``), in two partitions:

- ``regions`` = use1 (tried first) + usw2: with no capacity anywhere in us-east-1 a
  ``--requeue`` job runs on ``usw2``;
- ``mixed`` = gce (tried first) + use1: with GCE's zone stocked out the job runs on AWS.

The names sort in the order of the node sets' weights on purpose: slurmctld 22.05.8 was seen
here to allocate powered-down CLOUD nodes in name order, not by Weight (with ``gce`` Weight 1
and ``east`` Weight 2, a job of ``mixed`` went to east-1 first), as AWS ParallelCluster
documents ("Slurm does not support Weights for powered down CLOUD nodes",
aws/aws-parallelcluster-cookbook#1490). The failover itself does not depend on Weight: the
failed node set's free nodes are DOWN while it cools down.

Each time the failed node set is cooled down (its free nodes DOWN under a cooldown reason, so
slurmctld does not try it again while that lasts: one launch failure, one CreateFleet / bulk
insert), the job is requeued once and its hold cleared by the resume hook, and the events name
where it went. Every process reaches the fakes through spot.yaml (``endpoint_url``,
``api_endpoint``), as slurmctld's hooks with an empty environment must. A
:class:`tests.fakes.boot_simulator.BootSimulator` over the three providers' listings boots a
local slurmd for each instance, so the job really runs on the "cloud" node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from slurm_spot.config import load_config
from slurm_spot.providers import get_provider
from slurm_spot.providers.aws.fleet import decode_node
from tests.cloud_e2e import (
    cancel_all,
    cloud_config,
    log_tail,
    running_cluster,
    wait_node_set_cooled,
    wait_powered_down,
)
from tests.cluster import Cluster, wait_for
from tests.fakes.boot_simulator import BootSimulator
from tests.fakes.ec2 import REGION, TEMPLATE, WEST_REGION, WEST_ZONES, World
from tests.fakes.ec2_proxy import MotoEc2
from tests.fakes.gce_api import FakeCompute

pytestmark = pytest.mark.e2e

ICE = "InsufficientInstanceCapacity"
EXHAUSTED = "ZONE_RESOURCE_POOL_EXHAUSTED"
GCE_ZONE = "us-central1-a"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
COOLDOWN_S = 300  # longer than a test: the failed node set must stay skipped meanwhile
#: Capacity error -> the job RUNNING elsewhere: the hold is cleared within a second, then the
#: other node's boot (BootSimulator: 2 s after the instance shows) and slurmctld 22.05's
#: CONFIGURING until its next periodic pass (<= 30 s), as in tests/test_failover_e2e.py.
RUNNING_WITHIN_S = 45.0


@dataclass
class Site:
    """The module's world: the cluster, moto (two regions) + proxy, the GCE fake, the boot
    simulator over all three providers."""

    cluster: Cluster
    moto: MotoEc2
    east: World
    west: World
    gce: FakeCompute
    sim: BootSimulator

    def running(self, region: str) -> dict[str, dict[str, Any]]:
        """node -> moto record of the pending/running instances of ``region``."""
        found = {}
        for record in self.moto.records("pending", "running", region=region):
            tags = {t["Key"]: t["Value"] for t in record.get("Tags") or []}
            found[decode_node(tags) or "?"] = record
        return found

    def events(self, action: str) -> list[dict[str, Any]]:
        path = self.cluster.log_dir / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, filter(None, lines)) if e["action"] == action]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("clouds-e2e")
    with MotoEc2() as moto, FakeCompute() as gce:
        west = moto.world_in(WEST_REGION, WEST_ZONES)
        creds = moto.write_credentials(root / "aws-credentials")

        def aws(world: World) -> dict[str, Any]:
            return {"launch_template": TEMPLATE, "subnets": world.subnets,
                    "subnet_zones": world.zones}

        # A node as small as this machine (not the instance type's shape, no GPU): its slurmd
        # runs here.
        shape = {"cpus": 1, "memory_mib": 1000, "gpus": None}
        config = cloud_config(
            root,
            providers={
                "aws-east": {"type": "aws", "region": REGION, "endpoint_url": moto.proxy.url,
                             "credentials_file": creds},
                "aws-west": {"type": "aws", "region": WEST_REGION,
                             "endpoint_url": moto.proxy.url, "credentials_file": creds},
                "gcp": {"type": "gcp", "project": gce.project, "region": "us-central1",
                        "api_endpoint": gce.endpoint, "preemption_events": False}},
            node_sets=[
                {"name": "gce", "provider": "gcp", "count": 2, "weight": 1, **shape,
                 "gcp": {"zones": [GCE_ZONE], "machine_type": "n1-standard-8",
                         "image": IMAGE}},
                {"name": "use1", "provider": "aws-east", "count": 2, "weight": 2, **shape,
                 "instance_types": ["g5.xlarge"], "aws": aws(moto.world)},
                {"name": "usw2", "provider": "aws-west", "count": 2, "weight": 3, **shape,
                 "instance_types": ["g5.xlarge"], "aws": aws(west)},
            ],
            partitions=[{"name": "regions", "node_sets": ["use1", "usw2"], "default": True},
                        {"name": "mixed", "node_sets": ["gce", "use1"]}],
        )
        config["reconcile"] = {**config["reconcile"], "cooldown_s": COOLDOWN_S}
        with running_cluster(root, config) as cluster:
            spot_config = load_config(cluster.spot_yaml)
            listings = [get_provider(spot_config, name).list_instances
                        for name in ("aws-east", "aws-west", "gcp")]
            with BootSimulator(listings, cluster.conf_dir / "slurm.conf",
                               cluster.log_dir) as sim:
                sim.allow(*(n for ns in spot_config.node_sets for n in ns.node_names))
                yield Site(cluster, moto, moto.world, west, gce, sim)
                assert sim.errors == []


def _after(site: Site, *nodes: str) -> None:
    """Capacity back, cooldowns ended (as docs/admin.md tells an admin), the providers' own
    pool cooldowns forgotten, and the nodes the job used powered down again (the simulated
    slurmds share one port: the next test's node boots only after they are gone)."""
    cancel_all(site.cluster)
    site.moto.proxy.clear()
    site.gce.forget_failures()
    site.cluster.end_cooldowns()
    for path in site.cluster.state_dir.glob("*/*-pool-cooldowns.json"):
        path.unlink()
    for node in nodes:
        wait_powered_down(site.cluster, node, timeout=90)


def _run(site: Site, partition: str) -> tuple[dict[str, str], float]:
    """A 1-node ``--requeue`` job printing its hostname in ``partition``, to its end; returns
    its ``scontrol show job`` fields when it ran, and when that was seen (``time.time()``)."""
    cluster = site.cluster
    out = cluster.root / f"{partition}.out"
    job = cluster.sbatch("-p", partition, "-N", "1", "--requeue", "-o", str(out),
                         "--wrap", "hostname")
    running = wait_for(lambda: (cluster.job(job).get("JobState") in ("RUNNING", "COMPLETING",
                                                                    "COMPLETED")
                                and cluster.job(job)),
                       timeout=150, interval=0.25,
                       what=f"job {job} running\n{log_tail(cluster.log_dir / 'hooks.log')}")
    seen = time.time()
    assert isinstance(running, dict)
    wait_for(lambda: cluster.job(job).get("JobState") == "COMPLETED", timeout=120,
             what=f"job {job} completed")
    fields = cluster.job(job)
    fields["Output"] = out.read_text().strip()
    return fields, seen


def _error_at(site: Site, prefix: str) -> float:
    (failed,) = [e for e in site.events("launch_failed") if e["node"].startswith(prefix)]
    return datetime.fromisoformat(failed["time"]).timestamp()


def test_no_capacity_in_one_region_runs_the_job_in_the_other(site: Site) -> None:
    cluster, proxy = site.cluster, site.moto.proxy
    for subnet in site.east.subnets:  # us-east-1: no g5.xlarge capacity in any zone
        proxy.fail_pools(ICE, subnet=subnet)
    fleets = len(proxy.fleets)
    ran: list[str] = []
    try:
        job, seen = _run(site, "regions")
        ran = [job["NodeList"]]
        took = seen - _error_at(site, "use1-")
        print(f"\nregions: ICE in {REGION} -> running on {job['NodeList']} ({WEST_REGION}) "
              f"{took:.1f} s after the error")
        assert job["NodeList"].startswith("usw2-"), job
        assert job["Restarts"] == "1", job  # requeued once by the failed launch, no more
        (record,) = site.running(WEST_REGION).values()
        assert job["Output"] == record["PrivateDnsName"].split(".")[0]  # ran on that instance
        assert site.running(REGION) == {}
        east_calls = [c for c in proxy.fleets[fleets:]
                      if {s for _, s in c.pools} <= set(site.east.subnets)]
        assert len(east_calls) == 1 and not east_calls[0].forwarded  # east was tried once
        failed = [e["node"] for e in site.events("launch_failed")]
        assert len(failed) == 1
        others = [n for n in ("use1-1", "use1-2") if n not in failed]
        wait_node_set_cooled(cluster, failed[0], others, ICE)
        (moved,) = site.events("failover_started")
        assert (moved["extra"]["from_node_set"], moved["extra"]["node_set"]) == ("use1", "usw2")
        assert took < RUNNING_WITHIN_S, took
    finally:
        _after(site, *ran)


def test_a_gce_stockout_runs_the_job_on_aws(site: Site) -> None:
    cluster = site.cluster
    site.gce.fail_operation(EXHAUSTED, zone=GCE_ZONE, times=None)
    inserts = len(site.gce.calls("bulkInsert"))
    ran: list[str] = []
    try:
        job, seen = _run(site, "mixed")
        ran = [job["NodeList"]]
        took = seen - _error_at(site, "gce-")
        print(f"\nmixed: {EXHAUSTED} in {GCE_ZONE} -> running on {job['NodeList']} (AWS) "
              f"{took:.1f} s after the error")
        assert job["NodeList"].startswith("use1-"), job
        assert job["Restarts"] == "1", job
        (record,) = site.running(REGION).values()
        assert job["Output"] == record["PrivateDnsName"].split(".")[0]
        assert [i for i in site.gce.all_instances() if i["status"] == "RUNNING"] == []
        assert len(site.gce.calls("bulkInsert")) - inserts == 1  # gce was tried once
        failed = [e["node"] for e in site.events("launch_failed") if e["node"].startswith("gce")]
        others = [n for n in ("gce-1", "gce-2") if n not in failed]
        wait_node_set_cooled(cluster, failed[0], others, EXHAUSTED)
        moved = [e for e in site.events("failover_started")
                 if e["extra"]["from_node_set"] == "gce"]
        assert [e["extra"]["node_set"] for e in moved] == ["use1"]
        assert took < RUNNING_WITHIN_S, took
    finally:
        _after(site, *ran)
