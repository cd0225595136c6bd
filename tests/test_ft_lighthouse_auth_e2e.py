"""The authenticated torchft lighthouse against a real slurmctld (issue 27): ``slurm-spot
lighthouse --job JOB`` asks squeue who owns JOB, admits that uid's relay (real MUNGE, torchft's
own client behind the relay), refuses another uid's, and will not start for a job Slurm does
not know."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.other_account import other_account_python

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def _slurm_bin() -> str:
    import shutil

    found = shutil.which("squeue")
    return os.path.dirname(found) if found else "/usr/bin"


@pytest.fixture(scope="module")
def held_job(cluster: Cluster) -> Iterator[str]:
    """A job of this uid that stays pending (held: no node is powered up for it)."""
    job = cluster.sbatch("-p", "spot", "-N", "1", "--hold", "-o", "/dev/null",
                         "--wrap", "sleep 600")
    yield str(job)
    cluster.slurm("scancel", str(job), check=False)


def _start(cluster: Cluster, job: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "slurm_spot", "lighthouse", "--job", job,
                             "--listen", "127.0.0.1", "--port", "0", "--slurm-bin-dir",
                             _slurm_bin()],
                            stderr=subprocess.PIPE, text=True,
                            env={**cluster.env, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        found = re.search(rf"front door listening on (127\.0\.0\.1:\d+) for job {job} "
                          rf"\(only uid {os.getuid()},", line)
        if found:
            return proc, found.group(1)
    raise AssertionError("".join(seen))


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_the_jobs_owner_is_admitted_and_another_uid_refused(cluster: Cluster,
                                                           held_job: str) -> None:
    from torchft._torchft import LighthouseClient

    from slurm_spot.jobs.injob.lighthouse_relay import relay_lighthouse

    proc, endpoint = _start(cluster, held_job)
    try:
        url = relay_lighthouse(endpoint, held_job)
        client = LighthouseClient(url, connect_timeout=timedelta(seconds=10))
        quorum = client.quorum(replica_id="g0", timeout=timedelta(seconds=10))
        assert [m.replica_id for m in quorum.participants] == ["g0"]
        if os.getuid() == 0:  # another account: nobody's credential, the same job id
            python, env = other_account_python()
            other = subprocess.run(
                [python, "-m", "slurm_spot", "lighthouse-relay", "--lighthouse",
                 endpoint, "--job", held_job, "--", "true"], user=65534, capture_output=True,
                text=True, timeout=120, env={**cluster.env, **env}, cwd="/")
            assert other.returncode == 1, other.stderr
            assert f"refused: uid 65534 does not own job {held_job}" in other.stderr
    finally:
        err = _stop(proc)
    if os.getuid() == 0:
        assert f"uid 65534 does not own job {held_job}" in err


def test_a_job_slurm_does_not_know_is_refused_at_start(cluster: Cluster) -> None:
    done = subprocess.run([sys.executable, "-m", "slurm_spot", "lighthouse", "--job", "999999",
                           "--listen", "127.0.0.1", "--port", "0", "--slurm-bin-dir",
                           _slurm_bin()], capture_output=True, text=True, timeout=120,
                          env={**cluster.env, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "--job 999999: Slurm does not know this job" in done.stderr
