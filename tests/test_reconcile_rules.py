"""The reconciler's rules, each case of tests/data/reconcile.yaml (a copy of the shared field
cases) as a unit test of the pure classifier and of a whole pass against fakes of Slurm (a
runner that parses scontrol/squeue argv and keeps state) and of a provider."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from slurm_spot.config import SpotConfig
from slurm_spot.events import Event, emit, read_events
from slurm_spot.providers.base import InstanceState
from slurm_spot.reconcile.reconciler import PassResult, Reconciler
from slurm_spot.reconcile.rules import History, Settings, Verdict, classify_node
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.reasons import cooldown_reason, is_clearable, parse_cooldown, short_state
from slurm_spot.slurm.states import parse_node_state
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm

DATA = Path(__file__).parent / "data"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
STAMP = "2026-03-01T12:00:00Z"
CASES = yaml.safe_load((DATA / "reconcile.yaml").read_text())
STATUS = {"RUNNING": InstanceState.RUNNING, "STAGING": InstanceState.PENDING,
          "PROVISIONING": InstanceState.PENDING}


class World:
    """A config with node set spot-[1-4], a fake Slurm, a fake provider and a fixed clock."""

    def __init__(self, tmp_path: Path, **reconcile: object) -> None:
        # No grace for an absent instance unless a test asks for one (the cases file's rows
        # with "instance: null" are about what happens once the absence is evidence).
        reconcile.setdefault("missing_grace_s", 0)
        self.config = SpotConfig.model_validate({
            "cluster": "test",
            "node_sets": [{"name": "spot", "provider": "local", "count": 4}],
            "partitions": [{"name": "spot", "node_sets": ["spot"]}],
            "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
            "reconcile": reconcile,
        })
        self.slurm = FakeSlurm()
        for name in self.config.all_nodes():
            self.slurm.add_node(name)
        self.provider = FakeProvider()
        self.now = NOW
        self.reconciler = Reconciler(
            self.config, self.slurm.client(), providers=lambda config, name: self.provider,
            clock=lambda: self.now, sleep=lambda s: None, expedite_wait_s=0)

    def run(self) -> PassResult:
        return self.reconciler.run_pass()

    def state(self, node: str) -> str:
        return self.slurm.nodes[node].state

    def reason(self, node: str) -> str:
        return self.slurm.nodes[node].reason

    def events(self, action: str | None = None) -> list[dict]:
        return [e for e in read_events(self.config.log_dir)
                if e["source"] == "reconcile" and action in (None, e["action"])]

    def emit(self, action: str, source: str, node: str | None, ago_s: float,
             **fields: object) -> None:
        emit(self.config.log_dir, Event(action, source, node=node,
                                        time=(self.now - timedelta(seconds=ago_s)).isoformat(),
                                        **fields))  # type: ignore[arg-type]


def node(name: str, state: str, reason: str = "", jobs: tuple[int, ...] = (),
         boot_time: str = "None") -> Node:
    return Node(name, parse_node_state(state), reason=reason, addr="10.0.0.1", jobs=jobs,
                boot_time=boot_time)


# -- every row of the cases file ----------------------------------------------------------
# (verdict, instance terminated, node state after one pass)
EXPECT = [
    (Verdict.OK, False, "IDLE+CLOUD+POWERED_DOWN"),
    (Verdict.OK, True, "IDLE+CLOUD+POWERED_DOWN"),
    (Verdict.RECLAIMED, False, "DOWN+CLOUD+POWER_DOWN"),
    (Verdict.RESUME_FAILED, False, "IDLE+CLOUD+POWERED_DOWN"),
    (Verdict.RESUME_FAILED, True, "IDLE+CLOUD+POWERED_DOWN"),
    (Verdict.OK, False, "MIXED+CLOUD"),
]


def test_every_case_has_an_expectation() -> None:
    assert len(CASES) == len(EXPECT)


def _setup_case(world: World, case: dict) -> str | None:
    state = case["node"]
    world.slurm.add_node("spot-1", state, addr="10.0.0.1",
                         reason="ResumeTimeout reached" if state.startswith("DOWN") else "")
    if state.startswith(("ALLOCATED", "MIXED")):
        world.slurm.add_job(7, ["spot-1"])
    spec = case.get("instance")
    if spec is None:
        return None
    return world.provider.add("spot-1", spec["age_s"], NOW, STATUS[spec["status"]]).instance_id


@pytest.mark.parametrize(("case", "expect"), list(zip(CASES, EXPECT, strict=True)),
                         ids=[f"row{i}" for i in range(len(CASES))])
def test_case_classifier(case: dict, expect: tuple, tmp_path: Path) -> None:
    world = World(tmp_path)
    _setup_case(world, case)
    n = world.slurm.client().nodes(["spot-1"])[0]
    # The World's settings: an absent instance counts at once (missing_grace_s 0).
    decision = classify_node(n, world.provider.list_instances(), NOW, world.reconciler.settings,
                             History())
    assert decision.verdict is expect[0]
    assert bool(decision.terminate) is expect[1]


@pytest.mark.parametrize(("case", "expect"), list(zip(CASES, EXPECT, strict=True)),
                         ids=[f"row{i}" for i in range(len(CASES))])
def test_case_pass(case: dict, expect: tuple, tmp_path: Path) -> None:
    world = World(tmp_path)
    instance = _setup_case(world, case)
    result = world.run()
    assert not result.errors
    assert world.state("spot-1") == expect[2]
    if instance is not None:
        assert (instance not in world.provider.alive()) is expect[1]
    if expect[0] is Verdict.RECLAIMED:
        assert world.reason("spot-1") == f"spot-interruption:reclaimed@{STAMP}"
        job = world.slurm.jobs[7]
        assert (job.state, job.reason, job.restarts) == ("PENDING", "None", 1)
        assert [e["job_ids"] for e in world.events("reclaimed")] == [[7]]
        assert [e["job_ids"] for e in world.events("expedited")] == [[7]]
    if expect[0] is Verdict.RESUME_FAILED:
        assert world.reason("spot-1") == ""
        assert world.slurm.nodes["spot-1"].addr == "spot-1"  # address cleared, as Slurm does
        assert [e["reason"] for e in world.events("resume_failed")] == ["ResumeTimeout reached"]
    if expect[1]:
        assert [e["instance"] for e in world.events("terminated")] == [instance]
    assert world.run().actions == []  # converged: a second pass has nothing to do


# -- node-states.yaml rows that the reconciler acts on -----------------------------------
def test_instance_lost_while_up_and_down_not_responding(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-2", "DOWN+CLOUD+NOT_RESPONDING", reason="Not responding")
    world.run()
    assert world.state("spot-2") == "DOWN+CLOUD+NOT_RESPONDING+POWER_DOWN"
    world.slurm.finish_power_downs()
    assert world.state("spot-2") == "IDLE+CLOUD+POWERED_DOWN"


def test_power_down_flag_on_powered_down_node_old_instance_is_orphan(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "IDLE+CLOUD+POWER_DOWN+POWERED_DOWN")
    inst = world.provider.add("spot-1", 600, NOW).instance_id
    world.run()
    assert world.provider.alive() == []
    assert [e["instance"] for e in world.events("terminated")] == [inst]


def test_admin_drain_is_left_alone_even_when_the_instance_is_gone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "MIXED+DRAIN", reason="bad GPU, ticket 42")
    world.slurm.add_node("spot-2", "MIXED+CLOUD+DRAIN", reason="bad GPU, ticket 43")
    world.slurm.add_job(7, ["spot-1"])
    world.slurm.add_job(8, ["spot-2"])
    world.provider.add("spot-1", 600, NOW)
    world.slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN", reason="disk replacement")
    result = world.run()
    assert result.actions == []
    assert world.state("spot-1") == "MIXED+DRAIN"
    assert world.reason("spot-2") == "bad GPU, ticket 43"
    assert world.state("spot-3") == "DOWN+CLOUD+POWERED_DOWN"
    assert world.slurm.jobs[8].state == "RUNNING"


@pytest.mark.parametrize("reason", ["slurm-spot: keep drained, debugging NCCL",
                                    "Not responding, NIC swapped (ticket 42)",
                                    "spot-interruption: check GPU 3"])
def test_admin_reasons_that_look_like_ours_are_never_lifted(tmp_path: Path, reason: str) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN", reason=reason)
    world.slurm.add_node("spot-2", "IDLE+CLOUD+DRAIN+POWERED_DOWN", reason=reason)
    world.slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    for _ in range(2):
        world.run()
    assert (world.state("spot-1"), world.reason("spot-1")) == ("DOWN+CLOUD+POWERED_DOWN", reason)
    assert world.reason("spot-2") == reason and "DRAIN" in world.state("spot-2")
    assert world.state("spot-3") == "IDLE+CLOUD+POWERED_DOWN"  # Slurm's own reason: lifted


def test_booting_node_with_alive_instance_waits(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "MIXED+CLOUD+NOT_RESPONDING+POWERING_UP")
    world.provider.add("spot-1", 20, NOW, InstanceState.PENDING)
    result = world.run()
    assert result.verdicts == {"wait": 1, "ok": 3}
    assert result.actions == []


def test_reclaimed_watcher_drained_node_requeues_its_job(tmp_path: Path) -> None:
    """The watcher drained the node, then died with the instance: the pass finishes its work."""
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "MIXED+CLOUD+DRAIN",
                         reason="spot-interruption:terminate@2026-03-01T11:00:00Z")
    world.slurm.add_job(9, ["spot-1"])
    world.provider.add("spot-1", 900, NOW, InstanceState.TERMINATED,
                       reason="Server.SpotInstanceTermination")
    world.run()
    assert world.slurm.jobs[9].state == "PENDING"
    assert world.reason("spot-1").startswith("spot-interruption:reclaimed@")


def test_stuck_completing_after_power_down_force_on_a_dead_node_is_unstuck(tmp_path: Path) -> None:
    """POWER_DOWN_FORCE alone on a dead node leaves the job COMPLETING; DOWN releases it."""
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(5, ["spot-1"])
    world.slurm.dead.add("spot-1")
    world.slurm.client().set_state(["spot-1"], "POWER_DOWN_FORCE", "spot-interruption:x")
    assert world.slurm.jobs[5].state == "COMPLETING"
    world.run()
    assert world.slurm.jobs[5].state == "PENDING"
    assert world.slurm.jobs[5].reason == "None"


# -- booting nodes -----------------------------------------------------------------------
def test_boot_lost_powers_down_and_requeues(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP",
                         boot_time="2026-03-01T10:00:00")
    world.slurm.add_job(3, ["spot-1"], state="CONFIGURING")
    world.provider.add("spot-1", 7200, NOW, InstanceState.TERMINATED)  # its previous life
    lost = world.provider.add("spot-1", 40, NOW, InstanceState.TERMINATED,
                              reason="Server.InternalError").instance_id
    world.run()
    assert world.state("spot-1") == "DOWN+CLOUD+NOT_RESPONDING+POWER_DOWN"
    assert world.reason("spot-1") == f"slurm-spot:instance lost while booting@{STAMP}"
    assert world.slurm.jobs[3].state == "PENDING"
    assert [e["instance"] for e in world.events("boot_lost")] == [lost]


def test_booting_node_whose_only_dead_instance_is_older_than_its_boot_waits(tmp_path: Path) -> None:
    """The resume hook has not launched yet; the dead instance is from the node's last life."""
    world = World(tmp_path)
    boot = (NOW - timedelta(seconds=50)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD+POWERING_UP", boot_time=boot)
    world.provider.add("spot-1", 60, NOW, InstanceState.TERMINATED)
    assert world.run().actions == []
    assert world.state("spot-1") == "ALLOCATED+CLOUD+POWERING_UP"


def test_a_node_powering_up_again_is_not_lost_for_the_instance_slurm_spot_ended(
        tmp_path: Path) -> None:
    """Powered down (the suspend hook terminated its instance: event ``terminated``) and
    powered up again, with no BootTime (slurmctld 22.05 clears it) and the resume hook's
    launch not yet made: the old instance is not this boot's, the node is not lost, the job
    stays (seen in the failover e2e, where it was requeued onto another node set)."""
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD+POWERING_UP")
    world.slurm.add_job(3, ["spot-1"], state="CONFIGURING")
    old = world.provider.add("spot-1", 60, NOW, InstanceState.TERMINATED,
                             reason="Terminated by slurm-spot").instance_id
    world.emit("terminated", "suspend", "spot-1", 51, instance=old)
    assert world.run().actions == []
    assert world.state("spot-1") == "ALLOCATED+CLOUD+POWERING_UP"
    assert world.slurm.jobs[3].state == "CONFIGURING"


def test_boot_lost_is_acted_on_once(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD+POWERING_UP")
    dead = world.provider.add("spot-1", 30, NOW, InstanceState.TERMINATED).instance_id
    world.emit("boot_lost", "reconcile", "spot-1", 60, instance=dead)
    assert world.run().actions == []


# -- duplicates and orphans --------------------------------------------------------------
def test_duplicates_keep_the_instance_at_the_node_address(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD", addr="10.0.0.7")
    world.slurm.add_job(4, ["spot-1"])
    known = world.provider.add("spot-1", 300, NOW, ip="10.0.0.7").instance_id
    world.provider.add("spot-1", 200, NOW, ip="10.0.0.8")
    world.provider.add("spot-1", 20, NOW, ip="10.0.0.9")
    world.run()
    assert world.provider.alive() == [known]
    assert world.state("spot-1") == "ALLOCATED+CLOUD"
    assert {e["reason"] for e in world.events("terminated")} == {"duplicate"}


def test_duplicates_on_one_address_keep_the_newest_that_predates_the_boot(tmp_path: Path) -> None:
    """Local instances all share 127.0.0.1: the one that registered booted last before BootTime."""
    world = World(tmp_path)
    boot = (NOW - timedelta(seconds=100)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    world.slurm.add_node("spot-1", "IDLE+CLOUD", addr="127.0.0.1", boot_time=boot)
    world.provider.add("spot-1", 900, NOW, ip="127.0.0.1")  # a leaked earlier life
    kept = world.provider.add("spot-1", 101, NOW, ip="127.0.0.1").instance_id
    world.provider.add("spot-1", 30, NOW, ip="127.0.0.1")  # started behind Slurm's back
    world.run()
    assert world.provider.alive() == [kept]


@pytest.mark.parametrize("tag", [None, "spot-99", "gpu-1"])
def test_instance_of_no_known_node_is_terminated_after_the_grace_only(
        tag: str | None, tmp_path: Path) -> None:
    world = World(tmp_path, orphan_grace_s=90)
    young = world.provider.add(tag, 89, NOW).instance_id
    old = world.provider.add(tag, 91, NOW).instance_id
    world.run()
    assert world.provider.alive() == [young]
    assert [e["instance"] for e in world.events("terminated")] == [old]


def test_orphan_is_spared_when_slurm_powers_its_node_up_meanwhile(tmp_path: Path) -> None:
    world = World(tmp_path)
    inst = world.provider.add("spot-4", 600, NOW).instance_id

    def resume_spot4(call: int) -> None:
        if call == 2:  # the re-check just before terminating
            world.slurm.nodes["spot-4"].flags = {"CLOUD", "POWERING_UP"}

    world.slurm.on_show = resume_spot4
    world.run()
    assert world.provider.alive() == [inst]


# -- failures stay isolated --------------------------------------------------------------
def test_one_node_failing_does_not_stop_the_others(tmp_path: Path) -> None:
    world = World(tmp_path)
    for name in ("spot-1", "spot-2"):
        world.slurm.add_node(name, "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    world.slurm.refuse["spot-1"] = "Invalid node state specified"
    result = world.run()
    assert world.state("spot-2") == "IDLE+CLOUD+POWERED_DOWN"
    assert world.state("spot-1") == "DOWN+CLOUD+POWERED_DOWN"
    assert len(result.errors) == 1 and "spot-1" in result.errors[0]


def test_failed_termination_keeps_the_node_down_until_it_succeeds(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN", reason="ResumeTimeout reached")
    inst = world.provider.add("spot-1", 700, NOW).instance_id
    world.provider.fail_terminate.add(inst)
    assert world.run().errors
    assert world.state("spot-1") == "DOWN+CLOUD+POWERED_DOWN"
    world.provider.fail_terminate.clear()
    world.run()
    assert world.state("spot-1") == "IDLE+CLOUD+POWERED_DOWN"
    assert world.provider.alive() == []


def test_provider_that_cannot_list_leaves_its_nodes_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(1, ["spot-1"])
    world.provider.fail_listing = RuntimeError("RequestLimitExceeded")
    result = world.run()
    assert world.state("spot-1") == "ALLOCATED+CLOUD"
    assert result.errors == ["provider local: listing failed: RequestLimitExceeded"]
    assert world.provider.listings == 1


# -- capacity cooldown, circuit breaker, drains ------------------------------------------
def _capacity_failure(world: World, node: str, ago_s: float) -> None:
    world.emit("launch_failed", "resume", node, ago_s,
               reason="(Code:InsufficientInstanceCapacity)no capacity",
               extra={"code": "InsufficientInstanceCapacity", "class": "capacity"})


def test_capacity_failure_cools_the_node_set_down_then_reenables_it(tmp_path: Path) -> None:
    world = World(tmp_path, cooldown_s=600)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(1, ["spot-1"])
    world.provider.add("spot-1", 60, NOW)
    _capacity_failure(world, "spot-2", 30)
    world.run()
    reason = "(Code:InsufficientInstanceCapacity)Temporarily disabled until 2026-03-01T12:10:00Z"
    for name in ("spot-2", "spot-3", "spot-4"):
        assert world.state(name) == "DOWN+CLOUD+POWERED_DOWN"
        assert world.reason(name) == reason
    assert world.state("spot-1") == "ALLOCATED+CLOUD"
    world.now = NOW + timedelta(seconds=300)
    assert world.run().actions == []  # cooling; the old failure does not start another
    world.now = NOW + timedelta(seconds=601)
    world.run()
    for name in ("spot-2", "spot-3", "spot-4"):
        assert world.state(name) == "IDLE+CLOUD+POWERED_DOWN"
        assert world.reason(name) == ""
    assert len(world.events("cooldown_end")) == 3
    world.now = NOW + timedelta(seconds=700)
    assert world.run().actions == []


def test_node_powered_down_during_a_cooldown_joins_it(tmp_path: Path) -> None:
    world = World(tmp_path, cooldown_s=600)
    reason = cooldown_reason("ZONE_RESOURCE_POOL_EXHAUSTED", NOW + timedelta(seconds=120))
    world.slurm.add_node("spot-2", "DOWN+CLOUD+POWERED_DOWN", reason=reason)
    world.run()
    assert world.reason("spot-1") == reason
    assert world.state("spot-1") == "DOWN+CLOUD+POWERED_DOWN"


def test_repeated_resume_failures_trip_the_breaker(tmp_path: Path) -> None:
    world = World(tmp_path, max_resume_failures=3, failure_window_s=3600)
    world.emit("resume_failed", "reconcile", "spot-3", 7200)  # outside the window
    world.emit("resume_failed", "reconcile", "spot-3", 1800)
    world.emit("resume_failed", "reconcile", "spot-3", 600)
    world.slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN+NOT_RESPONDING",
                         reason="ResumeTimeout reached")
    world.run()
    assert world.state("spot-3") == "IDLE+CLOUD+DRAIN+POWERED_DOWN"
    assert world.reason("spot-3").startswith("slurm-spot:circuit-breaker: 3 resume failures")
    world.now = NOW + timedelta(seconds=60)
    assert world.run().actions == []  # left for an admin: scontrol update ... state=RESUME
    world.slurm.client().set_state(["spot-3"], "RESUME")
    world.slurm.client().set_state(["spot-3"], "DOWN", "ResumeTimeout reached")
    world.run()  # the count restarted at the breaker: one failure, back to idle~
    assert world.state("spot-3") == "IDLE+CLOUD+POWERED_DOWN"


def test_launch_failures_that_resume_powered_down_itself_trip_the_breaker(tmp_path: Path) -> None:
    """On 22.05 a launch failure goes idle% -> idle~, never down~: resume's events count."""
    world = World(tmp_path, max_resume_failures=3)
    for ago in (900, 600, 300):
        world.emit("launch_failed", "resume", "spot-2", ago, reason="(Code:InvalidAMIID.NotFound)x",
                   extra={"code": "InvalidAMIID.NotFound", "class": "config"})
    world.slurm.add_node("spot-2", reason="(Code:InvalidAMIID.NotFound)x")
    world.run()
    assert world.state("spot-2") == "IDLE+CLOUD+DRAIN+POWERED_DOWN"
    assert world.reason("spot-2").startswith("slurm-spot:circuit-breaker: 3 resume failures")
    assert world.state("spot-1") == "IDLE+CLOUD+POWERED_DOWN"


def test_down_node_with_a_capacity_code_starts_a_cooldown_without_events(tmp_path: Path) -> None:
    world = World(tmp_path, cooldown_s=600)
    world.slurm.add_node("spot-3", "DOWN+CLOUD+POWERED_DOWN",
                         reason="(Code:ZONE_RESOURCE_POOL_EXHAUSTED)no n1 in us-central1-a")
    world.run()
    for name in ("spot-1", "spot-2", "spot-3", "spot-4"):
        assert world.reason(name).startswith(
            "(Code:ZONE_RESOURCE_POOL_EXHAUSTED)Temporarily disabled until ")


def test_capacity_failures_do_not_count_towards_the_breaker(tmp_path: Path) -> None:
    world = World(tmp_path, max_resume_failures=1, cooldown_s=0)
    world.slurm.add_node("spot-1", "DOWN+CLOUD+POWERED_DOWN",
                         reason="(Code:InsufficientInstanceCapacity)no spot capacity")
    world.run()
    assert world.state("spot-1") == "IDLE+CLOUD+POWERED_DOWN"


def test_our_drain_on_a_powered_down_node_is_lifted(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_node("spot-1", "IDLE+CLOUD+DRAIN+POWERED_DOWN",
                         reason="spot-interruption:terminate@2026-03-01T11:00:00Z")
    world.run()
    assert "DRAIN" not in world.state("spot-1")


# -- the requeue safety net --------------------------------------------------------------
def test_pending_job_of_our_interruption_is_expedited_once(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.add_job(11, [], state="PENDING", reason="BeginTime")
    world.slurm.add_job(12, [], state="PENDING", reason="BeginTime")  # a user's --begin
    world.emit("notice", "watch", "spot-1", 30, job_ids=(11,))
    world.run()
    assert world.slurm.jobs[11].reason == "None"
    assert world.slurm.jobs[12].reason == "BeginTime"
    assert world.slurm.expedited == [11]
    world.run()
    assert world.slurm.expedited == [11]


# -- a job that requeued itself (exit code 85), long after any interruption ---------------
def _requeued_by_exit(world: World, job_id: int, hold_s: float = 121, exit_code: str = "85:0",
                      partition: str = "spot") -> None:
    """A job as Slurm 22.05.8 shows it after its batch script exited 85 (RequeueExit):
    PENDING, Reason=BeginTime, Restarts=1, ExitCode=85:0, eligible 121 s after the requeue."""
    job = world.slurm.add_job(job_id, [], state="PENDING", reason="BeginTime")
    job.restarts, job.exit_code, job.partition = 1, exit_code, partition
    job.submit_time = int(world.now.timestamp())
    job.eligible_time = job.submit_time + int(hold_s)


def test_a_job_requeued_by_its_exit_code_starts_at_once(tmp_path: Path) -> None:
    """An elastic job whose survivors fell below MIN exits 85 long after any notice (nothing
    in the events names it): the pass clears its ~121 s hold, and says so in an event."""
    world = World(tmp_path)
    _requeued_by_exit(world, 21)
    client = world.slurm.client()
    assert client.job_record(21).eligible_time == world.now.timestamp() + 121
    world.run()
    record = client.job_record(21)
    assert world.slurm.jobs[21].reason == "None"  # no longer BeginTime: eligible now
    assert record.eligible_time == record.submit_time
    expedited = world.events("expedited")
    assert [(e["job_ids"], e["reason"]) for e in expedited] == [
        ([21], "requeued by exit code 85")]
    world.run()  # already eligible: nothing more to do
    assert len(world.events("expedited")) == 1


def test_a_job_requeued_by_exit_soon_after_a_notice_is_expedited_once(tmp_path: Path) -> None:
    """The notice is still remembered (the safety net would catch the job too): one
    ``expedited`` event, with the precise reason."""
    world = World(tmp_path)
    _requeued_by_exit(world, 23)
    world.emit("notice", "watch", "spot-2", 30, job_ids=(23,))
    world.run()
    assert world.slurm.jobs[23].reason == "None"
    assert [e["reason"] for e in world.events("expedited")] == ["requeued by exit code 85"]
    assert world.slurm.expedited == [23]


def test_many_jobs_requeued_by_exit_are_read_and_expedited_in_one_call_each(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    for job in range(31, 36):
        _requeued_by_exit(world, job)
    world.slurm.calls.clear()
    world.run()
    assert all(world.slurm.jobs[j].reason == "None" for j in range(31, 36))
    reads = [c[1:] for c in world.slurm.calls if c[1:4] == ["-o", "show", "job"]]
    assert reads == [["-o", "show", "job"]]
    assert [c[2] for c in world.slurm.calls if c[-1] == "StartTime=now"] == [
        "jobid=31,32,33,34,35"]


def _requeued_again(world: World, job_id: int, after_s: float) -> None:
    """``after_s`` seconds on, the job ran and exited 85 again: requeued and held anew."""
    world.now += timedelta(seconds=after_s)
    job = world.slurm.jobs[job_id]
    job.state, job.reason, job.restarts = "PENDING", "BeginTime", job.restarts + 1
    job.submit_time = int(world.now.timestamp())
    job.eligible_time = job.submit_time + 121


def test_a_job_in_a_crash_loop_is_expedited_only_so_often(tmp_path: Path) -> None:
    """Every run exits 85 at once: the first 3 requeues within 10 minutes (the defaults) are
    expedited, the 4th is left to Slurm's hold with one event that says why (not one per
    pass); a job requeued once in the meantime is still expedited; requeues ~2 minutes apart
    keep the loop held; once the job ran past the window, its next requeue is expedited."""
    world = World(tmp_path)
    _requeued_by_exit(world, 41)
    _requeued_by_exit(world, 42)
    world.run()
    for _ in range(2):
        _requeued_again(world, 41, 20)
        world.run()
    assert world.slurm.expedited == [41, 42, 41, 41]
    _requeued_again(world, 41, 20)  # the 4th requeue within 60 s
    _requeued_by_exit(world, 43)  # another job's first: not affected
    world.run()
    world.now += timedelta(seconds=30)
    world.run()  # still held: nothing new, no second event
    assert world.slurm.jobs[41].reason == "BeginTime"
    assert world.slurm.expedited == [41, 42, 41, 41, 43]
    (held,) = world.events("expedite_withheld")
    assert held["job_ids"] == [41] and held["extra"]["restarts"] == 4
    assert held["reason"].startswith("requeued by exit code 85 4 times within 600 s "
                                     "(reconcile.max_fast_requeues=3): a crash loop? left to "
                                     "Slurm's requeue hold, eligible at 2026-03-01T12:03:")
    _requeued_again(world, 41, 125)  # Slurm released it, it exited 85 again at once
    world.run()
    assert world.slurm.jobs[41].reason == "BeginTime"
    assert len(world.events("expedite_withheld")) == 2
    _requeued_again(world, 41, 3600)  # it ran for an hour: an ordinary requeue again
    world.run()
    assert world.slurm.jobs[41].reason == "None"
    assert world.slurm.expedited[-1] == 41


def test_the_crash_loop_cap_is_a_reconcile_setting_and_survives_a_restart(
        tmp_path: Path) -> None:
    """max_fast_requeues 1: the 2nd requeue within the window waits, also for a reconciler
    started afresh (the count is read back from the events file)."""
    world = World(tmp_path, max_fast_requeues=1, fast_requeue_window_s=60)
    _requeued_by_exit(world, 51)
    world.run()
    world.reconciler = Reconciler(
        world.config, world.slurm.client(), providers=lambda config, name: world.provider,
        clock=lambda: world.now, sleep=lambda s: None, expedite_wait_s=0)
    _requeued_again(world, 51, 30)
    world.emit("notice", "watch", "spot-2", 5, job_ids=(51,))  # the safety net holds back too
    world.run()
    assert world.slurm.expedited == [51]
    assert [e["extra"]["requeues"] for e in world.events("expedite_withheld")] == [2]
    _requeued_again(world, 51, 200)  # the window is 60 s: expedited again
    world.run()
    assert world.slurm.expedited == [51, 51]


@pytest.mark.parametrize(("hold_s", "exit_code", "partition"), [
    (3600, "85:0", "spot"),  # someone set StartTime an hour ahead on purpose
    (121, "1:0", "spot"),  # a failure requeued by someone else: not ours to hurry
    (121, "85:0", "other"),  # not a slurm-spot partition
])
def test_other_held_jobs_keep_their_begin_time(tmp_path: Path, hold_s: float, exit_code: str,
                                               partition: str) -> None:
    world = World(tmp_path)
    _requeued_by_exit(world, 22, hold_s, exit_code, partition)
    world.run()
    assert world.slurm.jobs[22].reason == "BeginTime"
    assert world.events("expedited") == []


# -- small pure helpers ------------------------------------------------------------------
@pytest.mark.parametrize(("state", "short"), [
    ("IDLE+CLOUD+POWERED_DOWN", "idle~"), ("MIXED+CLOUD+POWERING_UP", "mix#"),
    ("DOWN+CLOUD+NOT_RESPONDING", "down*"), ("IDLE+CLOUD+DRAIN+POWERED_DOWN", "drain~"),
    ("ALLOCATED+CLOUD", "alloc"), ("IDLE+CLOUD+POWERING_DOWN", "idle%"),
])
def test_short_state(state: str, short: str) -> None:
    assert short_state(parse_node_state(state)) == short


@pytest.mark.parametrize(("reason", "clearable"), [
    ("", True), ("spot-interruption:terminate@2026-03-01T11:00:00Z", True), ("(Code:X)y", True),
    ("(Code:InsufficientInstanceCapacity)Temporarily disabled until 2026-03-01T11:10:00Z", True),
    ("slurm-spot:circuit-breaker: 3 resume failures within 3600 s, last: x", True),
    ("slurm-spot:instance lost while booting@2026-03-01T11:00:00Z", True),
    ("ResumeTimeout reached", True), ("Not responding", True),
    ("Node unexpectedly rebooted boot_time=1767225600 last response=1767225500", True),
    ("bad GPU", False), ("slurm spot", False),
    # Admin reasons that only start like ours or Slurm's (issue 11, section 5).
    ("spot-interruption: check GPU 3 before reuse", False),
    ("spot-interruption:terminate@x", False),
    ("slurm-spot: keep drained, debugging NCCL", False),
    ("slurm-spot:circuit-breaker: 3", False),
    ("(Code:17) bad DIMM per vendor", False),
    ("Not responding, NIC swapped (ticket 42)", False),
    ("ResumeTimeout reached; disk died, do not resume", False),
])
def test_only_our_and_slurms_power_saving_reasons_are_clearable(reason: str, clearable: bool) -> None:
    assert is_clearable(reason) is clearable


def test_cooldown_reason_round_trips() -> None:
    reason = cooldown_reason("InsufficientInstanceCapacity", NOW)
    assert reason == f"(Code:InsufficientInstanceCapacity)Temporarily disabled until {STAMP}"
    assert parse_cooldown(reason) == ("InsufficientInstanceCapacity", NOW)
    assert parse_cooldown("(Code:X)no capacity") is None


# -- evidence before "reclaimed" (issue 11, section 3) -----------------------------------------
FIELD = yaml.safe_load((Path(__file__).parent / "data" / "field-2026-12.yaml").read_text())


def test_field_case_pending_instance_without_ip_is_not_missing(tmp_path: Path) -> None:
    """instance-pending-without-ip: DescribeInstances shows a pending instance without
    PrivateIpAddress; the node is matched by tag and nothing is replaced or terminated."""
    from slurm_spot.providers.aws.fleet import instance_from_ec2
    from slurm_spot.providers.base import TAG_CLUSTER, TAG_NODE

    case = next(c for c in FIELD if c["id"] == "instance-pending-without-ip")
    record = dict(case["input"]["instance"])
    record["Tags"] = [*record["Tags"], {"Key": TAG_NODE, "Value": "spot-1"},
                      {"Key": TAG_CLUSTER, "Value": "test"}]
    inst = instance_from_ec2(record)
    assert inst.private_ip is None and inst.state is InstanceState.PENDING
    world = World(tmp_path, missing_grace_s=60)
    world.slurm.add_node("spot-1", case["input"]["node_state"])
    world.slurm.add_job(5, ["spot-1"])
    world.provider.instances[inst.instance_id] = replace(inst, launch_time=NOW)
    for minutes in range(3):
        world.now = NOW + timedelta(minutes=minutes)
        assert world.run().actions == []
    assert world.provider.alive() == ["i-0abc"]
    assert world.slurm.jobs[5].state == "RUNNING"
    # Up now, still without an address: alive all the same.
    world.slurm.nodes["spot-1"].flags = {"CLOUD"}
    world.slurm.nodes["spot-1"].base = "ALLOCATED"
    assert world.run().actions == [] and world.provider.alive() == ["i-0abc"]


def test_an_ec2_record_without_a_state_is_not_an_ended_instance() -> None:
    from slurm_spot.providers.aws.fleet import instance_from_ec2

    assert instance_from_ec2({"InstanceId": "i-1"}).state.is_alive


def test_absent_instance_is_reclaimed_only_after_the_grace(tmp_path: Path) -> None:
    world = World(tmp_path, missing_grace_s=60)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(9, ["spot-1"])
    assert world.run().verdicts.get("wait") == 1  # first pass to see it absent
    world.now = NOW + timedelta(seconds=59)
    assert world.run().actions == []
    world.now = NOW + timedelta(seconds=61)
    assert [a["action"] for a in world.run().actions][:1] == ["reclaimed"]
    assert world.slurm.jobs[9].state == "PENDING"


def test_failed_listings_are_no_evidence_however_long(tmp_path: Path) -> None:
    """The provider's API fails for ten minutes: nothing is declared reclaimed; the grace only
    counts passes whose listing succeeded."""
    world = World(tmp_path, missing_grace_s=60)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(9, ["spot-1"])
    world.provider.fail_listing = RuntimeError("RequestLimitExceeded")
    for minutes in range(10):
        world.now = NOW + timedelta(minutes=minutes)
        result = world.run()
        assert result.actions == [] and result.errors
    world.provider.fail_listing = None
    world.provider.add("spot-1", 700, NOW)  # it was there all along
    world.now = NOW + timedelta(minutes=11)
    assert world.run().actions == []
    assert world.slurm.jobs[9].state == "RUNNING"


def test_a_failed_scontrol_call_decides_nothing(tmp_path: Path) -> None:
    from slurm_spot.errors import SlurmCommandError

    world = World(tmp_path)
    world.slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    world.slurm.add_job(9, ["spot-1"])
    world.provider.add("spot-1", 600, NOW)
    world.slurm.json_nodes = False
    world.slurm.refuse_show = "Unable to contact slurm controller (connect failure)"
    with pytest.raises(SlurmCommandError):
        world.run()
    assert world.provider.alive() and world.slurm.jobs[9].state == "RUNNING"


def test_rule_settings_default_to_the_config_models_defaults() -> None:
    """A default changed in spot.yaml's model reaches the rules with no second copy."""
    from slurm_spot.config import default_local_config
    from slurm_spot.reconcile.reconciler import settings_of

    assert Settings() == settings_of(default_local_config())


# -- quota: its own back-off, never capacity (issue 11, section 2) ------------------------------
def _quota_failure(world: World, node: str, ago_s: float) -> None:
    reason = "(Code:VcpuLimitExceeded)quota: You have requested more vCPU capacity than 32"
    world.emit("launch_failed", "resume", node, ago_s, reason=reason,
               extra={"code": "VcpuLimitExceeded", "class": "quota", "pool": ""})
    world.slurm.nodes[node].reason = reason
    world.slurm.nodes[node].base = "DOWN"


def test_quota_failure_backs_the_node_set_off_longer_than_a_cooldown(tmp_path: Path) -> None:
    world = World(tmp_path, cooldown_s=600, quota_backoff_s=1800, max_resume_failures=1)
    _quota_failure(world, "spot-2", 30)
    world.run()
    reason = "(Code:VcpuLimitExceeded)Temporarily disabled until 2026-03-01T12:30:00Z"
    assert {world.reason(n) for n in ("spot-1", "spot-2", "spot-3", "spot-4")} == {reason}
    assert world.events("breaker") == []  # a quota error is no resume failure of the node
    world.now = NOW + timedelta(seconds=900)  # a capacity cooldown would be over here
    world.run()
    assert world.state("spot-3") == "DOWN+CLOUD+POWERED_DOWN"
    world.now = NOW + timedelta(seconds=1801)
    world.run()
    assert world.state("spot-3") == "IDLE+CLOUD+POWERED_DOWN" and world.reason("spot-3") == ""


def test_quota_codes_are_not_capacity_codes(tmp_path: Path) -> None:
    from slurm_spot.reconcile.history import KNOWN_CAPACITY_CODES

    assert "vcpulimitexceeded" not in KNOWN_CAPACITY_CODES
    world = World(tmp_path, cooldown_s=600, quota_backoff_s=0)
    _quota_failure(world, "spot-2", 30)
    world.run()  # back-off off: no cooldown either
    assert world.events("cooldown") == []
