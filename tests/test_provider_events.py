"""A node lost without notice is handled when its provider says so, not at the next pass
(issue 26): EC2's EventBridge events through SQS (moto: the events are put through an
EventBridge rule whose target is the queue, as an admin sets it up from docs/admin.md) and
GCE's compute.instances.preempted operations (the fake Compute API, the real client).

Each test runs the reconciler's daemon loop with a 600 s interval: the second pass can only
come from the provider's event. What it shows is what an admin sees: the node DOWN and
powering down with a spot-interruption reason, its job requeued, the events in the file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.events import read_events
from slurm_spot.providers.aws.events import SqsEventSource, parse_message
from slurm_spot.providers.base import TAG_CLUSTER, TAG_NODE, TAG_NODE_SET, Provider
from slurm_spot.providers.events import EventSource, event_sources
from slurm_spot.reconcile.loop import ConfigSource, Loop
from slurm_spot.reconcile.reconciler import Reconciler
from tests.fakes.aws_harness import SESSION, Harness, moto_world
from tests.fakes.ec2 import REGION, World
from tests.fakes.fake_slurm import FakeSlurm
from tests.fakes.gce_api import FakeCompute, gcp_config

RULE_PATTERN = {"source": ["aws.ec2"], "detail-type": [
    "EC2 Spot Instance Interruption Warning", "EC2 Instance State-change Notification"]}
INTERVAL_S = 60.0  # a pass within seconds can only be an early one


class WhileWaiting:
    """An event source that first runs ``happen`` (what the provider does while the
    reconciler waits for its next pass), then reads ``source``."""

    def __init__(self, source: EventSource, happen: Any) -> None:
        self.provider = source.provider
        self.source = source
        self.happen = happen

    def receive(self, wait_s: float) -> list[Any]:
        if self.happen is not None:
            # in a thread of its own: the provider's doing, not the reconciler's (no slurm_spot
            # frame on its stack for tests/fakes/record_aws_calls.py to count)
            worker = threading.Thread(target=self.happen)
            worker.start()
            worker.join()
            self.happen = None
        return self.source.receive(wait_s)

    def close(self) -> None:
        self.source.close()


def run_loop(config: SpotConfig, slurm: FakeSlurm, providers: Any,
             sources: list[EventSource], passes: int = 2) -> float:
    """Run the daemon loop for ``passes`` passes; returns the seconds it took."""
    def make(cfg: SpotConfig) -> Reconciler:
        return Reconciler(cfg, slurm.client(), providers=providers, sleep=lambda s: None,
                          expedite_wait_s=0)

    loop = Loop(ConfigSource(config), make, events=lambda cfg: sources)  # no signals here
    started = time.monotonic()
    loop.run(max_passes=passes)
    return time.monotonic() - started


# -- EC2: EventBridge -> SQS ---------------------------------------------------------------
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with moto_world(monkeypatch) as (ec2, world):
        sqs = boto3.client("sqs", region_name=REGION)
        bridge = boto3.client("events", region_name=REGION)
        url = sqs.create_queue(QueueName="slurm-spot-events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        bridge.put_rule(Name="slurm-spot-ec2", EventPattern=json.dumps(RULE_PATTERN))
        bridge.put_targets(Rule="slurm-spot-ec2", Targets=[{"Id": "queue", "Arn": arn}])
        yield {"ec2": ec2, "world": world, "bridge": bridge, "sqs": sqs, "url": url,
               "config": aws_config(world, url, tmp_path)}


def aws_config(world: World, url: str, tmp_path: Path) -> SpotConfig:
    return parse_config({
        "cluster": "c1", "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "providers": {"aws": {"type": "aws", "region": REGION, "events_queue_url": url}},
        "node_sets": [{"name": "gpu", "provider": "aws", "count": 8,
                       "instance_types": ["g5.xlarge"],
                       "aws": {"launch_template": world.template_name, "subnets": world.subnets}}],
        "partitions": [{"name": "gpu", "node_sets": ["gpu"]}],
        "reconcile": {"interval_s": INTERVAL_S, "events_poll_s": 1, "missing_grace_s": 0},
    })


def ec2_event(bridge: Any, detail_type: str, detail: dict[str, str]) -> None:
    """What EC2 publishes to EventBridge (the default bus); the rule puts it in the queue."""
    answer = bridge.put_events(Entries=[{
        "Source": "aws.ec2", "DetailType": detail_type, "Detail": json.dumps(detail),
        "Resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{detail['instance-id']}"]}])
    assert answer["FailedEntryCount"] == 0


def one_running_job(config: SpotConfig) -> tuple[FakeSlurm, Harness, str]:
    """gpu-1 up with job 7 on a launched EC2 instance; returns the fake Slurm, the provider
    harness and the instance id."""
    harness = Harness(config)
    (instance,) = harness.launch("gpu-1").launched
    slurm = FakeSlurm()
    slurm.add_node("gpu-1", "ALLOCATED+CLOUD", addr=instance.private_ip or "")
    slurm.add_job(7, ["gpu-1"])
    return slurm, harness, instance.instance_id


def aws_providers(harness: Harness) -> Any:
    def providers(cfg: SpotConfig, name: str) -> Provider:
        return harness.provider
    return providers


def test_an_ec2_state_change_event_powers_the_node_down_and_requeues_at_once(
        aws: dict[str, Any]) -> None:
    config = aws["config"]
    slurm, harness, instance = one_running_job(config)

    def reclaim() -> None:  # after the first pass, with no notice seen on the node
        aws["ec2"].terminate_instances(InstanceIds=[instance])
        ec2_event(aws["bridge"], "EC2 Instance State-change Notification",
                  {"instance-id": instance, "state": "shutting-down"})

    source = SqsEventSource("aws", config.providers["aws"], session=SESSION)
    took = run_loop(config, slurm, aws_providers(harness), [WhileWaiting(source, reclaim)])

    assert took < 30  # two passes: the second started by the event, not the 60 s interval
    node = slurm.nodes["gpu-1"]
    assert node.state == "DOWN+CLOUD+POWER_DOWN" and node.reason.startswith(
        "spot-interruption:reclaimed@")
    job = slurm.jobs[7]
    assert (job.state, job.restarts) == ("PENDING", 1)  # requeued once
    assert 7 in slurm.expedited
    (reclaimed,) = [e for e in read_events(config.log_dir) if e["action"] == "reclaimed"]
    assert reclaimed["node"] == "gpu-1" and reclaimed["extra"]["detected_by"] == "provider event"
    (news,) = [e for e in read_events(config.log_dir) if e["action"] == "provider_event"]
    assert news["instance"] == instance and news["extra"]["state"] == "stopping"
    assert "Messages" not in aws["sqs"].receive_message(QueueUrl=aws["url"])  # deleted


def test_an_event_ahead_of_the_listing_is_believed(aws: dict[str, Any]) -> None:
    """DescribeInstances may show an instance running for a while after EC2 began to take it
    back: the event decides. The warning alone powers nothing down (the node's watcher acts
    on it, docs/DESIGN.md flow 3); the state change that follows does, as a spot interruption."""
    config = aws["config"]
    slurm, harness, instance = one_running_job(config)
    source = SqsEventSource("aws", config.providers["aws"], session=SESSION)
    warn = WhileWaiting(source, lambda: ec2_event(
        aws["bridge"], "EC2 Spot Instance Interruption Warning",
        {"instance-id": instance, "instance-action": "terminate"}))
    assert run_loop(config, slurm, aws_providers(harness), [warn]) < 30
    assert slurm.nodes["gpu-1"].state == "ALLOCATED+CLOUD" and slurm.jobs[7].state == "RUNNING"
    (warning,) = [e for e in read_events(config.log_dir) if e["action"] == "provider_event"]
    assert warning["extra"]["kind"] == "interruption-warning"

    stop = WhileWaiting(source, lambda: ec2_event(
        aws["bridge"], "EC2 Instance State-change Notification",
        {"instance-id": instance, "state": "shutting-down"}))  # moto still says running
    assert run_loop(config, slurm, aws_providers(harness), [stop]) < 30
    assert slurm.nodes["gpu-1"].state == "DOWN+CLOUD+POWER_DOWN"
    assert (slurm.jobs[7].state, slurm.jobs[7].restarts) == ("PENDING", 1)
    (reclaimed,) = [e for e in read_events(config.log_dir) if e["action"] == "reclaimed"]
    assert reclaimed["extra"]["instance_state"] == (
        "state-change: shutting-down after a spot interruption warning")


def test_events_about_other_instances_start_no_pass(aws: dict[str, Any]) -> None:
    config = aws["config"]
    slurm, harness, _ = one_running_job(config)
    ec2_event(aws["bridge"], "EC2 Instance State-change Notification",
              {"instance-id": "i-0someoneelse0000", "state": "terminated"})
    source = SqsEventSource("aws", config.providers["aws"], session=SESSION)
    loop_config = config.model_copy(update={"reconcile": config.reconcile.model_copy(
        update={"interval_s": 3.0})})
    assert run_loop(loop_config, slurm, aws_providers(harness), [source]) >= 3  # waited it out
    assert slurm.nodes["gpu-1"].state == "ALLOCATED+CLOUD"


def test_event_sources_follow_the_config(aws: dict[str, Any]) -> None:
    config = aws["config"]
    (source,) = event_sources(config)
    assert isinstance(source, SqsEventSource) and source.queue_url == aws["url"]
    source.close()
    settings = config.providers["aws"].model_copy(update={"events_queue_url": None})
    assert event_sources(config.model_copy(update={"providers": {"aws": settings}})) == []


@pytest.mark.parametrize("body", ["not json", "{}", json.dumps({"source": "aws.ec2"}),
                                  json.dumps({"source": "aws.ec2", "detail-type": "Other",
                                              "detail": {"instance-id": "i-1"}}),
                                  *(json.dumps({"source": "aws.ec2",
                                                "detail-type": "EC2 Instance State-change "
                                                "Notification",
                                                "detail": {"instance-id": "i-1", "state": state}})
                                    for state in ("odd", "pending", "running"))])
def test_messages_that_are_no_news_of_an_end_are_ignored(body: str) -> None:
    assert parse_message("aws", body) is None


def test_a_bad_events_queue_url_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    from slurm_spot.config import load_config
    from slurm_spot.errors import ConfigError

    path = tmp_path / "spot.yaml"
    path.write_text("cluster: c1\nproviders:\n  aws: {type: aws, region: us-east-1,\n"
                    "        events_queue_url: 'sqs my queue'}\nnode_sets:\n"
                    "  - {name: gpu, provider: aws, count: 1, aws: {launch_template: lt,"
                    " subnets: [subnet-1]}}\npartitions: [{name: p, node_sets: [gpu]}]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "line 4: providers.aws.events_queue_url" in str(err.value)


# -- GCE: compute.instances.preempted operations -------------------------------------------
GCE_SET = {"name": "gpu", "count": 4, "market": "spot",
           "gcp": {"zones": ["us-central1-a"], "machine_type": "n1-standard-8"}}


@pytest.mark.parametrize("listed_as", ["STOPPING", "RUNNING"])
def test_a_gce_preemption_operation_powers_the_node_down_and_requeues_at_once(
        tmp_path: Path, listed_as: str) -> None:
    with FakeCompute() as fake:
        fake.create("us-central1-a", "demo-gpu-1", {"labels": {
            TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu", TAG_NODE: "gpu-1"}})
        config = gcp_config(fake, [GCE_SET], log_dir=str(tmp_path / "log"),
                            state_dir=str(tmp_path / "state"),
                            reconcile={"interval_s": INTERVAL_S, "events_poll_s": 1,
                                       "missing_grace_s": 0})
        ip = fake.all_instances()[0]["networkInterfaces"][0]["networkIP"]
        slurm = FakeSlurm()
        slurm.add_node("gpu-1", "ALLOCATED+CLOUD", addr=ip)
        slurm.add_job(9, ["gpu-1"])
        (source,) = event_sources(config)  # on by default
        # an older preemption in the zone (before the reconciler started) is not news
        fake.create("us-central1-a", "demo-gpu-2", {"labels": {TAG_CLUSTER: "demo"}})
        old = fake.preempt("us-central1-a", "demo-gpu-2", status="TERMINATED")
        old["insertTime"] = "2026-01-01T00:00:00.000+00:00"
        from slurm_spot.providers import get_provider

        took = run_loop(config, slurm, get_provider, [WhileWaiting(source, lambda: fake.preempt(
            "us-central1-a", "demo-gpu-1", status=listed_as))])
        listed = [r for r in fake.requests if r["method"] == "listOperations"]
    assert took < 30
    node = slurm.nodes["gpu-1"]
    assert node.state == "DOWN+CLOUD+POWER_DOWN" and node.reason.startswith(
        "spot-interruption:reclaimed@")
    assert (slurm.jobs[9].state, slurm.jobs[9].restarts) == ("PENDING", 1)
    assert listed and all('operationType="compute.instances.preempted"' in r["query"]["filter"]
                          for r in listed)
    events = list(read_events(config.log_dir))
    (news,) = [e for e in events if e["action"] == "provider_event"]
    assert news["instance"] == "demo-gpu-1" and news["extra"]["kind"] == "preempted"
    reclaimed = [e for e in events if e["action"] == "reclaimed"]
    assert len(reclaimed) == 1, [e["action"] for e in events]
    # RUNNING: the listing lags; the event alone says the instance is gone
    assert reclaimed[0]["extra"]["detected_by"] == "provider event"


def test_gce_preemption_events_can_be_turned_off(tmp_path: Path) -> None:
    with FakeCompute() as fake:
        config = gcp_config(fake, [GCE_SET], log_dir=str(tmp_path), state_dir=str(tmp_path))
        settings = config.providers["gcp"].model_copy(update={"preemption_events": False})
        assert event_sources(config.model_copy(update={"providers": {"gcp": settings}})) == []


def test_a_stop_during_a_long_poll_ends_the_daemon_within_one_poll_step(tmp_path: Path) -> None:
    """systemd's stop waits at most reconcile.events_poll_s for a receive under way."""
    from tests.test_reconcile_rules import World as RulesWorld

    world = RulesWorld(tmp_path, interval_s=INTERVAL_S, events_poll_s=1)
    received: list[float] = []

    class SlowQueue:  # an SQS long poll with nothing to say: takes all the time it may
        provider = "local"

        def receive(self, wait_s: float) -> list[Any]:
            received.append(wait_s)
            time.sleep(wait_s)
            return []

        def close(self) -> None:
            pass

    loop = Loop(ConfigSource(world.config), lambda cfg: world.reconciler,
                events=lambda cfg: [SlowQueue()])
    threading.Timer(0.5, loop.stop.set).start()
    started = time.monotonic()
    loop.run()
    assert time.monotonic() - started < 3
    assert received and max(received) <= 1.0
