"""The gcp provider: pure request builders against expected dicts, then launches, listings and
deletions against the fake Compute API driven by the real google-cloud-compute client."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from slurm_spot.config import GcpProviderConfig, NodeSetConfig
from slurm_spot.errors import ProviderError
from slurm_spot.lifecycle import power
from slurm_spot.providers.base import (
    TAG_CLUSTER,
    TAG_MARKET,
    TAG_NODE_SET,
    ErrorClass,
    Instance,
    InstanceState,
    LaunchRequest,
)
from slurm_spot.providers.gcp import api as gcp_api
from slurm_spot.providers.gcp.provider import GcpProvider
from slurm_spot.providers.gcp.requests import (
    Attempt,
    bulk_insert_body,
    instance_from_resource,
    is_valid_instance_name,
    label_filter,
    label_value,
    request_id,
    scheduling,
)
from slurm_spot.slurm.client import CommandResult, SlurmClient
from tests.fakes.gce_api import FakeCompute, gcp_config

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
GPU_SET: dict[str, Any] = {
    "name": "gpu", "count": 8, "fallback": "on-demand", "gpus": {"type": "t4", "count": 1},
    "gcp": {"zones": [A, B], "machine_type": "n1-standard-8",
            "image": "projects/debian-cloud/global/images/family/debian-12"}}
CPU_SET: dict[str, Any] = {"name": "cpu", "count": 4, "market": "on-demand",
           "gcp": {"zones": [C], "instance_template": "cpu-template"}}


# -- pure builders and parsers ---------------------------------------------------------------
def _node_set(data: dict) -> NodeSetConfig:
    return NodeSetConfig.model_validate({"provider": "gcp", **data})


def test_bulk_insert_body_for_a_regional_spot_gpu_node_set() -> None:
    attempt = Attempt("spot", "n1-standard-8", (A, B), regional=True)
    body = bulk_insert_body("proj", "us-central1", "demo", _node_set(GPU_SET),
                            ["demo-gpu-1", "demo-gpu-2"], attempt)
    assert body == {
        "count": "2",
        "minCount": "1",
        "perInstanceProperties": {"demo-gpu-1": {"name": "demo-gpu-1"},
                                  "demo-gpu-2": {"name": "demo-gpu-2"}},
        "instanceProperties": {
            "labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu", TAG_MARKET: "spot"},
            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                           "onHostMaintenance": "TERMINATE", "automaticRestart": False},
            "machineType": "n1-standard-8",
            "guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}],
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {
                           "sourceImage": "projects/debian-cloud/global/images/family/debian-12",
                           "diskSizeGb": "50"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
        },
        "locationPolicy": {"locations": {f"zones/{A}": {"preference": "ALLOW"},
                                         f"zones/{B}": {"preference": "ALLOW"}},
                           "targetShape": "ANY_SINGLE_ZONE"},
    }


def test_bulk_insert_body_for_a_zonal_on_demand_template_node_set() -> None:
    attempt = Attempt("on-demand", None, (C,), regional=False)
    body = bulk_insert_body("proj", "us-central1", "demo", _node_set(CPU_SET),
                            ["demo-cpu-1"], attempt)
    assert body == {
        "count": "1",
        "minCount": "1",
        "perInstanceProperties": {"demo-cpu-1": {"name": "demo-cpu-1"}},
        "instanceProperties": {
            "labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "cpu", TAG_MARKET: "on-demand"},
            "scheduling": {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE",
                           "automaticRestart": False},
        },
        "sourceInstanceTemplate": "projects/proj/global/instanceTemplates/cpu-template",
    }


def test_a_retry_denies_the_zones_that_failed_and_keeps_local_ssds_and_subnetwork() -> None:
    data = {**GPU_SET, "gcp": {**GPU_SET["gcp"], "zones": [A, B, C], "local_ssds": 2,
                               "subnetwork": "compute", "termination_action": "STOP",
                               "machine_type": "a2-highgpu-1g"}}
    attempt = Attempt("spot", "a2-highgpu-1g", (B, C), regional=True, denied=(A,))
    body = bulk_insert_body("proj", "us-central1", "demo", _node_set(data), ["demo-gpu-1"],
                            attempt)
    props = body["instanceProperties"]
    assert body["locationPolicy"]["locations"] == {  # type: ignore[index]
        f"zones/{B}": {"preference": "ALLOW"}, f"zones/{C}": {"preference": "ALLOW"},
        f"zones/{A}": {"preference": "DENY"}}
    assert props["scheduling"]["instanceTerminationAction"] == "STOP"  # type: ignore[index]
    assert "guestAccelerators" not in props  # type: ignore[operator]  # A2 brings its GPUs
    disks = props["disks"]  # type: ignore[index]
    assert disks[1:] == [{"type": "SCRATCH", "interface": "NVME", "autoDelete": True,
                          "initializeParams": {"diskType": "local-ssd"}}] * 2
    assert props["networkInterfaces"] == [{  # type: ignore[index]
        "network": "global/networks/default",
        "subnetwork": "regions/us-central1/subnetworks/compute"}]


@pytest.mark.parametrize(("market", "preemptible", "expected"), [
    ("spot", False, {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}),
    ("on-demand", False, {"provisioningModel": "STANDARD"}),
    ("on-demand", True, {"preemptible": True}),
])
def test_scheduling_per_market(market: str, preemptible: bool, expected: dict) -> None:
    assert scheduling(market, "DELETE", preemptible) == {
        "onHostMaintenance": "TERMINATE", "automaticRestart": False, **expected}


@pytest.mark.parametrize(("name", "valid"), [
    ("demo-gpu-1", True), ("a", True), ("demo-", False), ("1demo", False),
    ("Demo-gpu-1", False), ("demo_gpu", False), ("d" * 63, True), ("d" * 64, False),
])
def test_instance_names_follow_gce_naming(name: str, valid: bool) -> None:
    assert is_valid_instance_name(name) is valid


def test_labels_and_filters_are_label_safe() -> None:
    assert label_value("On Demand.X") == "on-demand-x"
    assert len(label_value("x" * 80)) == 63
    assert label_filter({"b": "2", "a": "1"}) == '(labels.a = "1") AND (labels.b = "2")'


def test_request_ids_are_uuids_derived_from_the_batch() -> None:
    attempt = Attempt("spot", "n1-standard-8", (A, B), regional=True)
    first = request_id("demo|tok", attempt)
    assert first == request_id("demo|tok", attempt)
    assert len({first, request_id("demo|tok", attempt, 1), request_id("demo|other", attempt),
                request_id("demo|tok", replace(attempt, zones=(B,)))}) == 4
    assert len(first) == 36 and first.count("-") == 4


@pytest.mark.parametrize(("status", "state"), [
    ("PROVISIONING", InstanceState.PENDING), ("STAGING", InstanceState.PENDING),
    ("RUNNING", InstanceState.RUNNING), ("STOPPING", InstanceState.STOPPING),
    ("SUSPENDING", InstanceState.STOPPING), ("TERMINATED", InstanceState.STOPPED),
    ("STOPPED", InstanceState.STOPPED), ("SUSPENDED", InstanceState.STOPPED),
])
def test_instance_status_maps_to_provider_neutral_states(status: str, state: InstanceState) -> None:
    inst = instance_from_resource({"name": "demo-gpu-1", "status": status}, "demo")
    assert inst.state is state


def test_instance_resource_becomes_an_instance() -> None:
    inst = instance_from_resource({
        "name": "demo-gpu-3", "status": "TERMINATED",
        "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-b",
        "machineType": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-b/"
                       "machineTypes/n1-standard-8",
        "labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu"},
        "scheduling": {"provisioningModel": "SPOT"},
        "networkInterfaces": [{"networkIP": "10.0.0.7"}],
        "creationTimestamp": "2024-06-26T11:42:22.006-07:00",
    }, "demo")
    assert inst == Instance(
        instance_id="demo-gpu-3", node="gpu-3", node_set="gpu", state=InstanceState.STOPPED,
        market="spot", instance_type="n1-standard-8", zone="us-central1-b",
        launch_time=datetime(2024, 6, 26, 18, 42, 22, 6000, tzinfo=timezone.utc),
        private_ip="10.0.0.7", hostname="demo-gpu-3", state_reason="preempted")
    assert inst.was_reclaimed


@pytest.mark.parametrize("stamp", ["2024-06-26T18:42:22.006Z", "2024-06-26T18:42:22.006+00:00",
                                   "2024-06-26T11:42:22.006-07:00"])
def test_a_creation_time_in_z_or_offset_form_is_the_same_utc_instant(stamp: str) -> None:
    """RFC 3339 lets the Compute API write UTC as ``Z`` (Python 3.11's fromisoformat reads
    it): the instance's launch time, which the reconciler ages instances by, is that instant."""
    inst = instance_from_resource({
        "name": "demo-gpu-3", "status": "RUNNING", "zone": "zones/us-central1-b",
        "labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu"},
        "creationTimestamp": stamp}, "demo")
    assert inst.launch_time == datetime(2024, 6, 26, 18, 42, 22, 6000, tzinfo=timezone.utc)


