"""An interruption never makes a job FAILED: which ended jobs are requeued."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from slurm_spot import events
from slurm_spot.jobs.interruption.requeue import (
    decide,
    ended_on,
    requeue_ended,
    requeue_ended_on,
    requeued_since,
    restarts_at_notice,
)
from slurm_spot.slurm.client import CommandResult, SlurmClient, parse_job_record
from slurm_spot.slurm.states import parse_job_state
from tests.test_reconcile_rules import NOW, World

# A real line of Slurm 22.05.8 (a batch job killed by SIGUSR2 it did not catch), shortened.
FAILED_LINE = (
    "JobId=7 JobName=j.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=JobLaunchFailure "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:12 "
    "RunTime=00:00:05 TimeLimit=UNLIMITED StartTime=2026-12-01T07:25:40 "
    "EndTime=2026-12-01T07:25:45 Partition=spot NodeList=spot-[1-2] BatchHost=spot-1 "
    "NumNodes=2 Command=/tmp/j.sh")


def line(**changes: str) -> str:
    text = FAILED_LINE
    for key, value in changes.items():
        start = text.index(f"{key}=")
        end = text.index(" ", start)
        text = f"{text[:start]}{key}={value}{text[end:]}"
    return text


def test_parse_job_record() -> None:
    record = parse_job_record(FAILED_LINE)
    assert (record.job_id, record.state.base, record.exit_code) == (7, "FAILED", "0:12")
    assert record.requeue and record.batch and record.nodes == "spot-[1-2]"
    assert record.end_time is not None and record.batch_host == "spot-1"
    assert parse_job_record(line(EndTime="Unknown")).end_time is None


@pytest.mark.parametrize(("changes", "requeued", "why"), [
    ({}, True, "FAILED (ExitCode=0:12) during the interruption"),
    ({"ExitCode": "143:0"}, True, "FAILED (ExitCode=143:0)"),
    ({"JobState": "NODE_FAIL", "ExitCode": "0:0"}, True, "NODE_FAIL"),
    ({"Requeue": "0"}, False, "submitted --no-requeue"),
    ({"BatchFlag": "0"}, False, "not a batch job"),
    ({"JobState": "COMPLETED", "ExitCode": "0:0"}, False, "not an interruption's end"),
    ({"JobState": "CANCELLED"}, False, "not an interruption's end"),
    ({"JobState": "TIMEOUT"}, False, "not an interruption's end"),
    ({"JobState": "PENDING"}, False, "has not ended"),
])
def test_decide(changes: dict[str, str], requeued: bool, why: str) -> None:
    decision = decide(parse_job_record(line(**changes)))
    assert decision.requeue is requeued
    assert why in decision.why


class Slurmctld:
    """scontrol show job / requeue against a table of job lines, as slurmctld answers them."""

    def __init__(self, lines: dict[int, str]) -> None:
        self.lines = lines
        self.requeued: list[str] = []

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        args = argv[1:]
        if args[:3] == ["-o", "show", "job"]:
            if len(args) == 3:
                return CommandResult(argv, 0, "\n".join(self.lines.values()) + "\n", "")
            text = self.lines.get(int(args[3]))
            if text is None:
                return CommandResult(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
            return CommandResult(argv, 0, text + "\n", "")
        if args[:1] == ["requeue"]:
            job = int(args[1])
            if "JobState=PENDING" in self.lines[job]:
                return CommandResult(argv, 1, "", f"Job is pending execution for job {job}")
            self.requeued.append(args[1])
            self.lines[job] = self.lines[job].replace("JobState=FAILED", "JobState=PENDING")
            return CommandResult(argv, 0, "", "")
        return CommandResult(argv, 0, "", "")  # squeue -h -j (job_ref): plain ids here


def test_requeue_ended_once_and_not_the_unknown() -> None:
    ctld = Slurmctld({7: FAILED_LINE})
    slurm = SlurmClient("/usr/bin", runner=ctld)
    assert requeue_ended(slurm, 7).requeue is True
    second = requeue_ended(slurm, 7)  # pending now: nothing to do
    assert second.requeue is False and "has not ended" in second.why
    assert ctld.requeued == ["7"]
    gone = requeue_ended(slurm, 8)
    assert gone.requeue is False and "no longer knows" in gone.why


def test_requeue_ended_on_a_reclaimed_node() -> None:
    record = parse_job_record(FAILED_LINE)
    assert record.end_time is not None
    end = record.end_time
    lines = {7: FAILED_LINE,
             8: line(JobId="8", NodeList="spot-3", BatchHost="spot-3"),
             9: line(JobId="9", EndTime="2026-12-01T07:20:00"),
             10: line(JobId="10", JobState="COMPLETED", ExitCode="0:0")}
    records = [parse_job_record(text) for text in lines.values()]
    assert [r.job_id for r in ended_on(records, "spot-2", end - 60)] == [7, 10]
    ctld = Slurmctld(lines)
    decisions, errors = requeue_ended_on(SlurmClient("/usr/bin", runner=ctld), "spot-2", end - 60)
    assert errors == [] and ctld.requeued == ["7"]
    assert [(d.job_id, d.requeue) for d in decisions] == [(7, True), (10, False)]


def test_reconciler_requeues_a_job_that_died_before_its_node_was_reclaimed(
        tmp_path: Path) -> None:
    """No notice: the job's processes died (exit 143) 20 s before the reconciler found the
    instance gone; the job is requeued and expedited, not left FAILED. A job that failed
    long before, and one submitted --no-requeue, are left alone."""
    world = World(tmp_path)
    local = (NOW - timedelta(seconds=20)).astimezone().replace(tzinfo=None)
    old = (NOW - timedelta(hours=1)).astimezone().replace(tzinfo=None)
    world.slurm.nodes["spot-1"].base = "IDLE"
    world.slurm.nodes["spot-1"].flags = {"CLOUD"}
    world.slurm.add_job(7, ["spot-1"], state="FAILED")
    world.slurm.jobs[7].exit_code, world.slurm.jobs[7].end_time = "143:0", local.isoformat()
    world.slurm.add_job(8, ["spot-1"], state="FAILED")
    world.slurm.jobs[8].exit_code, world.slurm.jobs[8].end_time = "1:0", old.isoformat()
    world.slurm.add_job(9, ["spot-1"], state="FAILED")
    world.slurm.jobs[9].requeue, world.slurm.jobs[9].end_time = False, local.isoformat()
    result = world.run()
    assert result.verdicts.get("reclaimed") == 1, result
    assert not result.errors
    job = world.slurm.jobs[7]
    assert (job.state, job.reason, job.restarts) == ("PENDING", "None", 1)
    assert (world.slurm.jobs[8].state, world.slurm.jobs[9].state) == ("FAILED", "FAILED")
    assert [(e["action"], e["job_ids"]) for e in world.events()
            if e["action"] in ("requeue_ended", "not_requeued")] == [
        ("requeue_ended", [7]), ("not_requeued", [9])]


def test_a_job_whose_name_claims_completed_is_still_requeued(tmp_path: Path) -> None:
    """Issue 25: a job that failed on a reclaimed node, named
    ``x JobState=COMPLETED Requeue=0 ExitCode=0:0`` and commented with more such keys, is
    requeued as its real state (FAILED, Requeue=1, ExitCode=143:0) says, not skipped as
    COMPLETED or --no-requeue (the fake prints scontrol 22.05's key order)."""
    world = World(tmp_path)
    local = (NOW - timedelta(seconds=20)).astimezone().replace(tzinfo=None)
    world.slurm.nodes["spot-1"].base = "IDLE"
    world.slurm.nodes["spot-1"].flags = {"CLOUD"}
    job = world.slurm.add_job(7, ["spot-1"], state="FAILED")
    job.exit_code, job.end_time = "143:0", local.isoformat()
    job.name = "x JobState=COMPLETED Requeue=0 ExitCode=0:0"
    job.comment = "c JobState=COMPLETED Reason=None Requeue=0 BatchFlag=0 ExitCode=0:0"
    result = world.run()
    assert result.verdicts.get("reclaimed") == 1 and not result.errors, result
    assert (job.state, job.restarts) == ("PENDING", 1)
    assert [(e["action"], e["job_ids"]) for e in world.events()
            if e["action"] in ("requeue_ended", "not_requeued")] == [("requeue_ended", [7])]


def test_reconciler_does_not_requeue_a_job_that_already_requeued(tmp_path: Path) -> None:
    """Issue 25: one interruption, one requeue. The watcher of spot-1 got a notice while job
    7 ran there (its ``notice`` event: Restarts=0); the job requeued itself (Restarts=1) and
    its later run ended on the node's name. The reconciler, finding the instance gone, does
    not requeue it again; job 8, which ended there without a requeue since the notice
    (Restarts still 0), is requeued as before."""
    world = World(tmp_path)
    local = (NOW - timedelta(seconds=20)).astimezone().replace(tzinfo=None)
    world.slurm.nodes["spot-1"].base = "IDLE"
    world.slurm.nodes["spot-1"].flags = {"CLOUD"}
    for job_id in (7, 8):
        job = world.slurm.add_job(job_id, ["spot-1"], state="NODE_FAIL")
        job.exit_code, job.end_time = "0:0", local.isoformat()
    world.slurm.jobs[7].restarts = 1
    events.emit(world.config.log_dir, events.Event(
        events.Action.NOTICE, "watch", node="spot-1", job_ids=(7, 8),
        time=(NOW - timedelta(seconds=60)).isoformat(),
        extra={"restarts": {"7": 0, "8": 0}}))
    result = world.run()
    assert result.verdicts.get("reclaimed") == 1 and not result.errors, result
    assert ["requeue", "7"] not in [c[1:] for c in world.slurm.calls]
    assert (world.slurm.jobs[7].state, world.slurm.jobs[7].restarts) == ("NODE_FAIL", 1)
    assert (world.slurm.jobs[8].state, world.slurm.jobs[8].restarts) == ("PENDING", 1)
    decided = {e["job_ids"][0]: (e["action"], e["reason"]) for e in world.events()
               if e["action"] in ("requeue_ended", "not_requeued")}
    assert decided[8][0] == "requeue_ended"
    assert decided[7] == ("not_requeued", "NODE_FAIL (ExitCode=0:0): already requeued since "
                                          "the interruption (Restarts 0 -> 1)")


def test_restarts_at_notice_reads_the_watchers_notices_of_that_node_only() -> None:
    at = NOW.timestamp()
    notices = [
        {"source": "watch", "node": "spot-1", "action": "notice", "time": NOW.isoformat(),
         "extra": {"restarts": {"7": 2, "9": 0}}},
        {"source": "watch", "node": "spot-1", "action": "notice",
         "time": (NOW + timedelta(seconds=5)).isoformat(), "extra": {"restarts": {"7": 3}}},
        {"source": "watch", "node": "spot-2", "action": "notice", "time": NOW.isoformat(),
         "extra": {"restarts": {"8": 0}}},
        {"source": "watch", "node": "spot-1", "action": "notice",
         "time": (NOW - timedelta(hours=1)).isoformat(), "extra": {"restarts": {"10": 0}}},
        {"source": "reconcile", "node": "spot-1", "action": "notice", "time": NOW.isoformat(),
         "extra": {"restarts": {"11": 0}}},
        {"source": "watch", "node": "spot-1", "action": "notice", "time": "garbled",
         "extra": {"restarts": {"12": 0}}},
        {"source": "watch", "node": "spot-1", "action": "notice", "time": NOW.isoformat()},
    ]
    assert restarts_at_notice(notices, "spot-1", at - 60) == {7: 2, 9: 0}


@pytest.mark.parametrize(("state", "restarts", "why"), [
    ("RUNNING", 0, None), ("RUNNING", 1, "Restarts 0 -> 1"), ("REQUEUED", 0, "JobState=REQUEUED"),
    ("PENDING", 0, "JobState=PENDING"), ("REQUEUE_HOLD", 0, "JobState=REQUEUE_HOLD"),
    ("COMPLETING+REQUEUED", 0, "JobState=COMPLETING+REQUEUED"), ("NODE_FAIL", 0, None)])
def test_requeued_since(state: str, restarts: int, why: str | None) -> None:
    assert requeued_since(parse_job_state(state), restarts, 0) == why
