"""The recovery breakdown of ``slurm-spot demo``: which source times which part."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from slurm_spot.recovery import (
    PARTS,
    STARTUP_PARTS,
    breakdown,
    process_started,
    slurm_time,
    startup_times,
)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def _local(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")  # as scontrol prints


def test_notice_breakdown_from_watcher_training_and_slurm_times() -> None:
    t0 = 1_800_000_000.0
    training = [
        {"event": "step", "step": 52, "time": t0 + 1.0},
        {"event": "preempted", "step": 70, "time": t0 + 8.0},
        {"event": "resume", "step": 70, "time": t0 + 15.5, "started": t0 + 13.0},
        {"event": "step", "step": 71, "time": t0 + 16.0},
    ]
    watch = [{"action": "signalled", "time": _iso(t0 + 6.0), "job_ids": [5],
              "extra": {"prewarmed": True, "replacements": ["spot-3"]}},
             {"action": "signalled", "time": _iso(t0 + 2.0), "job_ids": [9], "extra": {}}]
    job = {"EligibleTime": _local(t0 + 9.0), "StartTime": _local(t0 + 10.0),
           "NodeList": "spot-[2-3]"}
    parts = breakdown("notice", t0, 50, training, watch, job, 5)
    assert [parts[p] for p in PARTS] == [6.0, 2.0, 1.0, 1.0, 3.0, 3.0]
    assert parts["exit_to_first_step_s"] == 8.0 and parts["steps_after_notice"] == 20
    assert parts["prewarmed"] is True and parts["landed_on_replacement"] is True


def test_kill_breakdown_starts_at_the_kill_and_has_no_signal() -> None:
    t0 = 1_800_000_000.0
    training = [{"event": "resume", "step": 40, "time": t0 + 30.0, "started": t0 + 27.0},
                {"event": "step", "step": 41, "time": t0 + 31.0}]
    job = {"EligibleTime": _local(t0 + 6.0), "StartTime": _local(t0 + 20.0), "NodeList": "spot-4"}
    parts = breakdown("kill", t0, 60, training, [], job, 5)
    assert parts["notice_to_signal_s"] is None and parts["signal_to_exit_s"] is None
    assert parts["exit_to_requeue_s"] == 6.0 and parts["requeue_to_allocation_s"] == 14.0
    assert parts["exit_to_first_step_s"] == 31.0
    assert parts["prewarmed"] is False and parts["landed_on_replacement"] is False


def test_slurm_time_unknown_values() -> None:
    assert slurm_time("Unknown") is None and slurm_time("") is None and slurm_time("x") is None
    assert slurm_time("2026-12-01T07:20:01") is not None


def _slurmd(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]  # as slurmd logs


def test_startup_split_from_slurmd_logs_the_batch_script_agents_and_training() -> None:
    """Allocation -> first step, part by part: slurmd's lines (the latest node's), the batch
    script's and the agents' lines of the job's output, the training's timestamps; what
    came before the interruption (the previous run's lines, another job's) is not used."""
    t0 = 1_800_000_000.0
    logs = [
        f"[{_slurmd(t0 - 50)}] Launching batch job 5 for UID 0\n"  # the run before
        f"[{_slurmd(t0 + 10.4)}] Launching batch job 5 for UID 0\n"
        f"[{_slurmd(t0 + 10.5)}] Launching batch job 6 for UID 0\n"
        f"[{_slurmd(t0 + 10.9)}] launch task StepId=5.0 request from UID:0 GID:0 HOST:x\n",
        f"[{_slurmd(t0 + 11.0)}] launch task StepId=5.0 request from UID:0 GID:0 HOST:x\n"
        f"[{_slurmd(t0 + 11.2)}] [5.0] done with job\n",
    ]
    output = [f"slurm-spot: job 5 restart 0 on spot-[1-2] at {t0 - 49:.6f}",
              f"slurm-spot: job 5 restart 1 on spot-[2-3] at {t0 + 10.6:.6f}",
              f"slurm-spot: agent started at {t0 + 11.5:.3f} on spot-2",
              f"slurm-spot: agent started at {t0 + 11.7:.3f} on spot-3",
              "slurm-spot: torchrun --nnodes=2 ..."]
    startup = startup_times(5, t0, output, logs)
    assert startup == pytest.approx({"batch_launch": t0 + 10.4, "step_launch": t0 + 11.0,
                                     "batch_start": t0 + 10.6, "agent_started": t0 + 11.7})
    training = [{"event": "resume", "step": 40, "time": t0 + 15.0, "started": t0 + 13.0,
                 "process_started": t0 + 12.9, "process_group": t0 + 13.5,
                 "restoring": t0 + 14.5},
                {"event": "step", "step": 41, "time": t0 + 15.25}]
    job = {"EligibleTime": _local(t0 + 6.0), "StartTime": _local(t0 + 10.0), "NodeList": "x"}
    parts = breakdown("kill", t0, 60, training, [], job, 5, startup)["startup"]
    assert isinstance(parts, dict) and list(parts) == list(STARTUP_PARTS)
    assert parts == {"allocation_to_launch_s": 0.4, "launch_to_batch_s": 0.2,
                     "batch_to_step_s": 0.4, "step_to_agent_s": 0.7, "agent_s": 1.2,
                     "worker_s": 0.1, "gloo_s": 0.5, "setup_s": 1.0, "restore_s": 0.5,
                     "first_step_s": 0.25}
    # Their sum is allocation -> first step.
    assert round(sum(parts.values()), 2) == 5.25
    # Without the start-up sources, those parts are unknown, not zero.
    unknown = breakdown("kill", t0, 60, training[1:], [], job, 5)["startup"]
    assert isinstance(unknown, dict) and set(unknown.values()) == {None}


def test_process_started_is_when_the_process_was_forked() -> None:
    """/proc's start time of a process started now, and of this test's process (earlier)."""
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = process_started(proc.pid)
        assert started is not None and before - 0.1 <= started <= time.time() + 0.1
        mine = process_started()
        assert mine is not None and mine <= started
        again = process_started(os.getpid())
        assert again is not None and abs(again - mine) < 0.05
    finally:
        proc.kill()
        proc.wait()
    assert process_started(proc.pid) is None  # gone


def test_startup_reads_slurmd_26_05s_batch_line() -> None:
    """Slurm 26.05's slurmd says ``Launching batch JobId=5 SLUID=... for UID 0`` (22.05 and
    24.11: ``Launching batch job 5 for UID 0``); the matrix's 26.05 demo lost the part."""
    t0 = 1_800_000_000.0
    logs = [f"[{_slurmd(t0 + 1.0)}] Launching batch JobId=5 SLUID=s0SXM8VVPDA400 for UID 0\n"
            f"[{_slurmd(t0 + 1.1)}] Launching batch JobId=15 SLUID=s0SXM8VVPDA401 for UID 0\n"
            f"[{_slurmd(t0 + 1.4)}] launch task StepId=5.0 request from UID:0 GID:0 HOST:x\n"]
    assert startup_times(5, t0, [], logs) == pytest.approx(
        {"batch_launch": t0 + 1.0, "step_launch": t0 + 1.4})