# -- against the fake Compute API ------------------------------------------------------------
@pytest.fixture
def fake():
    with FakeCompute() as server:
        server.add_template("cpu-template", {"machineType": "e2-standard-4"})
        yield server


def _provider(fake: FakeCompute, *sets: dict, **kwargs: object) -> GcpProvider:
    config = gcp_config(fake, list(sets) or [GPU_SET, CPU_SET])
    kwargs.setdefault("sleep", lambda s: None)
    return GcpProvider(config, "gcp", config.providers["gcp"], **kwargs)  # type: ignore[arg-type]


def _launch(provider: GcpProvider, set_name: str, *nodes: str, token: str = "tok"):
    node_set = provider.config.node_set(set_name)
    return provider.launch(LaunchRequest("demo", node_set, nodes, token))


def test_one_bulk_request_per_node_set_creates_labelled_spot_vms(fake: FakeCompute) -> None:
    provider = _provider(fake)
    gpu = _launch(provider, "gpu", "gpu-1", "gpu-2", "gpu-3")
    cpu = _launch(provider, "cpu", "cpu-1", "cpu-2")

    bulk = fake.calls("bulkInsert")
    assert [c["path"].split("/projects/test-project/")[1] for c in bulk] == [
        "regions/us-central1/instances/bulkInsert", f"zones/{C}/instances/bulkInsert"]
    assert [sorted(c["body"]["perInstanceProperties"]) for c in bulk] == [
        ["demo-gpu-1", "demo-gpu-2", "demo-gpu-3"], ["demo-cpu-1", "demo-cpu-2"]]
    assert gpu.failed == cpu.failed == ()
    assert gpu.api_calls == 4  # list, bulkInsert, wait, list
    by_name = {i["name"]: i for i in fake.all_instances()}
    assert sorted(by_name) == ["demo-cpu-1", "demo-cpu-2", "demo-gpu-1", "demo-gpu-2",
                               "demo-gpu-3"]
    vm = by_name["demo-gpu-2"]
    assert vm["labels"] == {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu", TAG_MARKET: "spot"}
    assert vm["scheduling"]["provisioningModel"] == "SPOT"
    assert vm["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert vm["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4",
                                        "acceleratorCount": 1}]
    assert by_name["demo-cpu-1"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert by_name["demo-cpu-1"]["machineType"].endswith("/e2-standard-4")
    launched = {i.node: i for i in gpu.launched + cpu.launched}
    assert launched["gpu-2"].private_ip == vm["networkInterfaces"][0]["networkIP"]
    assert (launched["gpu-2"].market, launched["cpu-1"].market) == ("spot", "on-demand")
    assert launched["gpu-2"].zone == A and launched["cpu-1"].zone == C


def test_instances_have_the_same_json_fields_as_every_provider(fake: FakeCompute) -> None:
    provider = _provider(fake)
    _launch(provider, "gpu", "gpu-1")
    (listed,) = provider.list_instances()
    local_like = Instance("loc-1", "spot-1", "spot", InstanceState.RUNNING, "spot", "local",
                          "local", datetime.now(timezone.utc), "127.0.0.1", "spot-1")
    as_json = listed.to_json()
    assert as_json.keys() == local_like.to_json().keys()
    assert as_json | {"launch_time": None} == {
        "instance_id": "demo-gpu-1", "node": "gpu-1", "node_set": "gpu", "state": "running",
        "market": "spot", "instance_type": "n1-standard-8", "zone": A, "launch_time": None,
        "private_ip": listed.private_ip, "state_reason": ""}
    assert datetime.fromisoformat(str(as_json["launch_time"])).tzinfo is not None


def test_stockout_in_the_operation_falls_over_to_the_next_zone(fake: FakeCompute) -> None:
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=A, market="spot")
    result = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2")
    assert result.failed == ()
    assert {(i.node, i.zone, i.market) for i in result.launched} == {
        ("gpu-1", B, "spot"), ("gpu-2", B, "spot")}
    assert result.failed_pools == (f"n1-standard-8/{A}/spot",)
    second = fake.calls("bulkInsert")[1]["body"]["locationPolicy"]["locations"]
    assert second == {f"zones/{B}": {"preference": "ALLOW"}, f"zones/{A}": {"preference": "DENY"}}


