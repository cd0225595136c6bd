"""Run examples/train_ft.py as real replica-group processes (torch on CPU, gloo, a real torchft
lighthouse on 127.0.0.1), without Slurm, and read what they print."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ft.py"


def events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a replica's stdout (other lines skipped)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def step_times(evs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, time) of every step event, in order."""
    return [(e["step"], e["time"]) for e in evs if e["event"] == "step"]


def max_gap(times: list[tuple[int, float]], within: tuple[float, float] | None = None) -> float:
    """The longest wait (seconds) between two consecutive step events, optionally only of
    pairs whose later step lies within ``within`` (start, end) times."""
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(times)
            if within is None or within[0] <= b[1] <= within[1]]
    return max(gaps, default=0.0)


@dataclass
class Replica:
    """One replica-group process and its output files (one pair per run)."""

    name: str
    folder: Path
    args: list[str]
    runs: int = 0
    proc: subprocess.Popen[bytes] | None = None
    outputs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        self.runs += 1
        out = self.folder / f"{self.name}.{self.runs}.out"
        err = self.folder / f"{self.name}.{self.runs}.err"
        self.outputs.append(out)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name in ("SLURM_SPOT_CHECKPOINT_DIR", "TORCHFT_MANAGER_PORT", "TORCHFT_LIGHTHOUSE"):
            env.pop(name, None)
        with open(out, "wb") as o, open(err, "wb") as e:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(EXAMPLE), "--replica-id", self.name, *self.args],
                stdout=o, stderr=e, env=env, cwd=self.folder)

    @property
    def current(self) -> Path:
        return self.outputs[-1]

    def last_step(self) -> int:
        steps = step_times(events(self.current))
        return steps[-1][0] if steps else -1

    def wait_step(self, step: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.last_step() < step:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode} before step "
                                     f"{step}: {self.stderr_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not at step {step} in {timeout_s} s "
                                     f"(at {self.last_step()}): {self.stderr_tail()}")
            time.sleep(0.05)

    def signal(self, number: int) -> float:
        assert self.proc is not None
        os.kill(self.proc.pid, number)
        return time.time()

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stderr_tail(self, lines: int = 15) -> str:
        path = self.current.with_suffix(".err")
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def reference(args: list[str]) -> dict[str, Any]:
    """The example's one-process run without torchft (``--reference``): its done event."""
    done = subprocess.run([sys.executable, str(EXAMPLE), "--reference", *args],
                          capture_output=True, text=True, timeout=600, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout.strip().splitlines()[-1])
