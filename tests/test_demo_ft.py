"""What ``slurm-spot demo --fault-tolerant`` reports from the groups' training events
(slurm_spot/localcluster/ft_demo.py): the survivors' pauses, the joins, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_spot.localcluster.demo import TrainingLog
from slurm_spot.localcluster.ft_demo import joins, survivor_gap, verdict


def _log(path: Path, evs: list[dict]) -> TrainingLog:
    path.write_text("".join(json.dumps(e) + "\n" for e in evs) + "a line of torchft's log\n")
    log = TrainingLog(path)
    log.poll()
    return log


def test_a_survivors_pause_counts_its_own_steps_never_a_gap_between_two_runs(
        tmp_path: Path) -> None:
    g0 = _log(tmp_path / "g0", [{"event": "start", "time": 0.0}] + [
        {"event": "step", "step": i, "time": t} for i, t in
        enumerate([1.0, 1.2, 1.4, 2.9, 3.1, 3.3, 3.5])])
    # g1 is away from 1.3 to 9.0: its own absence is no survivor's pause.
    g1 = _log(tmp_path / "g1", [
        {"event": "start", "time": 0.0}, {"event": "step", "step": 0, "time": 1.1},
        {"event": "step", "step": 1, "time": 1.3}, {"event": "start", "time": 8.0},
        {"event": "heal", "step": 5, "from_peer": True, "heal_s": 0.25, "bytes": 100,
         "time": 9.0}, {"event": "step", "step": 6, "time": 9.1}])
    g2 = _log(tmp_path / "g2", [{"event": "start", "time": 0.0},
                                {"event": "step", "step": 0, "time": 1.0},
                                {"event": "step", "step": 9, "time": 9.5}])
    logs = {"g0": g0, "g1": g1, "g2": g2}
    assert survivor_gap(logs, "g2", 1.3, 5.0) == 1.5  # g0's 1.4 -> 2.9; not g1's 1.3 -> 9.1
    assert survivor_gap(logs, "g1", 1.3, 5.0) == 1.5
    assert survivor_gap(logs, "g0", 1.3, 5.0) == 0.2  # g1's 1.1 -> 1.3; g2's 1.0 -> 9.5 ends later
    assert survivor_gap(logs, "g0", 1.3, 10.0) == 8.5
    assert joins([e for _, e in g1.events], "g1") == [
        {"group": "g1", "step": 5, "healed_from_peer": True, "heal_s": 0.25, "bytes": 100,
         "time": 9.0}]


def test_the_verdict_names_what_a_user_would_call_a_failure() -> None:
    good = {"state": "COMPLETED", "jobs": {}, "replicas_identical": True,
            "joins": [{"healed_from_peer": True}], "loss_within_tolerance": True,
            "final_loss": 0.1, "reference_loss": 0.1, "loss_tolerance": 1e-3}
    assert verdict(good) == []
    bad = {**good, "replicas_identical": False, "joins": [], "loss_within_tolerance": False,
           "final_loss": 0.2}
    assert verdict(bad) == ["the groups' final weights differ",
                            "a replacement did not heal from a peer",
                            "final loss 0.2 is not within 0.001 of the reference 0.1"]
