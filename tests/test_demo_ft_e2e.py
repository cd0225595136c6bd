"""``slurm-spot demo --fault-tolerant --json`` end to end on the real local cluster: torchft
replica groups as Slurm jobs, one reclaimed with notice, one killed without; what a user sees."""

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

pytest.importorskip("torchft", reason="the ft extra (pip install 'slurm-spot[ft]')")


@pytest.fixture
def short_workdir() -> Iterator[Path]:
    """A work directory short enough for the local nodes' step sockets (unix(7) sun_path)."""
    path = Path(tempfile.mkdtemp(prefix="ft-demo-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_replica_groups_train_through_two_reclaims_and_heal_from_a_peer(
        short_workdir: Path) -> None:
    """Every group's job COMPLETED (the two reclaimed ones requeued once each), both
    replacements healed from a live peer, every group ends with the same weights and the
    one-process loss within the stated tolerance, and the lighthouse job ended by itself."""
    with acquire_cluster_lock():
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_spot", "demo", "--fault-tolerant", "--json",
             "--workdir", str(short_workdir)],
            capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read_envelope(proc.stdout)
    assert result["state"] == "COMPLETED"
    assert {name: job["state"] for name, job in result["jobs"].items()} == {
        "g0": "COMPLETED", "g1": "COMPLETED", "g2": "COMPLETED"}
    assert result["jobs"]["g0"]["restarts"] == 0 and result["restarts"] >= 2
    assert result["lighthouse"]["state"] == "COMPLETED"
    assert result["lighthouse"]["node"] == "coord-1"
    notice, kill = result["interruptions"]
    assert (notice["kind"], notice["group"], kill["kind"], kill["group"]) == (
        "notice", "g1", "kill", "g2")
    assert notice["left_at_step"] is not None  # left at a step boundary, told by the watcher
    for item in (notice, kill):
        assert 0 < item["survivor_max_gap_s"]
    healed = {j["group"] for j in result["joins"]}
    assert healed >= {"g1", "g2"}
    assert all(j["healed_from_peer"] and j["bytes"] > 0 for j in result["joins"])
    assert result["replicas_identical"] is True
    assert abs(result["final_loss"] - result["reference_loss"]) <= result["loss_tolerance"]
    print(json.dumps(result))
