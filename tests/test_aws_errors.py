"""Every AWS row of tests/data/cloud-errors.yaml: the class in the
table, and what a user sees when EC2 answers with that code (real EC2 XML, through botocore's
parser, on moto): instances in EC2, nodes launched, failures with code, class and reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_spot.providers.aws.errors import (
    ERROR_TABLE,
    PRECEDENCE,
    FleetError,
    Scope,
    decisive,
    error_kind,
    fleet_errors,
)
from slurm_spot.providers.base import ErrorClass, classify
from tests.fakes.aws_harness import Harness, make_config, moto_world, nodes_in_ec2, tags_of
from tests.fakes.ec2 import World

CASES = yaml.safe_load((Path(__file__).parent / "data" / "cloud-errors.yaml").read_text())
AWS_ROWS = CASES["aws"]


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    with moto_world(monkeypatch) as world:
        yield world


# ---- the table ----------------------------------------------------------------------------------
@pytest.mark.parametrize("row", AWS_ROWS, ids=[r["code"] for r in AWS_ROWS])
def test_cases_file_class(row):
    expected = ErrorClass(row["class"])
    assert error_kind(row["code"]).error_class is expected
    assert classify(row["code"], {k: v.error_class for k, v in ERROR_TABLE.items()}) is expected


@pytest.mark.parametrize("spelling", [
    "InsufficientInstanceCapacity", "INSUFFICIENT_INSTANCE_CAPACITY",
    "insufficient-instance-capacity",
])
def test_codes_compare_without_case_or_separators(spelling):
    assert error_kind(spelling).error_class is ErrorClass.CAPACITY
    assert error_kind(spelling).scope is Scope.POOL


def test_classification_never_reads_the_message():
    error = FleetError("SomethingNewAndUnlisted", "Insufficient capacity; request limit exceeded")
    assert error.error_class is ErrorClass.UNKNOWN
    template = error_kind("InvalidLaunchTemplateName.NotFoundException")
    assert template.error_class is ErrorClass.CONFIG


def test_pointer_entries_are_dropped_unless_alone():
    response = {"Errors": [
        {"ErrorCode": "UnfulfillableCapacity", "ErrorMessage": "Failed to fulfill capacity."},
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no g5  in\n 1a",
         "Lifecycle": "spot", "LaunchTemplateAndOverrides": {
             "Overrides": {"InstanceType": "g5.xlarge", "SubnetId": "subnet-1"}}},
    ]}
    (only,) = fleet_errors(response)
    assert (only.code, only.instance_type, only.subnet, only.market, only.message) == (
        "InsufficientInstanceCapacity", "g5.xlarge", "subnet-1", "spot", "no g5 in 1a")
    alone = fleet_errors({"Errors": [{"ErrorCode": "UnfulfillableCapacity"}]})
    assert [e.code for e in alone] == ["UnfulfillableCapacity"]


def test_the_most_consequential_error_decides():
    errors = [FleetError("InsufficientInstanceCapacity", ""), FleetError("VcpuLimitExceeded", ""),
              FleetError("RequestLimitExceeded", "")]
    assert decisive(errors).code == "VcpuLimitExceeded"  # type: ignore[union-attr]
    assert decisive([]) is None
    assert PRECEDENCE[0] is ErrorClass.AUTH and PRECEDENCE[-1] is ErrorClass.UNKNOWN


# ---- what a user sees, per code ---------------------------------------------------------------
def capacity_in_every_pool(code: str) -> Callable[[Any, World], None]:
    def scenario(ec2: Any, world: World) -> None:
        h = Harness(make_config(world))
        h.market.fail_pools(code)
        result = h.launch("gpu-1", "gpu-2")
        assert result.launched == () and tags_of(ec2) == {}
        (failure,) = result.failed
        assert failure.nodes == ("gpu-1", "gpu-2") and failure.error_class is ErrorClass.CAPACITY
        assert failure.reason.startswith(f"(Code:{code})capacity: ")
        assert sorted(result.failed_pools) == sorted(
            f"{t}/{z}/spot" for t in ("g5.xlarge", "g6.xlarge") for z in world.zones.values())
        assert h.calls["CreateFleet"] == 1  # every pool failed at once: nothing left to try
    return scenario


def max_price_too_low(ec2: Any, world: World) -> None:
    h = Harness(make_config(world, fallback="on-demand", aws={"max_price_usd_per_hour": 0.1}))
    h.market.spot_price = 0.4312
    result = h.launch("gpu-1")
    assert result.launched == () and tags_of(ec2) == {}
    (failure,) = result.failed
    assert failure.error_class is ErrorClass.CONFIG
    assert failure.reason.startswith("(Code:SpotMaxPriceTooLow)config: offered max price 0.1 USD/h")
    assert "required spot price 0.4312 USD/h" in failure.reason
    assert h.calls["CreateFleet"] == 1  # config: stop, no on-demand fallback


def vcpu_quota(ec2: Any, world: World) -> None:
    # the example of the cases file: limit 32 vCPU, 13 nodes of 4 vCPU -> 8 launched, 5 fail
    h = Harness(make_config(world, instance_types=["g5.xlarge"]))
    h.market.vcpu_limit["spot"] = 32
    nodes = [f"gpu-{i}" for i in range(1, 14)]
    result = h.launch(*nodes)
    assert [i.node for i in result.launched] == nodes[:8]
    assert nodes_in_ec2(ec2) == sorted(nodes[:8])
    (failure,) = result.failed
    assert failure.nodes == tuple(nodes[8:]) and failure.error_class is ErrorClass.QUOTA
    assert failure.reason.startswith("(Code:VcpuLimitExceeded)quota: ")
    assert "vCPU limit of 32" in failure.reason
    assert h.calls["CreateFleet"] == 1  # regional: other pools would not help


def spot_count_quota(ec2: Any, world: World) -> None:
    h = Harness(make_config(world, fallback="on-demand"))
    h.market.fail_next(400, "MaxSpotInstanceCountExceeded",
                       message="Max spot instance count exceeded")
    result = h.launch("gpu-1", "gpu-2")
    assert result.launched == () and tags_of(ec2) == {}
    (failure,) = result.failed
    assert failure.error_class is ErrorClass.QUOTA
    assert failure.reason == (
        "(Code:MaxSpotInstanceCountExceeded)quota: Max spot instance count exceeded")
    assert h.calls["CreateFleet"] == 1


def throttled(ec2: Any, world: World) -> None:
    h = Harness(make_config(world))
    h.market.fail_next(503, "RequestLimitExceeded", times=3)
    result = h.launch("gpu-1", "gpu-2")
    assert sorted(i.node or "" for i in result.launched) == ["gpu-1", "gpu-2"]
    assert result.failed == ()
    assert h.calls["CreateFleet"] == 4 and len(h.sleeps) == 3
    assert len({r["ClientToken"] for r in h.market.requests}) == 1  # the same request each time


SCENARIOS: dict[str, Callable[[Any, World], None]] = {
    "InsufficientInstanceCapacity": capacity_in_every_pool("InsufficientInstanceCapacity"),
    "InsufficientHostCapacity": capacity_in_every_pool("InsufficientHostCapacity"),
    "SpotMaxPriceTooLow": max_price_too_low,
    "VcpuLimitExceeded": vcpu_quota,
    "MaxSpotInstanceCountExceeded": spot_count_quota,
    "RequestLimitExceeded": throttled,
}


def test_every_aws_row_has_a_scenario():
    assert {r["code"] for r in AWS_ROWS} == set(SCENARIOS)


@pytest.mark.parametrize("code", sorted(SCENARIOS))
def test_what_the_user_sees(aws, code):
    ec2, world = aws
    SCENARIOS[code](ec2, world)
