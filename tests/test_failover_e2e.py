"""Failover in seconds (issue 24, part 1) on a real slurmctld: a partition ``spot`` of two node
sets, ``cheap`` (Weight 1) and ``other`` (Weight 10); ``cheap`` has no capacity. A 1-node
``--requeue`` job must run on ``other`` within 30 s of the capacity error (goal 10 s) instead
of waiting out Slurm's ~121 s requeue hold (211 s from submission before), not FAILED, and
the events must say where it went and why.

One cluster for the module (reconciler running, as ``local up`` starts it). The measured
seconds from the capacity error to RUNNING are printed and written to
``<cluster root>/failover-seconds.json`` (benchmarks/ keeps the method for BENCHMARKS.md).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e
COOLDOWN_S = 120  # longer than the test: cheap must stay skipped while the job starts
#: What slurm-spot controls: the hold cleared and the job allocated on ``other`` (goal 10 s;
#: measured 1.7 s).
ALLOCATED_WITHIN_S = 10.0
#: Error -> RUNNING: boot of the local instance (~8 s), then slurmctld 22.05 keeps the job
#: CONFIGURING until its next periodic job_time_limit pass (every 30 s, PERIODIC_TIMEOUT)
#: or batch-launch retry ("Configuration for JobId=N complete"), which slurm-spot cannot
#: trigger: measured 25.7-26.1 s, bounded by boot + 30 s.
RUNNING_WITHIN_S = 40.0


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """``spot`` = ``cheap`` (Weight 1, 2 nodes) + ``other`` (Weight 10, 2 nodes)."""
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("failover")
    config = base_config(root)
    config["node_sets"] = [
        {"name": "cheap", "provider": "local", "count": 2, "cpus": 1, "weight": 1},
        {"name": "other", "provider": "local", "count": 2, "cpus": 1, "weight": 10}]
    config["partitions"] = [{"name": "spot", "node_sets": ["cheap", "other"], "default": True}]
    config["reconcile"] = {"interval_s": 5, "orphan_grace_s": 20, "cooldown_s": COOLDOWN_S}
    c = Cluster(root, config, reconcile=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _file_events(c: Cluster) -> list[dict]:
    path = c.log_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_no_capacity_on_cheap_runs_the_job_on_other_within_seconds(two_sets: Cluster) -> None:
    c = two_sets
    c.spot("local", "capacity", "cheap", "0", "--conf-dir", str(c.conf_dir))
    try:
        job = c.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                       "--wrap", "sleep 120")
        submitted = time.time()
        running = wait_for(lambda: c.job(job).get("JobState") == "RUNNING" and c.job(job),
                           timeout=90, interval=0.25, what="job RUNNING")
        running_at = time.time()
        info: dict = running  # type: ignore[assignment]
        failed = [e for e in _file_events(c)
                  if e["action"] == "launch_failed" and e["node"].startswith("cheap-")]
        assert failed, "the job never met the capacity error on cheap"
        error_at = datetime.fromisoformat(failed[0]["time"]).timestamp()
        seconds = running_at - error_at
        record = {"job": job, "error_to_running_s": round(seconds, 2),
                  "submit_to_running_s": round(running_at - submitted, 2),
                  "nodes": info["NodeList"]}
        (c.root / "failover-seconds.json").write_text(json.dumps(record))
        print(f"\nfailover: capacity error -> RUNNING on {info['NodeList']}: {seconds:.1f} s "
              f"(submission -> RUNNING {running_at - submitted:.1f} s)")
        assert info["NodeList"].startswith("other-"), info["NodeList"]
        assert info["Restarts"] == "1"  # requeued once by the failed launch, nothing more
        assert len(failed) == 1, "cheap was tried again during its cooldown"
        assert seconds < RUNNING_WITHIN_S, record
        # where it went and why: events, then the job's AdminComment
        moved = wait_for(lambda: [e for e in _file_events(c) if e["action"] == "failover_started"
                                  and e["job_ids"] == [job]], timeout=10,
                         what="failover_started event")
        started = moved[0]  # type: ignore[index]
        record["error_to_allocated_s"] = started["extra"]["seconds_from_error"]
        (c.root / "failover-seconds.json").write_text(json.dumps(record))
        print(f"failover: capacity error -> allocated on other: "
              f"{record['error_to_allocated_s']} s")
        assert record["error_to_allocated_s"] < ALLOCATED_WITHIN_S, record
        assert started["extra"]["from_node_set"] == "cheap"
        assert started["extra"]["node_set"] == "other"
        assert started["extra"]["code"] == "InsufficientInstanceCapacity"
        (failover,) = [e for e in _file_events(c) if e["action"] == "failover"]
        assert failover["extra"]["expedited"] is True
        assert "no capacity on node set cheap" in failover["reason"]
        comment = wait_for(lambda: c.job(job).get("AdminComment", ""), timeout=10,
                           what="AdminComment")
        assert "failover: no capacity on node set cheap" in comment  # type: ignore[operator]
        assert "started on node set other" in comment  # type: ignore[operator]
        # cheap stays skipped while its cooldown lasts; status says so
        for name in ("cheap-1", "cheap-2"):
            assert "Temporarily disabled until" in c.node(name).get("Reason", "") \
                or "POWER" in c.node(name)["State"]
        sets = {s["node_set"]: s for s in read_envelope(c.spot("status", "--json").stdout,
                                                        "status")["node_sets"]}
        assert sets["cheap"]["capacity"] == "cooldown" and sets["cheap"]["until"]
        assert sets["other"]["capacity"] == "ok"
        assert c.job(job)["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED")
    finally:
        subprocess.run(["scancel", "-u", "root"], env=c.env, check=False)
        c.spot("local", "capacity", "cheap", "--conf-dir", str(c.conf_dir))
