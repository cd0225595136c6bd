"""Prewarm on and off on a real local cluster: a 2-node ``--requeue`` batch job whose step
traps SIGUSR2 and exits 85 gets a notice on one of its nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from tests.cluster import Cluster, base_config, wait_for

pytestmark = pytest.mark.e2e

# The step exits 85 on SIGUSR2 (its "checkpoint" is instant), the batch script passes the
# code on, and RequeueExit=85 requeues the job. Each task first says what the TaskProlog
# exported to it.
SCRIPT = """#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}"
srun --kill-on-bad-exit=0 bash -c 'echo "task on $SLURMD_NODENAME restart $SLURM_SPOT_RESTART_COUNT \
dir $SLURM_SPOT_CHECKPOINT_DIR"; trap "exit 85" USR2; while true; do sleep 0.2; done'
exit $?
"""


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[object]:
    started: list[Cluster] = []

    def make(**preemption: object) -> Cluster:
        config = base_config(tmp_path, preemption=preemption)
        cluster = Cluster(tmp_path, config, reconcile=True)
        cluster.start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


def _run_and_preempt(cluster: Cluster, notice_s: int) -> tuple[int, str, str]:
    script = cluster.root / "job.sh"
    script.write_text(SCRIPT)
    out = cluster.root / "job.out"
    job = cluster.sbatch("-p", "spot", "-N", "2", "--requeue", "-o", str(out), str(script))
    wait_for(lambda: out.exists() and "run 0" in out.read_text(), timeout=120,
             what="the job running")
    before = cluster.job(job)["NodeList"]
    victim = expand(before)[0]
    cluster.spot("local", "preempt", victim, "--notice", str(notice_s), "--conf-dir",
                 str(cluster.conf_dir))
    wait_for(lambda: out.read_text().count("restart 1 dir") == 2, timeout=240,
             what="the requeued job's step running on both nodes")
    # The TaskProlog ran to the end on each node, the replacement included: no "slurm
    # task_prolog did not exit normally" (seen when a test cancelled the job while the
    # TaskProlog ran), and the task got its exports.
    text = out.read_text()
    assert "task_prolog" not in text and "TaskProlog" not in text, text
    for node in expand(cluster.job(job)["NodeList"]):
        assert f"task on {node} restart 1 dir {cluster.root / 'checkpoints'}" in text, text
    return job, before, victim


def _watch_events(cluster: Cluster, job: int) -> dict[str, dict]:
    return {e["action"]: e for e in cluster.events()
            if e.get("source") == "watch" and job in (e.get("job_ids") or [])}


def test_prewarm_on_requeued_job_lands_on_the_prewarmed_node(make_cluster) -> None:
    # The job has no checkpoint history: assume 5 s, so its latest signal is 20 s in.
    cluster = make_cluster(default_checkpoint_s=5)
    job, before, victim = _run_and_preempt(cluster, notice_s=40)
    events = _watch_events(cluster, job)
    replacement = events["prewarm"]["extra"]["power_up"]
    assert len(replacement) == 1 and replacement[0] not in expand(before)
    assert events["signalled"]["extra"]["when"] == "replacement up"
    after = expand(cluster.job(job)["NodeList"])
    assert replacement[0] in after and victim not in after
    assert cluster.job(job)["Restarts"] == "1"
    # Back to the configured weight once its job landed (watcher, else the reconciler).
    wait_for(lambda: cluster.node(replacement[0]).get("Weight") == "1", timeout=30,
             what="the replacement's weight restored")
    cluster.slurm("scancel", str(job))


def test_prewarm_off_the_job_still_recovers(make_cluster) -> None:
    cluster = make_cluster(prewarm=False)
    job, _, victim = _run_and_preempt(cluster, notice_s=30)
    events = _watch_events(cluster, job)
    assert "prewarm" not in events
    assert events["signalled"]["extra"]["when"] == "prewarm off"
    assert events["signalled"]["extra"]["prewarmed"] is False
    after = cluster.job(job)
    assert after["Restarts"] == "1" and victim not in expand(after["NodeList"])
    cluster.slurm("scancel", str(job))
