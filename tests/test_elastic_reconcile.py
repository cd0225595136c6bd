"""The reconciler and elastic jobs: a node lost without notice is released from the job (the
job goes on with its other nodes, never requeued for it), as the watcher does with notice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slurm_spot.contract.names import ELASTIC_MARK
from slurm_spot.providers.base import InstanceState
from tests.test_reconcile_rules import NOW, World

ELASTIC_SCRIPT = f"#!/bin/bash\n{ELASTIC_MARK}\n#SBATCH --no-kill\nsrun ...\n"


def _world(tmp_path: Path) -> World:
    """spot-1..3 run elastic job 7 (batch script on spot-1); spot-4 runs plain job 8."""
    world = World(tmp_path)
    for name in ("spot-1", "spot-2", "spot-3", "spot-4"):
        world.slurm.add_node(name, "ALLOCATED+CLOUD")
        world.provider.add(name, 900, NOW)
    elastic = world.slurm.add_job(7, ["spot-1", "spot-2", "spot-3"])
    elastic.script, elastic.no_kill, elastic.batch_host = ELASTIC_SCRIPT, True, "spot-1"
    world.slurm.add_job(8, ["spot-4"]).script = "#!/bin/bash\nsrun train.py\n"
    return world


def _lose(world: World, node: str) -> None:
    """``node``'s instance vanishes without notice (the provider lists it terminated)."""
    for inst in world.provider.instances.values():
        if inst.hostname == node:
            world.provider.instances[inst.instance_id] = replace(
                inst, state=InstanceState.TERMINATED,
                state_reason="Server.SpotInstanceTermination")


def test_a_lost_worker_is_released_from_its_elastic_job_which_goes_on(tmp_path: Path) -> None:
    world = _world(tmp_path)
    _lose(world, "spot-3")
    _lose(world, "spot-4")
    result = world.run()
    assert not result.errors
    job = world.slurm.jobs[7]
    assert (job.state, job.nodes, job.restarts) == ("RUNNING", ["spot-1", "spot-2"], 0)
    assert "requeued" not in job.admin_comment
    # The lost node is DOWN (its step ended at once) and powering down, as for any job.
    assert world.state("spot-3") == "DOWN+CLOUD+POWER_DOWN"
    assert world.reason("spot-3").startswith("spot-interruption:reclaimed@")
    released = world.events("released")
    assert [(e["node"], e["job_ids"], e["extra"]["remaining"]) for e in released] == [
        ("spot-3", [7], "spot-[1-2]")]
    # The plain job on the other lost node is requeued, as before; the elastic one is not
    # counted as requeued anywhere.
    assert (world.slurm.jobs[8].state, world.slurm.jobs[8].restarts) == ("PENDING", 1)
    reclaimed = {e["node"]: e.get("job_ids") or [] for e in world.events("reclaimed")}
    assert reclaimed == {"spot-3": [], "spot-4": [8]}
    assert 7 not in world.slurm.expedited and 8 in world.slurm.expedited


def test_an_elastic_job_whose_batch_host_is_lost_falls_back_to_requeue(tmp_path: Path) -> None:
    """DOWN takes any failed node out of a --no-kill job, its batch host too, which would
    leave the job running without its batch script: the pass requeues it instead."""
    world = _world(tmp_path)
    _lose(world, "spot-1")
    result = world.run()
    assert not result.errors
    job = world.slurm.jobs[7]
    assert job.state == "PENDING" and job.restarts == 1
    assert world.events("released") == []
    assert [e["job_ids"] for e in world.events("reclaimed")] == [[7]]
    assert 7 in world.slurm.expedited


def test_a_second_pass_does_nothing_more(tmp_path: Path) -> None:
    """The released node is powered down; the next pass neither releases nor requeues again."""
    world = _world(tmp_path)
    _lose(world, "spot-2")
    world.run()
    world.slurm.finish_power_downs()
    again = world.run()
    assert [a["action"] for a in again.actions] == []
    assert world.slurm.jobs[7].state == "RUNNING" and world.slurm.jobs[7].restarts == 0
    assert len(world.events("released")) == 1
