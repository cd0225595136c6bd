"""Every row of the gcp part of the field cases (tests/data/gcp_cloud_errors.yaml), through the
pure error table and through a launch against the fake Compute API with the real client."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_spot.lifecycle import power
from slurm_spot.providers.base import ErrorClass, LaunchRequest
from slurm_spot.providers.gcp.errors import (
    GceError,
    classify_gcp,
    errors_from_resource,
    most_specific,
)
from slurm_spot.providers.gcp.provider import GcpProvider
from slurm_spot.slurm.client import CommandResult, SlurmClient
from tests.fakes.gce_api import FakeCompute, gcp_config

CASES = yaml.safe_load((Path(__file__).parent / "data" / "gcp_cloud_errors.yaml").read_text())
ROWS = CASES["gcp"]
ZONE = "us-central1-a"
NODE_SET = {"name": "gpu", "count": 4, "gcp": {
    "zones": [ZONE], "machine_type": "n1-standard-4", "image": "debian-12"}}


def _codes(row: dict) -> list[str]:
    return row["code"] if isinstance(row["code"], list) else [row["code"]]


def _id(row: dict) -> str:
    return "+".join(_codes(row))


@pytest.fixture
def fake():
    with FakeCompute() as server:
        yield server


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _provider(fake: FakeCompute, sleeps: list[float], tmp_path: Path | None = None):
    extra = {"log_dir": str(tmp_path), "state_dir": str(tmp_path)} if tmp_path else {}
    config = gcp_config(fake, [NODE_SET], **extra)
    provider = GcpProvider(config, "gcp", config.providers["gcp"], sleep=sleeps.append,
                           rng=lambda: 0.5)
    return config, provider


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_table_classifies_each_row_as_the_cases_say(row: dict) -> None:
    errors = errors_from_resource(
        {"errors": [{"code": c, "message": f"{c} happened"} for c in _codes(row)]})
    best = most_specific(errors)
    assert best is not None
    assert best.error_class.value == row["class"]


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_operation_error_reaches_the_user_with_code_class_and_reason(
    row: dict, fake: FakeCompute, sleeps: list[float]
) -> None:
    codes = _codes(row)
    decisive = codes[-1]  # the listed code that is not generic
    fake.fail_operation(codes, zone=ZONE, times=None)
    config, provider = _provider(fake, sleeps)
    result = provider.launch(LaunchRequest("demo", config.node_sets[0], ("gpu-1", "gpu-2")))

    assert result.launched == ()
    assert fake.all_instances() == []
    (failure,) = result.failed
    assert failure.nodes == ("gpu-1", "gpu-2")
    assert failure.code == decisive
    assert failure.error_class.value == row["class"]
    assert failure.reason.startswith(f"(Code:{decisive})")
    bulk_calls = len(fake.calls("bulkInsert"))
    if row["class"] in ("capacity", "quota"):
        assert bulk_calls == 1  # fail fast, no retry of the same pool
        assert result.failed_pools == (f"n1-standard-4/{ZONE}/spot",)
        assert sleeps == []
    else:  # throttle and unknown: bounded retries with jittered back-off, no pool blamed
        assert result.failed_pools == ()
        assert bulk_calls == provider.max_attempts
        assert sleeps == [provider.backoff_s * 0.75, provider.backoff_s * 2 * 0.75]
        ids = {c["query"]["requestId"] for c in fake.calls("bulkInsert")}
        assert len(ids) == provider.max_attempts  # a new request id after a failed operation


def test_unknown_error_lists_instances_before_each_retry(
    fake: FakeCompute, sleeps: list[float]
) -> None:
    fake.fail_operation("SOMETHING_NEW_AND_UNLISTED", zone=ZONE, times=None)
    config, provider = _provider(fake, sleeps)
    provider.launch(LaunchRequest("demo", config.node_sets[0], ("gpu-1",)))
    methods = [r["method"] for r in fake.requests if r["method"] != "wait"]
    for i, method in enumerate(methods):
        if method == "bulkInsert" and i > 1:
            assert methods[i - 1] == "aggregatedList"


def test_a_transient_throttle_in_the_operation_is_retried_and_then_launches(
    fake: FakeCompute, sleeps: list[float]
) -> None:
    fake.fail_operation("RATE_LIMIT_EXCEEDED", zone=ZONE, times=1)
    config, provider = _provider(fake, sleeps)
    result = provider.launch(LaunchRequest("demo", config.node_sets[0], ("gpu-1",)))
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert result.failed == ()
    assert len(sleeps) == 1


def test_capacity_row_note_nodes_are_powered_down_never_left_in_plain_down(
    fake: FakeCompute, sleeps: list[float], tmp_path: Path
) -> None:
    """The resume hook turns the capacity failure into DOWN + POWER_DOWN (back to idle~)."""
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=ZONE, times=None)
    config, _ = _provider(fake, sleeps, tmp_path)
    scontrol: list[list[str]] = []

    def runner(argv: list[str], timeout_s: float) -> CommandResult:
        scontrol.append(argv[1:])
        return CommandResult(argv, 0, "", "")

    result = power.resume(config, "gpu-[1-2]", SlurmClient("/usr/bin", runner))
    assert [f.code for f in result.failed] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    states = [next(a for a in argv if a.startswith("state=")) for argv in scontrol]
    assert states == ["state=DOWN", "state=POWER_DOWN"]
    for argv in scontrol:
        assert "nodename=gpu-[1-2]" in argv
        assert any(a.startswith("reason=(Code:ZONE_RESOURCE_POOL_EXHAUSTED)") for a in argv)


@pytest.mark.parametrize(("code", "expected"), [
    ("QUOTA_EXCEEDED", ErrorClass.QUOTA),
    ("quotaExceeded", ErrorClass.QUOTA),
    ("rateLimitExceeded", ErrorClass.THROTTLE),
    ("zone_resource_pool_exhausted", ErrorClass.CAPACITY),
    ("notFound", ErrorClass.CONFIG),
    ("forbidden", ErrorClass.AUTH),
    ("VM_MIN_COUNT_NOT_REACHED", ErrorClass.CAPACITY),
    ("SOMETHING_NEW_AND_UNLISTED", ErrorClass.UNKNOWN),
])
def test_codes_compare_in_any_spelling(code: str, expected: ErrorClass) -> None:
    assert classify_gcp(code) is expected


def test_most_specific_ignores_already_exists_and_prefers_listed_codes() -> None:
    errors = [GceError("RESOURCE_ALREADY_EXISTS"), GceError("VM_MIN_COUNT_NOT_REACHED"),
              GceError("SOMETHING_NEW"), GceError("STOCKOUT")]
    assert most_specific(errors) == GceError("STOCKOUT")
    assert most_specific(errors[:3]) == GceError("SOMETHING_NEW")
    assert most_specific(errors[:1]) is None


def test_capacity_details_carry_the_zone() -> None:
    (error,) = errors_from_resource({"errors": [{
        "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "message": "no room",
        "errorDetails": [{"help": {}}, {"errorInfo": {"reason": "resource_availability",
                                                      "metadatas": {"zone": "us-central1-b",
                                                                    "vmType": "a2-highgpu-1g"}}}],
    }]})
    assert (error.zone, error.vm_type) == ("us-central1-b", "a2-highgpu-1g")


@pytest.mark.parametrize(("status", "reason", "expected", "bulk_calls"), [
    (403, "quotaExceeded", ErrorClass.QUOTA, 1),
    (403, "forbidden", ErrorClass.AUTH, 1),
    (400, "invalid", ErrorClass.CONFIG, 1),
    (429, "rateLimitExceeded", ErrorClass.THROTTLE, 3),
    (500, "backendError", ErrorClass.UNKNOWN, 3),
])
def test_http_errors_of_the_bulk_insert_are_classified_too(
    fake: FakeCompute, sleeps: list[float], status: int, reason: str, expected: ErrorClass,
    bulk_calls: int,
) -> None:
    fake.fail_http("bulkInsert", status, reason, times=10)
    config, provider = _provider(fake, sleeps)
    result = provider.launch(LaunchRequest("demo", config.node_sets[0], ("gpu-1",)))
    (failure,) = result.failed
    assert (failure.code, failure.error_class) == (reason, expected)
    calls = fake.calls("bulkInsert")
    assert len(calls) == bulk_calls
    # a refused HTTP call is retried with the same request id: GCE dedups if it got through
    assert len({c["query"]["requestId"] for c in calls}) == 1


def test_a_throttled_http_call_is_retried_with_the_same_request_id_and_launches(
    fake: FakeCompute, sleeps: list[float]
) -> None:
    fake.fail_http("bulkInsert", 429, "rateLimitExceeded", times=1)
    config, provider = _provider(fake, sleeps)
    result = provider.launch(LaunchRequest("demo", config.node_sets[0], ("gpu-1",)))
    assert [i.node for i in result.launched] == ["gpu-1"]
    first, second = fake.calls("bulkInsert")
    assert first["query"]["requestId"] == second["query"]["requestId"]


@pytest.mark.parametrize(("reason", "message", "pair"), [
    # HTTP 400 of instances.insert with a zonal machine type URL (field report, terratest)
    ("invalid", "Invalid value for field 'resource.machineType': "
     "'zones/europe-west8-a/machineTypes/f1-micro'. Machine type with name 'f1-micro' does not "
     "exist in zone 'europe-west8-a'.", ("f1-micro", "europe-west8-a")),
    # the same for a bare type name (bulkInsert's instanceProperties.machineType)
    ("invalid", "Invalid value for field 'resource.instanceProperties.machineType': "
     "'a2-highgpu-1g'. Machine type with name 'a2-highgpu-1g' does not exist in zone "
     "'us-central1-a'.", ("a2-highgpu-1g", "us-central1-a")),
    # HTTP 404 on an accelerator type the zone lacks (field report, gcloud instances create)
    ("notFound", "The resource 'projects/p-1/zones/us-west1-b/acceleratorTypes/nvidia-tesla-p4' "
     "was not found", ("nvidia-tesla-p4", "us-west1-b")),
])
def test_a_type_not_offered_in_a_zone_is_permanent_for_that_pair(
    reason: str, message: str, pair: tuple[str, str]
) -> None:
    (error,) = errors_from_resource({"errors": [{"reason": reason, "message": message}]})
    assert error.error_class is ErrorClass.PERMANENT
    assert error.pair == pair


@pytest.mark.parametrize(("reason", "message"), [
    ("invalid", "Invalid value for field 'resource.name': 'Bad_Name'."),
    ("notFound", "The resource 'projects/p/global/images/debian-13' was not found"),
    ("notFound", "The resource 'projects/p/global/instanceTemplates/gpu' was not found"),
    # a capacity code naming the zone's machine type stays capacity
    ("ZONE_RESOURCE_POOL_EXHAUSTED", "zones/us-central1-a/machineTypes/a2-highgpu-1g: none left"),
])
def test_other_errors_naming_resources_keep_their_class(reason: str, message: str) -> None:
    (error,) = errors_from_resource({"errors": [{"reason": reason, "message": message}]})
    assert error.error_class is classify_gcp(reason) and error.pair is None


@pytest.mark.parametrize(("message", "metric", "limit", "unit"), [
    ("Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1.", "CPUS", 24, "vCPU"),
    ("Quota 'N2_CPUS' exceeded.  Limit: 8.0 in region europe-west4.", "N2_CPUS", 8, "vCPU"),
    ("Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 16.0 in region us-central1.",
     "NVIDIA_A100_GPUS", 16, "GPU"),
    ("Quota 'INSTANCES' exceeded.  Limit: 10.0 in region us-east1.", "INSTANCES", 10,
     "instance"),
])
def test_a_quota_error_names_its_quota_and_limit(message: str, metric: str, limit: int,
                                                 unit: str) -> None:
    from slurm_spot.providers.gcp.errors import gce_error, quota_limit

    found = quota_limit(gce_error("QUOTA_EXCEEDED", message))
    assert found is not None
    assert (found.metric, found.limit, found.unit) == (metric, limit, unit)
    assert quota_limit(gce_error("ZONE_RESOURCE_POOL_EXHAUSTED", message)) is None
    assert quota_limit(gce_error("QUOTA_EXCEEDED", "quota exceeded")) is None
