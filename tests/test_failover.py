"""Failover after a capacity error (issue 24, part 1; slurm_spot.lifecycle.failover) with fakes: when the
requeue hold is cleared, which nodes are cooled down, what is recorded; and the node sets'
capacity state of ``slurm-spot status``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm_spot.config import SpotConfig, load_config
from slurm_spot.lifecycle.failover import (
    Failover,
    HoldStep,
    candidate_node_sets,
    cooldown_targets,
    fail_over,
    hold_step,
    nodes_to_set_down_again,
    note_text,
    stuck_cleaning,
)
from slurm_spot.lifecycle.power import PowerResult
from slurm_spot.lifecycle.status import failover_rows, last_failovers, node_set_rows
from slurm_spot.providers.base import ErrorClass, LaunchFailure
from slurm_spot.reconcile.history import INTERRUPTION_ACTIONS
from slurm_spot.slurm.client import Job, Node
from slurm_spot.slurm.states import parse_job_state, parse_node_state

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
ICE = "InsufficientInstanceCapacity"


@pytest.fixture
def config(tmp_path: Path) -> SpotConfig:
    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({
        "cluster": "test",
        "node_sets": [{"name": "cheap", "provider": "local", "count": 3, "weight": 1},
                      {"name": "other", "provider": "local", "count": 2, "weight": 10},
                      {"name": "mid", "provider": "local", "count": 1, "weight": 5}],
        "partitions": [{"name": "spot", "node_sets": ["cheap", "other", "mid"]}],
        "reconcile": {"cooldown_s": 300},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }))
    return load_config(path)


def job(state: str, nodes: str = "", reason: str = "", job_id: int = 7,
        restarts: int = 0) -> Job:
    return Job(job_id, parse_job_state(state), reason=reason, nodes=nodes, partition="spot",
               restarts=restarts)


def node(name: str, state: str, reason: str = "") -> Node:
    return Node(name, parse_node_state(state), reason=reason)


# -- when to clear the hold ----------------------------------------------------------------
@pytest.mark.parametrize(("found", "step"), [
    (None, HoldStep.GONE),                                        # slurmctld forgot it
    (job("CONFIGURING", "cheap-1"), HoldStep.WAIT),               # not requeued yet
    (job("RUNNING", "cheap-1"), HoldStep.WAIT),
    (job("PENDING", reason="BeginTime", restarts=1), HoldStep.EXPEDITE),  # requeue hold
    (job("PENDING", reason="None", restarts=1), HoldStep.EXPEDITE),  # harmless: now anyway
    (job("PENDING", reason="JobHeldAdmin"), HoldStep.LEAVE),      # beyond quota: held
    (job("PENDING", reason="JobHeldUser"), HoldStep.LEAVE),
    (job("CONFIGURING", "other-1"), HoldStep.GONE),               # already elsewhere
    (job("COMPLETED", "cheap-1"), HoldStep.GONE),
    (job("CANCELLED"), HoldStep.GONE),
])
def test_hold_step(found: Job | None, step: HoldStep) -> None:
    assert hold_step(found, ["cheap-1"]) is step


# -- a requeued job slurmctld keeps in "Cleaning" -------------------------------------------
COOLING = f"(Code:{ICE})Temporarily disabled until 2026-03-01T12:05:00Z"


@pytest.mark.parametrize(("found", "stuck"), [
    (job("PENDING", reason="Cleaning", restarts=1), True),
    (job("PENDING", reason="None", restarts=1), False),
    (job("PENDING", reason="BeginTime", restarts=1), False),
    (job("CONFIGURING", "other-1", reason="Cleaning"), False),  # placed: not pending
    (None, False),
])
def test_stuck_cleaning(found: Job | None, stuck: bool) -> None:
    assert stuck_cleaning(found) is stuck


@pytest.mark.parametrize(("found", "reasons", "expected"), [
    # the hook's DOWN, and the IDLE+POWERING_DOWN 22.05 turns it into: the cooldown reason
    (node("cheap-1", "DOWN+CLOUD", f"(Code:{ICE})no capacity"), {"cheap": COOLING},
     [("cheap-1", COOLING)]),
    (node("cheap-1", "IDLE+CLOUD+POWERING_DOWN", f"(Code:{ICE})no capacity"),
     {"cheap": COOLING}, [("cheap-1", COOLING)]),
    (node("cheap-1", "IDLE+CLOUD+POWERED_DOWN", f"(Code:{ICE})no capacity"),
     {"cheap": COOLING}, [("cheap-1", COOLING)]),
    # cooldowns off: the node's own reason, which the reconciler clears like the first
    (node("cheap-1", "IDLE+CLOUD+POWERING_DOWN", f"(Code:{ICE})no capacity"), {},
     [("cheap-1", f"(Code:{ICE})no capacity")]),
    (node("cheap-1", "IDLE+CLOUD+POWERING_DOWN"), {}, []),  # no reason to give Slurm
    # back in use, or an admin's: left alone
    (node("cheap-1", "IDLE+CLOUD+POWERING_UP", f"(Code:{ICE})no capacity"),
     {"cheap": COOLING}, []),
    (node("cheap-1", "ALLOCATED+CLOUD", f"(Code:{ICE})no capacity"), {"cheap": COOLING}, []),
    (node("cheap-1", "IDLE+CLOUD", ""), {"cheap": COOLING}, []),
    (node("cheap-1", "DOWN+CLOUD", "bad DIMM"), {"cheap": COOLING}, []),
    (node("cheap-2", "DOWN+CLOUD", COOLING), {"cheap": COOLING}, []),  # not the job's
])
def test_which_failed_nodes_are_set_down_again(found: Node, reasons: dict[str, str],
                                               expected: list[tuple[str, str]]) -> None:
    move = Failover(7, "cheap", ICE, (), None, 1000.0, failed_nodes=("cheap-1",))
    assert nodes_to_set_down_again(move, [found], reasons) == expected


def test_a_job_kept_cleaning_after_the_hold_is_cleared_gets_its_failed_node_set_down_again(
        config: SpotConfig) -> None:
    """slurmctld 22.05 requeues a job whose PrologSlurmctld still runs as PENDING with
    Reason=Cleaning and keeps it so after that program ends (its failed node never sends an
    epilog): the worker sets the failed node DOWN again once that lasted a second, once a
    second while it lasts, and the job is placed."""
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    cleaning = job("PENDING", reason="Cleaning", restarts=1)
    slurm = FakeClient(
        [node("cheap-1", "IDLE+CLOUD+POWERING_DOWN", f"(Code:{ICE})no capacity"),
         node("cheap-2", "IDLE+CLOUD+POWERED_DOWN"), node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
        [[job("PENDING", reason="None", restarts=1)],             # requeued: StartTime=now
         [cleaning], [cleaning], [cleaning], [cleaning], [cleaning], [cleaning],
         [job("CONFIGURING", "other-1", restarts=1)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert run.errors == []
    assert [c[0] for c in slurm.calls] == ["set_state", "expedite", "set_state", "set_state",
                                           "admin_comment"]
    cooling = run.cooldowns[0].reason
    assert slurm.calls[2][1] == (("cheap-1",), "DOWN", cooling)
    assert slurm.calls[3][1] == (("cheap-1",), "DOWN", cooling)
    assert run.moves[7].nodes == ("other-1",)


def test_a_short_cleaning_is_left_to_slurmctld(config: SpotConfig) -> None:
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient(
        [node("cheap-1", "DOWN+CLOUD", f"(Code:{ICE})no capacity")],
        [[job("PENDING", reason="None", restarts=1)],
         [job("PENDING", reason="Cleaning", restarts=1)],           # half a second
         [job("PENDING", reason="Priority", restarts=1)],
         [job("CONFIGURING", "other-1", restarts=1)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert [c[0] for c in slurm.calls] == ["expedite", "admin_comment"]
    assert run.moves[7].nodes == ("other-1",)


# -- what is cooled down -------------------------------------------------------------------
def test_the_failed_node_sets_free_nodes_are_cooled_down(config: SpotConfig) -> None:
    failure = LaunchFailure(("cheap-1",), ICE, "no capacity", ErrorClass.CAPACITY)
    nodes = [node("cheap-1", "DOWN+CLOUD+POWERING_DOWN", f"(Code:{ICE})no capacity"),
             node("cheap-2", "IDLE+CLOUD+POWERED_DOWN"),
             node("cheap-3", "IDLE+CLOUD+POWERED_DOWN+DRAIN", "disk swap"),  # admin's
             node("other-1", "IDLE+CLOUD+POWERED_DOWN")]
    (cool,) = cooldown_targets(config, [failure], nodes, NOW)
    assert (cool.node_set, cool.code, cool.nodes) == ("cheap", ICE, ("cheap-2",))
    assert cool.until == NOW + timedelta(seconds=300)
    assert cool.reason == f"(Code:{ICE})Temporarily disabled until 2026-03-01T12:05:00Z"


def test_a_longer_running_cooldown_is_kept(config: SpotConfig) -> None:
    failure = LaunchFailure(("cheap-1",), ICE, "no capacity", ErrorClass.CAPACITY)
    running = f"(Code:{ICE})Temporarily disabled until 2026-03-01T13:00:00Z"
    nodes = [node("cheap-2", "DOWN+CLOUD+POWERED_DOWN", running),
             node("cheap-3", "IDLE+CLOUD+POWERED_DOWN")]
    (cool,) = cooldown_targets(config, [failure], nodes, NOW)
    assert cool.reason == running and cool.nodes == ("cheap-3",)


def test_no_cooldown_when_cooldowns_are_off(config: SpotConfig) -> None:
    off = config.model_copy(update={"reconcile": config.reconcile.model_copy(
        update={"cooldown_s": 0})})
    failure = LaunchFailure(("cheap-1",), ICE, "no capacity", ErrorClass.CAPACITY)
    assert cooldown_targets(off, [failure], [node("cheap-2", "IDLE+CLOUD+POWERED_DOWN")],
                            NOW) == []


@pytest.mark.parametrize(("code", "error_class", "seconds"), [
    (ICE, ErrorClass.CAPACITY, 300),                            # reconcile.cooldown_s
    ("ZONE_RESOURCE_POOL_EXHAUSTED", ErrorClass.CAPACITY, 300),  # GCE's stockout: the same
    ("QUOTA_EXCEEDED", ErrorClass.QUOTA, 1800),                  # quota_backoff_s, the longer
    ("VcpuLimitExceeded", ErrorClass.QUOTA, 1800)])
def test_a_quota_error_cools_the_node_set_down_for_the_quota_back_off(
        config: SpotConfig, code: str, error_class: ErrorClass, seconds: int) -> None:
    """The failover writes the reconciler's own rule: a quota error (regional) keeps the node
    set off for ``quota_backoff_s`` (default 1800 s), a capacity error for ``cooldown_s``; the
    reconciler reads the cooldown back from the reason and does not lengthen it later."""
    failure = LaunchFailure(("cheap-1",), code, "none left", error_class)
    (cool,) = cooldown_targets(config, [failure], [node("cheap-2", "IDLE+CLOUD+POWERED_DOWN")],
                               NOW)
    assert cool.until == NOW + timedelta(seconds=seconds)
    assert cool.reason.startswith(f"(Code:{code})Temporarily disabled until")
    assert cool.nodes == ("cheap-2",)
    off = config.model_copy(update={"reconcile": config.reconcile.model_copy(
        update={"cooldown_s": 0, "quota_backoff_s": 0})})
    assert cooldown_targets(off, [failure], [node("cheap-2", "IDLE+CLOUD+POWERED_DOWN")],
                            NOW) == []


def test_candidates_are_the_partitions_other_node_sets_by_weight(config: SpotConfig) -> None:
    assert candidate_node_sets(config, "spot", ["cheap"]) == ("mid", "other")
    assert candidate_node_sets(config, "spot", ["cheap", "mid"]) == ("other",)
    assert candidate_node_sets(config, "elsewhere", []) == ()


def test_failover_jobs_get_the_reconcilers_safety_net() -> None:
    assert "failover" in INTERRUPTION_ACTIONS


# -- the whole step, against a fake Slurm ---------------------------------------------------
class FakeClient:
    """The few calls fail_over makes; each ``jobs`` call moves the script one step on."""

    def __init__(self, nodes: list[Node], script: list[list[Job]]) -> None:
        self._nodes = nodes
        self.script = script
        self.calls: list[tuple[str, object]] = []

    def nodes(self, names: Iterable[str] | None = None, with_jobs: bool = True) -> list[Node]:
        return self._nodes

    def jobs(self, job_ids: Iterable[int] | None = None) -> list[Job]:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def set_state(self, names: Sequence[str], state: str, reason: str | None = None) -> None:
        self.calls.append(("set_state", (tuple(names), state, reason)))

    def expedite_many(self, job_ids: Iterable[int]) -> tuple[list[int], list[str]]:
        self.calls.append(("expedite", tuple(job_ids)))
        return list(job_ids), []

    def record_interruptions(self, notes: Sequence[tuple[int, str]]) -> list[str]:
        self.calls.append(("admin_comment", tuple(notes)))
        return []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _events(config: SpotConfig) -> list[dict]:
    path = config.log_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_hold_is_cleared_once_the_job_is_requeued_and_where_it_went_is_recorded(
        config: SpotConfig) -> None:
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient(
        [node("cheap-1", "DOWN+CLOUD", f"(Code:{ICE})no capacity"),
         node("cheap-2", "IDLE+CLOUD+POWERED_DOWN"), node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
        [[job("CONFIGURING", "cheap-1")],                       # not requeued yet: wait
         [job("PENDING", reason="BeginTime", restarts=1)],      # requeued: StartTime=now
         [job("PENDING", reason="Priority", restarts=1)],
         [job("CONFIGURING", "other-1", restarts=1)]])          # started on other
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert run.errors == []
    names = [c[0] for c in slurm.calls]
    assert names == ["set_state", "expedite", "admin_comment"]
    assert slurm.calls[0][1][:2] == (("cheap-2",), "DOWN")  # type: ignore[index]
    assert slurm.calls[1][1] == (7,)
    move = run.moves[7]
    assert (move.node_set, move.nodes, move.candidates) == ("other", ("other-1",),
                                                           ("mid", "other"))
    assert move.expedited_at == 1000.5  # one poll after the error, not 121 s
    (note,) = slurm.calls[2][1]  # type: ignore[misc]
    assert note[0] == 7 and "no capacity on node set cheap" in note[1]
    assert "started on node set other (other-1)" in note[1]
    by_action = {e["action"]: e for e in _events(config)}
    assert by_action["cooldown"]["extra"]["node_set"] == "cheap"
    assert by_action["failover"]["job_ids"] == [7]
    assert by_action["failover"]["extra"]["expedited"] is True
    assert by_action["failover"]["extra"]["restarts"] == 1
    assert by_action["failover_started"]["extra"]["node_set"] == "other"


def test_a_node_set_still_cooling_from_an_earlier_failure_is_no_candidate(
        config: SpotConfig) -> None:
    """A job failing over a second time (mid had no capacity before, cheap now) is eligible
    only where no cooldown runs: its event and AdminComment must not name mid."""
    until = (datetime.now(timezone.utc) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient(
        [node("cheap-1", "DOWN+CLOUD", f"(Code:{ICE})no capacity"),
         node("mid-1", "DOWN+CLOUD+POWERED_DOWN", f"(Code:{ICE})Temporarily disabled until {until}"),
         node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
        [[job("PENDING", reason="BeginTime", restarts=2)], [job("RUNNING", "other-1", restarts=2)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert run.moves[7].candidates == ("other",)
    (failover,) = [e for e in _events(config) if e["action"] == "failover"]
    assert failover["extra"]["candidates"] == ["other"]


def test_a_failover_cooldown_an_admin_ended_is_not_started_again(config: SpotConfig) -> None:
    """docs/admin.md: when capacity is back, ``state=RESUME`` ends the cooldown. The
    reconciler must take the failover's cooldown event as the answer to the capacity error,
    or its next pass cools the node set down again for a whole ``cooldown_s``."""
    from slurm_spot import events
    from slurm_spot.events import read_events
    from slurm_spot.reconcile.history import build_history
    from slurm_spot.reconcile.rules import Settings, cooldowns

    failure = LaunchFailure(("cheap-1",), ICE, "no capacity", ErrorClass.CAPACITY)
    events.record(config.log_dir, "resume", events.Action.LAUNCH_FAILED, ["cheap-1"],
                  reason=f"(Code:{ICE})no capacity",
                  extra={"code": ICE, "class": "capacity", "pool": ""})
    fail_over(config, FakeClient([node("cheap-2", "IDLE+CLOUD+POWERED_DOWN")], [[]]),
              PowerResult(failed=[failure]), None)
    now = datetime.now(timezone.utc) + timedelta(seconds=1)
    set_of = {n: ns.name for ns in config.node_sets for n in ns.node_names}
    history = build_history(read_events(config.log_dir), set_of, now,
                            Settings(cooldown_s=300))
    assert history.new_capacity == {}
    resumed = [node(n, "IDLE+CLOUD+POWERED_DOWN+NOT_RESPONDING") for n in set_of]
    assert cooldowns(resumed, set_of, history, now, 300) == {}


def test_a_controller_too_busy_to_answer_for_a_while_still_gets_the_start_recorded(
        config: SpotConfig) -> None:
    """squeue timing out while slurmctld is stalled (seen on the local cluster: 20 s
    resolving the failed nodes' names during a 2-node requeue) must not end the wait: the
    start is recorded once slurmctld answers again, and the error is reported once."""
    from slurm_spot.errors import SlurmCommandError

    class Busy(FakeClient):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)  # type: ignore[arg-type]
            self.stalled = 0

        def jobs(self, job_ids: Iterable[int] | None = None) -> list[Job]:
            if self.calls and self.calls[-1][0] == "expedite" and self.stalled < 3:
                self.stalled += 1
                raise SlurmCommandError(["squeue"], None, "timed out")
            return super().jobs(job_ids)

    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = Busy([node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
                 [[job("PENDING", reason="BeginTime", restarts=1)],
                  [job("CONFIGURING", "other-1", restarts=1)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert slurm.stalled == 3
    assert len(run.errors) == 1 and run.errors[0].startswith("failover: reading jobs:")
    assert (run.moves[7].node_set, run.moves[7].nodes) == ("other", ("other-1",))
    (started,) = [e for e in _events(config) if e["action"] == "failover_started"]
    assert started["extra"]["node_set"] == "other"


def test_a_job_missing_from_one_squeue_answer_is_still_waited_for(config: SpotConfig) -> None:
    """Seen in CI: while slurmctld stalled on a 2-node requeue, one squeue answer came back
    without the job; the worker took it for ended and wrote the note without where the job
    went. squeue keeps an ended job for MinJobAge, so a missing job is asked for again."""
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient([node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
                       [[job("PENDING", reason="BeginTime", restarts=1)], [],
                        [job("CONFIGURING", "other-1", restarts=1)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert (run.moves[7].node_set, run.moves[7].nodes) == ("other", ("other-1",))
    (started,) = [e for e in _events(config) if e["action"] == "failover_started"]
    assert started["extra"]["node_set"] == "other"
    (note,) = next(c[1] for c in slurm.calls if c[0] == "admin_comment")  # type: ignore[misc]
    assert "started on node set other (other-1)" in note[1]


def test_a_job_placed_before_the_worker_cleared_its_hold_is_still_recorded(
        config: SpotConfig) -> None:
    """The reconciler's safety net may clear the hold first (the worker's squeue calls timed
    out meanwhile): the job already runs elsewhere when the worker sees it again. That is
    still a failover: its events and AdminComment say where it went."""
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient([node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
                       [[job("CONFIGURING", "cheap-1")],
                        [job("RUNNING", "other-1", restarts=1)]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep)
    assert "expedite" not in [c[0] for c in slurm.calls]
    by_action = {e["action"]: e for e in _events(config)}
    assert by_action["failover"]["extra"]["expedited"] is False
    assert by_action["failover"]["reason"].endswith("(requeue hold cleared by the reconciler)")
    assert by_action["failover_started"]["extra"]["node_set"] == "other"
    (note,) = next(c[1] for c in slurm.calls if c[0] == "admin_comment")  # type: ignore[misc]
    assert "started on node set other (other-1)" in note[1]
    assert run.moves[7].node_set == "other"


def test_a_job_never_requeued_in_time_is_left_to_the_reconciler(config: SpotConfig) -> None:
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), ICE, "no capacity",
                                               ErrorClass.CAPACITY)])
    slurm = FakeClient([], [[job("CONFIGURING", "cheap-1")]])
    clock = Clock()
    run = fail_over(config, slurm, result, {7: ("cheap-1",)},  # type: ignore[arg-type]
                    clock=clock, sleep=clock.sleep, requeue_wait_s=3)
    assert "expedite" not in [c[0] for c in slurm.calls]
    assert 1003 <= clock.now <= 1004  # gave up after the wait
    (failover,) = [e for e in _events(config) if e["action"] == "failover"]
    assert failover["extra"]["expedited"] is False and failover["job_ids"] == [7]
    assert run.moves == {}


def test_other_failures_and_other_jobs_are_left_alone(config: SpotConfig) -> None:
    result = PowerResult(failed=[LaunchFailure(("cheap-1",), "AuthFailure", "bad key",
                                               ErrorClass.AUTH)])
    slurm = FakeClient([], [[]])
    run = fail_over(config, slurm, result, {7: ("cheap-1",)})  # type: ignore[arg-type]
    assert slurm.calls == [] and run.moves == {}


def test_note_before_the_start_names_the_candidates(config: SpotConfig) -> None:
    from slurm_spot.lifecycle.failover import Failover

    move = Failover(7, "cheap", ICE, ("other",), NOW, 0.0)
    assert note_text(move) == (
        f"slurm-spot: failover: no capacity on node set cheap (Code:{ICE}), cooled down until "
        "2026-03-01T12:00:00Z; requeued at once, eligible now on other")


# -- status --------------------------------------------------------------------------------
def test_status_shows_each_node_sets_capacity(config: SpotConfig) -> None:
    nodes = [node("cheap-1", "IDLE+CLOUD+POWERED_DOWN", f"(Code:{ICE})no spot capacity in a"),
             node("cheap-2", "DOWN+CLOUD+POWERED_DOWN",
                  f"(Code:{ICE})Temporarily disabled until 2026-03-01T12:05:00Z"),
             node("other-1", "IDLE+CLOUD+POWERED_DOWN"),
             node("mid-1", "DOWN+CLOUD+POWERED_DOWN",  # over: the reconciler re-enables it
                  f"(Code:{ICE})Temporarily disabled until 2026-03-01T11:55:00Z")]
    rows = {r["node_set"]: r for r in node_set_rows(config, nodes, NOW)}
    assert rows["cheap"]["capacity"] == "cooldown"
    assert rows["cheap"]["until"] == "2026-03-01T12:05:00+00:00"
    assert rows["cheap"]["why"] == f"no capacity ({ICE}): no spot capacity in a"
    assert (rows["other"]["capacity"], rows["other"]["until"]) == ("ok", None)
    assert rows["mid"]["capacity"] == "ok"


def test_status_shows_where_the_last_failovers_went(config: SpotConfig) -> None:
    """Issue 24 part 6: the events two failovers wrote (one job started on ``other``, one not
    requeued in time) read back as status's rows, newest first."""
    ice = [LaunchFailure(("cheap-1",), ICE, "no capacity", ErrorClass.CAPACITY)]
    clock = Clock()
    moved = FakeClient([node("other-1", "IDLE+CLOUD+POWERED_DOWN")],
                       [[job("PENDING", reason="BeginTime", restarts=1)],
                        [job("RUNNING", "other-1", restarts=1)]])
    fail_over(config, moved, PowerResult(failed=ice), {7: ("cheap-1",)},  # type: ignore[arg-type]
              clock=clock, sleep=clock.sleep)
    stuck = FakeClient([], [[job("CONFIGURING", "cheap-1", job_id=8)]])
    fail_over(config, stuck, PowerResult(failed=ice), {8: ("cheap-1",)},  # type: ignore[arg-type]
              clock=clock, sleep=clock.sleep, requeue_wait_s=1)
    rows = last_failovers(config.log_dir, datetime.now(timezone.utc))
    assert [r["job"] for r in rows] == [8, 7]
    newest, older = rows
    assert (older["from_node_set"], older["to_node_set"], older["nodes"], older["code"]) == (
        "cheap", "other", ["other-1"], ICE)
    assert older["expedited"] is True and older["seconds_from_error"] == 0.0  # fake clock
    assert older["candidates"] == ["mid", "other"]
    assert "started on node set other (other-1)" in str(older["reason"])
    assert (newest["to_node_set"], newest["nodes"], newest["expedited"]) == (None, [], False)
    assert last_failovers(config.log_dir, datetime.now(timezone.utc), limit=1) == [newest]
    # older than the window: not shown
    assert last_failovers(config.log_dir, datetime.now(timezone.utc) + timedelta(days=2)) == []


