"""Field states of issue 25 ("Field states left alone"), inputs in tests/data/field-states.yaml:
each is found by a reconcile pass against the fakes of Slurm and of a provider, and repaired
(node state after the pass) or reported (the event and its reason), one event each."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from slurm_spot.errors import SlurmCommandError
from tests.test_reconcile_rules import NOW, STAMP, World

CASES = yaml.safe_load((Path(__file__).parent / "data" / "field-states.yaml").read_text())


def test_idle_not_responding_without_instance_back_to_plain_idle(tmp_path: Path) -> None:
    case = CASES["not_responding_idle"]
    world = World(tmp_path)
    world.slurm.add_node("spot-1", case["node_state"], reason=case["reason"])
    world.slurm.add_node("spot-2", case["node_state"])
    world.slurm.refuse["spot-2"] = "Invalid node state specified"
    result = world.run()
    assert world.state("spot-1") == case["expect_state"]
    [event] = world.events("not_responding_cleared")
    assert event["node"] == "spot-1"
    # one node refused never stops the other: its failure is in the pass's errors
    assert any(e.startswith("spot-2:") for e in result.errors)
    assert "NOT_RESPONDING" in world.slurm.nodes["spot-2"].flags


def test_not_responding_clear_that_slurm_ignores_is_not_repeated_every_pass(
        tmp_path: Path) -> None:
    """22.05.8 keeps ``idle~*`` after ``state=IDLE`` (seen in the failover e2e): the clear
    was written as an event on every pass until the node booted."""
    case = CASES["not_responding_idle"]
    world = World(tmp_path)
    world.slurm.idle_keeps_not_responding = True
    world.slurm.add_node("spot-1", case["node_state"])
    for _ in range(3):
        world.run()
    assert "NOT_RESPONDING" in world.slurm.nodes["spot-1"].flags
    assert len(world.events("not_responding_cleared")) == 1
    # something else happens to the node (its next launch): the clear is tried once more
    world.emit("terminated", "suspend", "spot-1", ago_s=0, instance="i-1")
    world.run()
    world.run()
    assert len(world.events("not_responding_cleared")) == 2


def test_idle_not_responding_with_admin_reason_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", CASES["not_responding_idle"]["node_state"],
                         reason="NIC swapped, ticket 42")
    world.run()
    assert "NOT_RESPONDING" in world.slurm.nodes["spot-1"].flags
    assert not world.events("not_responding_cleared")


def test_kill_task_failed_node_powered_down_and_instance_replaced(tmp_path: Path) -> None:
    case = CASES["kill_task_failed"]
    world = World(tmp_path)
    world.slurm.add_node("spot-1", case["node_state"], reason=case["reason"], addr="10.0.0.1")
    instance = world.provider.add("spot-1", 3600, NOW).instance_id
    result = world.run()
    assert not result.errors
    assert world.state("spot-1") == case["expect_state"]
    reason = f"slurm-spot:kill task failed, instance replaced@{STAMP}"
    assert world.reason("spot-1") == reason
    [event] = world.events("kill_task_failed")
    assert (event["node"], event["instance"], event["reason"]) == ("spot-1", instance, reason)
    assert event["extra"]["previous_reason"] == "Kill task failed"
    # SuspendTimeout passes: the node is drain~ with our reason; the next pass undrains it
    world.slurm.finish_power_downs()
    world.provider.terminate(["spot-1"])
    world.run()
    assert world.events("undrained")
    assert "DRAIN" not in world.state("spot-1")


def test_kill_task_failed_waits_for_running_jobs(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "MIXED+CLOUD+DRAIN", reason="Kill task failed")
    world.slurm.add_job(7, ["spot-1"])
    world.provider.add("spot-1", 3600, NOW)
    world.run()
    assert world.state("spot-1") == "MIXED+CLOUD+DRAIN"
    assert world.slurm.jobs[7].state == "RUNNING"
    assert not world.events("kill_task_failed")


def test_admin_drain_with_alive_instance_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "IDLE+CLOUD+DRAIN", reason="Kill task failed? checking")
    world.provider.add("spot-1", 3600, NOW)
    world.run()
    assert world.state("spot-1") == "IDLE+CLOUD+DRAIN"


def test_duplicate_instance_terminated_with_a_warning_naming_both(tmp_path: Path) -> None:
    case = CASES["duplicate_instances"]
    world = World(tmp_path)
    world.slurm.add_node("spot-1", case["node_state"], addr="10.0.0.1")
    world.slurm.add_job(7, ["spot-1"])
    for spec in case["instances"]:
        world.provider.add("spot-1", spec["age_s"], NOW, instance_id=spec["id"], ip=spec["ip"])
    result = world.run()
    assert not result.errors
    assert world.provider.alive("spot-1") == [case["kept"]]
    [warning] = world.events("duplicate_instance")
    assert warning["extra"]["level"] == "warning"
    assert (warning["extra"]["kept"], warning["extra"]["terminated"]) == ("i-0aaa", "i-0bbb")
    assert "i-0aaa" in warning["reason"] and "i-0bbb" in warning["reason"]


def _held_job(world: World, job_id: int, restarts: int, partition: str = "spot") -> None:
    case = CASES["launch_failed_held"]
    job = world.slurm.add_job(job_id, [], case["job_state"], case["reason"])
    job.restarts, job.partition = restarts, partition


def test_launch_failed_held_job_released_with_an_event(tmp_path: Path) -> None:
    world = World(tmp_path)
    _held_job(world, 12, restarts=1)
    _held_job(world, 13, restarts=1, partition="cpu")  # not ours: left to its admin
    result = world.run()
    assert not result.errors
    assert world.slurm.released == [12]
    assert (world.slurm.jobs[12].state, world.slurm.jobs[12].reason) == ("PENDING", "None")
    assert world.slurm.jobs[13].reason == CASES["launch_failed_held"]["reason"]
    [event] = world.events("job_released")
    assert event["job_ids"] == [12] and event["extra"]["restarts"] == 1


def test_launch_failed_held_release_capped_so_it_cannot_loop(tmp_path: Path) -> None:
    world = World(tmp_path, max_fast_requeues=2, fast_requeue_window_s=600)
    _held_job(world, 12, restarts=1)
    for restarts in (2, 3):  # two launches failed again, each released by a pass
        world.run()
        world.now += timedelta(seconds=60)
        _held_job(world, 12, restarts=restarts)
    world.run()
    world.run()  # a second pass says it once per requeue
    assert world.slurm.released == [12, 12]
    assert world.slurm.jobs[12].reason == CASES["launch_failed_held"]["reason"]
    [withheld] = world.events("release_withheld")
    assert withheld["job_ids"] == [12]
    assert "left held" in withheld["reason"]
    assert "scontrol release 12" in withheld["reason"]


def test_one_refused_release_does_not_stop_the_others(tmp_path: Path) -> None:
    world = World(tmp_path)
    _held_job(world, 12, restarts=1)
    _held_job(world, 14, restarts=1)
    world.slurm.jobs[14].reason = "launch failed requeued held"  # the spelling with spaces
    client = world.reconciler.slurm
    real_release = client.release

    def release(job_id: int | str) -> None:
        if job_id == 12:  # the job ended between squeue and scontrol release
            raise SlurmCommandError(["scontrol", "release", "12"], 1, "Invalid job id")
        real_release(job_id)

    client.release = release  # type: ignore[method-assign]
    result = world.run()
    assert world.slurm.released == [14]
    assert [e["job_ids"] for e in world.events("job_released")] == [[14]]
    assert any("job 12: release" in e for e in result.errors)


def test_requeued_job_on_bad_constraints_reported_once_with_admin_comment(
        tmp_path: Path) -> None:
    case = CASES["bad_constraints"]
    world = World(tmp_path)
    job = world.slurm.add_job(21, [], case["job_state"], case["reason"])
    job.restarts, job.features = 1, case["features"]
    result = world.run()
    world.run()  # reported once per requeue, not once per pass
    assert not result.errors
    [event] = world.events("bad_constraints")
    assert event["job_ids"] == [21]
    assert event["extra"]["constraint"] == "a100&nvlink"
    assert "a100&nvlink" in event["reason"] and "Features=" in event["reason"]
    assert job.admin_comment.startswith("slurm-spot: job 21 pends on BadConstraints")
    assert job.admin_comment.count("BadConstraints") == 1


def test_low_real_memory_replacement_powered_down_with_a_reason_saying_what_to_do(
        tmp_path: Path) -> None:
    case = CASES["low_real_memory"]
    world = World(tmp_path)
    world.slurm.add_node("spot-1", case["node_state"], reason=case["reason"], addr="10.0.0.1")
    instance = world.provider.add("spot-1", 600, NOW).instance_id
    result = world.run()
    assert not result.errors
    assert world.state("spot-1") == case["expect_state"]
    reason = world.reason("spot-1")
    assert reason.startswith("slurm-spot:low RealMemory 15500 < 16000 MiB")
    assert "set memory_mib <= 15500" in reason and "spot.yaml" in reason
    [event] = world.events("real_memory_low")
    assert (event["node"], event["instance"], event["reason"]) == ("spot-1", instance, reason)
    assert event["extra"]["level"] == "warning" and event["extra"]["node_set"] == "spot"
    assert (event["extra"]["reported_mib"], event["extra"]["configured_mib"]) == (15500, 16000)
    # powered down, it stays drained (powering it up again would only drain it again)
    world.slurm.finish_power_downs()
    world.provider.terminate(["spot-1"])
    world.run()
    assert world.state("spot-1") == "IDLE+CLOUD+DRAIN+POWERED_DOWN"
    assert world.reason("spot-1") == reason
    assert len(world.events("real_memory_low")) == 1
