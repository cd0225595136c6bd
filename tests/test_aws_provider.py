"""The aws provider against moto (in-process): what a user would find in EC2 and in the result.

Capacity, quota and price behaviour comes from tests/fakes/ec2.py (FleetMarket), which makes
moto's CreateFleet answer like EC2 does; every assertion looks at instances and tags in moto,
at the LaunchResult, or at the requests the provider sent.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason

from slurm_spot.config import AwsProviderConfig
from slurm_spot.errors import ProviderError
from slurm_spot.providers import get_provider
from slurm_spot.providers.aws.fleet import TAG_LAUNCH, TAG_NODE_MAPPED
from slurm_spot.providers.aws.provider import AwsProvider
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_MARKET,
    TAG_NODE,
    TAG_NODE_SET,
    ErrorClass,
    InstanceState,
    LaunchRequest,
    Provider,
)
from tests.fakes.aws_harness import NOW, Harness, make_config, moto_world, nodes_in_ec2, tags_of
from tests.fakes.ec2 import AWS_ENV, REGION, World, canned, count_requests, xml_error


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    with moto_world(monkeypatch) as world:
        yield world


# ---- launch ---------------------------------------------------------------------------------
def test_launch_is_one_fleet_call_and_tags_every_instance(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    result = h.launch("gpu-1", "gpu-2", "gpu-3")

    assert h.calls["CreateFleet"] == 1
    assert sorted(i.node or "" for i in result.launched) == ["gpu-1", "gpu-2", "gpu-3"]
    assert result.failed == ()
    for inst in result.launched:
        assert inst.private_ip and inst.hostname and inst.hostname.startswith("ip-")
        assert inst.market == "spot" and inst.state.is_alive and inst.zone.startswith(REGION)
    tags = tags_of(ec2)
    assert len(tags) == 3
    for t in tags.values():
        assert t[TAG_CLUSTER] == "c1" and t[TAG_NODE_SET] == "gpu" and t[TAG_MARKET] == "spot"
        assert t[TAG_NODE_MAPPED] == "1" and t[TAG_LAUNCH].startswith("slurm-spot-")
    assert nodes_in_ec2(ec2) == ["gpu-1", "gpu-2", "gpu-3"]
    sent = h.market.requests[0]
    assert sent["Type"] == "instant"
    assert sent["TargetCapacitySpecification"] == {
        "TotalTargetCapacity": 3, "DefaultTargetCapacityType": "spot"}
    assert sent["SpotOptions"]["AllocationStrategy"] == "price-capacity-optimized"
    overrides = sent["LaunchTemplateConfigs"][0]["Overrides"]
    assert [(o["InstanceType"], o["SubnetId"]) for o in overrides] == [
        (t, s) for t in ("g5.xlarge", "g6.xlarge") for s in world.subnets]
    assert sent["ClientToken"] == tags[result.launched[0].instance_id][TAG_LAUNCH]


def test_listing_shows_what_launch_returned(aws):
    _, world = aws
    h = Harness(make_config(world))
    launched = h.launch("gpu-1", "gpu-7").launched
    listed = h.provider.list_instances()
    assert [(i.instance_id, i.node, i.private_ip) for i in listed] == [
        (i.instance_id, i.node, i.private_ip) for i in launched]
    assert listed[0].to_json()["node"] == "gpu-1"


def test_rerun_launches_nothing_new(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    first = h.launch("gpu-1", "gpu-2")
    h.calls.clear()
    again = h.launch("gpu-2", "gpu-1")
    assert dict(h.calls) == {"DescribeInstances": 1}
    assert again.api_calls == 1
    assert {i.instance_id for i in again.launched} == {i.instance_id for i in first.launched}
    assert len(tags_of(ec2)) == 2


def test_rerun_with_more_nodes_launches_only_the_missing(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    h.launch("gpu-1", "gpu-2")
    result = h.launch("gpu-1", "gpu-2", "gpu-3", "gpu-4")
    assert h.market.requests[-1]["TargetCapacitySpecification"]["TotalTargetCapacity"] == 2
    assert len(result.launched) == 4
    assert nodes_in_ec2(ec2) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]


def test_unfinished_launch_is_adopted_not_repeated(aws):
    """A hook killed after CreateFleet but before the mapping tags: the re-run (same token)
    adopts those instances instead of launching again."""
    ec2, world = aws
    h = Harness(make_config(world))
    first = h.launch("gpu-1", "gpu-2")
    ids = [i.instance_id for i in first.launched]
    ec2.delete_tags(Resources=ids, Tags=[{"Key": TAG_NODE_MAPPED}])
    assert h.provider.list_instances()[0].node is None  # not mapped: an orphan candidate
    fleet_calls = h.calls["CreateFleet"]
    again = h.launch("gpu-1", "gpu-2")
    assert h.calls["CreateFleet"] == fleet_calls
    assert sorted(i.instance_id for i in again.launched) == sorted(ids)
    assert nodes_in_ec2(ec2) == ["gpu-1", "gpu-2"]


def test_on_demand_node_set(aws):
    ec2, world = aws
    h = Harness(make_config(world, market="on-demand"))
    result = h.launch("gpu-1")
    assert result.launched[0].market == "on-demand"
    sent = h.market.requests[0]
    assert sent["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert "SpotOptions" not in sent
    assert next(iter(tags_of(ec2).values()))[TAG_MARKET] == "on-demand"


def test_launch_template_by_id_and_max_price(aws):
    _, world = aws
    h = Harness(make_config(world, aws={"launch_template": world.template_id,
                                        "max_price_usd_per_hour": 1.25}))
    assert h.launch("gpu-1").failed == ()
    config = h.market.requests[0]["LaunchTemplateConfigs"][0]
    assert config["LaunchTemplateSpecification"] == {
        "LaunchTemplateId": world.template_id, "Version": "$Default"}
    assert {o["MaxPrice"] for o in config["Overrides"]} == {"1.25"}


# ---- capacity ---------------------------------------------------------------------------------
def test_capacity_on_first_type_falls_over_to_the_next_in_the_same_call(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    h.market.fail_pools(instance_type="g5.xlarge", market="spot")
    result = h.launch("gpu-1", "gpu-2")
    assert h.calls["CreateFleet"] == 1
    assert {i.instance_type for i in result.launched} == {"g6.xlarge"}
    assert result.failed == ()
    assert nodes_in_ec2(ec2) == ["gpu-1", "gpu-2"]


def test_no_spot_capacity_falls_back_to_on_demand(aws):
    ec2, world = aws
    h = Harness(make_config(world, fallback="on-demand"))
    h.market.fail_pools(market="spot")
    result = h.launch("gpu-1", "gpu-2", "gpu-3")
    assert h.calls["CreateFleet"] == 2
    assert [r["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
            for r in h.market.requests] == ["spot", "on-demand"]
    assert {i.market for i in result.launched} == {"on-demand"}
    assert result.failed == ()
    assert sorted(result.failed_pools) == sorted(
        f"{t}/{z}/spot" for t in ("g5.xlarge", "g6.xlarge") for z in ("us-east-1a", "us-east-1b"))
    assert {t[TAG_MARKET] for t in tags_of(ec2).values()} == {"on-demand"}


def test_spot_capacity_for_some_nodes_then_on_demand_for_the_rest(aws):
    _, world = aws
    h = Harness(make_config(world, fallback="on-demand"))
    h.market.capacity["spot"] = 2
    result = h.launch(*(f"gpu-{i}" for i in range(1, 6)))
    markets = sorted(i.market for i in result.launched)
    assert markets == ["on-demand"] * 3 + ["spot"] * 2
    assert h.market.requests[1]["TargetCapacitySpecification"]["TotalTargetCapacity"] == 3


def test_no_capacity_anywhere_fails_the_nodes_with_a_code_reason(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    h.market.fail_pools()
    result = h.launch("gpu-1", "gpu-2")
    assert result.launched == ()
    (failure,) = result.failed
    assert failure.nodes == ("gpu-1", "gpu-2")
    assert failure.error_class is ErrorClass.CAPACITY
    assert failure.reason.startswith("(Code:InsufficientInstanceCapacity)capacity: no spot")
    assert failure.pool.endswith("/spot")
    assert len(result.failed_pools) == 4
    assert tags_of(ec2) == {}


# ---- retries ----------------------------------------------------------------------------------
def test_throttling_retries_the_same_request_with_jittered_backoff(aws):
    _, world = aws
    h = Harness(make_config(world))
    h.market.fail_next(503, "RequestLimitExceeded", times=2)
    result = h.launch("gpu-1")
    assert len(result.launched) == 1
    assert h.calls["CreateFleet"] == 3
    assert len({r["ClientToken"] for r in h.market.requests}) == 1
    assert len(h.sleeps) == 2 and all(0 <= s <= 10 for s in h.sleeps)


def test_throttling_is_bounded(aws):
    _, world = aws
    h = Harness(make_config(world))
    h.market.fail_next(503, "RequestLimitExceeded", times=20)
    result = h.launch("gpu-1")
    assert h.calls["CreateFleet"] == 5
    (failure,) = result.failed
    assert failure.error_class is ErrorClass.THROTTLE
    assert failure.reason.startswith("(Code:RequestLimitExceeded)")


def test_botocore_does_not_repeat_an_http_500_capacity_error(aws):
    _, world = aws
    h = Harness(make_config(world))
    h.market.fail_next(500, "InsufficientInstanceCapacity")
    result = h.launch("gpu-1")
    assert h.calls["CreateFleet"] == 1
    assert result.failed[0].code == "InsufficientInstanceCapacity"
    assert h.sleeps == []


def test_unknown_error_looks_up_by_tag_before_retrying(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    order: list[str] = []
    count_requests(h.provider.client, h.provider.launch_client, order=order)
    h.market.fail_next(500, "InternalError")
    result = h.launch("gpu-1")
    assert order[:4] == ["DescribeInstances", "CreateFleet", "DescribeInstances", "CreateFleet"]
    assert h.market.requests[0]["ClientToken"] == h.market.requests[1]["ClientToken"]
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert len(tags_of(ec2)) == 1


def test_unknown_error_after_ec2_launched_adopts_instead_of_duplicating(aws):
    """The answer to CreateFleet is lost (HTTP 500) although EC2 did launch: the lookup by
    launch tag finds the instance and no second CreateFleet is sent."""
    ec2, world = aws
    h = Harness(make_config(world))
    side = boto3.client("ec2", region_name=REGION)

    def launched_then_lost(model: Any, **_: Any) -> Any:
        if len(h.market.requests) == 1:
            side.create_fleet(**h.market.requests[0])
            return canned(model, 500, xml_error(500, "InternalError", "Internal error."))
        return None

    h.provider.launch_client.meta.events.register_first(
        "before-call.ec2.CreateFleet", launched_then_lost)
    result = h.launch("gpu-1")
    assert h.calls["CreateFleet"] == 1
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert len(tags_of(ec2)) == 1 and nodes_in_ec2(ec2) == ["gpu-1"]


def test_instances_that_cannot_be_mapped_are_terminated_at_once(aws):
    ec2, world = aws
    h = Harness(make_config(world))

    def tagging_fails(model: Any, **_: Any) -> Any:
        return canned(model, 500, xml_error(500, "InternalError", "Internal error."))

    h.provider.client.meta.events.register_first("before-call.ec2.CreateTags", tagging_fails)
    result = h.launch("gpu-1", "gpu-2")
    assert result.launched == ()
    (failure,) = result.failed
    assert failure.nodes == ("gpu-1", "gpu-2") and failure.error_class is ErrorClass.UNKNOWN
    assert failure.reason.startswith("(Code:InternalError)unknown: node mapping tags failed")
    assert tags_of(ec2) == {} and len(tags_of(ec2, "terminated")) == 2


def test_refused_credentials_raise_before_anything_is_launched(aws):
    _, world = aws
    h = Harness(make_config(world))
    h.market.fail_next(403, "UnauthorizedOperation", message="You are not authorized.")
    with pytest.raises(ProviderError) as err:
        h.launch("gpu-1")
    assert err.value.code == "UnauthorizedOperation" and err.value.error_class == "auth"


def test_stop_interruption_behaviour_fails_without_calling_create_fleet(aws):
    _, world = aws
    h = Harness(make_config(world, aws={"interruption_behavior": "stop"}))
    result = h.launch("gpu-1")
    assert h.calls["CreateFleet"] == 0
    assert result.failed[0].error_class is ErrorClass.CONFIG
    assert "instant" in result.failed[0].reason


# ---- terminate and list -----------------------------------------------------------------------
def test_terminate_kills_duplicates_and_is_idempotent(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    h.launch("gpu-1", "gpu-2", "gpu-3")
    duplicate = ec2.run_instances(
        ImageId="ami-0123456789abcdef0", MinCount=1, MaxCount=1, SubnetId=world.subnets[0],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": TAG_CLUSTER, "Value": "c1"}, {"Key": TAG_NODE_SET, "Value": "gpu"},
            {"Key": TAG_NODE, "Value": "gpu-1"}]}])["Instances"][0]["InstanceId"]
    gone = h.provider.terminate(["gpu-1", "gpu-2", "nope-1"])
    assert sorted(i.node or "" for i in gone) == ["gpu-1", "gpu-1", "gpu-2"]
    assert duplicate in {i.instance_id for i in gone}
    assert nodes_in_ec2(ec2) == ["gpu-3"]
    assert h.provider.terminate(["gpu-1", "gpu-2"]) == []


def test_terminate_instances_skips_unknown_ids(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    (inst,) = h.launch("gpu-1").launched
    h.provider.terminate_instances([inst.instance_id, "i-0000000000000dead"])
    assert tags_of(ec2) == {}
    h.provider.terminate_instances([inst.instance_id])  # already gone: fine


def test_reclaimed_spot_instance_is_listed_with_its_reason(aws):
    _, world = aws
    h = Harness(make_config(world))
    (inst,) = h.launch("gpu-4").launched
    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    moto_inst = backend.get_instance(inst.instance_id)
    moto_inst.terminate()
    moto_inst.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination")
    (listed,) = h.provider.list_instances()
    assert listed.node == "gpu-4" and listed.state is InstanceState.TERMINATED
    assert listed.state_reason == "Server.SpotInstanceTermination" and listed.was_reclaimed
    assert listed.market == "spot"


def test_get_provider_builds_an_aws_provider(aws):
    _, world = aws
    config = make_config(world)
    provider = get_provider(config, "aws")
    assert isinstance(provider, AwsProvider) and isinstance(provider, Provider)
    assert provider.list_instances() == []


def test_endpoint_from_config_then_environment(aws, monkeypatch):
    _, world = aws
    config = make_config(world)
    settings = config.providers["aws"]
    assert isinstance(settings, AwsProviderConfig)
    private = settings.model_copy(update={"endpoint_url": "http://127.0.0.1:5999"})
    assert AwsProvider(config, "aws", private).client.meta.endpoint_url == "http://127.0.0.1:5999"
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:5998")
    provider = AwsProvider(config, "aws", settings)
    assert provider.client.meta.endpoint_url == "http://127.0.0.1:5998"
    assert provider.launch_client.meta.config.retries["total_max_attempts"] == 1


def test_importing_the_provider_does_not_import_boto3():
    code = ("import sys, slurm_spot.providers.aws.provider, slurm_spot.providers.aws.checks, "
            "slurm_spot.providers.aws.catalog, slurm_spot.providers.aws.notices; "
            "print('boto3' in sys.modules, 'botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# ---- scale -------------------------------------------------------------------------------------
def test_200_nodes_in_moto_take_a_handful_of_calls(aws):
    ec2, world = aws
    h = Harness(make_config(world))
    nodes = [f"gpu-{i}" for i in range(1, 201)]
    result = h.launch(*nodes)
    assert len(result.launched) == 200 and result.failed == ()
    # lookup, CreateFleet, describe by launch tag, 8 index bits + the mapped mark
    assert dict(h.calls) == {"DescribeInstances": 2, "CreateFleet": 1, "CreateTags": 9}
    assert result.api_calls == 12
    assert nodes_in_ec2(ec2) == sorted(nodes)


def test_1000_nodes_take_a_handful_of_calls(monkeypatch):
    """The exact request sequence for 1000 nodes of one node set, with botocore's Stubber
    (moto is too slow at this size for a unit test; benchmarks/aws_launch_calls.py runs it on
    moto): 14 calls, whatever the instance count up to 1000."""
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    world = World(["subnet-aaaaaaaa", "subnet-bbbbbbbb"], {}, "lt-0123456789abcdef0")
    config = make_config(world)
    settings = config.providers["aws"]
    assert settings.type == "aws"
    provider = AwsProvider(config, "aws", settings, sleep=lambda s: None, now=lambda: NOW)
    ids = [f"i-{n:017x}" for n in range(1, 1001)]
    nodes = [f"gpu-{n}" for n in range(1, 1001)]
    general, launch = Stubber(provider.client), Stubber(provider.launch_client)
    general.add_response("describe_instances", {"Reservations": []})
    launch.add_response("create_fleet", {"FleetId": "fleet-1", "Instances": [{
        "InstanceIds": ids, "InstanceType": "g5.xlarge", "Lifecycle": "spot",
        "LaunchTemplateAndOverrides": {"Overrides": {
            "InstanceType": "g5.xlarge", "SubnetId": world.subnets[0]}}}]},
        {"Type": "instant", "ClientToken": ANY, "LaunchTemplateConfigs": ANY,
         "TargetCapacitySpecification": {"TotalTargetCapacity": 1000,
                                         "DefaultTargetCapacityType": "spot"},
         "SpotOptions": ANY, "TagSpecifications": ANY})
    general.add_response("describe_instances", {"Reservations": [{"Instances": [
        {"InstanceId": i, "State": {"Name": "pending"}, "PrivateDnsName": f"ip-{n}.ec2.internal",
         "PrivateIpAddress": f"10.1.{n // 250}.{n % 250}", "InstanceType": "g5.xlarge",
         "InstanceLifecycle": "spot", "Placement": {"AvailabilityZone": "us-east-1a"}}
        for n, i in enumerate(ids)]}]})
    for bit in range(10):
        subset = [i for n, i in enumerate(ids, start=1) if n >> bit & 1]
        general.add_response("create_tags", {}, {
            "Resources": subset, "Tags": [{"Key": f"slurm-spot-node-bit{bit}", "Value": "1"}]})
    general.add_response("create_tags", {}, {
        "Resources": sorted(ids), "Tags": [{"Key": TAG_NODE_MAPPED, "Value": "1"}]})
    with general, launch:
        result = provider.launch(LaunchRequest("c1", config.node_sets[0], tuple(nodes), "t"))
        general.assert_no_pending_responses()
        launch.assert_no_pending_responses()
    assert result.api_calls == 14
    assert {i.instance_id: i.node for i in result.launched} == dict(zip(ids, nodes, strict=True))