def test_stockout_in_every_zone_falls_back_to_on_demand(fake: FakeCompute) -> None:
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=A, market="spot", times=None)
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", zone=B, market="spot",
                        times=None)
    result = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2")
    assert result.failed == ()
    assert {(i.node, i.market) for i in result.launched} == {("gpu-1", "on-demand"),
                                                             ("gpu-2", "on-demand")}
    assert result.failed_pools == (f"n1-standard-8/{A}/spot", f"n1-standard-8/{B}/spot")
    labels = {i["labels"][TAG_MARKET] for i in fake.all_instances()}
    assert labels == {"on-demand"}


def test_stockout_everywhere_fails_the_nodes_with_a_capacity_reason(fake: FakeCompute) -> None:
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    result = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2")
    (failure,) = result.failed
    assert (failure.nodes, failure.error_class) == (("gpu-1", "gpu-2"), ErrorClass.CAPACITY)
    assert failure.reason.startswith("(Code:ZONE_RESOURCE_POOL_EXHAUSTED)The zone")
    assert len(result.failed_pools) == 4  # 2 zones x (spot, on-demand)
    assert len(fake.calls("bulkInsert")) == 4
    assert fake.all_instances() == []


def test_next_machine_type_before_the_fallback_market(fake: FakeCompute) -> None:
    data = {**GPU_SET, "instance_types": ["n1-standard-16"], "gcp": {**GPU_SET["gcp"],
                                                                     "zones": [A]}}
    fake.fail_operation("STOCKOUT", zone=A, market="spot")
    result = _launch(_provider(fake, data), "gpu", "gpu-1")
    assert [(i.instance_type, i.market) for i in result.launched] == [("n1-standard-16", "spot")]
    assert result.failed_pools == (f"n1-standard-8/{A}/spot",)


