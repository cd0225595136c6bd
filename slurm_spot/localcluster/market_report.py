"""What jobs went through under the chaos market, and their goodput next to
``slurm-spot simulate``'s prediction for the same settings.

Read from three places: the market's own log (:mod:`.marketd`: each interruption, applied or
not, with the jobs on the node; each capacity outage), slurm-spot's events since the market
started (``launch_failed`` with a capacity code, ``failover``/``failover_started``,
``requeued``) and Slurm (the job's state, restarts, submit and end times).

Goodput (:func:`measured_goodput`) is the job's compute seconds without interruptions (given:
only the job knows them) over its wall seconds from its first submission to its end (now while
it runs); Slurm resets SubmitTime on a requeue, so the first submission is the earliest of
SubmitTime and the first event that names the job.
The prediction (:func:`predict`) runs :func:`slurm_spot.cost.simulator.simulate` twice with
the market's rate as the node rate: every interruption with the notice (strategy
``slurm-spot``: checkpoint on notice, replacement booted during it), and every interruption
without one (strategy ``periodic``: the reconciler detects the loss within its interval, then
boot, restart, last periodic checkpoint); the predicted wall is their mean weighted by the
market's share with notice (to first order, exact: each interruption costs what its kind
costs), plus one boot and restart for the first start, which the simulator leaves out. With
different settings per node set, the prediction uses their mean: the job may run on any.
Capacity outages are not in the simulator: their cost shows as measured minus predicted.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from slurm_spot.config import SpotConfig
from slurm_spot.cost.simulator import SimParams, simulate
from slurm_spot.errors import BadInputError
from slurm_spot.events import Action, read_events
from slurm_spot.localcluster.market import CAPACITY, INTERRUPT, NodeSetMarket
from slurm_spot.localcluster.marketd import MarketPaths, read_plan, running
from slurm_spot.providers import capacity_codes
from slurm_spot.providers.base import normalize_code
from slurm_spot.recovery import slurm_time


@dataclass(frozen=True)
class PredictionInputs:
    """What the simulator needs beyond the market: seconds (``interval_s`` None: Daly's)."""

    compute_s: float
    nodes: int
    checkpoint_s: float = 1.0
    interval_s: float | None = None
    restart_s: float = 15.0
    boot_s: float = 5.0
    detect_s: float = 5.0
    runs: int = 200


def read_log(config: SpotConfig) -> list[dict]:
    """The market's log lines (:mod:`.marketd`), oldest first; [] if none."""
    path = MarketPaths.of(config).log
    try:
        text = path.read_text()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return lines


def _job_fields(config: SpotConfig, job_id: int) -> dict[str, str]:
    from slurm_spot.slurm.client import SlurmClient
    from slurm_spot.slurm.jobtext import job_fields_with_user_text, split_job_records

    result = SlurmClient(config.slurm_bin_dir).run("scontrol", "-o", "show", "job",
                                                   str(job_id), check=False)
    records = split_job_records(result.stdout) if result.returncode == 0 else []
    try:
        return job_fields_with_user_text(records[0]) if records else {}
    except ValueError:
        return {}


def measured_goodput(compute_s: float, fields: dict[str, str], now: float | None = None,
                     first_seen: float | None = None) -> tuple[float | None, float | None]:
    """``(wall seconds, goodput)`` of a job from its ``scontrol show job`` fields: wall from
    its first submission to EndTime (``now`` while it has not ended), goodput
    ``compute_s / wall``; ``(None, None)`` when neither time is known. Slurm resets
    SubmitTime when it requeues a job, so the first submission is the earlier of SubmitTime
    and ``first_seen`` (epoch seconds: the first event or market line that named the job)."""
    times = [t for t in (slurm_time(fields.get("SubmitTime")), first_seen) if t is not None]
    if not times:
        return None, None
    submit = min(times)
    end = slurm_time(fields.get("EndTime")) if fields.get("JobState") in (
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") else None
    wall = (end if end is not None else (now or time.time())) - submit
    return wall, (compute_s / wall if wall > 0 else None)


def simulate_command(market: NodeSetMarket, inputs: PredictionInputs, notice: bool) -> str:
    """The ``slurm-spot simulate`` command line of one half of the prediction."""
    parts = [f"slurm-spot simulate --nodes {inputs.nodes} "
             f"--job-hours {inputs.compute_s / 3600:.6g} --checkpoint-s {inputs.checkpoint_s:g} "
             f"--restart-s {inputs.restart_s:g} --boot-s {inputs.boot_s:g} "
             f"--mtbf-h {1 / market.rate_per_h:.6g}"]
    if inputs.interval_s is not None:
        parts.append(f"--interval-s {inputs.interval_s:g}")
    if notice:
        parts.append(f"--notice-s {market.notice_s:g} --strategy slurm-spot")
    else:
        parts.append("--notice-s 0 --strategy periodic")
    return " ".join(parts)


def mean_market(markets: Sequence[NodeSetMarket]) -> NodeSetMarket:
    """One market with the mean rate, share and notice of ``markets`` (those with a rate).

    Raises:
        BadInputError: no market has an interruption rate.
    """
    rated = [m for m in markets if m.rate_per_h > 0]
    if not rated:
        raise BadInputError("no node set of the market has an interruption rate: nothing to "
                            "predict")
    return NodeSetMarket(
        "+".join(m.node_set for m in rated),
        rate_per_h=statistics.fmean(m.rate_per_h for m in rated),
        notice_share=statistics.fmean(m.notice_share for m in rated),
        notice_s=statistics.fmean(m.notice_s for m in rated))


def predict(markets: Sequence[NodeSetMarket], inputs: PredictionInputs,
            seed: int = 0) -> dict[str, object]:
    """``slurm-spot simulate``'s goodput for a job under ``markets`` (module docstring).

    Returns ``goodput``, ``wall_s`` (mean), each half's goodput and command line.

    Raises:
        BadInputError: no rate, or settings the simulator refuses (its message).
    """
    market = mean_market(markets)
    halves: dict[str, dict[str, object]] = {}
    walls: dict[str, float] = {}
    for notice, strategy in ((True, "slurm-spot"), (False, "periodic")):
        params = SimParams(
            nodes=inputs.nodes, job_hours=inputs.compute_s / 3600,
            checkpoint_s=inputs.checkpoint_s, restart_s=inputs.restart_s,
            interval_s=inputs.interval_s, notice_s=market.notice_s if notice else 0.0,
            boot_s=inputs.boot_s, detect_s=inputs.detect_s, node_rate_per_h=market.rate_per_h)
        _base, (result,) = simulate(params, (strategy,), inputs.runs, seed)
        key = "with_notice" if notice else "without_notice"
        walls[key] = result.wall_h.mean * 3600
        halves[key] = {"strategy": strategy, "goodput": round(result.goodput.mean, 4),
                       "interruptions": round(result.interruptions.mean, 2),
                       "command": simulate_command(market, inputs, notice)}
    share = market.notice_share
    wall = (share * walls["with_notice"] + (1 - share) * walls["without_notice"]
            + inputs.boot_s + inputs.restart_s)
    return {"goodput": round(inputs.compute_s / wall, 4), "wall_s": round(wall, 1),
            "node_rate_per_h": market.rate_per_h, "notice_share": share,
            "notice_s": market.notice_s, **halves,
            "note": "capacity outages are not simulated"}


def _extra(event: dict) -> dict:
    extra = event.get("extra")
    return extra if isinstance(extra, dict) else {}


def _capacity_error(event: dict, codes: frozenset[str]) -> bool:
    code = str(_extra(event).get("code") or "")
    reason = str(event.get("reason") or "")
    return normalize_code(code) in codes or any(c.lower() in reason.lower() for c in codes)


def _job_ids(event: dict) -> list[int]:
    return [int(j) for j in event.get("job_ids") or [] if str(j).isdigit()]


def report(config: SpotConfig, job_ids: Iterable[int] | None = None,
           compute_s: float | None = None,
           inputs: PredictionInputs | None = None) -> dict[str, object]:
    """What the market did and what each job went through (module docstring).

    ``job_ids``: the jobs to report (default: every job an interruption or failover hit).
    ``compute_s``: the job's compute seconds without interruptions; with it and one job, the
    measured goodput and the prediction (``inputs``, defaults from the config) are added.

    Raises:
        BadInputError: no market was started on this cluster, or ``compute_s`` without
            exactly one job.
    """
    plan = read_plan(config)
    if not plan:
        raise BadInputError(f"no market was started on the local cluster of "
                            f"{config.source_path}: 'slurm-spot local market start' first")
    log = read_log(config)
    markets = [NodeSetMarket(**m) for m in plan["markets"]]
    since = datetime.fromtimestamp(float(plan["started"]) - 1, timezone.utc)
    seen = [e for e in read_events(config.log_dir, since=since)
            if (t := e.get("time")) and datetime.fromisoformat(str(t)) >= since]
    codes = frozenset(normalize_code(c) for c in capacity_codes())
    hits = [e for e in log if e.get("kind") == INTERRUPT and e.get("applied")]
    capacity_errors = [e for e in seen if e.get("action") == Action.LAUNCH_FAILED
                       and _capacity_error(e, codes)]
    failovers = [e for e in seen if e.get("action") == Action.FAILOVER]
    started_on = [e for e in seen if e.get("action") == Action.FAILOVER_STARTED]
    wanted = sorted(set(job_ids) if job_ids is not None else
                    {j for e in hits + failovers for j in _job_ids(e)})
    if compute_s is not None and len(wanted) != 1:
        raise BadInputError("goodput needs exactly one job: give --job with --compute-s")
    jobs = []
    for job in wanted:
        fields = _job_fields(config, job)
        mine = [e for e in hits if job in _job_ids(e)]
        requeued = [e for e in seen if e.get("action") == Action.REQUEUED and job in _job_ids(e)]
        moves = [{"from": _extra(e).get("from_node_set"), "to": _extra(e).get("node_set"),
                  "seconds_from_error": _extra(e).get("seconds_from_error")}
                 for e in started_on if job in _job_ids(e)]
        moved = [e for e in failovers if job in _job_ids(e)]
        entry: dict[str, object] = {
            "job_id": job, "state": fields.get("JobState"),
            "interruptions_with_notice": sum(1 for e in mine if e.get("notice_s")),
            "interruptions_without_notice": sum(1 for e in mine if not e.get("notice_s")),
            "failovers": max(len(moved), len(moves)), "failed_over_to": moves,
            "requeues": max(int(fields.get("Restarts", "0") or 0), len(requeued)),
        }
        if compute_s is not None:
            named = [datetime.fromisoformat(str(e["time"])).timestamp()
                     for e in [*seen, *log] if "time" in e and job in _job_ids(e)]
            wall, goodput = measured_goodput(compute_s, fields,
                                             first_seen=min(named) if named else None)
            entry.update(compute_s=compute_s, wall_s=None if wall is None else round(wall, 1),
                         goodput=None if goodput is None else round(goodput, 4))
        jobs.append(entry)
    result: dict[str, object] = {
        "seed": plan["seed"], "duration_s": plan.get("duration_s"),
        "running": running(plan), "markets": plan["markets"],
        "elapsed_s": round(min(time.time(), _end(log, plan)) - float(plan["started"]), 1),
        "interruptions": {
            "with_notice": sum(1 for e in hits if e.get("notice_s")),
            "without_notice": sum(1 for e in hits if not e.get("notice_s")),
            "not_applied": sum(1 for e in log if e.get("kind") == INTERRUPT
                               and not e.get("applied")),
        },
        "capacity_outages": sum(1 for e in log if e.get("kind") == CAPACITY
                                and e.get("available") is False),
        "capacity_errors": len(capacity_errors),
        "failovers": len(failovers),
        "jobs": jobs,
    }
    if compute_s is not None and wanted:
        inputs = inputs or default_inputs(config, compute_s, job_nodes(config, wanted[0]))
        try:
            result["prediction"] = predict(markets, inputs, int(plan["seed"]))
        except BadInputError as exc:
            result["prediction"] = {"error": str(exc)}
    return result


def _end(log: list[dict], plan: dict) -> float:
    """When the market ended (its last line's time), else now."""
    last = log[-1] if log else {}
    if last.get("kind") in ("ended", "stopped") and not running(plan):
        return datetime.fromisoformat(str(last["time"])).timestamp()
    return math.inf


def job_nodes(config: SpotConfig, job_id: int) -> int:
    try:
        return max(1, int(_job_fields(config, job_id).get("NumNodes", "1").split("-")[0]))
    except ValueError:
        return 1


def default_inputs(config: SpotConfig, compute_s: float, nodes: int,
                   **overrides: float | None) -> PredictionInputs:
    """The prediction's inputs from the config: boot = the local provider's boot delay + 3 s
    (slurmd's registration), detection = the reconciler's interval; ``overrides`` (None
    values ignored) replace any field."""
    from slurm_spot.config import LocalProviderConfig

    local = [p for p in config.providers.values() if isinstance(p, LocalProviderConfig)]
    boot = (local[0].boot_delay_s if local else 2.0) + 3.0
    fields: dict[str, float | int | None] = {
        "compute_s": compute_s, "nodes": nodes, "boot_s": boot,
        "detect_s": float(config.reconcile.interval_s)}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return PredictionInputs(**fields)  # type: ignore[arg-type]


def summary_lines(data: dict[str, object]) -> list[str]:
    """The human text of :func:`report`."""
    got = data["interruptions"]
    assert isinstance(got, dict)
    state = "running" if data["running"] else "ended"
    lines = [f"market (seed {data['seed']}) {state} after {data['elapsed_s']} s: "
             f"{got['with_notice']} interruption(s) with notice, {got['without_notice']} "
             f"without, {got['not_applied']} on nodes with no instance; "
             f"{data['capacity_outages']} capacity outage(s), {data['capacity_errors']} "
             f"capacity error(s), {data['failovers']} failover(s)"]
    for job in data["jobs"]:  # type: ignore[attr-defined]
        moves = ", ".join(f"{m['from']}->{m['to']}" for m in job["failed_over_to"])
        lines.append(f"job {job['job_id']} ({job['state']}): "
                     f"{job['interruptions_with_notice']} with notice, "
                     f"{job['interruptions_without_notice']} without, {job['failovers']} "
                     f"failover(s){' (' + moves + ')' if moves else ''}, "
                     f"{job['requeues']} requeue(s)")
        if "goodput" in job:
            lines.append(f"  goodput measured {job['goodput']} ({job['compute_s']:g} s of "
                         f"compute in {job['wall_s']} s from submission)")
    prediction = data.get("prediction")
    if isinstance(prediction, dict):
        if "error" in prediction:
            lines.append(f"  simulate: {prediction['error']}")
        else:
            lines.append(f"  goodput simulated {prediction['goodput']} (wall "
                         f"{prediction['wall_s']} s; {prediction['note']}); the same with:")
            for key in ("with_notice", "without_notice"):
                lines.append(f"    {prediction[key]['command']}")
    return lines
