"""What an admin sees in the cloud's API log and in ``ps`` when a pass or a hook handles many
nodes at once: one provider (one boto3 session, one Compute client) per pass, terminations
batched per provider call, Slurm updates batched per verdict, expedites batched, GCE deletions
concurrent, and ``events --since`` reading only the end of a long file.

Counts come from the fakes' own logs: moto's requests through botocore's events on a session
shared by every client, the fake Compute API's request log, the fake Slurm's argv log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest

from slurm_spot.config import SpotConfig
from slurm_spot.events import EVENTS_FILE, Event, emit, read_events, start_offset
from slurm_spot.lifecycle import power
from slurm_spot.providers import get_provider
from slurm_spot.providers.aws.provider import AwsProvider
from slurm_spot.providers.base import TAG_CLUSTER, TAG_NODE_SET, InstanceState, LaunchRequest, Provider
from slurm_spot.providers.gcp.provider import GcpProvider
from slurm_spot.reconcile.reconciler import Reconciler
from tests.fakes.aws_harness import make_config, moto_world
from tests.fakes.ec2 import REGION
from tests.fakes.fake_slurm import FakeSlurm
from tests.fakes.gce_api import FakeCompute, gcp_config
from tests.test_reconcile_rules import NOW, World

LATER = datetime.now(timezone.utc) + timedelta(hours=2)  # every instance is past its grace


def _nodes_updates(slurm: FakeSlurm) -> list[list[str]]:
    return [c[1:] for c in slurm.calls if len(c) > 2 and c[1] == "update"
            and c[2].startswith("nodename=")]


# -- AWS: one session, one provider, one TerminateInstances per pass ---------------------------
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    with moto_world(monkeypatch) as (ec2, world):
        yield ec2, world


def test_a_pass_terminating_20_orphans_among_200_makes_two_ec2_calls(aws: tuple) -> None:
    ec2, world = aws
    config = make_config(world, count=200)
    session = boto3.session.Session(region_name=REGION)
    calls: Counter[str] = Counter()  # every client made from this session reports to it
    session.events.register("before-parameter-build.ec2",
                            lambda event_name, **_: calls.update([event_name.rsplit(".", 1)[1]]))
    built: list[Provider] = []

    def providers(cfg: SpotConfig, name: str) -> Provider:
        settings = cfg.providers[name]
        assert settings.type == "aws"
        built.append(AwsProvider(cfg, name, settings, session=session))
        return built[-1]

    launched = providers(config, "aws").launch(
        LaunchRequest("c1", config.node_sets[0], tuple(f"gpu-{i}" for i in range(1, 201)), "t"))
    assert len(launched.launched) == 200
    slurm = FakeSlurm()
    by_node = {i.node: i for i in launched.launched}
    for i in range(1, 201):  # 180 up and matched; 20 powered down with an instance still alive
        name = f"gpu-{i}"
        if i <= 180:
            slurm.add_node(name, "IDLE+CLOUD", addr=by_node[name].private_ip or "")
        else:
            slurm.add_node(name)
    built.clear()
    calls.clear()

    result = Reconciler(config, slurm.client(), providers=providers, clock=lambda: LATER,
                        sleep=lambda s: None, expedite_wait_s=0).run_pass()

    terminated = [a for a in result.actions if a["action"] == "terminated"]
    assert sorted(str(a["node"]) for a in terminated) == sorted(f"gpu-{i}" for i in range(181, 201))
    assert len(built) == 1  # one provider, so one session's clients, for the whole pass
    assert calls == Counter({"DescribeInstances": 1, "TerminateInstances": 1})
    pages = ec2.get_paginator("describe_instances").paginate()
    states = Counter(i["State"]["Name"] for page in pages for r in page["Reservations"]
                     for i in r["Instances"])
    assert states["running"] == 180 and states["running"] + states["terminated"] == 200


def test_the_resume_hook_builds_one_boto3_session(aws: tuple, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    _, world = aws
    config = make_config(world, count=4)
    made: list[object] = []
    original = boto3.session.Session.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "__init__", counting_init)
    slurm = FakeSlurm()
    for name in config.all_nodes():
        slurm.add_node(name)
    result = power.resume(config, "gpu-[1-4]", slurm.client(), providers=get_provider)
    assert len(result.launched) == 4 and not result.errors
    assert len(made) == 1  # the lookup, CreateFleet and tagging clients share it


def test_more_nodes_than_one_fleet_takes_launch_in_one_call_per_batch(
        aws: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_spot.providers.aws import launch as aws_launch

    monkeypatch.setattr(aws_launch, "MAX_FLEET_TARGET", 2)  # EC2's 1000, scaled down
    _, world = aws
    config = make_config(world, count=7)
    session = boto3.session.Session(region_name=REGION)
    calls: Counter[str] = Counter()
    session.events.register("before-parameter-build.ec2",
                            lambda event_name, **_: calls.update([event_name.rsplit(".", 1)[1]]))
    settings = config.providers["aws"]
    assert settings.type == "aws"
    provider = AwsProvider(config, "aws", settings, session=session)
    result = provider.launch(LaunchRequest("c1", config.node_sets[0],
                                           tuple(f"gpu-{i}" for i in range(1, 8)), "t"))
    assert sorted(i.node or "" for i in result.launched) == sorted(f"gpu-{i}" for i in range(1, 8))
    assert result.failed == ()
    assert calls["CreateFleet"] == 4  # ceil(7 / 2), all in the spot market


def _counting_providers(calls: Counter[str]) -> Any:
    session = boto3.session.Session(region_name=REGION)
    session.events.register("before-parameter-build.ec2",
                            lambda event_name, **_: calls.update([event_name.rsplit(".", 1)[1]]))

    def providers(cfg: SpotConfig, name: str) -> Provider:
        settings = cfg.providers[name]
        assert settings.type == "aws"
        return AwsProvider(cfg, name, settings, session=session)

    return providers


def _states(ec2: Any) -> dict[str, str]:
    pages = ec2.get_paginator("describe_instances").paginate()
    return {i["InstanceId"]: i["State"]["Name"] for page in pages for r in page["Reservations"]
            for i in r["Instances"]}


def test_suspend_terminates_every_other_instance_when_one_refuses(aws: tuple) -> None:
    """EC2 refuses a whole TerminateInstances when one of its instances has termination
    protection: the suspend hook must still terminate the other 39 and name the one left."""
    ec2, world = aws
    config = make_config(world, count=40)
    calls: Counter[str] = Counter()
    providers = _counting_providers(calls)
    nodes = tuple(f"gpu-{i}" for i in range(1, 41))
    launched = providers(config, "aws").launch(LaunchRequest("c1", config.node_sets[0], nodes, "t"))
    by_node = {i.node: i.instance_id for i in launched.launched}
    assert len(by_node) == 40
    protected = by_node["gpu-17"]
    ec2.modify_instance_attribute(InstanceId=protected, DisableApiTermination={"Value": True})
    calls.clear()

    result = power.suspend(config, "gpu-[1-40]", providers=providers)

    states = _states(ec2)
    assert states[protected] == "running"
    assert all(states[iid] == "terminated" for node, iid in by_node.items() if node != "gpu-17")
    assert sorted(i.node or "" for i in result.terminated) == sorted(n for n in nodes
                                                                     if n != "gpu-17")
    assert len(result.errors) == 1
    assert protected in result.errors[0] and "gpu-17" in result.errors[0]
    assert "OperationNotPermitted" in result.errors[0]
    events = [e for e in read_events(config.log_dir) if e["action"] == "terminated"]
    assert sorted(str(e["node"]) for e in events) == sorted(n for n in nodes if n != "gpu-17")
    # the failed batch is halved down to the protected instance, not retried one by one:
    # 1 + 2 per level of a 40-id bisection (6 levels)
    assert calls["TerminateInstances"] <= 1 + 2 * 6


def test_a_pass_terminates_every_other_orphan_when_one_refuses(aws: tuple) -> None:
    ec2, world = aws
    config = make_config(world, count=12)
    calls: Counter[str] = Counter()
    providers = _counting_providers(calls)
    launched = providers(config, "aws").launch(
        LaunchRequest("c1", config.node_sets[0], tuple(f"gpu-{i}" for i in range(1, 13)), "t"))
    by_node = {i.node: i.instance_id for i in launched.launched}
    protected = by_node["gpu-5"]
    ec2.modify_instance_attribute(InstanceId=protected, DisableApiTermination={"Value": True})
    slurm = FakeSlurm()
    for name in config.all_nodes():  # every node powered down: all 12 instances are orphans
        slurm.add_node(name)

    result = Reconciler(config, slurm.client(), providers=providers, clock=lambda: LATER,
                        sleep=lambda s: None, expedite_wait_s=0).run_pass()

    states = _states(ec2)
    assert states[protected] == "running"
    assert all(states[iid] == "terminated" for node, iid in by_node.items() if node != "gpu-5")
    terminated = sorted(str(a["node"]) for a in result.actions if a["action"] == "terminated")
    assert terminated == sorted(n for n in by_node if n != "gpu-5")
    assert [e for e in result.errors if protected in e and "OperationNotPermitted" in e]


# -- GCE: one listing per pass whatever the orphans; concurrent deletes -------------------------
GPU_SET: dict[str, Any] = {"name": "gpu", "count": 100, "market": "on-demand",
                           "gcp": {"zones": ["us-central1-a"], "machine_type": "n1-standard-8",
                                   "image": "projects/debian-cloud/global/images/family/debian-12"}}


def _gce_instances(fake: FakeCompute, nodes: range) -> None:
    for i in nodes:
        fake.create("us-central1-a", f"demo-gpu-{i}",
                    {"labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu"}})


def test_a_gce_pass_lists_once_however_many_orphans(tmp_path: Path) -> None:
    with FakeCompute() as fake:
        _gce_instances(fake, range(1, 101))
        config = gcp_config(fake, [GPU_SET], log_dir=str(tmp_path), state_dir=str(tmp_path))
        slurm = FakeSlurm()
        for i in range(1, 101):  # 90 up, 10 powered down with an instance: orphans
            slurm.add_node(f"gpu-{i}", "IDLE+CLOUD" if i <= 90 else "IDLE+CLOUD+POWERED_DOWN",
                           addr=f"10.0.0.{i}")
        # the fake's addresses differ: match the 90 through their instance names instead
        for n in list(slurm.nodes.values())[:90]:
            n.hostname = n.addr = next(
                i["networkInterfaces"][0]["networkIP"] for i in fake.all_instances()
                if i["name"] == f"demo-{n.name}")
        fake.requests.clear()
        result = Reconciler(config, slurm.client(), clock=lambda: LATER, sleep=lambda s: None,
                            expedite_wait_s=0).run_pass()
        methods = Counter(r["method"] for r in fake.requests)
        terminated = sorted(str(a["node"]) for a in result.actions if a["action"] == "terminated")
        left = sorted(i["name"] for i in fake.all_instances())
    assert terminated == sorted(f"gpu-{i}" for i in range(91, 101))
    assert methods == Counter({"aggregatedList": 1, "delete": 10})  # not 1 + 10 listings
    assert left == sorted(f"demo-gpu-{i}" for i in range(1, 91))


def test_gce_suspend_deletes_concurrently(tmp_path: Path) -> None:
    with FakeCompute(latency_s=0.05) as fake:
        _gce_instances(fake, range(1, 41))
        config = gcp_config(fake, [GPU_SET], log_dir=str(tmp_path), state_dir=str(tmp_path))
        fake.requests.clear()
        result = power.suspend(config, "gpu-[1-40]")
        methods = Counter(r["method"] for r in fake.requests)
        in_flight = fake.max_in_flight
        left = fake.all_instances()
    assert len(result.terminated) == 40 and left == []
    assert methods == Counter({"aggregatedList": 1, "delete": 40})
    assert 1 < in_flight <= GcpProvider.__init__.__kwdefaults__["delete_workers"]


# -- Slurm: one scontrol per verdict and reason; expedites in one call ----------------------------
def test_reclaimed_nodes_are_updated_in_one_scontrol_per_state(tmp_path: Path) -> None:
    world = World(tmp_path)
    for i, name in enumerate(("spot-1", "spot-2", "spot-3"), start=1):
        world.slurm.add_node(name, "ALLOCATED+CLOUD", addr=f"10.0.0.{i}")
        world.slurm.add_job(i, [name])
        world.provider.add(name, 600, NOW, InstanceState.TERMINATED, ip=f"10.0.0.{i}",
                           reason="Server.SpotInstanceTermination")
    world.slurm.calls.clear()
    result = world.run()

    assert result.verdicts == {"reclaimed": 3, "ok": 1}
    assert [world.state(n) for n in ("spot-1", "spot-2", "spot-3")] == ["DOWN+CLOUD+POWER_DOWN"] * 3
    updates = _nodes_updates(world.slurm)
    assert [u[:3] for u in updates] == [["update", "nodename=spot-[1-3]", "state=DOWN"],
                                        ["update", "nodename=spot-[1-3]", "state=POWER_DOWN_FORCE"]]
    expedites = [c[1:] for c in world.slurm.calls if c[2:3] and c[2].startswith("jobid=")
                 and c[-1] == "StartTime=now"]
    assert expedites == [["update", "jobid=1,2,3", "StartTime=now"]]
    assert sorted(world.slurm.expedited) == [1, 2, 3]
    # every job read twice per pass, not per node: jobs that ended there, earlier comments
    reads = [c[1:] for c in world.slurm.calls if c[1:4] == ["-o", "show", "job"]]
    assert reads == [["-o", "show", "job"]] * 2
    assert [world.slurm.jobs[j].admin_comment.split(" (")[1] for j in (1, 2, 3)] == [
        "spot-1)", "spot-2)", "spot-3)"]


def test_a_node_slurm_refuses_does_not_stop_the_batch(tmp_path: Path) -> None:
    world = World(tmp_path)
    for i, name in enumerate(("spot-1", "spot-2", "spot-3"), start=1):
        world.slurm.add_node(name, "IDLE+CLOUD", addr=f"10.0.0.{i}")
        world.provider.add(name, 600, NOW, InstanceState.TERMINATED, ip=f"10.0.0.{i}",
                           reason="Server.SpotInstanceTermination")
    world.slurm.refuse["spot-2"] = "Invalid node state specified"
    result = world.run()
    assert world.state("spot-1") == world.state("spot-3") == "DOWN+CLOUD+POWER_DOWN"
    assert world.state("spot-2") == "IDLE+CLOUD"
    assert [e for e in result.errors if e.startswith("spot-2: reclaimed")]
    assert sorted(e["node"] for e in world.events("reclaimed")) == ["spot-1", "spot-3"]


# -- events --since reads the end of the file ----------------------------------------------------
def test_events_since_seeks_from_the_end(tmp_path: Path) -> None:
    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    lines = 20_000
    path = tmp_path / EVENTS_FILE
    with open(path, "w") as fh:  # one event a minute for ~2 weeks, as emit writes them
        for i in range(lines):
            fh.write(Event("launched", "resume", node=f"spot-{i % 64}", instance=f"i-{i:08d}",
                           time=(start + timedelta(minutes=i)).isoformat()).to_json() + "\n")
    emit(tmp_path, Event("orphan", "reconcile", node="spot-1",
                         time=(start + timedelta(minutes=lines - 30)).isoformat()))  # late writer
    since = start + timedelta(minutes=lines - 60)
    got = list(read_events(tmp_path, since))
    assert [e["instance"] for e in got[:2]] == [f"i-{lines - 60:08d}", f"i-{lines - 59:08d}"]
    assert len(got) == 61 and got[-1]["action"] == "orphan"
    with open(path, "rb") as fh:
        offset = start_offset(fh, since.timestamp() - 600)
        size = path.stat().st_size
    # read from about 70 events (the hour plus the 10 min of slack) before the end, not 20 000
    assert 0 < size - offset < 64 * 1024 + 2 * 70 * 250
