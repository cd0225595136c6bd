"""Recovery from one interruption, broken down into its parts (pure; for ``slurm-spot demo``
and ``benchmarks/prewarm_recovery.py``).

The parts, each in seconds, from the sources that know them best:

=========================  ==================================================================
``notice_to_signal_s``     the notice (when the demo published it) to the watcher's
                           ``signalled`` event for the job (events.jsonl)
``signal_to_exit_s``       to the training's ``preempted`` line: the checkpoint is committed
                           and the job leaves (requeue, exit 85)
``exit_to_requeue_s``      to the job's ``EligibleTime`` (``scontrol show job``): requeued and
                           its ~121 s requeue hold cleared (expedited)
``requeue_to_allocation_s`` to its ``StartTime``: slurmctld allocated nodes to it
``allocation_to_start_s``  to the training's ``started``: prolog, srun, torchrun, Python and
                           torch imports on the new nodes
``start_to_first_step_s``  to the first ``step`` line of the resumed run: process group,
                           checkpoint restore, one step
=========================  ==================================================================

Without notice (a kill) the interruption itself stands for notice, signal and exit. Slurm's
times have a resolution of one second (the two parts beside them carry that error, their sum
does not). ``exit_to_first_step_s`` is the figure the < 10 s target is about.

``allocation_to_start_s`` and ``start_to_first_step_s`` are split further
(:data:`STARTUP_PARTS`, from :func:`startup_times` and the training's ``--timestamps``
fields; where a node's figure is taken, the latest of the job's nodes, the one the first step
waits for):

==========================  =================================================================
``allocation_to_launch_s``  ``StartTime`` to slurmd's ``Launching batch job`` line (its log,
                            milliseconds): slurmctld's launch RPC and the Prolog on the batch
                            node (slurmd logs that line after the Prolog, src/slurmd/slurmd/
                            req.c ``_rpc_batch_job``); carries StartTime's 1 s resolution
``launch_to_batch_s``       to the batch script's first line (``at $EPOCHREALTIME``):
                            slurmstepd, the batch step's TaskProlog, bash
``batch_to_step_s``         to slurmd's ``launch task StepId=<job>.0`` line: srun creating the
                            job step
``step_to_agent_s``         to the torchrun agent's ``agent started at`` line: slurmstepd, the
                            Prolog of a node that is not the batch node, the TaskProlog,
                            Python's start and the agent's own imports
``agent_s``                 to the worker process's start (``process_started``, from /proc):
                            the agent imports torch and forms the rendezvous
``worker_s``                to the worker's ``main()`` (``started``): a new interpreter and
                            the script's imports, or (warm) a fork of the preloaded server
``gloo_s``                  to ``process_group``: ``init_process_group("gloo")``
``setup_s``                 to ``restoring``: data set, model, DDP's first broadcast
``restore_s``               to the ``start``/``resume`` line: the checkpoint read
``first_step_s``            to the first ``step`` line: one training step
==========================  =================================================================
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

from slurm_spot.hostlist import expand

PARTS = ("notice_to_signal_s", "signal_to_exit_s", "exit_to_requeue_s",
         "requeue_to_allocation_s", "allocation_to_start_s", "start_to_first_step_s")

#: The parts of allocation -> first step, in order (the module docstring).
STARTUP_PARTS = ("allocation_to_launch_s", "launch_to_batch_s", "batch_to_step_s",
                 "step_to_agent_s", "agent_s", "worker_s", "gloo_s", "setup_s", "restore_s",
                 "first_step_s")

#: slurmd's two lines: 22.05 and 24.11 say ``Launching batch job 12 for UID 0``, 26.05
#: ``Launching batch JobId=12 SLUID=... for UID 0`` (seen in the matrix's 26.05 root).
_SLURMD_LINE = re.compile(r"^\[(?P<time>[0-9T:.-]+)\] (?:Launching batch (?:job |JobId=)"
                          r"(?P<batch>[0-9]+) |launch task StepId=(?P<step>[0-9]+)\.0 )")
_BATCH_LINE = re.compile(r"^slurm-spot: (?:elastic )?job (?P<job>[0-9]+) restart [0-9]+ on \S+ "
                         r"at (?P<time>[0-9]+(?:\.[0-9]+)?)$")
_AGENT_LINE = re.compile(r"^slurm-spot: agent started at (?P<time>[0-9]+(?:\.[0-9]+)?) ")


def process_started(pid: int | str = "self") -> float | None:
    """When process ``pid`` started (forked), in seconds since the epoch, from its
    ``starttime`` in ``/proc/<pid>/stat`` (clock ticks since boot, proc(5)) and
    ``/proc/uptime``: 10 ms resolution. None where there is no such file (not Linux, the
    process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counting from 1 with pid
    return round(time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK")), 3)


def startup_times(job_id: int, since: float, output: Iterable[str],
                  slurmd_logs: Iterable[str]) -> dict[str, float]:
    """The start-up times of job ``job_id``'s run that began after ``since`` (epoch s), each
    the latest one seen (over the job's nodes):

    - ``batch_launch``: slurmd's ``Launching batch job <job>`` line, from ``slurmd_logs`` (the
      text of slurmd log files, whose ``[2026-12-01T07:20:01.123]`` times are local time);
    - ``step_launch``: slurmd's ``launch task StepId=<job>.0`` line, from them too;
    - ``batch_start``: the batch script's ``slurm-spot: job <job> restart R on NODES at T``
      line, from ``output`` (the job's output lines);
    - ``agent_started``: a torchrun agent's ``slurm-spot: agent started at T`` line there.

    Times before ``since`` (an earlier run's) are left out; a time not found is missing
    from the answer.
    """
    found: dict[str, float] = {}

    def keep(name: str, at: float) -> None:
        if at >= since and at > found.get(name, float("-inf")):
            found[name] = at

    for text in slurmd_logs:
        for line in text.splitlines():
            match = _SLURMD_LINE.match(line)
            if match is None or str(job_id) not in (match["batch"], match["step"]):
                continue
            try:
                at = datetime.fromisoformat(match["time"]).timestamp()
            except ValueError:
                continue
            keep("batch_launch" if match["batch"] else "step_launch", at)
    for line in output:
        batch = _BATCH_LINE.match(line.strip())
        if batch is not None and batch["job"] == str(job_id):
            keep("batch_start", float(batch["time"]))
        agent = _AGENT_LINE.match(line.strip())
        if agent is not None:
            keep("agent_started", float(agent["time"]))
    return found


def slurm_time(value: str | None) -> float | None:
    """Seconds since the epoch of a Slurm time (``2026-12-01T07:20:01``, local time, as
    ``scontrol show job`` prints it), or None for ``Unknown``/``None``/empty."""
    if not value or value in ("Unknown", "None", "(null)"):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _gap(later: float | None, earlier: float | None, digits: int = 1) -> float | None:
    if later is None or earlier is None:
        return None
    return round(later - earlier, digits)


def breakdown(kind: str, interrupted_at: float, step_at_notice: int,
              training: Iterable[Mapping[str, object]], watch: Iterable[Mapping[str, object]],
              job: Mapping[str, str], job_id: int,
              startup: Mapping[str, float] | None = None) -> dict[str, object]:
    """The parts of one recovery (see the module docstring).

    Args:
        kind: ``notice`` or ``kill``.
        interrupted_at: when the notice was published or the instance killed (epoch s).
        step_at_notice: the last training step seen at that moment.
        training: the job's JSON lines (``--timestamps``) from after ``interrupted_at``.
        watch: events.jsonl records (the watcher's ``signalled``/``prewarm``) since then.
        job: ``scontrol show job`` fields read once the job runs again.
        job_id: the job.
        startup: :func:`startup_times` of the resumed run (None: not known).

    Returns:
        ``{part: seconds or None, "exit_to_first_step_s", "steps_after_notice", "prewarmed",
        "replacements", "nodes_after", "landed_on_replacement", "startup": {startup part:
        seconds or None}}`` (:data:`PARTS`, :data:`STARTUP_PARTS`).
    """
    events = [e for e in training if isinstance(e.get("time"), (int, float))]
    exit_at: float | None = interrupted_at
    signal_at: float | None = None
    steps_after: int | None = None
    prewarmed = False
    replacements: list[str] = []
    for record in watch:
        if job_id not in (record.get("job_ids") or []):  # type: ignore[operator]
            continue
        extra = record.get("extra") or {}
        assert isinstance(extra, Mapping)
        if record.get("action") == "signalled" and signal_at is None:
            signal_at = datetime.fromisoformat(str(record["time"])).timestamp()
            prewarmed = bool(extra.get("prewarmed"))
            replacements = list(extra.get("replacements") or [])
    if kind == "notice":
        preempted = [e for e in events if e.get("event") == "preempted"]
        exit_at = float(preempted[0]["time"]) if preempted else None  # type: ignore[arg-type]
        if preempted:
            steps_after = int(preempted[0]["step"]) - step_at_notice  # type: ignore[call-overload]
    resumed = [e for e in events if e.get("event") in ("resume", "start")]
    started = float(resumed[-1]["started"]) if resumed and "started" in resumed[-1] else None  # type: ignore[arg-type]
    first_step = None
    if resumed:
        after = [e for e in events if e.get("event") == "step"
                 and float(e["time"]) >= float(resumed[-1]["time"])]  # type: ignore[arg-type]
        first_step = float(after[0]["time"]) if after else None  # type: ignore[arg-type]
    eligible, allocated = slurm_time(job.get("EligibleTime")), slurm_time(job.get("StartTime"))
    last = resumed[-1] if resumed else {}
    times = dict(startup or {})

    def field(name: str) -> float | None:
        value = last.get(name)
        return float(value) if isinstance(value, (int, float)) else None

    chain = [allocated, times.get("batch_launch"), times.get("batch_start"),
             times.get("step_launch"), times.get("agent_started"), field("process_started"),
             started, field("process_group"), field("restoring"), field("time"), first_step]
    startup_parts = {part: _gap(chain[i + 1], chain[i], 2) for i, part in enumerate(STARTUP_PARTS)}
    nodes_after = job.get("NodeList", "")
    landed = bool(replacements) and bool(
        set(replacements) & set(expand(nodes_after) if nodes_after else []))
    notice_at = interrupted_at if kind == "notice" else None
    return {
        "notice_to_signal_s": _gap(signal_at, notice_at),
        "signal_to_exit_s": _gap(exit_at, signal_at) if kind == "notice" else None,
        "exit_to_requeue_s": _gap(eligible, exit_at),
        "requeue_to_allocation_s": _gap(allocated, eligible),
        "allocation_to_start_s": _gap(started, allocated),
        "start_to_first_step_s": _gap(first_step, started),
        "exit_to_first_step_s": _gap(first_step, exit_at),
        "steps_after_notice": steps_after,
        "prewarmed": prewarmed,
        "replacements": replacements,
        "nodes_after": nodes_after,
        "landed_on_replacement": landed,
        "startup": startup_parts,
    }
