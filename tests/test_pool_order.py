"""Resume orders a node set's pools by price per GPU where slurm-spot chooses (GCP; AWS with
``lowest-price``) and skips pools in cooldown (issue 14, point 5): the ranking itself, then
what instance type a launch gets from moto (AWS) and from the GCE fake driven by the real
google-cloud-compute client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from slurm_spot.config import NodeSetConfig
from slurm_spot.events import read_events
from slurm_spot.providers.base import ErrorClass, LaunchRequest
from slurm_spot.providers.gcp.provider import GcpProvider
from slurm_spot.providers.gcp.shapes import gce_machine_shape
from slurm_spot.providers.ledger import PoolCooldowns
from slurm_spot.providers.pool_order import rank_pools, unit_counter
from slurm_spot.providers.prices import Price, UnknownPriceError
from tests.fakes.aws_harness import NOW, Harness, make_config, moto_world
from tests.fakes.ec2 import World
from tests.fakes.gce_api import FakeCompute, gcp_config

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)


# ---- the ranking (pure) -----------------------------------------------------------------------
def _gpu_set(**extra: Any) -> NodeSetConfig:
    return NodeSetConfig.model_validate({"name": "gpu", "provider": "aws", "count": 4,
                                         "gpus": {"type": "a10g", "count": 1}, **extra})


SHAPES = {"small": (1, 4), "quad": (4, 48), "cpu": (0, 16)}


def _units(node_set: NodeSetConfig, types: list[str]):
    return unit_counter(node_set, types, lambda t: SHAPES.get(t, (None, None)))


def test_cheaper_per_gpu_wins_over_cheaper_per_instance_and_unpriced_types_go_last() -> None:
    prices = {"small": 1.0, "quad": 3.2}  # quad: 0.80 per GPU-hour, small 1.00

    def price(market: str, itype: str, zone: str) -> Price:
        if itype not in prices:
            raise UnknownPriceError(f"no {market} price for {itype}")
        return Price(prices[itype], "config", zone)

    candidates = [("mystery", "z1"), ("small", "z1"), ("quad", "z1"), ("quad", "z2")]
    order = rank_pools(candidates, "spot", price=price,
                       units=_units(_gpu_set(), [t for t, _ in candidates]), cooled={})
    assert [(p.instance_type, p.zone) for p in order.pools] == [
        ("quad", "z1"), ("quad", "z2"), ("small", "z1"), ("mystery", "z1")]
    assert [p.usd_per_unit_h for p in order.pools] == [0.8, 0.8, 1.0, None]
    assert order.unpriced == {"mystery": "no spot price for mystery"}
    assert [t for t, _ in order.by_type()] == ["quad", "small", "mystery"]


def test_pools_in_cooldown_are_left_out_with_their_end() -> None:
    until = T0 + timedelta(minutes=10)
    candidates = [("small", "z1"), ("small", "z2")]
    order = rank_pools(candidates, "spot", price=None, units=_units(_gpu_set(), ["small"]),
                       cooled={"small/z1/spot": until, "small/z2/on-demand": until})
    assert [p.label for p in order.pools] == ["small/z2/spot"]
    assert order.skipped == (("small/z1/spot", until.isoformat()),)


def test_cpu_only_node_sets_compare_per_vcpu() -> None:
    cpu_set = NodeSetConfig.model_validate({"name": "cpu", "provider": "aws", "count": 2,
                                            "cpus": 8})
    count = unit_counter(cpu_set, ["cpu", "other"], lambda t: SHAPES.get(t, (None, None)))
    assert count("cpu") == (16, "vCPU")
    assert count("other") == (8, "vCPU")  # unknown type: the node set's cpus


@pytest.mark.parametrize(("machine_type", "shape"), [
    ("a2-highgpu-1g", (1, None)), ("a2-highgpu-8g", (8, None)), ("a2-megagpu-16g", (16, None)),
    ("a3-highgpu-8g", (8, None)), ("g2-standard-4", (1, 4)), ("g2-standard-24", (2, 24)),
    ("g2-standard-96", (8, 96)), ("n1-standard-8", (None, 8)), ("custom", (None, None))])
def test_gce_machine_shapes_from_their_names(machine_type: str, shape: tuple) -> None:
    assert gce_machine_shape(machine_type) == shape


def test_pool_cooldowns_survive_processes_and_expire(tmp_path: Path) -> None:
    memory = PoolCooldowns(tmp_path / "cool.json")
    memory.remember(["g5.xlarge/us-east-1a/spot"], T0 + timedelta(seconds=600), T0)
    memory.remember(["g6.xlarge/us-east-1b/spot"], T0 + timedelta(seconds=60), T0)
    again = PoolCooldowns(tmp_path / "cool.json")  # another hook process
    assert set(again.active(T0 + timedelta(seconds=30))) == {
        "g5.xlarge/us-east-1a/spot", "g6.xlarge/us-east-1b/spot"}
    assert set(again.active(T0 + timedelta(seconds=61))) == {"g5.xlarge/us-east-1a/spot"}
    assert again.active(T0 + timedelta(seconds=601)) == {}
    (tmp_path / "cool.json").write_text("{not json")
    assert PoolCooldowns(tmp_path / "cool.json").active(T0) == {}  # unreadable: nothing cools


# ---- AWS: moto ------------------------------------------------------------------------------
@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    with moto_world(monkeypatch) as world:
        yield world


def _spot_history(h: Harness, prices: dict[str, float]) -> None:
    """DescribeSpotPriceHistory (moto answers a placeholder price) reports ``prices`` per
    instance type; types not in ``prices`` get no record at all."""
    def rewrite(parsed: dict[str, Any], **_: Any) -> None:
        rows = [r for r in parsed.get("SpotPriceHistory", []) if r["InstanceType"] in prices]
        for row in rows:
            row["SpotPrice"] = f"{prices[row['InstanceType']]:.4f}"
        parsed["SpotPriceHistory"] = rows

    h.provider.client.meta.events.register("after-call.ec2.DescribeSpotPriceHistory", rewrite)


def _types_asked(h: Harness) -> list[set[str]]:
    return [{o["InstanceType"] for o in r["LaunchTemplateConfigs"][0]["Overrides"]}
            for r in h.market.requests]


def _events(config: Any, action: str) -> list[dict[str, Any]]:
    return [e for e in read_events(config.log_dir) if e.get("action") == action]


LOWEST = {"allocation_strategy": "lowest-price"}


def test_lowest_price_launches_the_type_cheapest_per_gpu_by_the_spot_price_history(aws):
    _, world = aws
    config = make_config(world, instance_types=["g5.xlarge", "g5.12xlarge"], aws=LOWEST)
    h = Harness(config)
    # g5.xlarge: 1 GPU at 0.50/h; g5.12xlarge: 4 GPUs at 1.60/h, 0.40 per GPU-hour
    _spot_history(h, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    result = h.launch("gpu-1", "gpu-2")
    assert result.failed == ()
    assert {i.instance_type for i in result.launched} == {"g5.12xlarge"}
    assert _types_asked(h) == [{"g5.12xlarge"}]
    assert h.calls["DescribeSpotPriceHistory"] == 2  # one per type, every zone at once (cached)
    (order,) = _events(config, "launch_order")
    assert [(p["pool"].split("/")[0], p["usd_per_unit_h"], p["source"])
            for p in order["extra"]["order"]][::2] == [
        ("g5.12xlarge", 0.4, "aws-spot-price-history"), ("g5.xlarge", 0.5, "aws-spot-price-history")]


def test_other_strategies_leave_the_choice_to_ec2(aws):
    _, world = aws
    h = Harness(make_config(world, instance_types=["g5.xlarge", "g5.12xlarge"]))
    _spot_history(h, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    result = h.launch("gpu-1")
    assert _types_asked(h) == [{"g5.xlarge", "g5.12xlarge"}]  # one call, every pool
    assert {i.instance_type for i in result.launched} == {"g5.xlarge"}  # moto: the first
    assert h.calls["DescribeSpotPriceHistory"] == 0


def test_a_price_in_spot_yaml_wins_over_the_price_history(aws):
    _, world = aws
    config = make_config(world, instance_types=["g5.12xlarge", "g5.xlarge"], aws=LOWEST)
    config = config.model_copy(update={"cost": config.cost.model_copy(
        update={"spot_usd_per_hour": {"g5.12xlarge": 4.4}})})  # 1.10 per GPU-hour
    h = Harness(config)
    _spot_history(h, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    result = h.launch("gpu-1")
    assert {i.instance_type for i in result.launched} == {"g5.xlarge"}


def test_a_type_without_a_price_goes_last_with_a_warning_event(aws):
    _, world = aws
    config = make_config(world, instance_types=["g6.xlarge", "g5.xlarge"], aws=LOWEST)
    h = Harness(config)
    _spot_history(h, {"g5.xlarge": 0.50})  # no record for g6.xlarge: unknown, not free
    result = h.launch("gpu-1")
    assert {i.instance_type for i in result.launched} == {"g5.xlarge"}
    (warning,) = _events(config, "price_unknown")
    assert warning["extra"]["type"] == "g6.xlarge"
    assert "no AWS spot price for instance type g6.xlarge" in warning["reason"]
    assert "tried after every priced type" in warning["reason"]


def test_a_pool_without_capacity_is_skipped_by_later_launches_until_its_cooldown_ends(aws):
    _, world = aws
    config = make_config(world, instance_types=["g5.xlarge", "g5.12xlarge"], aws=LOWEST)
    first = Harness(config)
    _spot_history(first, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    first.market.fail_pools(instance_type="g5.12xlarge", market="spot")
    result = first.launch("gpu-1")
    assert {i.instance_type for i in result.launched} == {"g5.xlarge"}
    assert _types_asked(first) == [{"g5.12xlarge"}, {"g5.xlarge"}]
    assert len(result.failed_pools) == 2  # g5.12xlarge in both zones

    later = Harness(config)  # the next resume hook: a new process
    _spot_history(later, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    later.now = NOW + 300
    later.launch("gpu-2")
    assert _types_asked(later) == [{"g5.xlarge"}]  # g5.12xlarge is cooling down
    order = _events(config, "launch_order")[-1]
    assert sorted(s["pool"] for s in order["extra"]["skipped"]) == [
        f"g5.12xlarge/{z}/spot" for z in sorted(world.zones.values())]

    after = Harness(config)
    _spot_history(after, {"g5.xlarge": 0.50, "g5.12xlarge": 1.60})
    after.now = NOW + config.reconcile.cooldown_s + 1
    after.launch("gpu-3")
    assert _types_asked(after) == [{"g5.12xlarge"}]  # its cooldown is over


def test_every_pool_cooling_down_fails_fast_as_capacity_or_goes_to_the_fallback(aws):
    _, world = aws
    config = make_config(world, instance_types=["g5.xlarge"], aws=LOWEST, fallback="on-demand")
    first = Harness(config)
    first.market.fail_pools(market="spot")
    assert {i.market for i in first.launch("gpu-1").launched} == {"on-demand"}

    later = Harness(config)
    result = later.launch("gpu-2")
    assert [r["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
            for r in later.market.requests] == ["on-demand"]  # spot pools not asked at all
    assert {i.market for i in result.launched} == {"on-demand"}

    (node_set,) = config.node_sets  # the same state dir, the node set without its fallback
    no_fallback = config.model_copy(
        update={"node_sets": [node_set.model_copy(update={"fallback": "none"})]})
    third = Harness(no_fallback)
    (failure,) = third.launch("gpu-3").failed
    assert third.market.requests == []
    assert failure.error_class is ErrorClass.CAPACITY
    assert failure.reason.startswith("(Code:PoolCooldown)capacity: no spot capacity")


# ---- GCP: the fake Compute API with the real client ---------------------------------------
A, B = "us-central1-a", "us-central1-b"


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    with FakeCompute() as server:
        yield server


def _gcp(fake: FakeCompute, types: list[str], zones: list[str] | None = None,
         cost: dict[str, Any] | None = None, state_dir: str | None = None,
         **gcp: Any) -> GcpProvider:
    node_set = {"name": "gpu", "count": 4, "gpus": {"type": "l4", "count": 1},
                "instance_types": types,
                "gcp": {"zones": zones or [A], "image": "debian-12", **gcp}}
    top: dict[str, Any] = {"cost": cost or {}}
    if state_dir:
        top["state_dir"] = state_dir
    config = gcp_config(fake, [node_set], **top)
    return GcpProvider(config, "gcp", config.providers["gcp"], sleep=lambda s: None)  # type: ignore[arg-type]


def _machine_types(fake: FakeCompute) -> list[str]:
    return [c["body"]["instanceProperties"]["machineType"] for c in fake.calls("bulkInsert")]


def _gce_launch(provider: GcpProvider, *nodes: str):
    node_set = provider.config.node_sets[0]
    return provider.launch(LaunchRequest("demo", node_set, nodes, ",".join(nodes)))


def test_gcp_launches_the_machine_type_cheapest_per_gpu_from_the_catalogue(fake):
    # shipped catalogue, us-central1 spot: a2-highgpu-1g (1 A100) dearer than g2-standard-4 (1 L4)
    provider = _gcp(fake, ["a2-highgpu-1g", "g2-standard-4"])
    result = _gce_launch(provider, "gpu-1")
    assert [i.instance_type for i in result.launched] == ["g2-standard-4"]
    assert _machine_types(fake) == ["g2-standard-4"]
    (vm,) = fake.all_instances()
    assert vm["machineType"].endswith("/machineTypes/g2-standard-4")


def test_gcp_type_order_config_keeps_the_written_order(fake):
    provider = _gcp(fake, ["a2-highgpu-1g", "g2-standard-4"], type_order="config")
    result = _gce_launch(provider, "gpu-1")
    assert [i.instance_type for i in result.launched] == ["a2-highgpu-1g"]


def test_gcp_ranks_per_gpu_not_per_instance(fake):
    cost = {"spot_usd_per_hour": {"a2-highgpu-1g": 1.5, "a2-highgpu-2g": 2.0}}  # 1.5 vs 1.0/GPU
    provider = _gcp(fake, ["a2-highgpu-1g", "a2-highgpu-2g"], cost=cost)
    result = _gce_launch(provider, "gpu-1")
    assert [i.instance_type for i in result.launched] == ["a2-highgpu-2g"]
    (order,) = [e for e in read_events(provider.config.log_dir) if e["action"] == "launch_order"]
    assert [(p["pool"], p["usd_per_unit_h"]) for p in order["extra"]["order"]] == [
        (f"a2-highgpu-2g/{A}/spot", 1.0), (f"a2-highgpu-1g/{A}/spot", 1.5)]


def test_gcp_unpriced_machine_type_goes_last_with_a_warning_event(fake):
    provider = _gcp(fake, ["n1-standard-8", "g2-standard-4"])
    result = _gce_launch(provider, "gpu-1")
    assert [i.instance_type for i in result.launched] == ["g2-standard-4"]
    (warning,) = [e for e in read_events(provider.config.log_dir)
                  if e["action"] == "price_unknown"]
    assert warning["extra"]["type"] == "n1-standard-8"
    assert "cost.spot_usd_per_hour.n1-standard-8" in warning["reason"]


def test_gcp_skips_a_stocked_out_pool_in_the_next_launch(fake):
    first = _gcp(fake, ["a2-highgpu-1g", "g2-standard-4"])
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=A, market="spot")
    result = _gce_launch(first, "gpu-1")
    assert _machine_types(fake) == ["g2-standard-4", "a2-highgpu-1g"]
    assert [i.instance_type for i in result.launched] == ["a2-highgpu-1g"]
    cooling = json.loads((first.config.state_dir / "gcp" / "gcp-pool-cooldowns.json").read_text())
    assert list(cooling) == [f"g2-standard-4/{A}/spot"]

    later = _gcp(fake, ["a2-highgpu-1g", "g2-standard-4"], state_dir=str(first.config.state_dir))
    again = _gce_launch(later, "gpu-2")
    assert _machine_types(fake)[2:] == ["a2-highgpu-1g"]  # g2-standard-4 is cooling down
    assert [i.instance_type for i in again.launched] == ["a2-highgpu-1g"]


def test_gcp_a_cooled_zone_is_denied_and_the_other_zone_asked(fake):
    first = _gcp(fake, ["g2-standard-4"], zones=[A, B])
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=A, market="spot")
    assert [i.zone for i in _gce_launch(first, "gpu-1").launched] == [B]
    later = _gcp(fake, ["g2-standard-4"], zones=[A, B], state_dir=str(first.config.state_dir))
    assert [i.zone for i in _gce_launch(later, "gpu-2").launched] == [B]
    policy = fake.calls("bulkInsert")[-1]["body"]["locationPolicy"]["locations"]
    assert policy == {f"zones/{B}": {"preference": "ALLOW"}, f"zones/{A}": {"preference": "DENY"}}
    assert len(fake.calls("bulkInsert")) == 3  # A failed, B; then B only
