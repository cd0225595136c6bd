"""A submitit job with its own checkpoint/requeue protocol (submitit.helpers.Checkpointable):
on SIGUSR2 submitit pickles the callable, with its step, runs ``scontrol requeue`` and exits;
the requeued job unpickles it and goes on. ``submit`` is run by the test in a subprocess whose
environment points at the local cluster (SLURM_CONF, PYTHONPATH with this directory)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import submitit


class Count(submitit.helpers.Checkpointable):
    """Counts ``steps`` steps of 0.25 s, logging each to ``<workdir>/events.jsonl``."""

    def __init__(self, workdir: str, steps: int) -> None:
        self.workdir = Path(workdir)
        self.steps = steps
        self.step = 0

    def _event(self, name: str, **fields: object) -> None:
        with open(self.workdir / "events.jsonl", "a") as fh:
            fh.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")

    def __call__(self) -> int:
        self._event("start", step=self.step, restart=int(os.environ.get("SLURM_RESTART_COUNT", 0)))
        while self.step < self.steps:
            time.sleep(0.25)
            self.step += 1
            self._event("step", step=self.step)
        self._event("done", step=self.step)
        return self.step


def submit(folder: str, workdir: str, steps: int) -> None:
    """Submit one Count job to partition spot; print its job id."""
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition="spot", nodes=1, tasks_per_node=1,
                               cpus_per_task=1, timeout_min=30)
    job = executor.submit(Count(workdir, steps))
    print(job.job_id)


if __name__ == "__main__":
    submit(sys.argv[1], sys.argv[2], int(sys.argv[3]))
