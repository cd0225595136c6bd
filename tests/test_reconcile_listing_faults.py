"""A pass that cannot see Slurm's nodes decides nothing, and an instance whose configured
node is missing from the listing is never taken for an orphan.

Found in the field (session 12's fault-tolerant demo, Slurm 22.05.8): MUNGE went away for a
few seconds, ``sinfo --json`` exited 0 with no nodes (the failure only in its ``errors``
list), and the reconciler terminated the instances of two running nodes as orphans."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from slurm_spot.errors import SlurmCommandError
from slurm_spot.lifecycle.power import controller_unreachable
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.slurm.runner import run_command
from tests.test_reconcile_rules import NOW, World


def _running_fleet(world: World) -> dict[str, str]:
    """spot-1 and spot-2 up and running job 7, their instances an hour old (well past
    orphan_grace_s); node -> instance id."""
    fleet = {}
    for name in ("spot-1", "spot-2"):
        world.slurm.add_node(name, "MIXED+CLOUD", addr="10.0.0.1")
        fleet[name] = world.provider.add(name, 3600, NOW).instance_id
    world.slurm.add_job(7, ["spot-1", "spot-2"])
    return fleet


def test_slurm_2205_reporting_no_nodes_with_an_error_ends_no_instance(tmp_path: Path) -> None:
    world = World(tmp_path)
    fleet = _running_fleet(world)
    world.slurm.controller_unreachable = True
    for _ in range(3):
        with pytest.raises(SlurmCommandError, match="Unspecified error"):
            world.run()
    assert world.provider.alive() == sorted(fleet.values())
    assert not world.events("terminated")
    # slurmctld answers again: the fleet is as it was, nothing to repair
    world.slurm.controller_unreachable = False
    result = world.run()
    assert not result.errors
    assert world.provider.alive() == sorted(fleet.values())
    assert world.state("spot-1") == "MIXED+CLOUD"


def test_a_listing_without_any_configured_node_decides_nothing(tmp_path: Path) -> None:
    """slurm.conf of another cluster, or a listing cut short: none of spot-[1-4] listed."""
    world = World(tmp_path)
    fleet = _running_fleet(world)
    world.slurm.nodes = {}
    world.slurm.add_node("login-1", "IDLE")
    with pytest.raises(SlurmCommandError, match=r"none of the 4 nodes spot\.yaml configures"):
        world.run()
    assert world.provider.alive() == sorted(fleet.values())


def test_a_node_left_out_of_the_listing_keeps_its_instance_others_go_on(tmp_path: Path) -> None:
    """spot-2's record is unreadable (skipped: one odd node never hides the others); its
    instance is reported and left alone, while an instance of a node set spot.yaml no longer
    has is still an orphan and spot-1 is still reconciled."""
    world = World(tmp_path)
    fleet = _running_fleet(world)
    old_set = world.provider.add("gpu-old-3", 3600, NOW).instance_id
    del world.slurm.nodes["spot-2"]
    result = world.run()
    assert world.provider.alive() == sorted(fleet.values())
    assert old_set not in world.provider.alive()
    [error] = result.errors
    assert error.startswith("spot-2: not in Slurm's node listing") and fleet["spot-2"] in error
    [ended] = world.events("terminated")
    assert ended["instance"] == old_set
    # the node is listed again: it is reconciled as before, the instance kept
    world.slurm.add_node("spot-2", "MIXED+CLOUD", addr="10.0.0.1")
    world.now = NOW + timedelta(seconds=60)
    assert not world.run().errors
    assert fleet["spot-2"] in world.provider.alive()


@pytest.mark.skipif(shutil.which("sinfo") is None, reason="needs Slurm 22.05's sinfo")
def test_the_real_sinfo_of_2205_with_its_controller_away_is_a_failed_listing(
        tmp_path: Path) -> None:
    """Against the host's own Slurm 22.05 tools, a controller nobody listens for (about 9 s
    of sinfo's retries): the client raises instead of answering "no nodes", and its error
    says the controller is away (``scontrol ping``'s words), which ``slurm-spot status`` and
    the power-saving hooks take as "no Slurm controller answered"."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=away\nSlurmctldHost=localhost\nSlurmctldPort=1\n"
                    "AuthType=auth/munge\nNodeName=spot-1 CPUs=1 State=CLOUD\n"
                    "PartitionName=spot Nodes=spot-1\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    client = SlurmClient(Path(shutil.which("sinfo") or "").parent,
                         runner=lambda argv, timeout_s: run_command(argv, timeout_s, env))
    if client.version.release.release[:2] != (22, 5):
        pytest.skip(f"the host's Slurm is {client.version}, not 22.05")
    with pytest.raises(SlurmCommandError) as failed:
        client.nodes(with_jobs=False)
    assert "Slurm reported: Unspecified error" in str(failed.value)
    assert "scontrol ping: Slurmctld(primary) at " in str(failed.value)
    assert "is DOWN" in str(failed.value)
    assert controller_unreachable(failed.value)


def test_squeue_2205_reporting_no_jobs_with_an_error_is_a_failed_read(tmp_path: Path) -> None:
    """The same for jobs: 22.05's ``squeue --json`` exits 0 with ``"jobs": []``, which must
    not be read as an empty queue."""
    world = World(tmp_path)
    world.slurm.add_job(7, ["spot-1"])
    client = world.slurm.client()
    assert [j.job_id for j in client.jobs()] == [7]
    world.slurm.controller_unreachable = True
    with pytest.raises(SlurmCommandError,
                       match="slurm_load_jobs: Failed while looking for jobs"):
        client.jobs()
