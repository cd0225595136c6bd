"""The jobs ``slurm-spot sbatch --torchrun --fault-tolerant N`` submits (pure, but for
:func:`submit_fault_tolerant`): a torchft job as N + 1 Slurm batch jobs.

- **The lighthouse job**: one node of the on-demand partition ``--coordinator-partition P``
  runs ``slurm-spot lighthouse --job`` (a front door that lets in only the job's owner) at its
  NodeAddr, the first free of :data:`LIGHTHOUSE_PORT_TRIES` ports from
  :data:`LIGHTHOUSE_PORT_BASE` + job id % 1000 (never every interface),
  until none of its replica groups is pending or running (their ids are in its Comment,
  ``slurm-spot-ft-groups:ID,...``, set right after they are submitted). How it is started
  is :func:`lighthouse_launch`, the one place to change that.
- **One job per replica group** on ``-p``'s spot partition, ``--requeue`` like every
  ``slurm-spot sbatch`` job, one node, one process (``srun`` step: the watcher signals it
  there). Its nodes boot while the lighthouse's does (no ``--dependency`` on it: that made
  the two boots one after the other); its script waits up to :data:`LIGHTHOUSE_WAIT_S` for
  the lighthouse job to run.
  What requeues on an interruption is that group's job only (the watcher's and the
  reconciler's existing path for batch jobs); its next run heals from a live peer. ``sacct``
  counts each group's restarts; ``squeue`` shows ``NAME-lighthouse`` and ``NAME-g0``..
  ``NAME-g<N-1>``.

The groups share one checkpoint directory, the lighthouse job's (``<root>/<user>/<its id>``:
:func:`slurm_spot.contract.jobenv.ft_checkpoint_dir`), for when every group is lost.
docs/ml-engineer.md, "Fault-tolerant training", is the user's description.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_spot import __version__
from slurm_spot.config import SpotConfig
from slurm_spot.contract.names import (
    ENV_FT_CHECKPOINT_KEY,
    ENV_FT_GROUP,
    ENV_FT_HOST,
    ENV_FT_LIGHTHOUSE_JOB,
)
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.submit.sbatch import Submission, plan_submission, take_option
from slurm_spot.jobs.submit.torchrun_scripts import one_line, split_hetjob_options
from slurm_spot.resources import render_template
from slurm_spot.slurm.client import SlurmClient

#: The lighthouse of lighthouse job J listens on the first free port from
#: ``LIGHTHOUSE_PORT_BASE + J % 1000`` (after the rendezvous ports of heterogeneous jobs,
#: 30400..31399), trying LIGHTHOUSE_PORT_TRIES ports: two fault-tolerant jobs whose ids differ
#: by a multiple of 1000 may share a coordinator node. Its groups' relays try the same ports
#: and keep the one whose front door admits them for job J.
LIGHTHOUSE_PORT_BASE = 31400
LIGHTHOUSE_PORT_TRIES = 8
#: How long a group's script waits for its lighthouse job to run (seconds: a cloud node's boot).
LIGHTHOUSE_WAIT_S = 600
#: How long a group's relay keeps looking for its lighthouse's front door once the lighthouse
#: job runs (seconds: its Python is starting), before it exits 1 naming what each port said.
FRONT_DOOR_WAIT_S = 120
#: Most replica groups one ``--fault-tolerant`` submission makes.
MAX_GROUPS = 64
#: The lighthouse's timing (``slurm-spot lighthouse``'s options, milliseconds; the defaults of
#: slurm_spot.jobs.services.ft_lighthouse.LighthouseTimeouts): a group silent for
#: HEARTBEAT_TIMEOUT_MS is left out of the next quorum, which waits up to JOIN_TIMEOUT_MS for
#: a group that heartbeats but has not joined. The heartbeat timeout, below the join timeout,
#: is the survivors' pause after a group leaves (notice) or dies (no notice), against leaving
#: out for one quorum a group whose heartbeats stall that long (docs/ml-engineer.md).
JOIN_TIMEOUT_MS = 1000
HEARTBEAT_TIMEOUT_MS = 500
#: The Comment of the lighthouse job that names its groups.
GROUPS_COMMENT = "slurm-spot-ft-groups:"
#: The placeholder for the lighthouse job's id in the groups' options before it is known
#: (what ``--dry-run`` prints).
LIGHTHOUSE_JOB_PLACEHOLDER = "<lighthouse job id>"


def parse_groups(value: str) -> int:
    """``--fault-tolerant N``: the number of replica groups, 1..:data:`MAX_GROUPS`.

    Raises:
        BadInputError: anything else (names the option).
    """
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_GROUPS:
        raise BadInputError(f"--fault-tolerant={value}: expected the number of replica groups, "
                            f"1..{MAX_GROUPS}")
    return int(value)


def lighthouse_launch(python: str, min_replicas: int = 1) -> str:
    """The shell command that starts the lighthouse in the lighthouse job's script, where
    ``$addr`` (the node's NodeAddr) and ``$port`` are set: ``slurm-spot lighthouse --job``,
    torchft's lighthouse on 127.0.0.1 behind a front door on that address only, which lets in
    only the owner of this job (a MUNGE handshake: slurm_spot.jobs.services.ft_front_door).
    The groups reach it through ``slurm-spot lighthouse-relay`` (:func:`group_script`)."""
    return (f"{shlex.quote(python)} -m slurm_spot lighthouse --listen \"${{addr}}\" "
            f"--port \"${{port}}\" --port-tries {LIGHTHOUSE_PORT_TRIES} "
            f"--job \"${{SLURM_JOB_ID}}\" --min-replicas {min_replicas} "
            f"--join-timeout-ms {JOIN_TIMEOUT_MS} --heartbeat-timeout-ms {HEARTBEAT_TIMEOUT_MS}")


def lighthouse_script(python: str) -> str:
    """The lighthouse job's batch script (module docstring; pure)."""
    return render_template("ft-lighthouse.sh.j2", version=__version__,
                           port_base=LIGHTHOUSE_PORT_BASE, launch=lighthouse_launch(python))


def group_script(config: SpotConfig, script: str, args: Sequence[str], python: str,
                 env: Sequence[tuple[str, str]]) -> str:
    """A replica group's batch script (the same for every group: the group's name and its
    lighthouse job come in its environment; pure). ``env``: (name, value) exported first.

    Raises:
        BadInputError: ``python`` is not one line.
    """
    one_line("--python", python)
    command = " ".join(shlex.quote(w) for w in [str(Path(script).absolute()), *args])
    return render_template(
        "ft-group.sh.j2", version=__version__, wait_tries=LIGHTHOUSE_WAIT_S // 2,
        door_wait_s=FRONT_DOOR_WAIT_S, port_tries=LIGHTHOUSE_PORT_TRIES,
        python=shlex.quote(python), command=command,
        requeue_exit_code=config.preemption.requeue_exit_code, port_base=LIGHTHOUSE_PORT_BASE,
        env=[(k, shlex.quote(v)) for k, v in env], env_lighthouse_job=ENV_FT_LIGHTHOUSE_JOB,
        env_group=ENV_FT_GROUP, env_host=ENV_FT_HOST, env_checkpoint_key=ENV_FT_CHECKPOINT_KEY)


@dataclass
class FaultTolerantPlan:
    """What ``--fault-tolerant`` submits: the lighthouse job and one job per group, whose
    options name the lighthouse job by :data:`LIGHTHOUSE_JOB_PLACEHOLDER` until
    :meth:`group_options` is given its id."""

    lighthouse: Submission
    group: Submission
    group_names: list[str]
    warnings: list[str] = field(default_factory=list)

    def group_options(self, index: int, lighthouse_job: str = LIGHTHOUSE_JOB_PLACEHOLDER
                      ) -> list[str]:
        """Group ``index``'s sbatch options, with the lighthouse job's id filled in."""
        return [o.replace(LIGHTHOUSE_JOB_PLACEHOLDER, lighthouse_job)
                .replace("{group}", self.group_names[index]) for o in self.group.options]


def plan_fault_tolerant(config: SpotConfig, script: str, args: Sequence[str], python: str,
                        env: Sequence[tuple[str, str]], groups: int, coordinator: str,
                        options: Sequence[str], script_name: str, nproc_per_node: int,
                        environ: Mapping[str, str], expedite: bool = False
                        ) -> FaultTolerantPlan:
    """Plan the lighthouse job and the group jobs from the command line's sbatch
    ``options``: ``-p``, ``-N`` and what a node needs (``--gres``, ``-c``, ...) go to the
    groups only (the lighthouse runs on ``coordinator``, one node); ``-J NAME`` names them
    ``NAME-lighthouse`` and ``NAME-g<i>`` (default: the script's name); every other option
    (a ``--dependency`` too) goes to all of them.

    Raises:
        BadInputError: ``--nproc-per-node`` above 1 or ``-N`` above 1 (a group is one process on
            one node in this version), ``--export`` without ALL (the groups get their names
            through their environment), ``-p`` equal to ``coordinator``, ``--array``,
            ``-n/--ntasks`` or ``--ntasks-per-node`` other than 1, a value not one line. An
            empty ``-J`` is the default name.
    """
    if nproc_per_node != 1:
        raise BadInputError(f"--nproc-per-node={nproc_per_node} with --fault-tolerant: a "
                            "replica group is one process on one node in this version")
    partition, nodes, worker_options, rest = split_hetjob_options(options)
    if nodes is not None and nodes != "1":
        raise BadInputError(f"-N/--nodes {nodes} with --fault-tolerant: each replica group is "
                            "a one-node job; give the number of groups to --fault-tolerant")
    if partition is not None and partition == coordinator:
        raise BadInputError(f"--coordinator-partition={coordinator} is also the groups' "
                            "partition (-p): the lighthouse belongs on an on-demand partition")
    exports, rest = take_option(rest, "--export", "--export")
    if any("ALL" not in e.split(",") for e in exports):
        raise BadInputError("--export without ALL with --fault-tolerant: each group gets its "
                            "name and lighthouse through its environment; add ALL")
    for long, short in (("--ntasks", "-n"), ("--ntasks-per-node", "--ntasks-per-node")):
        tasks, rest = take_option(rest, long, short)
        if any(t.strip() != "1" for t in tasks):
            raise BadInputError(f"{long}={tasks[-1]} with --fault-tolerant: a replica group's "
                                "step runs one process on one node in this version (the "
                                "extra tasks would only hold CPUs); give the number of "
                                "groups to --fault-tolerant")
    arrays, rest = take_option(rest, "--array", "-a")
    if arrays:
        raise BadInputError(f"--array={arrays[-1]} with --fault-tolerant: each replica group "
                            "is one job and the lighthouse one job (an array would start a "
                            "lighthouse per task, on ports its groups do not look at, and "
                            "groups of the same name); submit one fault-tolerant job per "
                            "task instead")
    names, rest = take_option(rest, "--job-name", "-J")
    base = (names[-1] if names and names[-1].strip()
            else re.sub(r"[^A-Za-z0-9._+-]", "_", script_name) or "job")
    one_line("--job-name", base)
    dependencies, rest = take_option(rest, "--dependency", "-d")
    extra = ",".join(item for e in exports for item in e.split(",") if item and item != "ALL")
    lighthouse_options = [*rest, f"--partition={coordinator}", "--nodes=1",
                          f"--job-name={base}-lighthouse",
                          *[f"--dependency={d}" for d in dependencies[-1:]]]
    group_options = [
        *rest, *([f"--partition={partition}"] if partition else []), "--nodes=1",
        *[shlex.split(w)[0] for w in worker_options], "--job-name=" + base + "-{group}",
        *[f"--dependency={d}" for d in dependencies[-1:]],
        f"--export=ALL,{ENV_FT_GROUP}={{group}},{ENV_FT_LIGHTHOUSE_JOB}="
        f"{LIGHTHOUSE_JOB_PLACEHOLDER}" + (f",{extra}" if extra else "")]
    signal, lead = config.preemption.signal, config.preemption.lead_s
    lighthouse = plan_submission(lighthouse_script(python), f"{base}-lighthouse",
                                 lighthouse_options, [], signal, lead, env=environ,
                                 expedite=expedite)
    group = plan_submission(group_script(config, script, args, python, env), script_name,
                            group_options, [], signal, lead, env=environ, expedite=expedite)
    return FaultTolerantPlan(lighthouse, group, [f"g{i}" for i in range(groups)],
                             [*lighthouse.warnings, *group.warnings])


@dataclass
class FaultTolerantJobs:
    """The submitted job ids."""

    lighthouse: str
    groups: list[str]


def _job_id(stdout: str) -> str:
    words = stdout.strip().split()
    job = words[-1].split(";")[0] if words else ""
    if not job.isdigit():
        raise BadInputError(f"sbatch did not say which job it submitted: {stdout.strip()!r}")
    return job


def submit_fault_tolerant(slurm: SlurmClient, plan: FaultTolerantPlan) -> FaultTolerantJobs:
    """Submit the lighthouse job, then each group's, then name the groups in the lighthouse
    job's Comment (it stops once they are all gone).
    A group that sbatch refuses, or an interruption (Ctrl-C) before the end, cancels what
    was submitted before it.

    Raises:
        SlurmCommandError: sbatch or scontrol refused (its message).
    """
    lighthouse = _job_id(slurm.submit_batch(plan.lighthouse.script, plan.lighthouse.options,
                                            []).stdout)
    groups: list[str] = []
    try:
        for index in range(len(plan.group_names)):
            result = slurm.submit_batch(plan.group.script,
                                        plan.group_options(index, lighthouse), [])
            groups.append(_job_id(result.stdout))
        slurm.run("scontrol", "update", f"JobId={lighthouse}",
                  f"Comment={GROUPS_COMMENT}{','.join(groups)}")
    except BaseException:  # Ctrl-C too: a lighthouse job with no groups named would hold
        slurm.run("scancel", lighthouse, *groups, check=False)  # its node to the time limit
        raise
    return FaultTolerantJobs(lighthouse, groups)

