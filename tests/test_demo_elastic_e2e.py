"""``slurm-spot demo --elastic --json`` end to end on the real local cluster: what a user sees."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_spot.jsonenvelope import read_envelope
from tests.cluster import acquire_cluster_lock

pytestmark = pytest.mark.e2e


def effective_rows(lines: list[str]) -> dict[int, list[dict]]:
    """The sample-log rows of the training that counted: a rank logging a step again (the
    survivors of a node lost without notice resume from the last periodic checkpoint) sets
    aside that step's and every later step's earlier rows (this test's own reading of the
    log, independent of the demo's)."""
    kept: dict[int, list[dict]] = {}
    for line in lines:
        row = json.loads(line)
        earlier = kept.get(row["step"], [])
        if any(r["rank"] == row["rank"] or r["world"] != row["world"] for r in earlier):
            for step in [s for s in kept if s >= row["step"]]:
                del kept[step]
        kept.setdefault(row["step"], []).append(row)
    return kept


@pytest.fixture
def short_workdir() -> Iterator[Path]:
    """A work directory short enough for the demo's step sockets (unix(7) sun_path: the demo
    refuses a longer --workdir), whatever the base of pytest's tmp_path: under xdist it grows
    by ``popen-gwN/``."""
    path = Path(tempfile.mkdtemp(prefix="elastic-demo-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_elastic_demo_goes_on_through_two_reclaims_without_a_requeue(short_workdir: Path) -> None:
    """1 on-demand coordinator + 3 spot workers: a worker reclaimed with notice, another
    without; the survivors go on, replacements join, the job completes without a requeue,
    the loss is within the stated tolerance of the uninterrupted reference, every sample is
    used once per epoch, and nothing is left running."""
    tmp_path = short_workdir
    with acquire_cluster_lock():
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_spot", "demo", "--elastic", "--json",
             "--workdir", str(tmp_path)],
            capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read_envelope(proc.stdout)
    assert result["state"] == "COMPLETED" and result["restarts"] == 0
    worlds = result["world_sizes"]
    assert worlds[0] == 3 and worlds[-1] == 3
    assert worlds.count(2) >= 1 and len(worlds) >= 3  # shrank and grew back
    notice, lost = result["interruptions"]
    assert (notice["kind"], lost["kind"]) == ("notice", "no-notice")
    assert notice["node"] != lost["node"]
    for item in (notice, lost):
        assert item["paused_s"] is not None and item["paused_s"] > 0
        assert item["world_before"] == 3
    assert result["joins"] and all(j["paused_s"] > 0 and j["world_after"] == 3
                                   for j in result["joins"])
    assert abs(result["final_loss"] - result["reference_loss"]) <= result["loss_tolerance"]
    assert result["tolerance_reason"]
    coordinator = result["coordinator"]
    assert coordinator["partition"] == "ondemand" and coordinator["node"] == "coord-1"
    assert "hetjob" in coordinator["description"]
    assert result["left_running"] == []
    # The sample log, read here: each step once, by every rank of its world; no sample twice
    # within an epoch; whole epochs of 18 global batches of 96.
    kept = effective_rows(Path(result["sample_log"]).read_text().splitlines())
    assert sorted(kept) == list(range(1, result["steps"] + 1))
    per_epoch: dict[int, list[int]] = {}
    for rows in kept.values():
        assert sorted(r["rank"] for r in rows) == list(range(rows[0]["world"]))
        for r in rows:
            per_epoch.setdefault(r["epoch"], []).extend(r["samples"])
    for epoch, used in per_epoch.items():
        assert len(used) == len(set(used)), f"epoch {epoch}: a sample used twice"
    last = max(per_epoch)
    assert all(len(per_epoch[e]) == 18 * 96 for e in per_epoch if e != last)
    assert result["samples"]["ok"] is True
    print(json.dumps(result))
