"""Boot hidden behind the notice: which node is prewarmed, when a job is signalled, and the
watcher's order of actions against a scripted slurmctld."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm_spot.checkpoint.commit import commit, new_temp_dir, write_manifest
from slurm_spot.checkpoint.files import SaveCost, save_costs
from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.events import read_events
from slurm_spot.lifecycle.prewarm import (
    choose_replacements,
    latest_signal_time,
    weights_to_restore,
)
from slurm_spot.lifecycle.watch import Watcher, source_for
from slurm_spot.lifecycle.weights import PREWARM_WEIGHT
from slurm_spot.slurm.client import CommandResult, Node, SlurmClient
from slurm_spot.slurm.states import parse_node_state


def _config(tmp_path: Path, **preemption: object) -> SpotConfig:
    return parse_config({
        "cluster": "c",
        "node_sets": [{"name": "spot", "provider": "local", "count": 4, "cpus": 4},
                      {"name": "big", "provider": "local", "count": 2, "cpus": 8, "weight": 5},
                      {"name": "small", "provider": "local", "count": 2, "cpus": 1}],
        "partitions": [{"name": "p", "node_sets": ["spot", "big", "small"]}],
        "preemption": preemption,
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "checkpoint": {"root": str(tmp_path / "ck")}})


def _node(name: str, state: str, jobs: tuple[int, ...] = (), weight: int | None = 1) -> Node:
    return Node(name, parse_node_state(state), jobs=jobs, weight=weight)


def test_replacement_is_an_up_idle_node_first_then_a_powered_down_one_of_the_same_set(
        tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = [_node("spot-1", "MIXED+CLOUD+DRAIN", (7,)), _node("spot-2", "ALLOCATED+CLOUD", (7,)),
             _node("spot-3", "IDLE+CLOUD+POWERED_DOWN"), _node("spot-4", "IDLE+CLOUD+POWERED_DOWN"),
             _node("big-1", "IDLE+CLOUD")]
    # Two jobs on the noticed node: the up big-1 needs no boot, then spot-3 (its own set).
    chosen = choose_replacements(config, "spot-1", nodes, 2)
    assert chosen.ready == ("big-1",) and chosen.power_up == ("spot-3",) and chosen.short == 0
    # One job: the up node wins over booting one of the same set.
    assert choose_replacements(config, "spot-1", nodes, 1).nodes == ("big-1",)


def test_replacement_never_a_drained_down_booting_or_smaller_node(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = [_node("spot-1", "MIXED+CLOUD+DRAIN", (7,)),
             _node("spot-2", "IDLE+CLOUD+DRAIN+POWERED_DOWN"),
             _node("spot-3", "DOWN+CLOUD+POWERED_DOWN"),
             _node("spot-4", "IDLE+CLOUD+POWERING_UP"),
             _node("small-1", "IDLE+CLOUD+POWERED_DOWN"),  # 1 CPU < spot's 4: not compatible
             _node("big-2", "IDLE+CLOUD+POWERED_DOWN"), _node("big-1", "IDLE+CLOUD+POWERED_DOWN")]
    chosen = choose_replacements(config, "spot-1", nodes, 3)
    assert chosen.ready == () and chosen.power_up == ("big-1", "big-2") and chosen.short == 1


def test_latest_signal_time_leaves_room_for_a_step_a_save_and_the_margins() -> None:
    deadline = 1000.0
    measured = SaveCost(save_s=4.0, step_s=0.5, size_bytes=10, checkpoints=2)
    assert latest_signal_time(deadline, 5, measured, 30, 10) == pytest.approx(980.5)
    # Unknown: the configured default stands in for the save, no step time.
    assert latest_signal_time(deadline, 5, SaveCost(), 30, 10) == pytest.approx(955.0)


def _save(directory: Path, step: int, payload: bytes, started: float | None) -> None:
    temp = new_temp_dir(directory, step)
    (temp / "state.pt").write_bytes(payload)
    write_manifest(temp, step, "torch", 1, started_s=started)
    commit(temp, step)


def test_save_costs_come_from_the_job_manifests(tmp_path: Path) -> None:
    import time

    assert save_costs(tmp_path / "missing") == SaveCost()
    _save(tmp_path, 40, b"x" * 100, time.monotonic() - 2.0)
    time.sleep(0.2)
    _save(tmp_path, 80, b"y" * 300, time.monotonic() - 0.5)
    cost = save_costs(tmp_path)
    assert cost.checkpoints == 2 and cost.size_bytes == 300
    assert cost.save_s is not None and 2.0 <= cost.save_s < 3.0  # the longest recent save
    assert cost.step_s is not None and 0 < cost.step_s < 0.1  # 40 steps in ~0.2 s
    manifest = json.loads((tmp_path / "step_000000080" / "manifest.json").read_text())
    assert manifest["size_bytes"] == 300 and 0.5 <= manifest["save_s"] < 1.5


def test_weights_restored_once_the_replacement_is_used_or_powered_down(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = [_node("spot-1", "IDLE+CLOUD+POWERING_UP", weight=PREWARM_WEIGHT),  # still booting
             _node("spot-2", "IDLE+CLOUD", weight=PREWARM_WEIGHT),  # up, waiting for its job
             _node("spot-3", "ALLOCATED+CLOUD", (9,), weight=PREWARM_WEIGHT),  # job landed
             _node("spot-4", "IDLE+CLOUD+POWERED_DOWN", weight=PREWARM_WEIGHT),  # unused, down
             _node("big-1", "IDLE+CLOUD+POWERED_DOWN", weight=7)]  # an admin's weight
    assert weights_to_restore(config, nodes) == {"spot-3": 1, "spot-4": 1}


class ScriptedCluster:
    """slurmctld as the watcher sees it: job 7 of alice on spot-[1-2]; spot-3 and spot-4
    powered down. POWER_UP makes a node POWERING_UP and up ``boot_polls`` node reads later
    (never with None); the signal makes the job requeue itself; StartTime=now lands it on the
    first two up idle nodes (lowest weight first, as slurmctld would)."""

    def __init__(self, boot_polls: int | None) -> None:
        self.state = {"spot-1": "MIXED+CLOUD", "spot-2": "ALLOCATED+CLOUD",
                      "spot-3": "IDLE+CLOUD+POWERED_DOWN", "spot-4": "IDLE+CLOUD+POWERED_DOWN"}
        self.weight = dict.fromkeys(self.state, 1)
        self.job_nodes = ["spot-1", "spot-2"]
        self.job_state = "RUNNING"
        self.boot_polls = boot_polls
        self.booting: dict[str, int] = {}
        self.commands: list[str] = []
        self.now = [0.0]
        self.signalled_at: float | None = None

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult:
        tool, args = argv[0].rsplit("/", 1)[-1], argv[1:]
        out = ""
        if tool == "scontrol" and args[:3] == ["-o", "show", "node"]:
            self._boot_tick()
            out = "".join(f"NodeName={n} State={s} Weight={self.weight[n]}\n"
                          for n, s in self.state.items())
        elif tool == "scontrol" and args[0] == "update":
            self.commands.append(" ".join(args))
            self._update(args)
        elif tool == "scancel":
            self.commands.append(" ".join([tool, *args]))
            self.signalled_at = self.now[0]
            self.job_state, self.job_nodes = "PENDING", []  # checkpoints, exits 85, requeued
            self.state["spot-1"], self.state["spot-2"] = "IDLE+CLOUD+DRAIN", "IDLE+CLOUD"
        elif tool == "scontrol" and args[:1] == ["listpids"]:  # step 0's task, pid 4242
            out = "PID      JOBID    STEPID   LOCALID GLOBALID\n4242     7        0        0  0\n"
        elif tool == "squeue" and "--json" in args:
            out = json.dumps({"jobs": [{"job_id": 7, "job_state": self.job_state,
                                        "user_name": "alice", "nodes": ",".join(self.job_nodes)}]})
        elif tool == "squeue":
            out = f"7 N/A N/A {','.join(self.job_nodes)}\n" if self.job_nodes else ""
        return CommandResult(argv, 0, out, "")

    def _boot_tick(self) -> None:
        for node in list(self.booting):
            self.booting[node] -= 1
            if self.booting[node] <= 0:
                self.state[node] = "IDLE+CLOUD"
                del self.booting[node]

    def _update(self, args: list[str]) -> None:
        target = dict(a.split("=", 1) for a in args[1:])
        if "jobid" in target:  # expedite: the scheduler places the job on up idle nodes
            up = sorted((n for n, s in self.state.items() if s == "IDLE+CLOUD"),
                        key=lambda n: (self.weight[n], n))
            if len(up) >= 2:
                self.job_state, self.job_nodes = "RUNNING", sorted(up[:2])
                for node in self.job_nodes:
                    self.state[node] = "ALLOCATED+CLOUD"
            return
        nodes = [target["nodename"]]
        if target["nodename"] == "spot-[1-2]":
            nodes = ["spot-1", "spot-2"]
        for node in nodes:
            if "weight" in target:
                self.weight[node] = int(target["weight"])
            if target.get("state") == "POWER_UP":
                self.state[node] = "IDLE+CLOUD+POWERING_UP"
                if self.boot_polls is not None:
                    self.booting[node] = self.boot_polls
            elif target.get("state") == "DRAIN":
                self.state[node] += "+DRAIN"
            elif target.get("state") == "POWER_DOWN_FORCE":
                self.state[node] = "IDLE+CLOUD+POWERED_DOWN+DRAIN"


def _watch(tmp_path: Path, cluster: ScriptedCluster, notice_s: float, in_prolog_s: float = 0.0,
           **preemption: object):
    """Run the watcher on a notice ``notice_s`` ahead; the job's task (pid 4242, catching
    SIGUSR2) appears ``in_prolog_s`` after the notice (before that the job is in its prolog)."""
    config = _config(tmp_path, **preemption)
    notices = config.state_dir / "local" / "notices"
    notices.mkdir(parents=True)
    deadline = datetime.now(timezone.utc) + timedelta(seconds=notice_s)
    (notices / "spot-1.json").write_text(json.dumps({"action": "terminate",
                                                     "time": deadline.isoformat()}))
    cluster.now[0] = deadline.timestamp() - notice_s
    task = tmp_path / "proc" / "4242"
    task.parent.mkdir(parents=True)

    def sleep(seconds: float) -> None:
        cluster.now[0] += seconds
        if cluster.now[0] >= deadline.timestamp() - notice_s + in_prolog_s and not task.exists():
            # /proc/<pid>/status of the task: it catches SIGUSR2 (bit 12) and SIGINT (bit 2).
            task.mkdir()
            (task / "status").write_text(
                "Name:\tpython\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000802\n")

    sleep(0.0)
    watcher = Watcher(config, "spot-1", SlurmClient("/usr/bin", runner=cluster),
                      source_for(config, "spot-1"), clock=lambda: cluster.now[0], sleep=sleep)
    watcher.signaller.proc_root = tmp_path / "proc"
    return config, deadline, watcher.run(once=True)


def test_prewarm_powers_up_first_signals_when_up_and_the_job_lands_there(tmp_path: Path) -> None:
    cluster = ScriptedCluster(boot_polls=6)
    config, deadline, outcome = _watch(tmp_path, cluster, 120)
    assert outcome is not None and outcome.requeued == [7] and outcome.replacements == ["spot-3"]
    assert cluster.commands == [
        "update nodename=spot-1 state=DRAIN reason=" + outcome.notice.reason,
        "update nodename=spot-3 weight=0",
        "update nodename=spot-3 state=POWER_UP",
        "scancel -s USR2 7.0",  # only once spot-3 was up; the step that catches it
        "update jobid=7 StartTime=now",
        "update nodename=spot-3 weight=1",  # its job landed: back to the configured weight
        # for sacct, before the power-down ends this instance (and its watcher)
        "update jobid=7 AdminComment=requeued: " + outcome.notice.reason,
        "update nodename=spot-1 state=POWER_DOWN_FORCE reason=" + outcome.notice.reason,
    ]
    assert cluster.job_nodes == ["spot-2", "spot-3"]
    # Signalled seconds after the notice (the boot), long before the deadline.
    assert cluster.signalled_at is not None
    assert cluster.signalled_at < deadline.timestamp() - 60
    signalled = [e for e in read_events(config.log_dir) if e["action"] == "signalled"]
    # One event says when (the replacement was up) and which signal and why (its task's handler).
    assert len(signalled) == 1
    sent = signalled[0]
    assert sent["extra"]["when"] == "replacement up" and sent["extra"]["prewarmed"]
    assert sent["extra"]["replacements"] == ["spot-3"]
    assert sent["extra"]["signal"] == "USR2" and sent["extra"]["steps"] == ["0"]
    assert "catch SIGUSR2" in sent["reason"]


def test_prewarm_signals_at_the_checkpoint_deadline_when_the_boot_is_slow(tmp_path: Path) -> None:
    import time

    cluster = ScriptedCluster(boot_polls=None)  # the replacement never comes up
    directory = tmp_path / "ck" / "alice" / "7"
    _save(directory, 40, b"x" * 10, time.monotonic() - 6.0)
    cost = save_costs(directory)
    config, deadline, _ = _watch(tmp_path, cluster, 60)
    expected = latest_signal_time(deadline.timestamp(), 5, cost, 30, 10)
    assert cluster.signalled_at is not None
    assert expected - 1.5 <= cluster.signalled_at <= expected + 0.1
    assert expected > deadline.timestamp() - 60 + 30  # it trained on for most of the notice
    signalled = [e for e in read_events(config.log_dir) if e["action"] == "signalled"]
    assert signalled[0]["extra"]["when"] == "checkpoint deadline"


def test_prewarm_off_signals_at_once_and_powers_nothing_up(tmp_path: Path) -> None:
    cluster = ScriptedCluster(boot_polls=1)
    _, deadline, outcome = _watch(tmp_path, cluster, 120, prewarm=False)
    assert outcome is not None and outcome.replacements == []
    assert cluster.signalled_at == deadline.timestamp() - 120
    assert not any("POWER_UP" in c or "weight" in c for c in cluster.commands)


def test_a_job_in_its_prolog_when_due_is_signalled_once_its_task_catches(
        tmp_path: Path) -> None:
    cluster = ScriptedCluster(boot_polls=2)
    config, deadline, outcome = _watch(tmp_path, cluster, 120, in_prolog_s=30)
    assert outcome is not None and outcome.requeued == [7]
    start = deadline.timestamp() - 120
    # Withheld while nothing caught it, signalled as soon as its task did: not at the deadline.
    assert cluster.signalled_at is not None and start + 30 <= cluster.signalled_at <= start + 31
    assert [c for c in cluster.commands if c.startswith("scancel")] == ["scancel -s USR2 7.0"]
    watch = [e for e in read_events(config.log_dir) if e["action"].startswith("signal")]
    assert [e["action"] for e in watch] == ["signal_plan", "signal_withheld", "signalled"]
    assert watch[2]["extra"]["when"] == "replacement up" and watch[2]["extra"]["prewarmed"]


def test_checkpointer_records_its_save_time_and_size_for_the_watcher(tmp_path: Path) -> None:
    import torch

    from slurm_spot.checkpoint import Checkpointer, TrainState

    model = torch.nn.Linear(64, 64)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (10, 20):
        state.step = step
        ckpt.save(state)
    cost = save_costs(tmp_path)
    assert cost.checkpoints == 2 and cost.save_s is not None and 0 <= cost.save_s < 60
    state_pt = (tmp_path / "step_000000020" / "state.pt").stat().st_size
    assert cost.size_bytes == state_pt > 64 * 64 * 4  # the weights are in it
    assert cost.step_s is not None and cost.step_s >= 0
