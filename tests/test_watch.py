"""The node-side watcher: local notices, the systemd unit, and what a notice does in Slurm."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import parse_config
from slurm_spot.events import read_events
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.lifecycle.watch import Watcher, source_for
from slurm_spot.providers.local.notices import LocalNoticeSource
from slurm_spot.providers.notices import Notice
from slurm_spot.slurm.client import CommandResult, SlurmClient
from tests.fakes.fake_slurm import FakeSlurm


def test_local_notice_file(tmp_path: Path) -> None:
    path = tmp_path / "spot-1.json"
    source = LocalNoticeSource(path, 0.5)
    assert source.poll() is None
    path.write_text('{"action": "terr')  # half-written: not a notice yet
    assert source.poll() is None
    path.write_text(json.dumps({"action": "terminate", "time": "2026-03-01T08:22:00+00:00"}))
    notice = source.poll()
    assert notice is not None
    assert notice.reason == "spot-interruption:terminate@2026-03-01T08:22:00Z"


class ScriptedSlurm:
    """scontrol/squeue/scancel as seen by the watcher: job 5 (task 3 of array 4) runs on
    spot-1 until the node is powered down, then it is pending (requeued)."""

    def __init__(self, with_job: bool = True, node: str = "spot-1",
                 version: str = "22.05.8") -> None:
        self.powered_down = not with_job  # no job: nothing runs there from the start
        self.commands: list[str] = []
        self.node = node
        self.version = version

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        tool, args = argv[0].rsplit("/", 1)[-1], argv[1:]
        self.commands.append(" ".join([tool, *args]))
        out = ""
        if tool == "scontrol" and args[:3] == ["-o", "show", "node"]:
            state = "IDLE+CLOUD+POWERED_DOWN" if self.powered_down else "MIXED+CLOUD+DRAIN"
            out = f"NodeName={self.node} State={state} Reason=x\n"
        elif tool == "scontrol" and args == ["-V"]:
            out = f"slurm {self.version}\n"
        elif tool == "scontrol" and ("state=POWER_DOWN_FORCE" in args
                                     or args[:3] == ["power", "down", "force"]):
            self.powered_down = True
        elif tool == "squeue" and "--json" in args:
            state = "PENDING" if self.powered_down else "RUNNING"
            out = json.dumps({"jobs": [{"job_id": 5, "job_state": state, "array_job_id": 4,
                                        "array_task_id": 3}]})
        elif tool == "squeue":
            out = "" if self.powered_down else f"5 4 3 {self.node}\n"
        elif tool == "scontrol" and args[:1] == ["listpids"]:  # step 0's task, pid 4242
            out = "PID      JOBID    STEPID   LOCALID GLOBALID\n4242     5        0        0  0\n"
        return CommandResult(argv, 0, out, "")


@pytest.mark.parametrize(("set_name", "version"), [
    ("spot", "22.05.8"), ("spot", "24.11.5"), ("gpu_a100.sxm", "22.05.8"), ("n.rack1", "24.11.5")])
def test_notice_drains_signals_the_task_powers_down_and_expedites(tmp_path: Path, set_name: str,
                                                                  version: str) -> None:
    """With prewarm off: the old order, signal at once, requeue by power-down. Also on nodes
    whose names hold characters Slurm allows (issue 11: the watcher crashed after draining,
    before signalling the job, on gpu_a100.sxm-1)."""
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": set_name, "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": [set_name]}],
        "preemption": {"prewarm": False},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    node = f"{set_name}-1"
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / f"{node}.json").write_text(json.dumps({"action": "terminate",
                                                      "time": deadline.isoformat()}))
    slurm = ScriptedSlurm(node=node, version=version)
    clock = [deadline.timestamp() - 30]
    watcher = Watcher(config, node, SlurmClient("/usr/bin", runner=slurm),
                      source_for(config, node), clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    # The task's /proc/<pid>/status: it catches SIGUSR2 (bit 12) and SIGINT (bit 2).
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "status").write_text(
        "Name:\tpython\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000802\n")
    watcher.signaller.proc_root = tmp_path / "proc"
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.jobs == [5] and outcome.requeued == [5]
    reason = f"spot-interruption:terminate@{deadline:%Y-%m-%dT%H:%M:%SZ}"
    reads = ("squeue", "scontrol -o", "scontrol --json", "sinfo", "scontrol -V",
             "scontrol listpids", "scontrol write")
    steps = [c for c in slurm.commands if not c.startswith(reads)]
    # 24.05+ powers down with 'scontrol power down force', which takes no reason.
    power_down = ([f"scontrol update nodename={node} reason={reason}",
                   f"scontrol power down force {node}"] if version >= "24.05" else
                  [f"scontrol update nodename={node} state=POWER_DOWN_FORCE reason={reason}"])
    assert steps == [
        f"scontrol update nodename={node} state=DRAIN reason={reason}",
        "scancel -s USR2 4_3.0",  # the task by its own name: '4' would be the whole array
        *power_down,
        "scontrol update jobid=4_3 StartTime=now",
        # the requeue is on the job's own record, where sacct shows it
        f"scontrol update jobid=4_3 AdminComment=requeued: {reason}",
    ]
    # It powered the node down before the deadline, not at it.
    assert clock[0] <= deadline.timestamp() - 5
    assert [e["action"] for e in read_events(config.log_dir)] == ["notice", "signalled",
                                                                  "requeued"]
    # 'slurm-spot events' names the array task as squeue/sacct do (4_3), not by its unique id 5
    spot_yaml = tmp_path / "spot.yaml"
    spot_yaml.write_text(json.dumps({
        "cluster": "c", "node_sets": [{"name": set_name, "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": [set_name]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")}))
    shown = CliRunner().invoke(cli, ["--config", str(spot_yaml), "events", "--noheader",
                                     "--format", "action,jobs"])
    assert shown.exit_code == 0, shown.output
    assert [line.split() for line in shown.stdout.splitlines()] == [
        ["notice", "4_3"], ["signalled", "4_3"], ["requeued", "4_3"]]


def test_notice_on_an_idle_node_powers_it_down_and_requeues_nothing(tmp_path: Path) -> None:
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / "spot-1.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    slurm = ScriptedSlurm(with_job=False)
    watcher = Watcher(config, "spot-1", SlurmClient("/usr/bin", runner=slurm),
                      source_for(config, "spot-1"), sleep=lambda s: None)
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.jobs == [] and outcome.requeued == []
    assert [e["action"] for e in read_events(config.log_dir)] == ["notice", "powered_down"]


def test_systemd_unit(tmp_path: Path) -> None:
    config = tmp_path / "spot.yaml"
    config.write_text("cluster: c\nnode_sets: [{name: spot, provider: local, count: 1}]\n"
                      "partitions: [{name: spot, node_sets: [spot]}]\n")
    result = CliRunner().invoke(cli, ["--config", str(config), "watch", "--systemd-unit"])
    assert result.exit_code == 0, result.output
    assert f"--config {config} watch\n" in result.output
    assert "Restart=always" in result.output and "[Install]" in result.output


def test_instance_id_is_recorded_in_the_watchers_events(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``watch --instance-id`` does what its help says: each event carries the instance."""
    from slurm_spot.commands.common import AppContext

    path = tmp_path / "spot.yaml"
    path.write_text(json.dumps({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")}))
    notices = tmp_path / "state" / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / "spot-1.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    slurm = ScriptedSlurm(with_job=False)
    monkeypatch.setattr(AppContext, "slurm", lambda self: SlurmClient("/usr/bin", runner=slurm))
    result = CliRunner().invoke(cli, ["--config", str(path), "watch", "--node", "spot-1",
                                      "--once", "--instance-id", "loc-0123abcd", "--json"])
    assert result.exit_code == 0, result.output
    assert read_envelope(result.stdout, "watch")["notice"]["action"] == "terminate"
    found = list(read_events(tmp_path / "log"))
    assert [(e["action"], e["instance"]) for e in found] == [
        ("notice", "loc-0123abcd"), ("powered_down", "loc-0123abcd")]
    shown = CliRunner().invoke(cli, ["--config", str(path), "events", "--node", "spot-1"])
    assert shown.exit_code == 0 and shown.stdout.count("loc-0123abcd") == 2, shown.output


def _job_7_leaving_slowly(tmp_path: Path) -> tuple[Any, FakeSlurm, Any, float, list[float]]:
    """A one-node set without prewarm, job 7 on spot-1 that stays on its node after a requeue
    until ``finish_requeues``, and a clock (epoch seconds) the watcher's sleep moves on."""
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"prewarm": False},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    slurm = FakeSlurm()
    slurm.requeue_leaves_later = True
    slurm.add_node("spot-1", "MIXED+CLOUD")
    job = slurm.add_job(7, ["spot-1"])
    start = datetime(2026, 3, 1, 12, tzinfo=timezone.utc).timestamp()
    clock = [start]
    return config, slurm, job, start, clock


def test_a_job_that_requeued_itself_is_not_requeued_again(tmp_path: Path) -> None:
    """Issue 25: one interruption, one requeue. Job 7 requeues itself 1 s after the notice
    (submitit's handler: ``scontrol requeue``), but its processes and epilog take until
    7 s after it to leave (Slurm 22.05: REQUEUED, completing, meanwhile), past the usual
    power-down time (deadline 10 s - margin 5 s). The watcher waits for it to leave before
    the power-down (which would make its run NODE_FAIL), never requeues it itself, and
    clears its requeue delay."""
    config, slurm, job, start, clock = _job_7_leaving_slowly(tmp_path)

    def the_job_acts(_: int) -> None:
        if clock[0] >= start + 1 and job.state == "RUNNING":
            slurm._scontrol(["requeue", "7"])  # the job's own, not the watcher's
        if clock[0] >= start + 7:
            slurm.finish_requeues()

    slurm.on_show = the_job_acts
    notice = Notice("terminate", datetime.fromtimestamp(start + 10, timezone.utc), "local")
    watcher = Watcher(config, "spot-1", slurm.client(), LocalNoticeSource(tmp_path / "notice.json"),
                      clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    outcome = watcher.handle(notice)
    assert [c[1:3] for c in slurm.calls if c[1:2] == ["requeue"]] == []
    assert (job.state, job.restarts) == ("PENDING", 1)  # never NODE_FAIL
    assert outcome.requeued == [7] and 7 in slurm.expedited
    powered = [e for e in read_events(config.log_dir) if e["action"] == "requeued"]
    assert powered[0]["extra"]["requeued_before_power_down"] == {
        "7": "by itself: JobState=REQUEUED"}
    assert start + 7 <= clock[0] < start + 10  # it waited for the job, not past the deadline


def test_a_job_still_running_at_the_power_down_is_requeued_first(tmp_path: Path) -> None:
    """A job that does not leave by ``deadline - margin`` is requeued before the power-down
    (its record then reads REQUEUED, not NODE_FAIL), once."""
    config, slurm, job, start, clock = _job_7_leaving_slowly(tmp_path)
    requeued_at: list[float] = []

    def the_job_leaves(_: int) -> None:
        if job.state == "REQUEUED":
            requeued_at.append(clock[0])
            if clock[0] >= requeued_at[0] + 2:
                slurm.finish_requeues()

    slurm.on_show = the_job_leaves
    notice = Notice("terminate", datetime.fromtimestamp(start + 10, timezone.utc), "local")
    watcher = Watcher(config, "spot-1", slurm.client(), LocalNoticeSource(tmp_path / "notice.json"),
                      clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    outcome = watcher.handle(notice)
    assert [c[1:3] for c in slurm.calls if c[1:2] == ["requeue"]] == [["requeue", "7"]]
    assert requeued_at[0] >= start + 5  # at the usual power-down time, not before
    assert (job.state, job.restarts) == ("PENDING", 1)
    assert outcome.requeued == [7] and 7 in slurm.expedited
