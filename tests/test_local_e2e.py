"""End to end on a real slurmctld: the local spot partition powers up, runs, powers down."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime

import pytest

from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.slurm.reasons import COOLDOWN_TEXT
from tests.cloud_e2e import wait_failed_node_powered_down
from tests.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e


def node_state(cluster: Cluster, node: str) -> str:
    return cluster.node(node)["State"]


def test_job_powers_nodes_up_runs_and_they_power_down(cluster: Cluster) -> None:
    out = cluster.root / "hostname.out"
    cluster.slurm("sbatch", "--wait", "-p", "spot", "-N", "2", "-o", str(out),
                  "--wrap", "srun hostname | sort", timeout=120)
    assert out.read_text().split() == ["spot-1", "spot-2"]
    # sbatch --wait polls with growing intervals, so the nodes may already be powering down.
    launched = read_envelope(cluster.spot("instances", "--all", "--json").stdout)
    assert {i["node"] for i in launched} == {"spot-1", "spot-2"}
    # SuspendTime=10 s, SuspendTimeout=10 s: idle nodes go idle% then idle~, slurmd gone.
    wait_for(lambda: all("POWERED_DOWN" in node_state(cluster, n) for n in ("spot-1", "spot-2")),
             timeout=60, what="nodes powered down")
    wait_for(lambda: not cluster.slurmd_pids(), timeout=15, what="slurmd processes gone")
    assert cluster.instances() == []
    actions = [(e["action"], e["node"]) for e in cluster.events()]
    assert ("launched", "spot-1") in actions and ("terminated", "spot-1") in actions


def test_capacity_failure_sets_code_reason_and_requeues_within_seconds(cluster: Cluster) -> None:
    """One node of a 2-node job gets no capacity: it carries the provider's code, the node
    set's other powered-down nodes are cooled down with it (no second try on a node set
    without capacity while the cooldown lasts, issue 24), the job is requeued in seconds, and
    nothing is left that nobody clears (the failed node back to idle~, the cooldown ended by
    the reconciler or an admin)."""
    cluster.spot("local", "capacity", "spot", "1", "--conf-dir", str(cluster.conf_dir))
    try:
        started = time.time()
        job = cluster.sbatch("-p", "spot", "-N", "2", "--requeue", "-o", "/dev/null",
                             "--wrap", "srun sleep 30")
        submitted = time.monotonic()
        wait_for(lambda: cluster.job(job).get("Restarts", "0") != "0", timeout=30,
                 what="job requeued")
        requeue_s = time.monotonic() - submitted
        assert requeue_s < 20, f"requeued after {requeue_s:.1f} s"
        failed = [e["node"] for e in cluster.events() if e["action"] == "launch_failed"
                  and datetime.fromisoformat(e["time"]).timestamp() >= started]
        assert len(failed) == 1, failed
        # the scheduler may pick any two nodes: the two the job did not take are cooled down
        others = [f"spot-{i}" for i in range(1, 5) if f"spot-{i}" != failed[0]]
        wait_for(lambda: sum(COOLDOWN_TEXT in cluster.node(n).get("Reason", "")
                             for n in others) == 2, timeout=20, what="the node set cooled down")
        reasons = {n: cluster.node(n).get("Reason", "") for n in others}
        cooled = [n for n, r in reasons.items() if COOLDOWN_TEXT in r]
        # ... DOWN with the cooldown, still powered down
        for node in cooled:
            assert reasons[node].startswith(
                "(Code:InsufficientInstanceCapacity)Temporarily disabled until "), reasons
            assert {"DOWN", "POWERED_DOWN"} <= set(node_state(cluster, node).split("+"))
        # the failed node: DOWN, then powered down (idle~ with its code, or down~ with the
        # cooldown where its job was kept in Reason=Cleaning), never left in plain DOWN.
        wait_failed_node_powered_down(cluster, failed[0], "InsufficientInstanceCapacity")
        assert len([i for i in cluster.instances() if i["state"] in ("pending", "running")]) <= 1
    finally:
        cluster.spot("local", "capacity", "spot", "--conf-dir", str(cluster.conf_dir))
        subprocess.run(["scancel", "-u", "root"], env=cluster.env, check=False)
        cluster.end_cooldowns()
    for node in cooled:
        flags = set(node_state(cluster, node).split("+"))
        assert {"IDLE", "POWERED_DOWN"} <= flags and "DOWN" not in flags, (node, flags)


def test_resume_twice_starts_no_second_instance(cluster: Cluster) -> None:
    wait_for(lambda: "POWERED_DOWN" in node_state(cluster, "spot-3"), timeout=60,
             what="spot-3 idle~")
    first = cluster.spot("resume", "spot-3", "--json")
    second = cluster.spot("resume", "spot-3", "--json")
    try:
        ids = {i["instance_id"] for i in cluster.instances() if i["node"] == "spot-3"}
        assert len(ids) == 1
        assert '"launched"' in first.stdout and next(iter(ids)) in second.stdout
    finally:
        cluster.spot("suspend", "spot-3")
    assert [i for i in cluster.instances() if i["node"] == "spot-3"] == []
    cluster.spot("suspend", "spot-3")  # idempotent: nothing behind the node, still fine


def test_hook_rejects_bad_input_with_exit_2(cluster: Cluster) -> None:
    bad = cluster.spot("resume", "spot-[1-", check=False)
    assert bad.returncode == 2 and "spot-[1-" in bad.stderr
    unknown = cluster.spot("suspend", "spot-9", check=False)
    assert unknown.returncode == 2 and "spot-9" in unknown.stderr
    assert cluster.instances() == [] or all(i["node"] != "spot-9" for i in cluster.instances())


def test_hostnames_match_scontrol(cluster: Cluster) -> None:
    import yaml

    from slurm_spot.hostlist import expand
    from tests.conftest import DATA

    cases = yaml.safe_load((DATA / "hostlists.yaml").read_text())["expand"]
    for case in cases:
        real = cluster.slurm("scontrol", "show", "hostnames", case["in"]).split()
        assert expand(case["in"]) == real


def test_the_local_controller_schedules_a_released_job_without_the_batch_delay(
        cluster: Cluster) -> None:
    """The local cluster's slurm.conf sets SchedulerParameters=batch_sched_delay=0 (Slurm's
    default is 3 s; slurm.conf(5)): the running slurmctld took it (an option it did not know
    would not be shown), so a requeued job released with StartTime=now is scheduled at its
    next background pass (BENCHMARKS.md, "The demo")."""
    config = cluster.slurm("scontrol", "show", "config")
    line = next(x for x in config.splitlines() if x.startswith("SchedulerParameters"))
    assert "batch_sched_delay=0" in line.split("=", 1)[1].replace(" ", "")
