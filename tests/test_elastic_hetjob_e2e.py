"""An elastic job with an on-demand coordinator on the real local cluster: a heterogeneous job
whose component 0 (one on-demand node) runs the batch script and the rendezvous store, and whose
component 1 (spot workers) loses a node to a reclaim with notice and goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.slurm.states import parse_oneline
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available
from tests.elastic_runs import EXAMPLE, training_events

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """3 spot nodes (partition spot) and 1 on-demand node (partition coord)."""
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("hybrid")
    config = base_config(
        root,
        node_sets=[{"name": "spot", "provider": "local", "count": 3, "cpus": 1},
                   {"name": "coord", "provider": "local", "count": 1, "cpus": 1,
                    "market": "on-demand"}],
        partitions=[{"name": "spot", "node_sets": ["spot"], "default": True},
                    {"name": "coord", "node_sets": ["coord"]}])
    c = Cluster(root, config)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _components(cluster: Cluster, job: int) -> list[dict[str, str]]:
    """``scontrol -o show job`` of a heterogeneous job: one record per component, leader first."""
    out = cluster.slurm("scontrol", "-o", "show", "job", str(job), check=False)
    return [parse_oneline(line) for line in out.splitlines() if line.startswith("JobId=")]


def test_workers_go_on_around_an_on_demand_coordinator(hybrid: Cluster) -> None:
    """1 on-demand coordinator + 3 spot workers; one worker is reclaimed with notice: its ranks
    save and leave, the watcher shrinks the workers' component, the other two finish. The
    rendezvous ran on the coordinator; the job was never requeued."""
    out = hybrid.root / "hybrid-%j.out"
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(hybrid.spot_yaml), "sbatch",
         "--torchrun", "--elastic", "2:3", "--coordinator-partition", "coord",
         "--join-timeout", "30", "--json", "-p", "spot", "-N", "3", "-o", str(out),
         str(EXAMPLE), "--steps", "80", "--step-sleep", "0.15", "--checkpoint-every", "20",
         "--log-every", "5"],
        env={**hybrid.env, "GLOO_SOCKET_IFNAME": "lo"}, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = int(read_envelope(proc.stdout)["job_id"])
    log = Path(str(out).replace("%j", str(job)))
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 15 for e in training_events(log)), 240,
             what="3-worker training to reach step 15")
    leader, workers = _components(hybrid, job)
    assert leader["Partition"] == "coord" and leader["BatchHost"] == "coord-1"
    assert workers["Partition"] == "spot" and len(expand(workers["NodeList"])) == 3
    # Not the workers' component's first node (its BatchHost in Slurm's eyes): Slurm 22.05.8
    # refuses to shrink a job off its BatchHost (docs/ml-engineer.md, known limits).
    leaving = next(n for n in reversed(expand(workers["NodeList"]))
                   if n != workers["BatchHost"])
    hybrid.spot("local", "preempt", leaving, "--notice", "20", "--conf-dir",
                str(hybrid.conf_dir))
    wait_for(lambda: any(e["event"] == "done" for e in training_events(log)), 240,
             what="training to finish on the two remaining workers")
    wait_for(lambda: _components(hybrid, job)[0].get("JobState") == "COMPLETED", 60,
             what=f"job {job} to complete")
    leader, workers = _components(hybrid, job)
    assert leader["Restarts"] == "0" and workers["Restarts"] == "0"  # never requeued
    text = log.read_text()
    # What the user sees: the store was on the on-demand node, not on the controller.
    assert "slurm-spot: rendezvous on the coordinator coord-1 at 127.0.0.1:" in text
    assert "c10d store listening on 127.0.0.1:" in text
    events = training_events(log)
    leave = next(e for e in events if e["event"] == "leave")
    resumed = next(e for e in events if e["event"] == "resume")
    assert resumed["world_size"] == 2 and resumed["step"] == leave["step"]
    done = next(e for e in events if e["event"] == "done")
    assert done["step"] == 80 and done["world_size"] == 2
    assert {e["world_size"] for e in events if e["event"] == "step"} == {2, 3}
    released = [e for e in hybrid.events() if e["action"] == "released"]
    assert released and released[0]["node"] == leaving
    assert int(workers["JobId"]) in released[0]["job_ids"]  # the workers' component
    first_after = next(e for e in events if e["event"] == "step" and e["step"] > leave["step"])
    print(json.dumps({"hetjob_notice_paused_s": round(first_after["time"] - leave["time"], 1)}))
