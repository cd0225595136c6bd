"""Which node set of a partition a job gets while every node is powered down, on the real
slurmctld: node sets ``zeta`` (Weight 1, cheapest) and ``alpha`` (Weight 2), names sorted
against the cost order, rendered as slurm-spot renders them (``zeta``'s NodeName lines
first).

Slurm 23.02 and newer order powered-down nodes by Weight, so the job runs on ``zeta``
(passed on 24.11.5 and 26.05.5 in Debian roots made as docs/slurm-versions.md says).
Before 23.02 a node set whose nodes are all powered down gets the reboot weight in place of
its Weight (src/slurmctld/node_scheduler.c, ``_build_node_list``) and slurmctld's node table
is sorted by name (src/slurmctld/read_config.c, ``_sort_node_record_table_ptr``), so the job
runs on ``alpha-1`` whatever the order of slurm.conf's lines; ``slurm-spot config check``
says so (:func:`slurm_spot.lifecycle.weights.name_order_warnings`). One cluster, one job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from slurm_spot.slurm.version import SlurmVersion
from tests.cluster import Cluster, base_config, wait_for
from tests.conftest import _slurm_available

pytestmark = pytest.mark.e2e
SETS = {"zeta": 1, "alpha": 10}  # node set -> spot.yaml weight; zeta is the cheapest


@pytest.fixture(scope="module")
def against_names(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("weightorder")
    config = base_config(root)
    config["node_sets"] = [{"name": name, "provider": "local", "count": 2, "cpus": 1,
                            "weight": weight} for name, weight in SETS.items()]
    config["partitions"] = [{"name": "spot", "node_sets": list(SETS), "default": True}]
    c = Cluster(root, config, reconcile=False)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_powered_down_nodes_follow_weight_from_23_02_and_name_before(
        against_names: Cluster) -> None:
    c = against_names
    version = SlurmVersion.detect()
    assert version is not None
    fragment = (c.conf_dir / "slurm-spot.conf").read_text().splitlines()
    nodes = [line.split()[0] for line in fragment if line.startswith("NodeName=")]
    assert nodes[0] == "NodeName=zeta-1", nodes  # cheapest first in the file
    states = c.slurm("sinfo", "-h", "-N", "-o", "%N %t %w").split("\n")
    weights = {line.split()[0]: int(line.split()[2]) for line in states if line.strip()}
    assert weights["zeta-1"] < weights["alpha-1"], states
    assert all(line.split()[1] == "idle~" for line in states if line.strip()), states

    job = c.sbatch("-N1", "--wrap", "sleep 30")
    try:
        node = wait_for(lambda: c.job(job).get("NodeList", "(null)").replace("(null)", ""),
                        timeout=30, what=f"job {job} allocated")
    finally:
        subprocess.run(["scancel", str(job)], env=c.env, check=False, timeout=30)
    expected = "zeta-1" if version.powered_down_weight else "alpha-1"
    assert node == expected, f"Slurm {version}: job {job} got {node}, expected {expected}"

    check = subprocess.run(
        [sys.executable, "-m", "slurm_spot", "--config", str(c.spot_yaml), "config", "check",
         "--json"], env=c.env, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    warnings = json.loads(check.stdout)["data"].get("warnings", [])
    if version.powered_down_weight:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "alpha, zeta" in warnings[0] and "alpha-1" in warnings[0]
        assert f"slurm-spot: warning: {c.spot_yaml}:" in check.stderr