def test_partial_capacity_sends_the_rest_to_the_next_zone(fake: FakeCompute) -> None:
    fake.capacity[A] = 1
    result = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2", "gpu-3")
    zones = sorted(i.zone for i in result.launched)
    assert zones == [A, B, B]
    assert len(fake.calls("bulkInsert")) == 2


def test_a_rerun_creates_nothing_new(fake: FakeCompute) -> None:
    provider = _provider(fake)
    first = _launch(provider, "gpu", "gpu-1", "gpu-2")
    before = fake.all_instances()
    again = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2")
    assert fake.all_instances() == before
    assert len(fake.calls("bulkInsert")) == 1
    assert again.api_calls == 1  # one listing
    assert [i.instance_id for i in again.launched] == [i.instance_id for i in first.launched]


def test_a_rerun_for_more_nodes_only_creates_the_missing_ones(fake: FakeCompute) -> None:
    _launch(_provider(fake), "gpu", "gpu-1")
    result = _launch(_provider(fake), "gpu", "gpu-1", "gpu-2", token="tok2")
    assert sorted(i.node for i in result.launched) == ["gpu-1", "gpu-2"]
    assert list(fake.calls("bulkInsert")[1]["body"]["perInstanceProperties"]) == ["demo-gpu-2"]


def test_an_ended_instance_is_deleted_and_replaced(fake: FakeCompute) -> None:
    _launch(_provider(fake), "gpu", "gpu-1")
    fake.set_status(A, "demo-gpu-1", "TERMINATED")  # preempted with termination action STOP
    result = _launch(_provider(fake), "gpu", "gpu-1", token="later")
    assert [i.state for i in result.launched] == [InstanceState.RUNNING]
    assert [i["status"] for i in fake.all_instances()] == ["RUNNING"]
    assert len(fake.calls("delete")) == 1


