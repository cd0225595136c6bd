"""End to end on a real local slurmctld whose node sets are Compute Engine Spot VMs in the fake
Compute API (:class:`tests.fakes.gce_api.FakeCompute`, served from this process and driven by
the real google-cloud-compute client in every slurm-spot process).

The config's ``providers.gcp.api_endpoint`` points at the fake (a loopback http endpoint gets
anonymous credentials), so the hooks slurmctld runs with an empty environment reach it. A
:class:`tests.fakes.boot_simulator.BootSimulator` boots a local slurmd for a fake VM so a real
job runs on a "GCP" node, and :class:`tests.fakes.gce_metadata.FakeMetadata` drives the watcher.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from slurm_spot.config import load_config
from slurm_spot.providers.base import TAG_CLUSTER, TAG_MARKET, TAG_NODE_SET
from slurm_spot.providers.gcp.provider import GcpProvider
from tests.cloud_e2e import (
    INSTANCE_FIELDS,
    cancel_all,
    cloud_config,
    forget_addresses,
    log_tail,
    run_job,
    running_cluster,
    spot,
    spot_json,
    state_flags,
    wait_failed_node_powered_down,
    wait_node_set_cooled,
)
from tests.cluster import Cluster, wait_for
from tests.fakes.boot_simulator import BootSimulator
from tests.fakes.gce_api import FakeCompute
from tests.fakes.gce_metadata import FakeMetadata

pytestmark = pytest.mark.e2e

SHAPE = {"cpus": 1, "memory_mib": 1000, "gpus": None}
REGION = "us-central1"
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
EXHAUSTED = "ZONE_RESOURCE_POOL_EXHAUSTED"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"


@dataclass
class GcpCloud:
    """The module's world: the cluster, the fake Compute API and the boot simulator."""

    cluster: Cluster
    fake: FakeCompute
    sim: BootSimulator

    @property
    def bulk_inserts(self) -> int:
        return len(self.fake.calls("bulkInsert"))

    def by_node(self) -> dict[str, list[dict[str, Any]]]:
        """node -> the fake's instances (REST JSON) named ``test-<node>``."""
        found: dict[str, list[dict[str, Any]]] = {}
        for inst in self.fake.all_instances():
            found.setdefault(inst["name"].removeprefix("test-"), []).append(inst)
        return found


@pytest.fixture(scope="module")
def gcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcpCloud]:
    root = tmp_path_factory.mktemp("gcp-e2e")
    with FakeCompute() as fake:
        config = cloud_config(
            root,
            providers={"gcp": {"type": "gcp", "project": fake.project, "region": REGION,
                               "api_endpoint": fake.endpoint}},
            # the "instances" are this machine's slurmd processes, not an n1-standard-4: their
            # shape is written (else render takes the machine type's, and slurmd registers less)
            node_sets=[
                {"name": "gpu", "provider": "gcp", "count": 4, "fallback": "on-demand", **SHAPE,
                 "gcp": {"zones": [A, B], "machine_type": "n1-standard-4", "image": IMAGE}},
                {"name": "cpu", "provider": "gcp", "count": 2, **SHAPE,
                 "gcp": {"zones": [C], "machine_type": "n1-standard-2", "image": IMAGE}},
            ],
            partitions=[{"name": "gcp", "node_sets": ["gpu"], "default": True},
                        {"name": "gcpcpu", "node_sets": ["cpu"]}],
        )
        with running_cluster(root, config) as cluster:
            spot_config = load_config(cluster.spot_yaml)
            settings = spot_config.providers["gcp"]
            assert settings.type == "gcp"
            provider = GcpProvider(spot_config, "gcp", settings)
            with BootSimulator(provider.list_instances, cluster.conf_dir / "slurm.conf",
                               cluster.log_dir) as sim:
                yield GcpCloud(cluster, fake, sim)
                assert sim.errors == []


@pytest.fixture(autouse=True)
def fresh_market(gcp: GcpCloud) -> Iterator[None]:
    """Each test starts with a market that has not run out recently: the tests change the
    fake's capacity within seconds of each other, while the resume hook remembers a stocked-out
    pool for ``reconcile.cooldown_s`` (``<state_dir>/gcp/<provider>-pool-cooldowns.json``) and
    would skip it in the next test. Failures a test queued and left unused go too."""
    yield
    for path in (gcp.cluster.state_dir / "gcp").glob("*-pool-cooldowns.json"):
        path.unlink()
    gcp.fake.capacity.clear()
    gcp.fake.forget_failures()


