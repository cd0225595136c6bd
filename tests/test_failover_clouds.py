"""Failover across regions and clouds (issue 24, part 4), without a real slurmctld: one
partition of AWS node sets in two regions (moto, one server, two regions), and one of a GCE node
set (the fake Compute API) and an AWS one.

The providers are the real ones, built from spot.yaml as the resume hook builds them
(``providers.<name>.endpoint_url`` / ``api_endpoint``); Slurm is :class:`tests.fakes.fake_slurm.
FakeSlurm`, which requeues a job when its node goes DOWN as slurmctld 22.05 does. Each test
runs the resume hook's work for the cheapest node set (:func:`slurm_spot.lifecycle.power.resume`, then
:func:`slurm_spot.lifecycle.failover.fail_over` with a fake clock) while that node set's region or zone
has no capacity, then checks what a user and slurmctld see: the failed node's ``(Code:...)``
reason, the node set's free nodes DOWN under a cooldown reason (so slurmctld does not try it
again while it lasts), the job's requeue hold cleared with the other node set named as where it
may run, and that node set's node then launching in its own region or cloud.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.lifecycle import power
from slurm_spot.lifecycle.failover import FailoverRun, fail_over
from slurm_spot.lifecycle.weights import current_weights
from slurm_spot.providers.aws.fleet import decode_node
from slurm_spot.slurm.reasons import COOLDOWN_TEXT, parse_cooldown
from tests.fakes.ec2 import REGION, TEMPLATE, WEST_REGION, WEST_ZONES, World
from tests.fakes.ec2_proxy import MotoEc2
from tests.fakes.fake_slurm import FakeSlurm
from tests.fakes.gce_api import FakeCompute

ICE = "InsufficientInstanceCapacity"
GCE_ZONE = "us-central1-a"
SHAPE = {"cpus": 1, "memory_mib": 1000}
COOLDOWN_S = 300
_CLUSTERS = itertools.count(1)


@dataclass
class Clouds:
    """moto (two regions' worlds) behind the EC2 proxy, and the fake Compute API."""

    moto: MotoEc2
    east: World
    west: World
    gce: FakeCompute
    credentials: str

    def running(self, region: str) -> dict[str, str]:
        """node -> instance id of the pending/running instances of ``region``, from moto."""
        found = {}
        for record in self.moto.records("pending", "running", region=region):
            tags = {t["Key"]: t["Value"] for t in record.get("Tags") or []}
            found[decode_node(tags) or "?"] = record["InstanceId"]
        return found

    def reset(self) -> None:
        self.moto.proxy.clear()
        self.gce.forget_failures()
        for region in (REGION, WEST_REGION):
            ids = [r["InstanceId"] for r in self.moto.records("pending", "running",
                                                               region=region)]
            if ids:
                self.moto.client(region).terminate_instances(InstanceIds=ids)


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    root = tmp_path_factory.mktemp("clouds")
    with MotoEc2() as moto, FakeCompute() as gce:
        west = moto.world_in(WEST_REGION, WEST_ZONES)
        creds = moto.write_credentials(root / "aws-credentials")
        yield Clouds(moto, moto.world, west, gce, creds)


@pytest.fixture
def world(clouds: Clouds) -> Iterator[Clouds]:
    clouds.reset()
    yield clouds
    clouds.reset()


def site_config(clouds: Clouds, tmp: Path) -> SpotConfig:
    """spot.yaml data of the site: AWS in two regions and GCE, three node sets, and two
    partitions: ``regions`` (east, then west) and ``mixed`` (gce, then east). The admin's
    ``weight`` tiers fix the order, so the first choice is known whatever the prices. Each
    config has a cluster name of its own: launch tokens and GCE request ids derive from the
    cluster and the node, and the fake, as GCE does, answers a repeated request id with the
    earlier operation."""
    proxy = clouds.moto.proxy.url

    def aws(world: World) -> dict[str, Any]:
        return {"launch_template": TEMPLATE, "subnets": world.subnets,
                "subnet_zones": world.zones}

    return parse_config({
        "cluster": f"multi{next(_CLUSTERS)}",
        "providers": {
            "aws-east": {"type": "aws", "region": REGION, "endpoint_url": proxy,
                         "credentials_file": clouds.credentials},
            "aws-west": {"type": "aws", "region": WEST_REGION, "endpoint_url": proxy,
                         "credentials_file": clouds.credentials},
            "gcp": {"type": "gcp", "project": clouds.gce.project, "region": "us-central1",
                    "api_endpoint": clouds.gce.endpoint},
        },
        "node_sets": [
            {"name": "gce", "provider": "gcp", "count": 2, "weight": 1, **SHAPE,
             "gcp": {"zones": [GCE_ZONE], "machine_type": "n1-standard-8",
                     "image": "projects/debian-cloud/global/images/family/debian-12"}},
            {"name": "east", "provider": "aws-east", "count": 2, "weight": 2, **SHAPE,
             "instance_types": ["g5.xlarge"], "aws": aws(clouds.east)},
            {"name": "west", "provider": "aws-west", "count": 2, "weight": 3, **SHAPE,
             "instance_types": ["g5.xlarge"], "aws": aws(clouds.west)},
        ],
        "partitions": [{"name": "regions", "node_sets": ["east", "west"], "default": True},
                       {"name": "mixed", "node_sets": ["gce", "east"]}],
        "reconcile": {"cooldown_s": COOLDOWN_S},
        "state_dir": str(tmp / "state"), "log_dir": str(tmp / "log"),
    })


class Clock:
    """``time.time``/``time.sleep`` for :func:`fail_over`: sleeping advances it at once."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def slurm_with(config: SpotConfig, job_id: int, node: str, partition: str) -> FakeSlurm:
    """Every node ``idle~`` with its slurm.conf Weight, and job ``job_id`` of ``partition``
    CONFIGURING on ``node`` (slurmctld asked the resume hook for it)."""
    slurm = FakeSlurm()
    weights = current_weights(config, [])
    for ns in config.node_sets:
        for name in ns.node_names:
            slurm.add_node(name).weight = weights[ns.name]
    slurm.nodes[node].flags = {"CLOUD", "POWERING_UP"}
    job = slurm.add_job(job_id, [node], state="CONFIGURING")
    job.partition = partition
    return slurm


def resume_hook(config: SpotConfig, slurm: FakeSlurm, node: str,
                jobs: dict[int, tuple[str, ...]]) -> tuple[power.PowerResult, FailoverRun]:
    """What ResumeProgram does for ``node`` (``resume_and_fail_over``), on a fake clock."""
    client = slurm.client()
    result = power.resume(config, node, client, jobs=jobs)
    clock = Clock()
    run = fail_over(config, client, result, jobs, clock=clock.time, sleep=clock.sleep,
                    start_wait_s=1.0)
    return result, run


def events(config: SpotConfig) -> list[dict[str, Any]]:
    path = config.log_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_cooled(slurm: FakeSlurm, node: str, code: str, seconds: float) -> None:
    """``node`` (free, idle~ before) is DOWN under ``(Code:<code>)Temporarily disabled until
    T``, T about ``seconds`` from now: slurmctld allocates no job there until the reconciler
    ends the cooldown."""
    from datetime import datetime, timezone

    fake = slurm.nodes[node]
    assert fake.base == "DOWN", (node, fake.state)
    assert fake.reason.startswith(f"(Code:{code}){COOLDOWN_TEXT}"), fake.reason
    found = parse_cooldown(fake.reason)
    assert found is not None
    left = (found[1] - datetime.now(timezone.utc)).total_seconds()
    assert seconds - 120 < left <= seconds, (fake.reason, seconds)


# -- two AWS regions ------------------------------------------------------------------------
def test_no_capacity_in_one_region_moves_the_job_to_the_node_set_in_the_other(
        world: Clouds, tmp_path: Path) -> None:
    config = site_config(world, tmp_path)
    for subnet in world.east.subnets:  # us-east-1 has no g5.xlarge spot capacity anywhere
        world.moto.proxy.fail_pools(ICE, subnet=subnet)
    slurm = slurm_with(config, 7, "east-1", "regions")
    fleets = len(world.moto.proxy.fleets)

    result, run = resume_hook(config, slurm, "east-1", {7: ("east-1",)})

    (failure,) = result.failed
    assert (failure.nodes, failure.code) == (("east-1",), ICE) and result.launched == []
    (call,) = world.moto.proxy.fleets[fleets:]  # one CreateFleet, only east's subnets
    assert {subnet for _, subnet in call.pools} == set(world.east.subnets)
    assert slurm.nodes["east-1"].reason.startswith(f"(Code:{ICE})")
    assert_cooled(slurm, "east-2", ICE, COOLDOWN_S)
    assert slurm.nodes["west-1"].base == "IDLE" and slurm.nodes["west-1"].reason == ""
    # the job was requeued by the DOWN and its hold cleared at once, pointing at the west
    job = slurm.jobs[7]
    assert (job.state, job.reason, job.restarts) == ("PENDING", "None", 1)
    assert slurm.expedited == [7]
    move = run.moves[7]
    assert (move.from_node_set, move.code, move.candidates) == ("east", ICE, ("west",))
    (failover,) = [e for e in events(config) if e["action"] == "failover"]
    assert failover["extra"]["candidates"] == ["west"] and failover["extra"]["expedited"]
    assert "no capacity on node set east" in failover["reason"]
    assert "eligible now on west" in failover["reason"]
    assert "no capacity on node set east" in job.admin_comment

    # slurmctld now powers up west-1 for the job: it launches in us-west-2, nothing in the east
    job.state, job.nodes = "CONFIGURING", ["west-1"]
    slurm.nodes["west-1"].flags = {"CLOUD", "POWERING_UP"}
    again, _ = resume_hook(config, slurm, "west-1", {7: ("west-1",)})
    assert again.failed == [] and again.errors == []
    (launched,) = again.launched
    assert launched.zone in WEST_ZONES and launched.node == "west-1"
    assert world.running(WEST_REGION) == {"west-1": launched.instance_id}
    assert world.running(REGION) == {}
    assert slurm.nodes["west-1"].addr == launched.private_ip


def test_no_capacity_in_one_pool_of_a_region_is_not_a_failover(
        world: Clouds, tmp_path: Path) -> None:
    """ICE on one pool (one subnet) of the east: EC2 Fleet moves to the region's other pool in
    the same call; the node set is not cooled down and no job moves."""
    config = site_config(world, tmp_path)
    world.moto.proxy.fail_pools(ICE, subnet=world.east.subnets[0])
    slurm = slurm_with(config, 8, "east-1", "regions")

    result, run = resume_hook(config, slurm, "east-1", {8: ("east-1",)})

    assert result.failed == [] and run.moves == {} and run.cooldowns == []
    (launched,) = result.launched
    assert launched.zone == world.east.zones[world.east.subnets[1]]
    assert slurm.nodes["east-2"].base == "IDLE" and slurm.jobs[8].state == "CONFIGURING"
    assert world.running(REGION) == {"east-1": launched.instance_id}


# -- AWS and GCE in one partition ------------------------------------------------------------
@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT",
                                  "QUOTA_EXCEEDED"])
def test_a_gce_stockout_moves_the_job_to_the_aws_node_set(
        world: Clouds, tmp_path: Path, code: str) -> None:
    config = site_config(world, tmp_path)
    world.gce.fail_operation(code, zone=GCE_ZONE, times=None)
    slurm = slurm_with(config, 9, "gce-1", "mixed")

    result, run = resume_hook(config, slurm, "gce-1", {9: ("gce-1",)})

    (failure,) = result.failed
    assert (failure.nodes, failure.code) == (("gce-1",), code)
    assert [i for i in world.gce.all_instances() if i["status"] != "TERMINATED"] == []
    seconds = COOLDOWN_S if code != "QUOTA_EXCEEDED" else config.reconcile.quota_backoff_s
    assert_cooled(slurm, "gce-2", code, seconds)
    (cool,) = run.cooldowns
    assert (cool.node_set, cool.code) == ("gce", code)
    job = slurm.jobs[9]
    assert (job.state, job.reason) == ("PENDING", "None") and slurm.expedited == [9]
    assert run.moves[9].candidates == ("east",)  # the partition's other node set: AWS

    job.state, job.nodes = "CONFIGURING", ["east-1"]
    slurm.nodes["east-1"].flags = {"CLOUD", "POWERING_UP"}
    again, _ = resume_hook(config, slurm, "east-1", {9: ("east-1",)})
    assert again.failed == [] and again.errors == []
    (launched,) = again.launched
    assert launched.zone.startswith(REGION) and world.running(REGION) == {
        "east-1": launched.instance_id}


def test_an_aws_capacity_error_moves_the_job_to_gce_when_gce_is_next(
        world: Clouds, tmp_path: Path) -> None:
    """The other way round: the admin's tiers put east first in ``mixed``; with no AWS
    capacity the job is sent to the GCE node set, which launches in its zone."""
    data = site_config(world, tmp_path).model_dump(mode="json")
    for ns in data["node_sets"]:
        ns["weight"] = {"east": 1, "gce": 2, "west": 3}[ns["name"]]
    config = parse_config(data)
    world.moto.proxy.fail_pools(ICE)
    slurm = slurm_with(config, 10, "east-1", "mixed")

    result, run = resume_hook(config, slurm, "east-1", {10: ("east-1",)})

    assert [f.code for f in result.failed] == [ICE]
    assert_cooled(slurm, "east-2", ICE, COOLDOWN_S)
    assert run.moves[10].candidates == ("gce",)
    job = slurm.jobs[10]
    job.state, job.nodes = "CONFIGURING", ["gce-1"]
    slurm.nodes["gce-1"].flags = {"CLOUD", "POWERING_UP"}
    again, _ = resume_hook(config, slurm, "gce-1", {10: ("gce-1",)})
    assert again.failed == [] and again.errors == []
    (launched,) = again.launched
    assert launched.zone == GCE_ZONE and launched.node == "gce-1"


# -- two providers that see the same instances ------------------------------------------------
def test_two_gce_regions_of_one_project_do_not_make_an_instance_its_own_duplicate(
        tmp_path: Path) -> None:
    """Two ``gcp`` providers of one project (two regions) both list every zone's instances
    (``aggregatedList``): the reconciler counts each instance once, under the provider of its
    node set, so an up node's only instance is not terminated as a "duplicate" of itself,
    and ``slurm-spot instances`` / ``status`` list it once."""
    from slurm_spot.lifecycle.status import status_rows
    from slurm_spot.providers import assign_listings, get_provider
    from slurm_spot.reconcile.reconciler import Reconciler

    with FakeCompute() as fake:
        image = "projects/debian-cloud/global/images/family/debian-12"
        config = parse_config({
            "cluster": "two",
            "providers": {
                "gce-us": {"type": "gcp", "project": fake.project, "region": "us-central1",
                           "api_endpoint": fake.endpoint, "preemption_events": False},
                "gce-eu": {"type": "gcp", "project": fake.project, "region": "europe-west4",
                           "api_endpoint": fake.endpoint, "preemption_events": False}},
            "node_sets": [
                {"name": "us", "provider": "gce-us", "count": 1, **SHAPE,
                 "gcp": {"zones": ["us-central1-a"], "machine_type": "n1-standard-8",
                         "image": image}},
                {"name": "eu", "provider": "gce-eu", "count": 1, **SHAPE,
                 "gcp": {"zones": ["europe-west4-a"], "machine_type": "n1-standard-8",
                         "image": image}}],
            "partitions": [{"name": "gpu", "node_sets": ["us", "eu"]}],
            "reconcile": {"missing_grace_s": 0},
            "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        })
        slurm = FakeSlurm()
        for name in ("us-1", "eu-1"):
            slurm.add_node(name)
        result = power.resume(config, "us-1,eu-1", slurm.client())
        assert result.failed == [] and result.errors == [] and len(result.launched) == 2
        for name in ("us-1", "eu-1"):  # both slurmds registered: the nodes are up
            slurm.nodes[name].base, slurm.nodes[name].flags = "IDLE", {"CLOUD"}

        passed = Reconciler(config, slurm.client(), sleep=lambda s: None,
                            expedite_wait_s=0).run_pass()

        assert passed.errors == []
        assert not [e for e in events(config) if e["action"] == "duplicate_instance"]
        alive = [i["name"] for i in fake.all_instances() if i["status"] == "RUNNING"]
        assert sorted(alive) == ["two-eu-1", "two-us-1"]  # nothing terminated
        # each provider sees both instances, and each is counted once, under its own node
        # set's provider
        listings = {n: get_provider(config, n).list_instances() for n in ("gce-us", "gce-eu")}
        assert all(len(listed) == 2 for listed in listings.values())
        assigned = assign_listings(config, listings)
        assert {n: [i.node for i in v] for n, v in assigned.items()} == {
            "gce-us": ["us-1"], "gce-eu": ["eu-1"]}
        rows, errors = status_rows(config, slurm.client())
        assert errors == []
        assert {r["node"]: (r["provider"], r["extra_instances"]) for r in rows} == {
            "us-1": ("gce-us", []), "eu-1": ("gce-eu", [])}