def test_a_replayed_request_id_from_an_earlier_failure_is_sent_anew(fake: FakeCompute) -> None:
    data = {**GPU_SET, "fallback": "none", "gcp": {**GPU_SET["gcp"], "zones": [A]}}
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", zone=A)
    first = _launch(_provider(fake, data), "gpu", "gpu-1")
    assert first.failed[0].error_class is ErrorClass.CAPACITY
    fake.clock_offset_s = 600  # ten minutes later, the same nodes are resumed again
    later = datetime.now(timezone.utc) + timedelta(seconds=600)
    result = _launch(_provider(fake, data, now=lambda: later), "gpu", "gpu-1")
    assert [i.node for i in result.launched] == ["gpu-1"]
    ids = [c["query"]["requestId"] for c in fake.calls("bulkInsert")]
    assert ids[0] == ids[1] != ids[2]  # the replay was recognised and a new id sent


def test_operations_are_polled_until_done(fake: FakeCompute) -> None:
    fake.polls_until_done = 3
    sleeps: list[float] = []
    result = _launch(_provider(fake, sleep=sleeps.append), "gpu", "gpu-1")
    assert [i.node for i in result.launched] == ["gpu-1"]
    assert len(fake.calls("wait")) == 3
    assert len(sleeps) == 2  # a wait that answered at once is not repeated in a tight loop


def test_an_operation_never_done_stops_the_launch_with_a_timeout(fake: FakeCompute) -> None:
    fake.polls_until_done = 10**6
    fake.fail_operation("ZONE_RESOURCE_POOL_EXHAUSTED", times=None)  # nothing appears
    ticks = iter(range(10**6))
    provider = _provider(fake, monotonic=lambda: float(next(ticks)), operation_timeout_s=5)
    result = _launch(provider, "gpu", "gpu-1", "gpu-2")
    (failure,) = result.failed
    assert (failure.code, failure.error_class) == ("OPERATION_TIMEOUT", ErrorClass.UNKNOWN)
    assert len(fake.calls("bulkInsert")) == 1  # no second request while one may be running
    assert 1 <= len(fake.calls("wait")) <= 5


def test_an_invalid_instance_name_fails_without_any_request(fake: FakeCompute) -> None:
    cluster, name = "c" * 30, "g" * 35  # "<cluster>-<node>" is 68 characters
    config = gcp_config(fake, [{**GPU_SET, "name": name}], cluster=cluster)
    provider = GcpProvider(config, "gcp", config.providers["gcp"])
    result = provider.launch(LaunchRequest(cluster, config.node_sets[0], (f"{name}-1",)))
    (failure,) = result.failed
    assert (failure.code, failure.error_class) == ("INVALID_INSTANCE_NAME", ErrorClass.CONFIG)
    assert fake.calls("bulkInsert") == []


