"""A demo wait that times out says why in its error: a CI log keeps only the error, so the
job's own output, the reconciler's log and the event log must be in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_spot.errors import SlurmSpotError
from slurm_spot.localcluster.demo import Demo, DemoSettings, TrainingLog


def test_a_timed_out_wait_shows_the_last_lines_of_the_job_and_reconciler_logs(
        tmp_path: Path) -> None:
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "reconcile.log").write_text("".join(f"pass {i}\n" for i in range(40)))
    (logs / "events.jsonl").write_bytes(b'{"kind": "requeued", "node": "n\xff1"}\n')
    job_out = tmp_path / "train-7.out"
    job_out.write_text("slurm-spot: job 7 restart 2 on a-1,a-2\n[W] hostname not found\n")
    demo = Demo(DemoSettings(workdir=tmp_path, timeout_s=0), lambda line: None)
    with pytest.raises(SlurmSpotError) as caught:
        demo.wait("training to start", lambda: False, TrainingLog(job_out))
    message = str(caught.value)
    assert "timed out after 0 s waiting for training to start" in message
    assert "job 7 restart 2 on a-1,a-2" in message and "hostname not found" in message
    assert "pass 39" in message and "pass 25" in message and "pass 24" not in message
    assert '"node": "n\ufffd1"' in message  # odd bytes shown, not a crash
    assert "squeue: no cluster" in message  # the cluster never came up: not asked