def test_resume_cli_bulk_inserts_once_per_node_set_and_records_addresses(gcp: GcpCloud) -> None:
    cluster = gcp.cluster
    before = gcp.bulk_inserts
    result = spot_json(cluster, "resume", "gpu-[2-3],cpu-1")
    try:
        assert result["failed"] == [] and result["errors"] == []
        assert gcp.bulk_inserts - before == 2  # one bulkInsert per node set, not per node
        created = gcp.by_node()
        assert {n: len(v) for n, v in created.items()} == {"gpu-2": 1, "gpu-3": 1, "cpu-1": 1}
        for node, (inst,) in created.items():
            assert inst["labels"][TAG_CLUSTER] == "test"
            assert inst["labels"][TAG_NODE_SET] == node.split("-")[0]
            assert inst["labels"][TAG_MARKET] == "spot"
            assert inst["scheduling"]["provisioningModel"] == "SPOT"
            assert inst["scheduling"]["instanceTerminationAction"] == "DELETE"
            fields = cluster.node(node)
            assert fields["NodeAddr"] == inst["networkInterfaces"][0]["networkIP"]
            assert fields["NodeHostName"] == inst["name"] == f"test-{node}"
        assert {i["zone"].rsplit("/", 1)[-1] for n, (i,) in created.items()
                if n.startswith("gpu")} <= {A, B}
        assert created["cpu-1"][0]["zone"].endswith(C)
        listed = spot_json(cluster, "instances")
        assert {i["node"] for i in listed} == {"gpu-2", "gpu-3", "cpu-1"}
        for entry in listed:
            assert set(entry) == INSTANCE_FIELDS
            assert entry["provider"] == "gcp" and entry["state"] == "running"
            assert entry["market"] == "spot" and entry["zone"].startswith(REGION)
            assert entry["private_ip"] == cluster.node(entry["node"])["NodeAddr"]
    finally:
        suspended = spot_json(cluster, "suspend", "gpu-[2-3],cpu-1")
        forget_addresses(cluster, "gpu-2", "gpu-3", "cpu-1")
    assert len(suspended["terminated"]) == 3
    assert gcp.by_node() == {}
    assert spot_json(cluster, "instances") == []


def test_rerun_creates_nothing_new_and_suspend_is_idempotent(gcp: GcpCloud) -> None:
    cluster = gcp.cluster
    first = spot_json(cluster, "resume", "gpu-4")
    try:
        inserts = gcp.bulk_inserts
        second = spot_json(cluster, "resume", "gpu-4")
        assert gcp.bulk_inserts == inserts  # listed by label first: no bulkInsert
        ids = [i["instance_id"] for i in first["launched"]]
        assert ids == ["test-gpu-4"] and [i["instance_id"] for i in second["launched"]] == ids
        assert len(gcp.by_node()["gpu-4"]) == 1
    finally:
        spot(cluster, "suspend", "gpu-4")
        forget_addresses(cluster, "gpu-4")
    assert gcp.by_node() == {}
    again = spot_json(cluster, "suspend", "gpu-4")
    assert again["terminated"] == [] and again["errors"] == []


def test_zone_exhausted_falls_over_to_next_zone_then_to_on_demand(gcp: GcpCloud) -> None:
    cluster, fake = gcp.cluster, gcp.fake
    try:
        fake.fail_operation(EXHAUSTED, zone=A, market="spot")
        before = gcp.bulk_inserts
        next_zone = spot_json(cluster, "resume", "gpu-2")
        (launched,) = next_zone["launched"]
        assert (launched["zone"], launched["market"]) == (B, "spot")
        assert gcp.bulk_inserts - before == 2
        denied = fake.calls("bulkInsert")[-1]["body"]["locationPolicy"]["locations"]
        assert denied[f"zones/{A}"] == {"preference": "DENY"}

        # Spot in A ran out a moment ago and cools down (reconcile.cooldown_s): not asked.
        fake.fail_operation(EXHAUSTED, zone=B, market="spot")
        before = gcp.bulk_inserts
        on_demand = spot_json(cluster, "resume", "gpu-3")
        (launched,) = on_demand["launched"]
        assert (launched["zone"], launched["market"]) == (A, "on-demand")
        assert gcp.bulk_inserts - before == 2  # spot in B only, then standard
        spot_asked = fake.calls("bulkInsert")[-2]["body"]["locationPolicy"]["locations"]
        assert spot_asked[f"zones/{A}"] == {"preference": "DENY"}
        (inst,) = gcp.by_node()["gpu-3"]
        assert inst["scheduling"].get("provisioningModel", "STANDARD") == "STANDARD"
        assert cluster.node("gpu-3")["NodeAddr"] == inst["networkInterfaces"][0]["networkIP"]
    finally:
        spot(cluster, "suspend", "gpu-[2-3]")
        forget_addresses(cluster, "gpu-2", "gpu-3")
    assert gcp.by_node() == {}