def test_a_missing_template_stops_the_node_set_with_a_config_reason(fake: FakeCompute) -> None:
    data = {**CPU_SET, "gcp": {**CPU_SET["gcp"], "instance_template": "nope"}}
    result = _launch(_provider(fake, data), "cpu", "cpu-1")
    (failure,) = result.failed
    assert (failure.code, failure.error_class) == ("notFound", ErrorClass.CONFIG)
    assert len(fake.calls("bulkInsert")) == 1


def test_suspend_deletes_every_instance_behind_the_nodes(fake: FakeCompute) -> None:
    provider = _provider(fake)
    _launch(provider, "gpu", "gpu-1", "gpu-2", "gpu-3")
    fake.create(B, "demo-gpu-1", {"labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu"}})
    ended = provider.terminate(["gpu-1", "gpu-2"])
    assert sorted((i.node, i.zone) for i in ended) == [("gpu-1", A), ("gpu-1", B), ("gpu-2", A)]
    assert [i["name"] for i in fake.all_instances()] == ["demo-gpu-3"]
    assert provider.terminate(["gpu-1", "gpu-2"]) == []  # idempotent


def test_terminate_instances_ignores_unknown_and_gone_ids(fake: FakeCompute) -> None:
    provider = _provider(fake)
    _launch(provider, "gpu", "gpu-1", "gpu-2")
    fake.fail_http("delete", 404, "notFound")  # gone between listing and delete
    provider.terminate_instances(["demo-gpu-1", "demo-gpu-2", "i-unknown"])
    # the deletes go out concurrently: whichever reached the fake first got the 404 and stays
    left = [i["name"] for i in fake.all_instances()]
    assert len(left) == 1 and left[0] in ("demo-gpu-1", "demo-gpu-2")
    assert len(fake.calls("delete")) == 2  # the unknown name is not ours: never asked


def test_list_instances_pages_through_the_aggregated_list(
    fake: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gcp_api, "PAGE_SIZE", 2)
    provider = _provider(fake)
    _launch(provider, "gpu", *[f"gpu-{i}" for i in range(1, 6)])
    fake.create(A, "someone-else", {"labels": {TAG_CLUSTER: "other"}})
    calls = provider.api_calls
    listed = provider.list_instances()
    assert sorted(i.node or "" for i in listed) == [f"gpu-{i}" for i in range(1, 6)]
    assert provider.api_calls - calls == 3
    assert fake.calls("aggregatedList")[-1]["query"]["maxResults"] == "2"


def test_resume_and_suspend_hooks_record_addresses_and_delete(
    fake: FakeCompute, tmp_path: Path
) -> None:
    config = gcp_config(fake, [GPU_SET], log_dir=str(tmp_path), state_dir=str(tmp_path))
    scontrol: list[list[str]] = []

    def runner(argv: list[str], timeout_s: float) -> CommandResult:
        if argv[1:] == ["-V"]:  # the release decides whether InstanceId is recorded (23.11+)
            return CommandResult(argv, 0, "slurm 22.05.8\n", "")
        scontrol.append(argv[1:])
        return CommandResult(argv, 0, "", "")

    result = power.resume(config, "gpu-[1-2]", SlurmClient("/usr/bin", runner))
    assert result.failed == [] and len(result.launched) == 2
    ips = ",".join(i["networkInterfaces"][0]["networkIP"] for i in fake.all_instances())
    assert scontrol == [["update", "nodename=gpu-1,gpu-2", f"nodeaddr={ips}",
                         "nodehostname=demo-gpu-1,demo-gpu-2"]]
    power.suspend(config, "gpu-[1-2]")
    assert fake.all_instances() == []


def test_a_bad_credentials_file_is_an_auth_error_that_leaks_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "-----BEGIN PRIVATE KEY-----\\nMIIsecretsecret\\n-----END PRIVATE KEY-----\\n"
    creds = tmp_path / "sa.json"
    creds.write_text('{"type": "service_account", "private_key": "' + secret + '"}')
    settings = GcpProviderConfig(project="p", region="us-central1", credentials_file=creds)
    with FakeCompute() as fake:
        config = gcp_config(fake, [GPU_SET])
    provider = GcpProvider(config, "gcp", settings)
    with pytest.raises(ProviderError) as info:
        provider.list_instances()
    assert info.value.error_class == "auth"
    assert "secret" not in str(info.value) and "secret" not in caplog.text


