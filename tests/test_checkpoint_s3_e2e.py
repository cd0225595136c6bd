"""The demo's training with its checkpoints in S3 (moto's HTTP server): interrupted twice on
local spot nodes, it resumes from S3 and ends bit-exactly like the uninterrupted run, as it
does with a POSIX root (tests/test_jobs_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import acquire_cluster_lock
from tests.fakes.s3_server import keys, moto_s3, new_bucket

pytestmark = pytest.mark.e2e


def test_demo_with_an_s3_root_resumes_bit_exact(tmp_path: Path) -> None:
    with moto_s3() as endpoint:
        bucket = new_bucket(endpoint)
        root = f"s3://{bucket}/demo runs/ß"
        with acquire_cluster_lock():
            proc = subprocess.run(
                [sys.executable, "-m", "slurm_spot", "demo", "--json", "--workdir",
                 str(tmp_path), "--checkpoint-root", root, "--s3-endpoint-url", endpoint,
                 "--s3-addressing-style", "path", "--steps", "170",
                 "--timeout", "720"],  # its own error, with its diagnosis, before ours
                capture_output=True, text=True, timeout=900, env=dict(os.environ))
        stored = keys(endpoint, bucket)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = read_envelope(proc.stdout)
    assert result["state"] == "COMPLETED" and result["restarts"] == 2
    assert result["exact_resume"] is True
    assert result["final_loss"] == result["reference_loss"]
    manifests = [k for k in stored if k.endswith("/manifest.json")]
    assert manifests and all(k.startswith("demo runs/ß/") for k in manifests)
    assert len(manifests) <= 2  # keep: 2
    assert not (tmp_path / "checkpoints").exists()  # no local checkpoint directory
