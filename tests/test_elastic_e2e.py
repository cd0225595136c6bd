"""Elastic training on the real local cluster: a reclaimed node leaves, the others go on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for
from tests.elastic_runs import (
    EXAMPLE,
    check_sample_log,
    job_processes,
    last_step,
    rendezvous_service,
    training_events,
)

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's cluster runs the reconciler (interval 5 s), as a site does: it is what
    tells an elastic job that a node was lost without notice (SlurmdTimeout is 300 s here)."""
    root = tmp_path_factory.mktemp("elastic-cluster")
    c = Cluster(root, base_config(root), reconcile=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def rendezvous(cluster: Cluster) -> Iterator[str]:
    """``slurm-spot rendezvous`` on a free port of this machine (the local controller)."""
    with rendezvous_service(cluster.env) as endpoint:
        yield endpoint


def _submit(cluster: Cluster, rendezvous: str, out: Path, *train_args: str) -> int:
    env = {**cluster.env, "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), "sbatch",
         "--torchrun", "--elastic", "2:3", "--rendezvous", rendezvous, "--join-timeout", "30",
         "--no-replacements",  # these tests follow the smaller world to the end
         "--json", "-p", "spot", "-N", "3", "-o", str(out), str(EXAMPLE), *train_args],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(read_envelope(proc.stdout)["job_id"])


def test_survivors_continue_when_a_node_is_reclaimed_with_notice(
        cluster: Cluster, rendezvous: str) -> None:
    """3 spot workers; one is reclaimed with notice: its ranks save and leave, the other two
    re-rendezvous and finish. Same job, never requeued (Restarts=0); no sample of an epoch is
    used twice or skipped across the change of world size."""
    out = cluster.root / "elastic-%j.out"
    samples = cluster.root / "samples.jsonl"
    job = _submit(cluster, rendezvous, out, "--steps", "120", "--step-sleep", "0.15",
                  "--checkpoint-every", "20", "--log-every", "5", "--sample-log", str(samples))
    log = Path(str(out).replace("%j", str(job)))
    wait_for(lambda: last_step(log) >= 15, 240, what="3-node training to reach step 15")
    nodes = expand(cluster.job(job)["NodeList"])
    batch_host = cluster.job(job)["BatchHost"]
    leaving = next(n for n in reversed(nodes) if n != batch_host)
    cluster.spot("local", "preempt", leaving, "--notice", "20", "--conf-dir",
                 str(cluster.conf_dir))
    wait_for(lambda: any(e["event"] == "done" for e in training_events(log)), 240,
             what="training to finish on the survivors")
    wait_for(lambda: cluster.job(job).get("JobState") == "COMPLETED", 60,
             what=f"job {job} to complete")
    fields = cluster.job(job)
    assert fields["Restarts"] == "0"  # never requeued
    events = training_events(log)
    leave = next(e for e in events if e["event"] == "leave")
    assert len(leave["leaving_ranks"]) == 1
    resumed = [e for e in events if e["event"] == "resume"]
    assert resumed and resumed[0]["world_size"] == 2 and resumed[0]["step"] == leave["step"]
    assert resumed[0]["elastic_round"] >= 1 and resumed[0]["restarts"] == 0
    done = next(e for e in events if e["event"] == "done")
    assert done["step"] == 120 and done["world_size"] == 2
    first_after = next(e for e in events if e["event"] == "step" and e["step"] > leave["step"])
    print(json.dumps({"elastic_notice_paused_s": round(first_after["time"] - leave["time"], 1)}))
    worlds = {e["world_size"] for e in events if e["event"] == "step"}
    assert worlds == {2, 3}
    # The watcher released the node from the job instead of requeueing it.
    released = [e for e in cluster.events() if e["action"] == "released"]
    assert released and released[0]["node"] == leaving and job in released[0]["job_ids"]
    # Every epoch: each sample at most once, across both world sizes; whole epochs complete.
    per_epoch = check_sample_log(samples, 120)
    assert len(per_epoch[0]) == 18 * 96  # 1797 samples // 96 global batch = 18 steps
    # Workers were forked warm, and nothing of the job (agent, fork server, worker) outlives
    # it on any node.
    assert "warm worker start: fork server" in log.read_text()
    wait_for(lambda: not job_processes(job), 60, what=f"job {job}'s processes to end")


def test_a_node_lost_without_notice_is_detected_without_the_collective_timeout(
        cluster: Cluster, rendezvous: str) -> None:
    """A worker's instance is killed without notice: the survivors' next collective fails on
    the reset connections (not after --pg-timeout, set to 600 s here), they re-rendezvous and
    resume from the last periodic checkpoint; the reconciler releases the lost node from the
    job (DOWN ends its step at once), so the job COMPLETES when training is done instead of
    staying COMPLETING until SlurmdTimeout (300 s); the job is never requeued."""
    out = cluster.root / "lost-%j.out"
    job = _submit(cluster, rendezvous, out, "--steps", "100", "--step-sleep", "0.15",
                  "--checkpoint-every", "10", "--log-every", "5", "--pg-timeout", "600")
    log = Path(str(out).replace("%j", str(job)))
    wait_for(lambda: last_step(log) >= 15, 240, what="3-node training to reach step 15")
    fields = cluster.job(job)
    lost = next(n for n in reversed(expand(fields["NodeList"])) if n != fields["BatchHost"])
    killed_at = time.time()
    cluster.spot("local", "preempt", lost, "--notice", "0", "--conf-dir", str(cluster.conf_dir))
    # The resume after the loss: a round restarted before it (an agent late to the first round
    # on a loaded machine) logs a resume of its own, at world 3.
    def after_loss() -> list[dict]:
        return [e for e in training_events(log)
                if e["event"] == "resume" and e["time"] >= killed_at]

    wait_for(after_loss, 120,
             what="the survivors to resume (well before the 600 s collective timeout)")
    resumed = after_loss()[0]
    assert resumed["world_size"] == 2 and resumed["step"] % 10 == 0
    assert resumed["time"] - killed_at < 120
    wait_for(lambda: any(e["event"] == "done" for e in training_events(log)), 240,
             what="training to finish on the survivors")
    done = next(e for e in training_events(log) if e["event"] == "done")
    assert done["step"] == 100 and done["world_size"] == 2
    # The reconciler saw the instance gone and released the node from the job, which went on.
    released = [e for e in cluster.events() if e["action"] == "released"
                and job in e.get("job_ids", [])]
    assert [(e["source"], e["node"]) for e in released] == [("reconcile", lost)]
    assert lost not in expand(released[0]["extra"]["remaining"])
    # With the node gone from the job, nothing waits for its dead slurmd: the job completes
    # within seconds of its batch script (not SlurmdTimeout, 300 s, after the kill).
    wait_for(lambda: cluster.job(job).get("JobState") == "COMPLETED", 60,
             what=f"job {job} to complete (not stay COMPLETING)")
    print(json.dumps({"no_notice_completed_after_kill_s": round(time.time() - killed_at, 1)}))
    assert cluster.job(job)["Restarts"] == "0"
    assert not any(e["action"] in ("requeued", "requeue_ended") and job in e.get("job_ids", [])
                   for e in cluster.events())
