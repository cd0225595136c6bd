"""Replacements for an elastic job's lost nodes: one-node companion jobs that join its rendezvous.

The batch script of ``slurm-spot sbatch --torchrun --elastic MIN:MAX`` starts one agent per node
and, next to them, this supervisor (``python -m slurm_spot.jobs.injob.elastic_replacement``). Every
``--interval`` seconds it counts the job's agents that still run (the batch script's ``srun``
processes, ``--pids``) and its companion jobs that are pending or running; while that is fewer
than the nodes the job started with (``--target``, never more than MAX) it submits one more
companion: a one-node job on the job's partition (``$SLURM_JOB_PARTITION``) running the same
agent command with ``--rdzv-run-id <job>-<restart count>`` and the job's checkpoint directory.
Once it runs, its agent waits in the rendezvous; the running agents see a node waiting, restart
their workers (they save at the step boundary) and the next round includes it.

Why companion jobs, not growing the job itself: Slurm can only grow a running job by merging
another job's allocation into it (``--dependency=expand`` and ``scontrol update NumNodes=ALL``),
which still needs that second job, and then the batch script must source a resize script and
start a step on the new node; a companion job keeps the elastic job's own allocation as the
watcher already handles it (a departing node is released from it) and needs nothing but sbatch,
which the batch script may run as the job's user.

A companion:

- copies what the elastic job asked of each node from ``scontrol show job``: partition,
  account, QOS, reservation, time limit, ``--constraint`` (Features), ``--gres`` (TresPerNode;
  GPUs asked per job or per task become ``--gpus-per-node``),
  ``--mincpus``, ``--mem``/``--mem-per-cpu``, working directory, and writes to the job's own
  output and error files (``--open-mode=append``);
- is named ``<job name>+replacement`` with the comment ``slurm-spot replacement for job <job>``
  (``squeue``, ``sacct`` show which job it serves) and is submitted ``--no-requeue``: losing it
  just makes the supervisor request another one (the watcher does not requeue a
  ``--no-requeue`` job either: :mod:`slurm_spot.jobs.interruption.requeue`);
- never outlives the job: the supervisor cancels its companions when it is told to stop (the
  batch script's EXIT trap, or SIGTERM when Slurm ends the batch step), cancels those left over
  from an earlier run of the job when it starts, and a companion's agent exits by itself when
  the run's rendezvous is closed (training finished) or cannot form (``--join-timeout``).

Counting a pending companion as a node keeps the world at most MAX: the supervisor never has
more than ``target - running agents`` companions pending or running.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from slurm_spot.contract import jobenv
from slurm_spot.errors import SlurmCommandError
from slurm_spot.slurm.client import SlurmClient
from slurm_spot.slurm.jobtext import job_fields_with_user_text, split_job_records

#: The comment of a companion job of job N (what the supervisor looks for to clean up).
COMMENT = "slurm-spot replacement for job {job}"


def wanted(target: int, max_nodes: int, running_agents: int, live_companions: int) -> int:
    """How many companions to request now (pure): the nodes missing from ``target`` (capped at
    ``max_nodes``), less those already running and the companions pending or running; never
    negative."""
    return max(0, min(target, max_nodes) - running_agents - live_companions)


def _null(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A", "None") else value


def companion_options(job: Mapping[str, str], job_id: str, job_name: str, partition: str,
                      signal_value: str) -> list[str]:
    """sbatch options of a companion of the job whose ``scontrol -o show job`` fields are
    ``job`` (pure; see the module docstring).

    Args:
        job: the elastic job's fields (``job_fields_with_user_text`` of ``scontrol -o show job``).
        job_id: its id (array tasks: ``<array job>_<task>``).
        job_name: its name (``$SLURM_JOB_NAME``).
        partition: where the companion goes (``$SLURM_JOB_PARTITION``).
        signal_value: the companion's ``--signal`` (the job's, e.g. ``USR2@120``).
    """
    options = ["--parsable", "--no-requeue", "--nodes=1", "--ntasks=1",
               f"--partition={partition}", f"--job-name={job_name}+replacement",
               f"--comment={COMMENT.format(job=job_id)}", f"--signal={signal_value}",
               "--open-mode=append"]
    simple = {"Account": "--account", "QOS": "--qos", "Reservation": "--reservation",
              "TimeLimit": "--time", "Features": "--constraint", "MinCPUsNode": "--mincpus",
              "WorkDir": "--chdir", "StdOut": "--output", "StdErr": "--error"}
    for key, option in simple.items():
        value = _null(job.get(key))
        if value is not None and not (key == "TimeLimit" and value == "UNLIMITED"):
            options.append(f"{option}={value}")
    gres = [g.removeprefix("gres:").removeprefix("gres/")
            for g in (_null(job.get("TresPerNode")) or "").split(",") if g]
    if gres:
        options.append(f"--gres={','.join(gres)}")
    if not any(g.split(":")[0] == "gpu" for g in gres):
        gpus = _gpus_per_node(job)
        if gpus is not None:
            options.append(f"--gpus-per-node={gpus}")
    for key, option in (("MinMemoryNode", "--mem"), ("MinMemoryCPU", "--mem-per-cpu")):
        value = _null(job.get(key))
        if value is not None and value not in ("0", "0M"):
            options.append(f"{option}={value}")
    return options


def _gpus_per_node(job: Mapping[str, str]) -> str | None:
    """``[type:]count`` GPUs per node of a job that asked for them per task
    (``--gpus-per-task``: ``TresPerTask=gres:gpu:2``; one agent task per node) or per job
    (``--gpus``/``-G``: ``TresPerJob=gres:gpu:a100:16``, split over ``NumNodes``, the nodes
    it started with; rounded up); None when it asked for none (Slurm 22.05 ``scontrol show
    job``; 23.02+ writes ``gres/gpu:``)."""
    for key, per_job in (("TresPerTask", False), ("TresPerJob", True)):
        for item in (_null(job.get(key)) or "").split(","):
            parts = item.removeprefix("gres:").removeprefix("gres/").split(":")
            if parts[0] != "gpu":
                continue
            kind = parts[1] if len(parts) > 2 or (len(parts) == 2
                                                  and not parts[1].isdigit()) else None
            count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
            nodes = job.get("NumNodes", "1")
            if per_job and nodes.isdigit() and int(nodes) > 1:
                count = -(-count // int(nodes))
            return f"{kind}:{count}" if kind else str(count)
    return None


def companion_script(agent: Sequence[str], run_id: str, checkpoint_dir: str | None,
                     job_id: str) -> str:
    """The companion's batch script (pure): one ``srun`` step running ``agent`` (the elastic
    job's agent command) with ``--rdzv-run-id`` (and ``--checkpoint-dir``) added before its
    ``--``.

    Raises:
        ValueError: ``agent`` has no ``--`` before the training command.
    """
    import shlex

    if "--" not in agent:
        raise ValueError("the agent command has no '--' before the training command")
    cut = list(agent).index("--")
    extra = [f"--rdzv-run-id={run_id}"]
    if checkpoint_dir:
        extra.append(f"--checkpoint-dir={checkpoint_dir}")
    argv = [*agent[:cut], *extra, *agent[cut:]]
    return ("#!/bin/bash\n"
            f"# slurm-spot: replacement node for elastic job {job_id} (rendezvous {run_id})\n"
            f"echo \"slurm-spot: replacement ${{SLURM_JOB_ID}} on ${{SLURMD_NODENAME}} joins "
            f"job {job_id}\"\n"
            "srun --nodes=1 --ntasks=1 --kill-on-bad-exit=0 --job-name=agent "
            + " ".join(shlex.quote(w) for w in argv) + "\n")


def process_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (``/proc/<pid>/stat``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class Supervisor:
    """Keeps an elastic job at ``target`` nodes with companion jobs (see the module docstring).

    ``pids`` are the batch script's ``srun`` processes (one agent each); ``submit`` takes the
    companion's batch script and returns its job id (raises on failure); ``active`` tells whether
    a companion is pending or running; ``cancel`` cancels companions; ``say`` prints a line.
    """

    target: int
    max_nodes: int
    pids: list[int]
    submit: Callable[[], str]
    active: Callable[[str], bool]
    cancel: Callable[[list[str]], None]
    say: Callable[[str], None] = print
    alive: Callable[[int], bool] = process_alive
    companions: list[str] = field(default_factory=list)
    retry_at: float = 0.0

    def step(self, now: float) -> int:
        """One pass: forget ended companions, request what is missing (one per pass; after a
        failed sbatch, not again for 30 s). Returns how many were requested."""
        self.companions = [c for c in self.companions if self.active(c)]
        running = sum(1 for p in self.pids if self.alive(p))
        missing = wanted(self.target, self.max_nodes, running, len(self.companions))
        if not missing or now < self.retry_at:
            return 0
        try:
            companion = self.submit()
        except Exception as exc:  # sbatch refused or failed: the job goes on, try again later
            self.retry_at = now + 30
            self.say(f"slurm-spot: could not request a replacement node ({exc}); retrying in 30 s")
            return 0
        self.companions.append(companion)
        self.say(f"slurm-spot: replacement job {companion} requested ({running} agents "
                 f"running, {len(self.companions)} replacements pending or running, "
                 f"target {min(self.target, self.max_nodes)})")
        return 1

    def stop(self) -> None:
        """Cancel every companion still pending or running."""
        live = [c for c in self.companions if self.active(c)]
        if live:
            self.cancel(live)
            self.say(f"slurm-spot: cancelled replacement job(s) {','.join(live)}")
        self.companions = []


def _slurm_functions(client: SlurmClient, options: Callable[[], list[str]], script: str
                     ) -> tuple[Callable[[], str], Callable[[str], bool],
                                Callable[[list[str]], None]]:
    def submit() -> str:
        import tempfile

        argv = options()  # raises while the job cannot be read: the supervisor retries

        # sbatch sends the script's text to slurmctld: the file is not needed afterwards.
        with tempfile.TemporaryDirectory(prefix="slurm-spot-replacement-") as folder:
            path = os.path.join(folder, "replacement.sh")
            with open(path, "w") as out:
                out.write(script)
            result = client.run("sbatch", *argv, path, check=False)
        if result.returncode != 0:
            raise RuntimeError((result.stderr or result.stdout).strip() or
                               f"sbatch exited {result.returncode}")
        return result.stdout.strip().split(";")[0]

    def active(job: str) -> bool:
        try:
            record = client.job_record(job)
        except SlurmCommandError:
            return True  # slurmctld did not answer: keep counting it (never over MAX)
        return record is not None and record.state.is_active

    def cancel(jobs: list[str]) -> None:
        client.run("scancel", *jobs, check=False)

    return submit, active, cancel


def leftovers(squeue_lines: str, job_id: str) -> list[str]:
    """Companions of ``job_id`` in ``squeue -h -o '%i|%k'`` output (pure)."""
    comment = COMMENT.format(job=job_id)
    return [line.split("|", 1)[0] for line in squeue_lines.splitlines()
            if "|" in line and line.split("|", 1)[1].strip() == comment]


_STOP: list[int] = []


def _on_stop(signum: int, _frame: FrameType | None) -> None:
    _STOP.append(signum)


def main(argv: list[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(
        prog="slurm_spot.jobs.injob.elastic_replacement",
        description="Keep an elastic job at its node count with one-node companion jobs.")
    parser.add_argument("--target", type=int, required=True,
                        help="nodes the job started with (replacements refill to this)")
    parser.add_argument("--max", type=int, required=True, dest="max_nodes", help="MAX nodes")
    parser.add_argument("--pids", required=True, help="the agents' srun process ids")
    parser.add_argument("--signal", required=True, help="the companions' --signal value")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between passes")
    parser.add_argument("agent", nargs=argparse.REMAINDER,
                        help="-- the agent command of the job's steps")
    args = parser.parse_args(argv)
    agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if "--" not in agent:
        parser.error("give the agent command after '--' (it holds a '--' of its own)")
    pids = [int(p) for p in re.split(r"[\s,]+", args.pids.strip()) if p]
    job_id = jobenv.requeue_target(env)
    from slurm_spot.jobs.injob.torchrun_agent import elastic_run_id

    client = SlurmClient(os.environ.get(jobenv.ENV_SLURM_BIN_DIR, "/usr/bin"))
    say = lambda text: print(text, flush=True)  # noqa: E731
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, _on_stop)
    try:
        stale = client.run("squeue", "--me", "-h", "-o", "%i|%k", check=False)
        old = leftovers(stale.stdout, job_id) if stale.returncode == 0 else []
        if old:
            client.run("scancel", *old, check=False)
            say(f"slurm-spot: cancelled replacement job(s) {','.join(old)} of an earlier run")
    except SlurmCommandError as exc:  # slurmctld too slow: the job's replacements matter more
        say(f"slurm-spot: could not look for replacement jobs of an earlier run ({exc})")
    checkpoint = str(jobenv.checkpoint_dir(env) or "") or None
    known: list[list[str]] = []

    def options() -> list[str]:
        """The companion's options, from the job's record once it could be read (a companion
        built without it would lack the job's GPUs, memory, account and time limit)."""
        if not known:
            shown = client.run("scontrol", "-o", "show", "job", job_id, check=False)
            records = split_job_records(shown.stdout)
            try:
                fields = job_fields_with_user_text(records[0]) if records else {}
            except ValueError:  # its name and comment copy Slurm's fields (jobtext)
                fields = {}
            if shown.returncode != 0 or fields.get("JobId") is None:
                raise RuntimeError(f"cannot read job {job_id} (scontrol show job: "
                                   f"{(shown.stderr or shown.stdout).strip()[:200]})")
            known.append(companion_options(
                fields, job_id, env.get("SLURM_JOB_NAME", "elastic"),
                env.get("SLURM_JOB_PARTITION", fields.get("Partition", "")), args.signal))
        return known[0]

    try:
        options()
    except Exception as exc:  # read again before the first replacement
        say(f"slurm-spot: replacement check failed ({exc}); trying again")
    script = companion_script(agent, elastic_run_id(env), checkpoint, job_id)
    submit, active, cancel = _slurm_functions(client, options, script)
    supervisor = Supervisor(args.target, args.max_nodes, pids, submit, active, cancel, say)
    try:
        while not _STOP:
            try:
                supervisor.step(time.monotonic())
            except Exception as exc:  # one bad pass never ends the supervisor
                say(f"slurm-spot: replacement check failed ({exc}); trying again")
            if not any(process_alive(p) for p in pids):
                break
            deadline = time.monotonic() + args.interval
            while not _STOP and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        supervisor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
