"""The pure builders of the aws provider against expected dicts: CreateFleet parameters, tags,
client tokens, node mapping tags, and DescribeInstances records -> Instance."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from slurm_spot.providers.aws.fleet import (
    MAX_FLEET_TARGET,
    TAG_LAUNCH,
    TAG_NODE_MAPPED,
    FleetSpec,
    Pool,
    build_create_fleet_params,
    client_token,
    decode_node,
    fleet_instance_ids,
    format_price,
    instance_from_ec2,
    instance_tags,
    launch_template_spec,
    node_index,
    node_mapping_calls,
)
from slurm_spot.providers.base import TAG_CLUSTER, TAG_MARKET, TAG_NODE, TAG_NODE_SET, InstanceState

POOLS = (
    Pool("g5.xlarge", "subnet-a"), Pool("g5.xlarge", "subnet-b"), Pool("g6.xlarge", "subnet-a"),
)


def test_spot_fleet_params():
    spec = FleetSpec("gpu-template", "$Default", POOLS, "spot", 5, "capacity-optimized", 0.5)
    params = build_create_fleet_params(spec, [("k", "v")], "tok-1")
    assert params == {
        "Type": "instant",
        "ClientToken": "tok-1",
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {
                "LaunchTemplateName": "gpu-template", "Version": "$Default"},
            "Overrides": [
                {"InstanceType": "g5.xlarge", "SubnetId": "subnet-a", "MaxPrice": "0.5"},
                {"InstanceType": "g5.xlarge", "SubnetId": "subnet-b", "MaxPrice": "0.5"},
                {"InstanceType": "g6.xlarge", "SubnetId": "subnet-a", "MaxPrice": "0.5"},
            ],
        }],
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": 5, "DefaultTargetCapacityType": "spot"},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}],
        "SpotOptions": {"AllocationStrategy": "capacity-optimized",
                        "InstanceInterruptionBehavior": "terminate"},
    }


def test_on_demand_fleet_params_have_no_spot_price():
    spec = FleetSpec("lt-0123456789abcdef0", "3", POOLS[:1], "on-demand", 1,
                     max_price_usd_per_hour=2.0)
    params = build_create_fleet_params(spec, [], "tok")
    assert params["LaunchTemplateConfigs"][0] == {
        "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-0123456789abcdef0", "Version": "3"},
        "Overrides": [{"InstanceType": "g5.xlarge", "SubnetId": "subnet-a"}],
    }
    assert params["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert "SpotOptions" not in params


@pytest.mark.parametrize("count", [0, MAX_FLEET_TARGET + 1])
def test_fleet_size_is_bounded(count):
    with pytest.raises(ValueError, match="count must be"):
        build_create_fleet_params(FleetSpec("t", "1", POOLS, "spot", count), [], "x")


def test_launch_template_by_name_or_id():
    assert launch_template_spec("lt-0abc12345678def90", "1") == {
        "LaunchTemplateId": "lt-0abc12345678def90", "Version": "1"}
    assert launch_template_spec("lt-gpu-nodes", "1") == {
        "LaunchTemplateName": "lt-gpu-nodes", "Version": "1"}


@pytest.mark.parametrize(
    "price, text", [(0.5, "0.5"), (1.0, "1"), (0.0012, "0.0012"), (12.25, "12.25")])
def test_prices_are_plain_decimals(price, text):
    assert format_price(price) == text


def test_instance_tags():
    assert dict(instance_tags("c1", "gpu", "spot", "tok")) == {
        TAG_CLUSTER: "c1", TAG_NODE_SET: "gpu", TAG_MARKET: "spot", TAG_LAUNCH: "tok",
        "Name": "c1-gpu (slurm-spot)"}


def test_client_token_is_stable_and_specific():
    spec = FleetSpec("t", "1", POOLS, "spot", 2)
    token = client_token(spec, "c1|gpu|gpu-1,gpu-2")
    assert token == client_token(FleetSpec("t", "1", POOLS, "spot", 2), "c1|gpu|gpu-1,gpu-2")
    assert token.startswith("slurm-spot-") and len(token) <= 64 and token.isascii()
    others = {
        client_token(FleetSpec("t", "1", POOLS, "on-demand", 2), "c1|gpu|gpu-1,gpu-2"),
        client_token(FleetSpec("t", "1", POOLS[1:], "spot", 2), "c1|gpu|gpu-1,gpu-2"),
        client_token(spec, "c1|gpu|gpu-1,gpu-3"),
        client_token(spec, "c1|gpu|gpu-1,gpu-2", generation=1),
    }
    assert token not in others and len(others) == 4


def test_fleet_instance_ids():
    response = {"Instances": [
        {"InstanceIds": ["i-1", "i-2"], "InstanceType": "g5.xlarge", "Lifecycle": "spot",
         "LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "g5.xlarge",
                                                      "SubnetId": "subnet-a"}}},
        {"InstanceIds": ["i-3"], "InstanceType": "g6.xlarge", "Lifecycle": "on-demand"},
    ]}
    assert fleet_instance_ids(response) == [
        ("i-1", "g5.xlarge", "subnet-a", "spot"), ("i-2", "g5.xlarge", "subnet-a", "spot"),
        ("i-3", "g6.xlarge", "", "on-demand")]
    assert fleet_instance_ids({}) == []


def test_node_index():
    assert node_index("gpu-12", "gpu") == 12
    assert node_index("big-gpu-3", "big-gpu") == 3
    for bad in ("gpu-0", "gpu-01", "gpu-x", "cpu-1", "gpu-"):
        with pytest.raises(ValueError):
            node_index(bad, "gpu")


def test_node_mapping_calls_for_three_nodes():
    assert node_mapping_calls({"i-b": 1, "i-a": 2, "i-c": 3}) == [
        (["i-b", "i-c"], [("slurm-spot-node-bit0", "1")]),
        (["i-a", "i-c"], [("slurm-spot-node-bit1", "1")]),
        (["i-a", "i-b", "i-c"], [(TAG_NODE_MAPPED, "1")]),
    ]


def test_node_mapping_round_trips_and_is_logarithmic():
    rng = random.Random(7)
    indices = rng.sample(range(1, 10001), 2500)
    assignment = {f"i-{n:08x}": index for n, index in enumerate(indices)}
    calls = node_mapping_calls(assignment)
    assert len(calls) <= 14 * 2 + 3  # 14 bits, each <= 2 chunks of 1000 ids, + the mark (3)
    assert all(len(ids) <= 1000 for ids, _ in calls)
    tags: dict[str, dict[str, str]] = {i: {TAG_NODE_SET: "gpu"} for i in assignment}
    for ids, pairs in calls:
        for i in ids:
            tags[i].update(pairs)
    assert {i: decode_node(t) for i, t in tags.items()} == {
        i: f"gpu-{index}" for i, index in assignment.items()}


def test_a_partly_written_mapping_means_no_node():
    assert decode_node({TAG_NODE_SET: "gpu", "slurm-spot-node-bit0": "1"}) is None
    assert decode_node({TAG_NODE_SET: "gpu", TAG_NODE_MAPPED: "1"}) is None  # index 0: invalid
    assert decode_node({TAG_NODE_SET: "gpu", TAG_NODE: "gpu-9"}) == "gpu-9"  # readable tag wins
    assert decode_node({}) is None


def test_instance_from_ec2_record():
    launched = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
    record = {
        "InstanceId": "i-0abc", "InstanceType": "g5.xlarge", "InstanceLifecycle": "spot",
        "State": {"Name": "shutting-down"},
        "StateReason": {"Code": "Server.SpotInstanceTermination"},
        "Placement": {"AvailabilityZone": "us-east-1b"}, "LaunchTime": launched,
        "PrivateIpAddress": "10.0.3.7", "PrivateDnsName": "ip-10-0-3-7.ec2.internal",
        "Tags": [{"Key": TAG_NODE_SET, "Value": "gpu"}, {"Key": TAG_NODE_MAPPED, "Value": "1"},
                 {"Key": "slurm-spot-node-bit2", "Value": "1"}],
    }
    inst = instance_from_ec2(record)
    assert (inst.instance_id, inst.node, inst.node_set, inst.state, inst.market) == (
        "i-0abc", "gpu-4", "gpu", InstanceState.STOPPING, "spot")
    assert (inst.zone, inst.private_ip, inst.hostname, inst.launch_time) == (
        "us-east-1b", "10.0.3.7", "ip-10-0-3-7", launched)
    assert inst.was_reclaimed
    on_demand = instance_from_ec2({"InstanceId": "i-1", "State": {"Name": "running"}})
    assert on_demand.market == "on-demand" and on_demand.node is None
    assert on_demand.private_ip is None and on_demand.hostname is None
