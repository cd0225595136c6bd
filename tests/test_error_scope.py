"""Every provider error has a scope and a memory (issue 11, section 2): EC2 ``Unsupported``
is remembered per (instance type, zone) and never capacity; hooks and reconciler read one code
table per provider."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from slurm_spot.providers import capacity_codes
from slurm_spot.providers.aws.errors import ERROR_TABLE
from slurm_spot.providers.base import ErrorClass, normalize_code
from slurm_spot.providers.gcp.errors import GCP_ERROR_CLASSES
from slurm_spot.reconcile.history import KNOWN_CAPACITY_CODES, build_history
from slurm_spot.reconcile.rules import Settings
from tests.fakes.aws_harness import Harness, make_config, moto_world, nodes_in_ec2
from tests.fakes.ec2 import World


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, World]]:
    with moto_world(monkeypatch) as world:
        yield world


def _pairs(request: dict[str, Any], world: World) -> set[tuple[str, str]]:
    overrides = request["LaunchTemplateConfigs"][0]["Overrides"]
    return {(o["InstanceType"], world.zones[o["SubnetId"]]) for o in overrides}


def test_unsupported_pair_is_remembered_and_never_asked_again(aws):
    """p5.48xlarge-like case: g5.xlarge is not offered in the second zone."""
    _, world = aws
    h = Harness(make_config(world))
    bad_subnet = world.subnets[1]
    bad = ("g5.xlarge", world.zones[bad_subnet])
    h.market.fail_pools(code="Unsupported", instance_type="g5.xlarge", subnet=bad_subnet)
    first = h.launch("gpu-1", "gpu-2")
    assert sorted(i.node or "" for i in first.launched) == ["gpu-1", "gpu-2"]
    assert first.failed == () and first.failed_pools == ()  # not capacity: no cooldown
    assert bad in _pairs(h.market.requests[0], world)
    # A later hook (a new provider object, as a new process would have) leaves it out.
    again = Harness(h.config)
    again.launch("gpu-3")
    assert bad not in _pairs(again.market.requests[-1], world)
    assert len(_pairs(again.market.requests[-1], world)) == 3
    assert nodes_in_ec2(again.provider.client) == ["gpu-1", "gpu-2", "gpu-3"]


def test_a_node_set_whose_only_pair_is_unsupported_fails_permanent_not_capacity(aws):
    _, world = aws
    h = Harness(make_config(world, instance_types=["g5.xlarge"],
                            aws={"subnets": world.subnets[:1]}))
    h.market.fail_pools(code="Unsupported")
    (failure,) = h.launch("gpu-1").failed
    assert failure.error_class is ErrorClass.PERMANENT and failure.code == "Unsupported"
    calls = h.calls["CreateFleet"]
    (again,) = h.launch("gpu-2").failed  # remembered: not even asked
    assert h.calls["CreateFleet"] == calls
    assert again.error_class is ErrorClass.PERMANENT
    assert f"g5.xlarge in {world.zones[world.subnets[0]]}" in again.reason


def test_permanent_failures_never_start_a_capacity_cooldown() -> None:
    now = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
    event = {"action": "launch_failed", "source": "resume", "node": "gpu-1",
             "time": (now - timedelta(seconds=5)).isoformat(),
             "reason": "(Code:Unsupported)permanent: ...",
             "extra": {"code": "Unsupported", "class": "permanent", "pool": ""}}
    history = build_history([event], {"gpu-1": "gpu"}, now, Settings())
    assert history.new_capacity == {}
    assert normalize_code("Unsupported") not in history.capacity_codes


def test_one_code_table_per_provider_for_hooks_and_reconciler() -> None:
    """The reconciler's capacity codes are exactly the providers' tables' (it had
    SpotMaxPriceTooLow, a config error in the AWS table, as capacity); Unsupported is
    PERMANENT in the table the hooks classify with, so the reconciler never cools down on it."""
    assert ERROR_TABLE["SpotMaxPriceTooLow"].error_class is ErrorClass.CONFIG
    assert normalize_code("SpotMaxPriceTooLow") not in KNOWN_CAPACITY_CODES
    from_tables = {normalize_code(c) for c, k in ERROR_TABLE.items()
                   if k.error_class is ErrorClass.CAPACITY}
    from_tables |= {normalize_code(c) for c, k in GCP_ERROR_CLASSES.items()
                    if k is ErrorClass.CAPACITY}
    from_tables.add(normalize_code("InsufficientInstanceCapacity"))
    assert KNOWN_CAPACITY_CODES == from_tables == capacity_codes()
    assert ERROR_TABLE["Unsupported"].error_class is ErrorClass.PERMANENT
    assert normalize_code("Unsupported") not in KNOWN_CAPACITY_CODES


def test_a_job_beyond_the_quota_is_flagged_naming_quota_and_job_and_held(aws):
    """The issue's input: a 3-node job of 16 vCPU each under a 32 vCPU spot quota."""
    from slurm_spot.events import read_events
    from slurm_spot.lifecycle import power
    from slurm_spot.slurm.client import SlurmClient
    from tests.fakes.fake_slurm import resuming_slurm

    _, world = aws
    h = Harness(make_config(world, instance_types=["g5.4xlarge"]))
    h.market.vcpu_limit["spot"] = 32
    scontrol = resuming_slurm(["gpu-1", "gpu-2", "gpu-3"], pending_jobs=(12,))
    result = power.resume(h.config, "gpu-[1-3]", SlurmClient("/usr/bin", runner=scontrol),
                          lambda c, name: h.provider, jobs={12: ("gpu-1", "gpu-2", "gpu-3")})
    (failure,) = result.failed
    assert failure.error_class is ErrorClass.QUOTA
    assert (failure.quota_limit, failure.quota_per_node) == (32, 16)
    reason = scontrol.nodes["gpu-3"].reason
    assert reason.startswith("(Code:VcpuLimitExceeded)quota: job 12 needs 48 vCPU")
    assert "32 vCPU quota" in reason
    assert ["/usr/bin/scontrol", "hold", "12"] in scontrol.calls
    assert scontrol.jobs[12].reason == "JobHeldAdmin"
    # all-or-nothing: the two instances the quota allowed are given back, not left idle
    assert result.launched == [] and len(result.terminated) == 2
    flagged = [e for e in read_events(h.config.log_dir)
               if (e.get("extra") or {}).get("beyond_quota")]
    assert [(e["node"], e["job_ids"]) for e in flagged] == [("gpu-3", [12])]


