"""``make test`` runs every benchmark once in a tiny size (``benchmarks/run.py --smoke``) so
that none rots: each script measures, builds its table and exits 0, without touching
BENCHMARKS.md. The scripts that need the local Slurm cluster (recovery_without_notice,
demo_recovery, prewarm_recovery) are left out by the runner: each needs minutes for a cluster
and a job, and the e2e tests run the same demo code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import run as bench_run  # noqa: E402 - benchmarks/run.py


def test_every_benchmark_runs_once_in_its_smoke_size(tmp_path: Path) -> None:
    before = (ROOT / "BENCHMARKS.md").read_text()
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--json-out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1100, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    ran = {r["name"]: r["status"] for r in results}
    assert set(ran) == {b.name for b in bench_run.BENCHMARKS if not b.cluster}
    assert all(status == "ok" or status.startswith("skipped") for status in ran.values()), ran
    assert (ROOT / "BENCHMARKS.md").read_text() == before  # a smoke run writes nothing
