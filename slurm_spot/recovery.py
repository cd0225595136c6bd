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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from slurm_spot.hostlist import expand

PARTS = ("notice_to_signal_s", "signal_to_exit_s", "exit_to_requeue_s",
         "requeue_to_allocation_s", "allocation_to_start_s", "start_to_first_step_s")


def slurm_time(value: str | None) -> float | None:
    """Seconds since the epoch of a Slurm time (``2026-12-01T07:20:01``, local time, as
    ``scontrol show job`` prints it), or None for ``Unknown``/``None``/empty."""
    if not value or value in ("Unknown", "None", "(null)"):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _gap(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round(later - earlier, 1)


def breakdown(kind: str, interrupted_at: float, step_at_notice: int,
              training: Iterable[Mapping[str, object]], watch: Iterable[Mapping[str, object]],
              job: Mapping[str, str], job_id: int) -> dict[str, object]:
    """The parts of one recovery (see the module docstring).

    Args:
        kind: ``notice`` or ``kill``.
        interrupted_at: when the notice was published or the instance killed (epoch s).
        step_at_notice: the last training step seen at that moment.
        training: the job's JSON lines (``--timestamps``) from after ``interrupted_at``.
        watch: events.jsonl records (the watcher's ``signalled``/``prewarm``) since then.
        job: ``scontrol show job`` fields read once the job runs again.
        job_id: the job.

    Returns:
        ``{part: seconds or None, "exit_to_first_step_s", "steps_after_notice", "prewarmed",
        "replacements", "nodes_after", "landed_on_replacement"}``.
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
            replacements = list(extra.get("replacements") or [])  # type: ignore[call-overload]
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
    }