def test_a_job_within_the_quota_is_not_held(aws):
    from slurm_spot.lifecycle import power
    from slurm_spot.slurm.client import SlurmClient
    from tests.fakes.fake_slurm import resuming_slurm

    _, world = aws
    h = Harness(make_config(world, instance_types=["g5.4xlarge"]))
    h.market.vcpu_limit["spot"] = 32
    Harness.launch(h, "gpu-9")  # 16 of the 32 vCPU in use by another job
    scontrol = resuming_slurm(["gpu-1", "gpu-2"], pending_jobs=(13,))
    result = power.resume(h.config, "gpu-[1-2]", SlurmClient("/usr/bin", runner=scontrol),
                          lambda c, name: h.provider, jobs={13: ("gpu-1", "gpu-2")})
    assert [f.error_class for f in result.failed] == [ErrorClass.QUOTA]
    assert not any(c[1:2] == ["hold"] for c in scontrol.calls)  # it fits once gpu-9 is gone
    assert "job 13" not in scontrol.nodes["gpu-2"].reason


# ---- GCE: a machine or accelerator type a zone does not offer ------------------------------
# The real google-cloud-compute client against the fake Compute API (tests/fakes/gce_api.py),
# which refuses such a request the way GCE does (HTTP 400 ``invalid`` / 404 ``notFound``
# naming the type's zonal resource).

GCE_A, GCE_B = "us-central1-a", "us-central1-b"


@pytest.fixture
def gce() -> Iterator[Any]:
    from tests.fakes.gce_api import FakeCompute

    with FakeCompute() as fake:
        yield fake


def _gce_config(fake: Any, tmp_path: Any, **gcp: Any) -> Any:
    from tests.fakes.gce_api import gcp_config

    node_set = {"name": "gpu", "count": 4, "instance_types": gcp.pop("instance_types", []),
                "gcp": {"zones": [GCE_A], "machine_type": "a2-highgpu-1g",
                        "image": "debian-12", **gcp}}
    if "gpus" in node_set["gcp"]:
        node_set["gpus"] = node_set["gcp"].pop("gpus")
    return gcp_config(fake, [node_set], state_dir=str(tmp_path / "state"),
                      log_dir=str(tmp_path / "log"))


def _gce_launch(config: Any, *nodes: str) -> Any:
    """One launch by a new provider object, as a new resume hook process would make."""
    from slurm_spot.providers.base import LaunchRequest
    from slurm_spot.providers.gcp.provider import GcpProvider

    provider = GcpProvider(config, "gcp", config.providers["gcp"], sleep=lambda s: None)
    return provider.launch(LaunchRequest(config.cluster, config.node_sets[0], nodes))


def _asked(fake: Any) -> list[tuple[str, tuple[str, ...]]]:
    """(machine type, zones it may land in) of every bulk insert the fake received."""
    asked = []
    for call in fake.calls("bulkInsert"):
        body, path = call["body"], call["path"]
        policy = (body.get("locationPolicy") or {}).get("locations") or {}
        zones = tuple(sorted(k.split("/")[-1] for k, v in policy.items()
                             if v.get("preference") == "ALLOW"))
        asked.append((body["instanceProperties"].get("machineType"),
                      zones or (path.split("/zones/")[1].split("/")[0],)))
    return asked