def test_the_fake_serves_insert_get_and_paged_list_to_the_real_client(fake: FakeCompute) -> None:
    """The parts of the fake the provider does not use yet, through the real client."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    client = compute_v1.InstancesClient(
        transport="rest", credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=fake.endpoint))
    for i in range(3):
        resource = compute_v1.Instance(name=f"vm-{i}", machine_type="e2-small",
                                       labels={"team": "a" if i else "b"})
        op = client.insert_unary(project=fake.project, zone=A, instance_resource=resource)
        assert op.status != compute_v1.Operation.Status.DONE  # polled by the caller
    got = client.get(project=fake.project, zone=A, instance="vm-1", timeout=5)
    assert (got.name, got.status, got.labels["team"]) == ("vm-1", "RUNNING", "a")
    request = compute_v1.ListInstancesRequest(project=fake.project, zone=A,
                                              filter='labels.team = "a"', max_results=1)
    pager = client.list(request=request, timeout=5)
    assert [i.name for i in pager] == ["vm-1", "vm-2"]
    assert len(fake.calls("list")) == 2


def test_the_compute_client_goes_through_the_proxy_of_its_environment(
        fake: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy variables are read once per client (not on every call) and still obeyed: an
    endpoint nothing listens on is reached through the fake acting as the HTTP proxy."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # closed again: nothing listens there
    for key in ("no_proxy", "NO_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("http_proxy", fake.endpoint)
    fake.create(A, "demo-gpu-1", {"labels": {TAG_CLUSTER: "demo", TAG_NODE_SET: "gpu"}})
    settings = GcpProviderConfig(type="gcp", project=fake.project, region="us-central1",
                                 api_endpoint=f"http://localhost:{dead_port}")
    api = gcp_api.ComputeApi(settings)
    monkeypatch.delenv("http_proxy")  # read when the client was built, not per call
    assert [i["name"] for i in api.list_instances("")] == ["demo-gpu-1"]
    assert fake.calls("aggregatedList")


def test_a_job_beyond_a_gce_quota_is_flagged_and_held_as_on_aws(
        fake: FakeCompute, tmp_path: Path) -> None:
    """Issue 25: QUOTA_EXCEEDED never flagged a job that can never fit (EC2's
    VcpuLimitExceeded did): 3 nodes of 1 T4 each under a 2-GPU regional quota."""
    from slurm_spot.events import read_events
    from tests.fakes.fake_slurm import FakeSlurm

    message = "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 2.0 in region us-central1."
    fake.fail_operation("QUOTA_EXCEEDED", times=None, message=message)
    config = gcp_config(fake, [{**GPU_SET, "fallback": "none"}], log_dir=str(tmp_path),
                        state_dir=str(tmp_path))
    scontrol = FakeSlurm()
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        scontrol.add_node(name, "IDLE+CLOUD+POWERING_UP")
    scontrol.add_job(12, [], state="PENDING")
    result = power.resume(config, "gpu-[1-3]", SlurmClient("/usr/bin", runner=scontrol),
                          jobs={12: ("gpu-1", "gpu-2", "gpu-3")})
    (failure,) = result.failed
    assert failure.error_class is ErrorClass.QUOTA
    assert (failure.quota_limit, failure.quota_per_node, failure.quota_unit) == (2, 1, "GPU")
    reason = scontrol.nodes["gpu-1"].reason
    assert reason.startswith("(Code:QUOTA_EXCEEDED)quota: job 12 needs 3 GPU")
    assert "2 GPU quota" in reason
    assert ["/usr/bin/scontrol", "hold", "12"] in scontrol.calls
    assert scontrol.jobs[12].reason == "JobHeldAdmin"
    flagged = [e for e in read_events(config.log_dir)
               if (e.get("extra") or {}).get("beyond_quota")]
    assert [e["job_ids"] for e in flagged] == [[12]] * 3
