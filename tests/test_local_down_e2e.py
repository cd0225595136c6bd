"""`slurm-spot local down` stops everything that `local up` and the hooks started."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster import Cluster, base_config, wait_for

pytestmark = pytest.mark.e2e


def test_local_down_leaves_nothing_running(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("downtest")
    other = Cluster(root, base_config(root), reconcile=True)
    other.start()
    try:
        other.spot("resume", "spot-1")
        wait_for(lambda: other.slurmd_pids(), timeout=10, what="slurmd started")
    finally:
        other.stop()
    left = subprocess.run(["pgrep", "-a", "-f", "slurmctld|slurmd|slurm_spot|slurm-spot"],
                          capture_output=True, text=True).stdout
    # Every process of this cluster names its files under root (slurmctld -f, slurmd -f,
    # the watchers' and the reconciler's --config); other test runs' processes do not.
    mine = [line for line in left.splitlines() if str(root) in line]
    assert mine == []
