"""Recovery from an interruption, part by part, with and without prewarming the replacement.

Method: for each scenario a fresh local cluster (``slurm-spot demo``'s: 4 one-CPU local nodes,
reconciler every 5 s) runs one long 2-node torchrun job (examples/train_digits.py, DDP over
gloo, 0.25 s per step, a checkpoint every 40 steps) and interrupts its first node ``--reps``
times, the first at step 50 and each next one 60 steps after the last resume:

- ``notice``: ``slurm-spot local preempt NODE --notice N`` (the watcher acts, the instance is
  killed after N s), with ``preemption.prewarm`` on and off;
- ``kill``: ``--notice 0`` (no notice: the reconciler acts; prewarm plays no part).

Each recovery is broken into notice -> signal -> job exit -> requeue -> allocation -> job start
-> first resumed step (:mod:`slurm_spot.recovery`); the table shows the median over the
repetitions of each part, so the parts need not add up to the median total. Scenarios: a
local node's simulated boot of 5 s with a 30 s notice, and 90 s (a cloud GPU node boots in
60-180 s) with a 120 s notice. The target: < 10 s from the job's exit to its first resumed
step, 0 steps lost, at least as many steps trained between notice and exit as without prewarm.

Usage (repository root, slurm-wlm and munge installed; each scenario holds
/tmp/slurm-spot-test-cluster.lock while its cluster runs, so other users' tests interleave)::

    python benchmarks/prewarm_recovery.py [--reps 3] [--reps-slow 2] [--only 5s-on,...]
        [--json-out FILE] [--from-json FILE] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from slurm_spot.localcluster.demo import Demo, DemoSettings  # noqa: E402
from slurm_spot.recovery import PARTS  # noqa: E402
from tests.cluster import acquire_cluster_lock  # noqa: E402

BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- prewarm:begin -->", "<!-- prewarm:end -->"
#: name -> (kind, boot delay s, notice s, prewarm, slow)
SCENARIOS = {
    "5s-on": ("notice", 5.0, 30.0, True, False),
    "5s-off": ("notice", 5.0, 30.0, False, False),
    "5s-kill": ("kill", 5.0, 0.0, True, False),
    "90s-on": ("notice", 90.0, 120.0, True, True),
    "90s-off": ("notice", 90.0, 120.0, False, True),
}
COLUMNS = (*PARTS, "exit_to_first_step_s", "steps_after_notice", "lost_steps")


def run_scenario(name: str, reps: int) -> dict[str, object]:
    kind, boot_s, notice_s, prewarm, _slow = SCENARIOS[name]
    workdir = Path(tempfile.mkdtemp(prefix=f"prewarm-{name}-"))
    settings = DemoSettings(workdir=workdir, boot_delay_s=boot_s, notice_s=notice_s or 30.0,
                            prewarm=prewarm, first_at_step=50, second_after_steps=60,
                            timeout_s=600.0 + reps * (3 * boot_s + notice_s + 120))
    lock = acquire_cluster_lock(timeout=3600)
    try:
        demo = Demo(settings, lambda line: print(f"[{name}] {line}", file=sys.stderr))
        runs = demo.measure(kind, reps)
    finally:
        lock.close()
    rows = []
    for run in runs:
        row = dict(run.breakdown)
        row["lost_steps"] = run.lost_steps
        row["recovery_s"] = None if run.recovery_s is None else round(run.recovery_s, 1)
        rows.append(row)
    return {"scenario": name, "kind": kind, "boot_delay_s": boot_s, "notice_s": notice_s,
            "prewarm": prewarm, "runs": rows}


def median(rows: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 1) if values else None


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def section(results: list[dict], note: str = "") -> str:
    head = ("| scenario | runs | notice -> signal | signal -> exit | exit -> requeue | "
            "requeue -> allocation | allocation -> start | start -> first step | "
            "**exit -> first step** | steps notice -> exit | steps lost | on replacement | "
            "measured |")
    lines = [head, "|" + "---|" * 13]
    verdicts = []
    for res in results:
        rows = res["runs"]
        label = (f"{res['boot_delay_s']:.0f} s boot, "
                 + (f"{res['notice_s']:.0f} s notice, prewarm {'on' if res['prewarm'] else 'off'}"
                    if res["kind"] == "notice" else "no notice (reconciler)"))
        cells = [_cell(median(rows, c)) for c in COLUMNS]
        cells[6] = f"**{cells[6]}**"
        landed = sum(1 for r in rows if r.get("landed_on_replacement"))
        used = f"{landed}/{len(rows)}" if res["kind"] == "notice" and res["prewarm"] else "-"
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(cells) + f" | {used} | "
                     f"{res.get('measured', '')} |")
        total = median(rows, "exit_to_first_step_s")
        if total is not None:
            parts = {p: median(rows, p) or 0.0 for p in PARTS[2:]}
            worst = max(parts, key=lambda p: parts[p])
            met = "meets" if total < 10 else f"misses by {total - 10:.1f} s"
            verdicts.append(f"- {label}: exit -> first resumed step {total} s, {met} the "
                            f"< 10 s target; largest part {worst.removesuffix('_s')} "
                            f"({parts[worst]} s).")
    when = datetime.now(timezone.utc)
    return "\n".join([
        BEGIN,
        "## Recovery part by part, with and without prewarming",
        "",
        f"`python benchmarks/prewarm_recovery.py` ({when:%Y-%m-%d %H:%M} UTC, Slurm 22.05.8, "
        f"{platform.machine()}, 2 CPUs shared with other work): method in the script's "
        "docstring. Medians over the runs, seconds; Slurm's EligibleTime/StartTime have 1 s "
        "resolution, so the parts next to them carry up to 1 s each (their sum does not).",
        "",
        *lines,
        "",
        *verdicts,
        "",
        "Without prewarm (and without notice) the replacement is powered up only after the "
        "requeue, so requeue -> allocation holds its boot and slurmctld's wait for its "
        "periodic (30 s) configuration check (Slurm resets StartTime when the job leaves "
        "CONFIGURING). With prewarm the job trains on while the replacement boots, is "
        "signalled when it is up (or at its checkpoint deadline), and lands on nodes that are "
        "already up: requeue -> allocation is the scheduler alone. What remains is the job's "
        "own teardown (exit -> requeue: processes ending after the requeue, the Epilog on "
        "each node) and start-up (allocation -> start: batch script, srun, Prolog, the "
        "torchrun agent and the worker each starting Python and importing torch; "
        "start -> first step: gloo rendezvous, restore, one step).",
        *(["", note] if note else []),
        END,
    ])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3, help="runs per fast scenario")
    parser.add_argument("--reps-slow", type=int, default=2, help="runs per 90 s-boot scenario")
    parser.add_argument("--only", default="", help="comma list of scenarios "
                        f"({', '.join(SCENARIOS)})")
    parser.add_argument("--json-out", type=Path, help="also write the raw results here")
    parser.add_argument("--from-json", type=Path, action="append",
                        help="record earlier raw results (repeatable) instead of running")
    parser.add_argument("--keep", type=Path,
                        help="raw results of earlier runs (benchmarks/prewarm_recovery.json): "
                             "the scenarios this run does not measure are taken from there, "
                             "each with when it was measured, and the file is updated")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="", help="a paragraph added to the section "
                        "(e.g. the machine's load while it ran)")
    args = parser.parse_args()
    results: list[dict] = []
    if args.from_json:
        for path in args.from_json:
            results += json.loads(path.read_text())
    else:
        names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(unknown)}")
        for name in names:
            reps = args.reps_slow if SCENARIOS[name][4] else args.reps
            results.append(run_scenario(name, reps))
            results[-1]["measured"] = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
            if args.json_out:
                args.json_out.write_text(json.dumps(results, indent=1))
        if args.keep and args.keep.exists():
            ran = {r["scenario"] for r in results}
            results += [r for r in json.loads(args.keep.read_text()) if r["scenario"] not in ran]
    order = list(SCENARIOS)
    results.sort(key=lambda r: order.index(r["scenario"]) if r["scenario"] in order else 99)
    text = section(results, args.note)
    print(text)
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, text)
        if args.keep and not args.from_json:
            args.keep.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
