"""Node shapes from instance types (catalogue, DescribeInstanceTypes on moto) and the offline
config checks of AWS node sets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from slurm_spot.config import NodeSetConfig, parse_config
from slurm_spot.errors import ConfigError
from slurm_spot.providers.aws.catalog import (
    NodeShape,
    ShapeResolver,
    UnknownInstanceTypeError,
    catalogue,
    gres_type,
    node_shape,
    resolve_node_set_shape,
    shape_from_api,
)
from slurm_spot.providers.aws.checks import check_aws_node_set
from tests.fakes.ec2 import AWS_ENV, REGION, count_requests


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def node_set(**fields: Any) -> NodeSetConfig:
    aws = {"launch_template": "gpu", "subnets": ["subnet-a", "subnet-b"]}
    aws.update(fields.pop("aws", {}))
    spec = {"name": "gpu", "provider": "aws", "count": 4, "instance_types": ["g5.xlarge"],
            "aws": aws, **fields}
    config = parse_config({
        "cluster": "c1", "providers": {"aws": {"type": "aws", "region": REGION}},
        "node_sets": [spec], "partitions": [{"name": "p", "node_sets": ["gpu"]}]})
    return config.node_sets[0]


# ---- catalogue ------------------------------------------------------------------------------
def test_catalogue_covers_the_common_gpu_families():
    families = {name.split(".")[0] for name in catalogue()}
    assert {"g4dn", "g5", "g6", "p3", "p4d", "p5"} <= families
    assert node_shape("g5.xlarge") == NodeShape("g5.xlarge", 4, 16384, "a10g", 1, 22888)
    assert node_shape("p4d.24xlarge").gpu_count == 8
    assert node_shape("p3.2xlarge").memory_mib == 61 * 1024


def test_catalogue_agrees_with_describe_instance_types(ec2):
    """Every type moto ships data for must match the catalogue figure for figure."""
    checked = 0
    for name, expected in sorted(catalogue().items()):
        try:
            (record,) = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
        except ec2.exceptions.ClientError:
            continue  # moto has no data for it (p3 today)
        got = shape_from_api(record)
        assert (got.vcpus, got.memory_mib, got.gpu_type, got.gpu_count, got.gpu_memory_mib) == (
            expected.vcpus, expected.memory_mib, expected.gpu_type, expected.gpu_count,
            expected.gpu_memory_mib), name
        checked += 1
    assert checked >= 30


def test_real_memory_leaves_room_for_the_system():
    assert node_shape("g5.xlarge").real_memory_mib() == 15564  # 95 % of 16384
    assert node_shape("g5.xlarge").real_memory_mib(1.0) == 16384


def test_gres_type():
    assert gres_type("A10G") == "a10g" and gres_type("H100") == "h100"
    assert gres_type("Radeon Pro V520") == "radeon_pro_v520"


def test_unknown_type_without_api_names_the_type():
    with pytest.raises(UnknownInstanceTypeError, match=r"'m7i\.large'.*no AWS API"):
        node_shape("m7i.large")


def test_other_types_come_from_the_api_once(ec2):
    resolver = ShapeResolver(ec2)
    calls = count_requests(ec2)
    shape = resolver.shape("m5.xlarge")
    assert (shape.vcpus, shape.memory_mib, shape.gpu_type, shape.source) == (4, 16384, None, "api")
    assert resolver.shape("m5.xlarge") is shape
    assert resolver.shape("g5.xlarge").source == "catalogue"
    assert dict(calls) == {"DescribeInstanceTypes": 1}
    with pytest.raises(UnknownInstanceTypeError, match=r"nonsense\.type"):
        resolver.shape("nonsense.type")


# ---- resolve_node_set_shape ---------------------------------------------------------------------
def test_unset_shape_is_filled_from_the_instance_type():
    resolved = resolve_node_set_shape(node_set(instance_types=["g5.12xlarge"]))
    assert (resolved.cpus, resolved.memory_mib) == (48, int(196608 * 0.95))
    assert resolved.gpus is not None and (resolved.gpus.type, resolved.gpus.count) == ("a10g", 4)


def test_written_values_that_fit_every_type_win():
    resolved = resolve_node_set_shape(
        node_set(instance_types=["g5.2xlarge", "g5.4xlarge"], cpus=6, memory_mib=30000))
    assert resolved.cpus == 6 and resolved.memory_mib == 30000
    assert resolved.gpus is not None and (resolved.gpus.type, resolved.gpus.count) == ("a10g", 1)


def test_types_of_different_shapes_are_refused_not_rendered_with_the_smallest():
    """A g5.12xlarge (4 GPUs) on a line written for a g5.xlarge (1 GPU) would show Slurm 1 of
    its 4 GPUs: the node set is refused, each type's shape named, until it is split or the
    field is written."""
    with pytest.raises(ConfigError) as err:
        resolve_node_set_shape(node_set(instance_types=["g5.xlarge", "g5.12xlarge"]),
                               where="node_sets.1")
    problems = err.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "node_sets.1.cpus", "node_sets.1.memory_mib", "node_sets.1.gpus"]
    assert "g5.xlarge (4 CPUs, 16384 MiB, 1 a10g); g5.12xlarge (48 CPUs, 196608 MiB, 4 a10g)" \
        in problems[0]
    assert all("split the node set (one per shape)" in p for p in problems)


def test_types_within_five_percent_of_memory_share_one_line():
    resolved = resolve_node_set_shape(node_set(instance_types=["g4dn.xlarge", "g4dn.xlarge"]))
    assert resolved.memory_mib == int(16384 * 0.95)


def test_a_written_shape_larger_than_a_type_names_both():
    with pytest.raises(ConfigError) as err:
        resolve_node_set_shape(node_set(instance_types=["g5.xlarge"], cpus=8, memory_mib=20000,
                                        gpus={"type": "a10g", "count": 2}), where="node_sets.0")
    assert err.value.problems == [
        "node_sets.0.cpus: 8 is more than g5.xlarge (4 CPUs, 16384 MiB, 1 a10g) has",
        "node_sets.0.memory_mib: 20000 MiB is more than g5.xlarge (4 CPUs, 16384 MiB, 1 a10g) has",
        "node_sets.0.gpus: 2 GPUs are more than g5.xlarge (4 CPUs, 16384 MiB, 1 a10g) has"]


def test_different_gpu_models_need_explicit_gpus():
    with pytest.raises(ConfigError) as err:
        resolve_node_set_shape(node_set(instance_types=["g5.xlarge", "g6.xlarge"]),
                               where="node_sets.0")
    assert err.value.problems == [
        "node_sets.0.gpus: g5.xlarge, g6.xlarge have different GPUs; split the node set (one "
        "per shape) or set gpus explicitly (instance_types: g5.xlarge (4 CPUs, 16384 MiB, "
        "1 a10g); g6.xlarge (4 CPUs, 16384 MiB, 1 l4))"]
    explicit = node_set(instance_types=["g5.xlarge", "g6.xlarge"],
                        gpus={"type": "gpu24g", "count": 1})
    assert resolve_node_set_shape(explicit).gpus == explicit.gpus


def test_unknown_type_names_the_field():
    with pytest.raises(ConfigError) as err:
        resolve_node_set_shape(node_set(instance_types=["g5.xlarge", "g9.huge"]),
                               where="node_sets.2")
    (problem,) = err.value.problems
    assert problem.startswith("node_sets.2.instance_types.1: unknown EC2 instance type 'g9.huge'")


def test_unknown_type_resolved_through_the_api(ec2):
    resolved = resolve_node_set_shape(node_set(instance_types=["m5.2xlarge"]),
                                      resolver=ShapeResolver(ec2))
    assert (resolved.cpus, resolved.gpus) == (8, None)


# ---- config checks ------------------------------------------------------------------------------
def test_a_sound_node_set_has_no_problems():
    ns = node_set(aws={"subnet_zones": {"subnet-a": "us-east-1a", "subnet-b": "us-east-1b"},
                       "max_price_usd_per_hour": 2.5})
    assert check_aws_node_set(ns, "node_sets.0") == []


def test_two_subnets_in_one_zone():
    ns = node_set(aws={"subnets": ["subnet-a", "subnet-b", "subnet-c"],
                       "subnet_zones": {"subnet-a": "us-east-1a", "subnet-c": "us-east-1a",
                                        "subnet-b": "us-east-1b"}})
    (problem,) = check_aws_node_set(ns, "node_sets.0")
    assert problem.startswith(
        "node_sets.0.aws.subnets: subnet-a and subnet-c are both in availability zone us-east-1a")


@pytest.mark.parametrize("behaviour", ["stop", "hibernate"])
def test_stop_or_hibernate_with_instant_fleets(behaviour):
    ns = node_set(aws={"interruption_behavior": behaviour})
    (problem,) = check_aws_node_set(ns, "node_sets.1")
    assert problem.startswith(f"node_sets.1.aws.interruption_behavior: {behaviour!r} needs")


@pytest.mark.parametrize("price, start", [
    (0.0005, "node_sets.0.aws.max_price_usd_per_hour: 0.0005 USD/h is not above"),
    (5000.0, "node_sets.0.aws.max_price_usd_per_hour: 5000.0 USD/h per instance is absurd"),
])
def test_max_price_out_of_any_sane_range(price, start):
    (problem,) = check_aws_node_set(node_set(aws={"max_price_usd_per_hour": price}), "node_sets.0")
    assert problem.startswith(start)


def test_max_price_at_or_below_zero_even_if_the_schema_was_bypassed():
    ns = node_set()
    assert ns.aws is not None
    aws = ns.aws.model_copy(update={"max_price_usd_per_hour": 0.0})
    broken = ns.model_copy(update={"aws": aws})
    assert check_aws_node_set(broken, "node_sets.0")[0].startswith(
        "node_sets.0.aws.max_price_usd_per_hour: 0.0 USD/h")


def test_instance_type_unknown_to_the_catalogue():
    ns = node_set(instance_types=["g5.xlarge", "g5.xxxl"])
    (problem,) = check_aws_node_set(ns, "node_sets.0")
    assert problem.startswith("node_sets.0.instance_types.1: 'g5.xxxl' is not in the")
    explicit = node_set(instance_types=["m7i.large"], cpus=2, memory_mib=7000, gpus=None)
    assert check_aws_node_set(explicit, "node_sets.0") == []


def test_other_aws_problems_name_their_field():
    ns = node_set(aws={"subnets": ["subnet-a", "subnet-a"], "subnet_zones": {"subnet-z": "x"}},
                  instance_types=[])
    problems = check_aws_node_set(ns, "node_sets.3")
    assert [p.split(":")[0] for p in problems] == [
        "node_sets.3.aws.subnets.1", "node_sets.3.aws.subnet_zones", "node_sets.3.instance_types"]
