"""The node-side watcher: local notices, the systemd unit, and what a notice does in Slurm."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import parse_config
from slurm_spot.events import read_events
from slurm_spot.providers.local.notices import LocalNoticeSource
from slurm_spot.slurm.client import CommandResult, SlurmClient
from slurm_spot.watch import Watcher, source_for


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

    def __init__(self, with_job: bool = True) -> None:
        self.powered_down = not with_job  # no job: nothing runs there from the start
        self.commands: list[str] = []

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        tool, args = argv[0].rsplit("/", 1)[-1], argv[1:]
        self.commands.append(" ".join([tool, *args]))
        out = ""
        if tool == "scontrol" and args[:3] == ["-o", "show", "node"]:
            state = "IDLE+CLOUD+POWERED_DOWN" if self.powered_down else "MIXED+CLOUD+DRAIN"
            out = f"NodeName=spot-1 State={state} Reason=x\n"
        elif tool == "scontrol" and "state=POWER_DOWN_FORCE" in args:
            self.powered_down = True
        elif tool == "squeue" and "--json" in args:
            state = "PENDING" if self.powered_down else "RUNNING"
            out = json.dumps({"jobs": [{"job_id": 5, "job_state": state, "array_job_id": 4,
                                        "array_task_id": 3}]})
        elif tool == "squeue":
            out = "" if self.powered_down else "5 4 3 spot-1\n"
        elif tool == "scontrol" and args[:1] == ["listpids"]:  # step 0's task, pid 4242
            out = "PID      JOBID    STEPID   LOCALID GLOBALID\n4242     5        0        0  0\n"
        return CommandResult(argv, 0, out, "")


def test_notice_drains_signals_the_task_powers_down_and_expedites(tmp_path: Path) -> None:
    """With prewarm off: the old order, signal at once, requeue by power-down."""
    config = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"prewarm": False},
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
    (notices / "spot-1.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    slurm = ScriptedSlurm()
    clock = [deadline.timestamp() - 30]
    watcher = Watcher(config, "spot-1", SlurmClient("/usr/bin", runner=slurm),
                      source_for(config, "spot-1"), clock=lambda: clock[0],
                      sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    # The task's /proc/<pid>/status: it catches SIGUSR2 (bit 12) and SIGINT (bit 2).
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "status").write_text(
        "Name:\tpython\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000802\n")
    watcher.signaller.proc_root = tmp_path / "proc"
    outcome = watcher.run(once=True)
    assert outcome is not None and outcome.jobs == [5] and outcome.requeued == [5]
    reason = f"spot-interruption:terminate@{deadline:%Y-%m-%dT%H:%M:%SZ}"
    steps = [c for c in slurm.commands
             if not c.startswith(("squeue", "scontrol -o", "scontrol listpids", "scontrol write"))]
    assert steps == [
        f"scontrol update nodename=spot-1 state=DRAIN reason={reason}",
        "scancel -s USR2 4_3.0",  # the task by its own name: '4' would be the whole array
        f"scontrol update nodename=spot-1 state=POWER_DOWN_FORCE reason={reason}",
        "scontrol update jobid=4_3 StartTime=now",
    ]
    # It powered the node down before the deadline, not at it.
    assert clock[0] <= deadline.timestamp() - 5
    assert [e["action"] for e in read_events(config.log_dir)] == ["notice", "signalled",
                                                                  "requeued"]


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
