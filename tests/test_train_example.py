"""examples/train_digits.py under torchrun (2 ranks, gloo, CPU): preempted mid-run with
SIGUSR2, resumed, and finished with the same weights as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_spot.checkpoint.files import find_latest_valid

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
STEPS = 60
pytestmark = pytest.mark.e2e


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return env


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node=2", str(SCRIPT), "--steps", str(STEPS), "--log-every", "1",
            "--checkpoint-every", "15", *args]


def _events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _run(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run(_argv(*args), capture_output=True, text=True, env=_env(),
                          timeout=180, check=False)
    return proc.returncode, _events(proc.stdout), proc.stderr


def _run_and_preempt(checkpoint_dir: Path, at_step: int) -> tuple[int, list[dict], str]:
    """Start a slow run; once it logged ``at_step``, send SIGUSR2 to every process under the
    torchrun agent (the ranks and their DataLoader workers, as ``scancel -s USR2`` would reach
    them; the agent itself is left alone, as ``trap '' USR2`` would)."""
    proc = subprocess.Popen(
        _argv("--checkpoint-dir", str(checkpoint_dir), "--step-sleep", "0.05", "--workers", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "step" and event["step"] == at_step:
                for pid in _descendants(proc.pid):
                    os.kill(pid, signal.SIGUSR2)
        stderr = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, _events("".join(lines)), stderr


def test_preempted_and_resumed_run_matches_the_reference(tmp_path: Path) -> None:
    rc, reference, err = _run("--reference")
    assert rc == 0, err
    ref_done = reference[-1]
    assert ref_done["event"] == "done" and ref_done["step"] == STEPS

    rc, first, err = _run_and_preempt(tmp_path, at_step=20)
    preempted = [e for e in first if e["event"] == "preempted"]
    assert len(preempted) == 1, err
    stop = preempted[0]["step"]
    assert 20 <= stop < STEPS
    assert preempted[0]["checkpoint"] == str(tmp_path / f"step_{stop:09d}")
    # Both ranks exited with the requeue code (torchrun itself reports the failure with 1).
    assert rc != 0 and len(re.findall(r"exitcode\s*:\s*85 \(pid", err)) == 2, err
    latest = find_latest_valid(tmp_path)
    assert latest is not None and latest.step == stop
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_{15:09d}", f"step_{stop:09d}"]

    rc, second, err = _run("--checkpoint-dir", str(tmp_path))
    assert rc == 0, err
    assert second[0] == {"event": "resume", "step": stop, "checkpoint": str(latest.path),
                         "restarts": 0}
    done = second[-1]
    assert done["event"] == "done" and done["step"] == STEPS
    assert done["weights_sha256"] == ref_done["weights_sha256"]
    assert done["loss"] == ref_done["loss"]

    before = [e["step"] for e in first if e["event"] == "step"]
    after = [e["step"] for e in second if e["event"] == "step"]
    assert before == list(range(1, stop + 1))  # nothing ran past the agreed stop step
    assert after == list(range(stop + 1, STEPS + 1))  # nothing repeated, nothing skipped