def test_everything_exhausted_nodes_go_down_then_idle_never_plain_down(gcp: GcpCloud) -> None:
    cluster, fake = gcp.cluster, gcp.fake
    fake.capacity.update({A: 0, B: 0})
    seen: list[set[str]] = []
    try:
        job = cluster.sbatch("-p", "gcp", "-w", "gpu-4", "-N", "1", "--requeue",
                             "-o", "/dev/null", "--wrap", "true")

        def requeued() -> bool:
            seen.append(state_flags(cluster, "gpu-4"))
            return cluster.job(job).get("Restarts", "0") != "0"

        wait_for(requeued, timeout=40, interval=0.2,
                 what=f"job {job} requeued\n{log_tail(cluster.log_dir / 'hooks.log')}")
        reason = cluster.node("gpu-4")["Reason"]
        assert reason.startswith(f"(Code:{EXHAUSTED})"), reason

        wait_failed_node_powered_down(cluster, "gpu-4", EXHAUSTED, seen)
        assert gcp.by_node() == {}
        failed = [e for e in cluster.events() if e["action"] == "launch_failed"]
        assert failed and failed[-1]["node"] == "gpu-4"
        wait_node_set_cooled(cluster, "gpu-4", ["gpu-1", "gpu-2", "gpu-3"], EXHAUSTED)
    finally:
        cancel_all(cluster)
        fake.capacity.clear()
        cluster.end_cooldowns()  # capacity is back: as an admin would (docs/admin.md)
    print("gpu-4 states seen:", ["+".join(sorted(s)) for s in dict.fromkeys(map(frozenset, seen))])


def test_slurmctld_resumes_gcp_node_and_a_job_runs_there(gcp: GcpCloud) -> None:
    cluster = gcp.cluster
    gcp.sim.allow("gpu-1")
    before = gcp.bulk_inserts
    out = cluster.root / "hostname.out"
    started = time.monotonic()
    job = run_job(cluster, "-p", "gcp", "-w", "gpu-1", "-N", "1", "-o", str(out),
                  "--wrap", "hostname")
    elapsed = time.monotonic() - started
    assert job["JobState"] == "COMPLETED", job
    assert out.read_text().split() == ["test-gpu-1"], log_tail(cluster.log_dir / "hooks.log")
    assert gcp.bulk_inserts - before == 1  # the ResumeProgram hook, with an empty environment
    (inst,) = gcp.by_node()["gpu-1"]
    assert gcp.sim.running() == {"gpu-1": inst["name"]}
    node = cluster.node("gpu-1")
    assert node["NodeHostName"] == "test-gpu-1" and node["NodeAddr"] == "127.0.0.1"
    print(f"job on gpu-1 done {elapsed:.1f} s after sbatch")


def test_preempted_true_drains_node_and_requeues_its_job(gcp: GcpCloud) -> None:
    cluster = gcp.cluster
    gcp.sim.allow("gpu-1")
    job = cluster.sbatch("-p", "gcp", "-w", "gpu-1", "-N", "1", "--requeue", "-o", "/dev/null",
                         "--wrap", "sleep 600")
    try:
        wait_for(lambda: cluster.job(job).get("JobState") == "RUNNING", timeout=120,
                 what=f"job {job} running on gpu-1")
        with FakeMetadata() as metadata:
            metadata.set("instance/name", "test-gpu-1")
            metadata.set("instance/preempted", "TRUE")
            # GCE gives ~30 s: act 25 s before the deadline, 5 s after the notice.
            outcome = spot_json(cluster, "watch", "--node", "gpu-1", "--once", "--margin", "25",
                                env={"GCE_METADATA_HOST": metadata.host})
            asked = [path for path, _ in metadata.requests]
        assert "instance/preempted" in asked
        assert outcome["notice"]["action"] == "preempt"
        assert outcome["jobs"] == [job] and outcome["requeued"] == [job], outcome
        assert outcome["errors"] == []
        assert cluster.node("gpu-1")["Reason"].startswith("spot-interruption:preempt@")
        fields = cluster.job(job)
        assert fields["Restarts"] == "1" and fields["JobState"] in ("PENDING", "CONFIGURING",
                                                                    "RUNNING"), fields
        cancel_all(cluster)  # before slurmctld resumes gpu-1 again for it
        # POWER_DOWN_FORCE ran SuspendProgram: the VM is deleted, its slurmd gone.
        wait_for(lambda: "gpu-1" not in gcp.by_node(), timeout=30, what="gpu-1's VM deleted")
        wait_for(lambda: "gpu-1" not in gcp.sim.running(), timeout=10, what="slurmd gone")
    finally:
        gcp.sim.disallow("gpu-1")
        cancel_all(cluster)
