"""Elastic training on the real local cluster: a replacement joins after a node is reclaimed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.events import read_events
from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.slurm.output import local_time
from tests.cluster import Cluster, wait_for
from tests.elastic_runs import (
    EXAMPLE,
    check_sample_log,
    last_step,
    rendezvous_service,
    training_events,
)

pytestmark = pytest.mark.e2e

@pytest.fixture
def rendezvous(cluster: Cluster) -> Iterator[str]:
    """``slurm-spot rendezvous`` on a free port of this machine (the local controller)."""
    with rendezvous_service(cluster.env) as endpoint:
        yield endpoint


@pytest.fixture
def reconciler(cluster: Cluster) -> Iterator[None]:
    """``slurm-spot reconcile`` (every 5 s, the test config's) as the controller runs it."""
    log = open(cluster.root / "reconcile-test.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_spot", "--config",
                             str(cluster.spot_yaml), "reconcile"], stdout=log, stderr=log,
                            env=cluster.env)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _worlds(events: list[dict]) -> list[int]:
    """The world sizes the steps ran with, in order, repeats folded."""
    seen: list[int] = []
    for event in events:
        if event["event"] == "step" and (not seen or seen[-1] != event["world_size"]):
            seen.append(event["world_size"])
    return seen


def test_a_replacement_joins_after_a_node_is_reclaimed(cluster: Cluster, rendezvous: str) -> None:
    """3 spot workers (--elastic 2:3, the 4th node free); one is reclaimed with notice: the
    others go on with 2, a one-node companion job (<name>+replacement) is requested, joins the
    rendezvous, and training goes on with 3 again from the step it had reached (no step run
    twice, no sample of an epoch used twice). The job completes without a requeue and the
    companion has ended with it."""
    out = cluster.root / "replaced-%j.out"
    samples = cluster.root / "samples.jsonl"
    env = {**cluster.env, "GLOO_SOCKET_IFNAME": "lo"}
    steps = 260
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), "sbatch",
         "--torchrun", "--elastic", "2:3", "--rendezvous", rendezvous, "--join-timeout", "30",
         "--json", "-p", "spot", "-N", "3", "-J", "elastic", "-o", str(out), str(EXAMPLE),
         "--steps", str(steps), "--step-sleep", "0.2", "--checkpoint-every", "20",
         "--log-every", "5", "--sample-log", str(samples)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = int(read_envelope(proc.stdout)["job_id"])
    log = Path(str(out).replace("%j", str(job)))
    wait_for(lambda: last_step(log) >= 15, 240, what="3-node training to reach step 15")
    fields = cluster.job(job)
    leaving = next(n for n in reversed(expand(fields["NodeList"])) if n != fields["BatchHost"])
    cluster.spot("local", "preempt", leaving, "--notice", "20", "--conf-dir",
                 str(cluster.conf_dir))
    requested = re.compile(r"slurm-spot: replacement job (\d+) requested")
    companion = int(wait_for(lambda: (m := requested.search(log.read_text())) and m.group(1),
                             120, what="a replacement job to be requested"))
    wait_for(lambda: _worlds(training_events(log))[-1:] == [3]
             and 2 in _worlds(training_events(log)), 180,
             what="training to go on with 3 nodes again")
    wait_for(lambda: any(e["event"] == "done" for e in training_events(log)), 240,
             what="training to finish")
    wait_for(lambda: cluster.job(job).get("JobState") == "COMPLETED", 60,
             what=f"job {job} to complete")
    assert cluster.job(job)["Restarts"] == "0"  # never requeued
    # The companion belonged to this job and has ended with it (not pending, not running).
    state = wait_for(lambda: (f := cluster.job(companion)) and f.get("JobState") not in (
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING") and f, 60,
        what=f"replacement job {companion} to end")
    assert state["JobName"] == "elastic+replacement"
    assert state["Comment"] == f"slurm-spot replacement for job {job}"
    assert state["Requeue"] == "0"
    events = training_events(log)
    assert _worlds(events) == [3, 2, 3]
    done = next(e for e in events if e["event"] == "done")
    assert done["step"] == steps and done["world_size"] == 3
    regroup = next(e for e in events if e["event"] == "regroup")
    rejoined = next(e for e in events if e["event"] == "resume" and e["world_size"] == 3)
    assert rejoined["step"] == regroup["step"] and rejoined["restarts"] == 0
    # Every step ran once, each epoch's samples at most once, across 3 -> 2 -> 3.
    per_epoch = check_sample_log(samples, steps)
    assert all(len(per_epoch[e]) == 18 * 96 for e in range(steps // 18))  # whole epochs
    first_at_3 = next(e for e in events if e["event"] == "step" and e["step"] > regroup["step"])
    started = local_time(state.get("StartTime", ""))
    print(json.dumps({
        "replacement_node": state.get("NodeList"), "reclaimed_node": leaving,
        "replacement_start_to_world_3_s":
            round(first_at_3["time"] - started, 1) if started else None,
        "regroup_paused_s": round(first_at_3["time"] - regroup["time"], 1),
        "companion_state": state["JobState"]}))


def test_below_min_without_replacements_falls_back_to_requeue(cluster: Cluster,
                                                              rendezvous: str,
                                                              reconciler: None) -> None:
    """--elastic 2:2 --no-replacements on 2 nodes; one is reclaimed with notice: the survivor
    cannot form a round of MIN=2 within --join-timeout, the job is requeued (Restarts=1),
    resumes from the step saved at the notice and finishes. The reconciler clears Slurm's
    ~121 s requeue hold (the watcher had released the node, not requeued the job), so the
    requeued run starts well within that hold."""
    out = cluster.root / "fallback-%j.out"
    env = {**cluster.env, "GLOO_SOCKET_IFNAME": "lo"}
    steps = 120
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(cluster.spot_yaml), "sbatch",
         "--torchrun", "--elastic", "2:2", "--no-replacements", "--rendezvous", rendezvous,
         "--join-timeout", "10", "--json", "-p", "spot", "-N", "2", "-o", str(out),
         str(EXAMPLE), "--steps", str(steps), "--step-sleep", "0.15", "--checkpoint-every",
         "20", "--log-every", "5"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = int(read_envelope(proc.stdout)["job_id"])
    log = Path(str(out).replace("%j", str(job)))
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 15
                         for e in training_events(log)), 240,
             what="2-node training to reach step 15")
    fields = cluster.job(job)
    leaving = next(n for n in reversed(expand(fields["NodeList"])) if n != fields["BatchHost"])
    cluster.spot("local", "preempt", leaving, "--notice", "20", "--conf-dir",
                 str(cluster.conf_dir))
    wait_for(lambda: any(e["event"] == "done" for e in training_events(log)), 300,
             what="the requeued job to finish training")
    wait_for(lambda: cluster.job(job).get("JobState") == "COMPLETED", 60,
             what=f"job {job} to complete")
    assert cluster.job(job)["Restarts"] == "1"  # requeued once, below MIN
    events = training_events(log)
    leave = next(e for e in events if e["event"] == "leave")
    resumed = next(e for e in events if e["event"] == "resume")
    assert resumed["restarts"] == 1 and resumed["step"] == leave["step"]
    assert resumed["world_size"] == 2
    assert not any(e["event"] == "step" and e["world_size"] == 1 for e in events)
    assert "falling back to requeue" in log.read_text() or "for requeue" in log.read_text()
    assert "replacement job" not in log.read_text()
    done = next(e for e in events if e["event"] == "done")
    assert done["step"] == steps
    expedited = [e for e in read_events(cluster.log_dir) if e["action"] == "expedited"
                 and job in e.get("job_ids", [])]
    assert [e["reason"] for e in expedited] == ["requeued by exit code 85"]
    # Without the reconciler's expedite this was 229 s: the 121 s hold, then the power-up.
    assert resumed["time"] - leave["time"] < 100
    print(json.dumps({"fallback_requeue_s": round(resumed["time"] - leave["time"], 1)}))
