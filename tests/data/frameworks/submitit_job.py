"""A submitit job with its own checkpoint/requeue protocol (submitit.helpers.Checkpointable):
on SIGUSR2 submitit pickles the callable, with its step, runs ``scontrol requeue`` and exits;
the requeued job unpickles it and goes on. ``submit`` is run by the test in a subprocess whose
environment points at the local cluster (SLURM_CONF, PYTHONPATH with this directory)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import submitit


class Count(submitit.helpers.Checkpointable):
    """Counts ``steps`` steps of 0.25 s, logging each to ``<workdir>/events.jsonl``. On the
    signal its checkpoint takes ``checkpoint_s`` seconds, and its process then stays
    ``linger_s`` seconds after submitit's ``scontrol requeue`` (a thread the exit waits for,
    as a data loader's or a logger's would): a job still leaving its node when the watcher
    would power it down."""

    def __init__(self, workdir: str, steps: int, checkpoint_s: float = 0.0,
                 linger_s: float = 0.0) -> None:
        self.workdir = Path(workdir)
        self.steps = steps
        self.step = 0
        self.checkpoint_s = checkpoint_s
        self.linger_s = linger_s

    def checkpoint(self, *args: object, **kwargs: object) -> submitit.helpers.DelayedSubmission:
        """submitit's hook on the signal: the (slow) save, then submitit requeues the job."""
        self._event("checkpoint", step=self.step)
        time.sleep(self.checkpoint_s)
        if self.linger_s:  # not a daemon: sys.exit after the requeue waits for it
            threading.Thread(target=time.sleep, args=(self.linger_s,)).start()
        return super().checkpoint(*args, **kwargs)

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


def submit(folder: str, workdir: str, steps: int, checkpoint_s: float = 0.0,
           linger_s: float = 0.0) -> None:
    """Submit one Count job to partition spot; print its job id."""
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition="spot", nodes=1, tasks_per_node=1,
                               cpus_per_task=1, timeout_min=30)
    job = executor.submit(Count(workdir, steps, checkpoint_s, linger_s))
    print(job.job_id)


def result(folder: str, job_id: str, poll_s: int) -> None:
    """Wait for job ``job_id`` as submitit's own client does (``job.result()``, its sacct
    watcher polling at most every ``poll_s`` seconds), print its result; a failure it
    reports (``UncompletedJobError``, e.g. a NODE_FAIL record) raises, exit status 1."""
    submitit.SlurmJob.watcher = submitit.slurm.slurm.SlurmInfoWatcher(delay_s=poll_s)
    print(submitit.SlurmJob(folder=folder, job_id=job_id).result())


if __name__ == "__main__":
    if sys.argv[1] == "result":
        result(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        submit(sys.argv[1], sys.argv[2], int(sys.argv[3]), *(float(a) for a in sys.argv[4:6]))
