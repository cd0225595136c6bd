"""Issue 11 end to end on a real slurmctld (22.05): node names with characters Slurm allows,
a reason with ``key=value`` words, a job interrupted on such a node, and the reconciler
passing all along; the test cluster stops only processes it started."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from slurm_spot.hostlist import expand
from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e
ODD = "gpu_a100.sxm"   # nodes gpu_a100.sxm-1, -2 ("+" is refused: see test_config_inputs)
DOTTED = "n.rack1"     # nodes n.rack1-1, -2
REASON = "maint: State=bad disk Exit=1 on step 3"


def _stranger(root: Path) -> subprocess.Popen[bytes]:
    """A process named slurmd that this test suite did not start as part of a cluster."""
    fake = root / "bin" / "slurmd"
    fake.parent.mkdir()
    shutil.copy("/bin/sleep", fake)
    return subprocess.Popen([str(fake), "600"], stdin=subprocess.DEVNULL,
                            start_new_session=True)


def test_odd_node_names_job_interrupted_reconciler_keeps_passing(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("names")
    config = base_config(root)
    config["node_sets"] = [{"name": ODD, "provider": "local", "count": 2, "cpus": 1},
                           {"name": DOTTED, "provider": "local", "count": 2, "cpus": 1}]
    config["partitions"] = [{"name": "spot", "node_sets": [ODD, DOTTED], "default": True}]
    config["reconcile"] = {"interval_s": 2, "orphan_grace_s": 20, "cooldown_s": 20,
                           "metrics_file": str(root / "metrics" / "slurm_spot.prom")}
    c = Cluster(root, config, reconcile=True)
    c.start()
    stranger = _stranger(root)  # after start(): the lock keeps old test runs from killing it
    try:
        victim = f"{ODD}-1"
        assert c.node(victim)["NodeName"] == victim  # slurmctld took the name as is
        c.slurm("scontrol", "update", f"nodename={DOTTED}-2", "state=drain", f"reason={REASON}")
        job = c.sbatch("-p", "spot", "-w", victim, "--requeue", "-o", "/dev/null",
                       "--wrap", "srun sleep 600")
        wait_for(lambda: c.job(job).get("JobState") == "RUNNING", timeout=90, what="job running")
        assert expand(c.job(job)["NodeList"]) == [victim]
        c.spot("local", "preempt", victim, "--notice", "0", "--conf-dir", str(c.conf_dir))
        wait_for(lambda: c.job(job).get("Restarts", "0") != "0", timeout=60, interval=0.5,
                 what="job requeued")
        wait_for(lambda: c.job(job).get("JobState") == "RUNNING", timeout=120, interval=0.5,
                 what="job running again")
        reclaimed = [e for e in c.events()
                     if e["source"] == "reconcile" and e["action"] == "reclaimed"]
        assert [(e["node"], e["job_ids"]) for e in reclaimed] == [(victim, [job])]
        # status reads the reason whole, and the reconciler left the admin's drain alone.
        rows = {r["node"]: r for r in read_envelope(c.spot("status", "--json").stdout)["nodes"]}
        assert rows[f"{DOTTED}-2"]["reason"] == REASON
        assert job in rows[expand(c.job(job)["NodeList"])[0]]["jobs"]
        # Passes keep completing after the interruption, and none failed.
        metrics = root / "metrics" / "slurm_spot.prom"

        def last_pass() -> float:
            for line in metrics.read_text().splitlines():
                if line.startswith("slurm_spot_reconcile_last_pass_timestamp_seconds "):
                    return float(line.split()[1])
            return 0.0

        seen = last_pass()
        wait_for(lambda: last_pass() > seen, timeout=20, what="another reconciler pass")
        log = (c.log_dir / "reconcile.log").read_text()
        assert "pass failed" not in log and "Traceback" not in log
        assert c.node(f"{DOTTED}-2")["Reason"] == REASON  # not lifted by any pass
        subprocess.run(["scancel", str(job)], env=c.env, check=False, timeout=30)
    finally:
        c.stop()
        alive = stranger.poll() is None
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait(timeout=10)
    assert alive, "stopping the test cluster killed a slurmd it had not started"
