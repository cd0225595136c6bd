"""The recovery breakdown of ``slurm-spot demo``: which source times which part."""

from __future__ import annotations

from datetime import datetime, timezone

from slurm_spot.recovery import PARTS, breakdown, slurm_time


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