def test_gce_unoffered_zone_is_remembered_and_the_other_zone_still_tried(gce, tmp_path):
    """a2-highgpu-1g is not offered in us-central1-a: the node set's other zone launches it,
    no pool is blamed (no cooldown), and no later hook run asks us-central1-a for it again."""
    gce.unoffer("a2-highgpu-1g", GCE_A)
    config = _gce_config(gce, tmp_path, zones=[GCE_A, GCE_B])
    first = _gce_launch(config, "gpu-1", "gpu-2")
    assert [(i.node, i.zone) for i in first.launched] == [("gpu-1", GCE_B), ("gpu-2", GCE_B)]
    assert first.failed == () and first.failed_pools == ()
    assert _asked(gce) == [("a2-highgpu-1g", (GCE_A, GCE_B)), ("a2-highgpu-1g", (GCE_B,))]

    gce.requests.clear()
    again = _gce_launch(config, "gpu-3")
    assert [(i.node, i.zone) for i in again.launched] == [("gpu-3", GCE_B)]
    assert _asked(gce) == [("a2-highgpu-1g", (GCE_B,))]  # remembered: asked once, right


def test_gce_unoffered_type_falls_to_the_next_type_and_is_never_asked_again(gce, tmp_path):
    gce.unoffer("a2-highgpu-1g", GCE_A)
    # In the order written (by price, the L4 type would be asked first and the A100 never).
    config = _gce_config(gce, tmp_path, instance_types=["g2-standard-4"], type_order="config")
    first = _gce_launch(config, "gpu-1")
    assert [(i.node, i.instance_type) for i in first.launched] == [("gpu-1", "g2-standard-4")]
    assert first.failed == () and first.failed_pools == ()
    assert [t for t, _ in _asked(gce)] == ["a2-highgpu-1g", "g2-standard-4"]

    gce.requests.clear()
    _gce_launch(config, "gpu-2")
    assert [t for t, _ in _asked(gce)] == ["g2-standard-4"]


def test_gce_a_node_set_with_no_offered_pair_fails_permanent_and_starts_no_cooldown(
    gce, tmp_path
):
    """The resume hook's view: the failure is PERMANENT (never capacity), the nodes are powered
    down with a (Code:...) reason, and the reconciler's history sees no capacity failure."""
    from slurm_spot.events import read_events
    from slurm_spot.lifecycle import power
    from slurm_spot.slurm.client import SlurmClient
    from tests.fakes.fake_slurm import resuming_slurm

    gce.unoffer("a2-highgpu-1g", GCE_A)
    config = _gce_config(gce, tmp_path)
    (failure,) = _gce_launch(config, "gpu-1").failed
    assert (failure.code, failure.error_class, failure.pool) == (
        "invalid", ErrorClass.PERMANENT, "")
    assert "does not exist in zone" in failure.message

    gce.requests.clear()
    scontrol = resuming_slurm(["gpu-2", "gpu-3"])
    result = power.resume(config, "gpu-[2-3]", SlurmClient("/usr/bin", runner=scontrol))
    assert gce.calls("bulkInsert") == []  # remembered: GCE is not even asked
    (again,) = result.failed
    assert (again.code, again.error_class) == ("TYPE_NOT_OFFERED", ErrorClass.PERMANENT)
    assert f"a2-highgpu-1g in {GCE_A}" in again.reason
    assert scontrol.nodes["gpu-2"].reason.startswith("(Code:TYPE_NOT_OFFERED)")

    now = datetime.now(timezone.utc)
    history = build_history(read_events(config.log_dir), {"gpu-2": "gpu", "gpu-3": "gpu"},
                            now + timedelta(seconds=1), Settings())
    assert history.new_capacity == {}
    assert normalize_code("TYPE_NOT_OFFERED") not in history.capacity_codes
    assert normalize_code("invalid") not in history.capacity_codes


def test_gce_unoffered_accelerator_is_remembered_per_zone(gce, tmp_path):
    """An N1 machine with T4s attached: nvidia-tesla-t4 is not offered in us-central1-a (GCE
    answers 404 notFound on the accelerator type); us-central1-b is used."""
    gce.unoffer("nvidia-tesla-t4", GCE_A)
    config = _gce_config(gce, tmp_path, zones=[GCE_A, GCE_B], machine_type="n1-standard-8",
                         gpus={"type": "t4", "count": 1})
    first = _gce_launch(config, "gpu-1")
    assert [i.zone for i in first.launched] == [GCE_B] and first.failed_pools == ()
    gce.requests.clear()
    _gce_launch(config, "gpu-2")
    assert _asked(gce) == [("n1-standard-8", (GCE_B,))]


def test_gce_an_invalid_request_that_names_no_type_stays_config(gce, tmp_path):
    """Only a missing machine/accelerator type of a zone is permanent per pair; any other
    ``invalid`` is the request as written (CONFIG), and nothing is remembered."""
    gce.fail_http("bulkInsert", 400, "invalid", times=5)
    config = _gce_config(gce, tmp_path, zones=[GCE_A, GCE_B])
    (failure,) = _gce_launch(config, "gpu-1").failed
    assert failure.error_class is ErrorClass.CONFIG
    assert not (tmp_path / "state" / "gcp" / "gcp-unoffered.json").exists()