def test_failover_rows_pair_each_start_with_its_own_failover() -> None:
    """A job that failed over twice (cheap, later mid) shows two rows, each with its own
    destination; other events and events without a job are skipped."""
    def ev(action: str, job_id: int, **extra: object) -> dict[str, object]:
        return {"time": "2026-03-01T12:00:00+00:00", "action": action, "job_ids": [job_id],
                "reason": action, "extra": extra}

    rows = failover_rows([
        ev("failover", 7, from_node_set="cheap", code=ICE, candidates=["mid", "other"],
           expedited=True),
        ev("notice", 7),
        {"time": "2026-03-01T12:00:01+00:00", "action": "failover", "job_ids": [], "extra": {}},
        ev("failover_started", 7, from_node_set="cheap", node_set="mid", nodes=["mid-1"],
           seconds_from_error=2.5),
        ev("failover", 7, from_node_set="mid", code="quota", candidates=["other"],
           expedited=True),
        ev("failover_started", 7, from_node_set="mid", node_set="other", nodes=["other-1"],
           seconds_from_error=3.0),
        ev("failover_started", 9, from_node_set="cheap", node_set="other", nodes=["other-2"]),
    ])
    assert [(r["job"], r["from_node_set"], r["to_node_set"]) for r in rows] == [
        (7, "mid", "other"), (7, "cheap", "mid")]
    assert [r["seconds_from_error"] for r in rows] == [3.0, 2.5]


def test_the_resume_file_of_slurm_22_05_names_the_jobs_nodes() -> None:
    """slurmctld 22.05.8 writes ``nodes`` (not ``nodes_alloc``): without it a failover
    would not know which job to move."""
    from slurm_spot.slurm.resume_file import parse_resume_file

    text = '{"jobs":[{"job_id":1,"nodes":"cheap-[1-2]"}],"all_nodes":"cheap-[1-2]"}'
    assert parse_resume_file(text) == {1: ("cheap-1", "cheap-2")}
