"""Capacity failover: seconds from a node set's capacity error to the job running on the next
node set of its partition, with slurm-spot's failover and without it (Slurm's own behaviour).

Method (issue 24's scenario; one local cluster per mode, several runs in each):

1. ``slurm-spot local up`` with the reconciler, a partition ``spot`` of two node sets,
   ``cheap`` (Weight 1, 2 nodes) and ``other`` (Weight 10, 2 nodes), ``reconcile.cooldown_s``
   600 (the default); ``power.failover`` true (after) or false (before: the failed node alone
   goes DOWN and the job waits out Slurm's requeue hold); ``slurm-spot local capacity cheap 0``.
2. ``sbatch -p spot -N 1 --requeue --wrap 'sleep 600'``; the scheduler picks ``cheap``
   (lowest Weight), the resume hook meets the capacity error.
3. Poll ``scontrol show job`` every 0.25 s. *error*: the ``launch_failed`` event's time in
   events.jsonl; *allocated*: the first poll that shows the job on an ``other`` node
   (CONFIGURING or RUNNING); *running*: the first poll with JobState=RUNNING there.
4. Reset for the next run: cancel the job, end the cooldown as an admin would
   (``scontrol update ... state=resume``), wait for every node to be ``idle~`` again.

The figures are the medians over the runs, each run's shown too; on Slurm 22.05 *running*
includes a freshly resumed node's boot (~8 s here) and slurmctld's periodic check that ends
CONFIGURING (up to 30 s), which slurm-spot cannot trigger.

Usage (repository root, as root, slurm-wlm and munge installed)::

    python benchmarks/capacity_failover.py [--runs 3] [--baseline-runs 2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from tests.cluster import Cluster, base_config, wait_for  # noqa: E402

BEGIN, END = "<!-- capacity-failover:begin -->", "<!-- capacity-failover:end -->"


def _events(cluster: Cluster) -> list[dict]:
    path = cluster.log_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _all_idle_powered_down(cluster: Cluster) -> bool:
    for name in ("cheap-1", "cheap-2", "other-1", "other-2"):
        flags = set(cluster.node(name)["State"].split("+"))
        if not {"IDLE", "POWERED_DOWN"} <= flags or "DOWN" in flags:
            return False
    return True


def one_run(cluster: Cluster, timeout_s: float) -> dict[str, object]:
    """One job through the capacity error; seconds from the error to allocated/running."""
    seen = len([e for e in _events(cluster) if e["action"] == "launch_failed"])
    job = cluster.sbatch("-p", "spot", "-N", "1", "--requeue", "-o", "/dev/null",
                         "--wrap", "sleep 600")
    submitted = time.time()
    allocated_at = running_at = None
    nodes = ""
    try:
        while time.time() - submitted < timeout_s:
            info = cluster.job(job)
            nodes = info.get("NodeList", "")
            on_other = nodes.startswith("other-")
            if on_other and allocated_at is None and info.get("JobState") in (
                    "CONFIGURING", "RUNNING"):
                allocated_at = time.time()
            if on_other and info.get("JobState") == "RUNNING":
                running_at = time.time()
                break
            time.sleep(0.25)
        failed = [e for e in _events(cluster) if e["action"] == "launch_failed"][seen:]
        error_at = datetime.fromisoformat(failed[0]["time"]).timestamp() if failed else None
    finally:
        cluster.slurm("scancel", str(job), check=False)
    return {
        "error_to_allocated_s": round(allocated_at - error_at, 1)
        if allocated_at and error_at else None,
        "error_to_running_s": round(running_at - error_at, 1) if running_at and error_at
        else None,
        "submit_to_running_s": round(running_at - submitted, 1) if running_at else None,
        "nodes": nodes}


def measure(failover: bool, runs: int, timeout_s: float) -> list[dict[str, object]]:
    """``runs`` runs on one cluster with ``power.failover`` = ``failover``."""
    root = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    config = base_config(root)
    config["node_sets"] = [
        {"name": "cheap", "provider": "local", "count": 2, "cpus": 1, "weight": 1},
        {"name": "other", "provider": "local", "count": 2, "cpus": 1, "weight": 10}]
    config["partitions"] = [{"name": "spot", "node_sets": ["cheap", "other"], "default": True}]
    config["reconcile"] = {"interval_s": 5, "orphan_grace_s": 20, "cooldown_s": 600}
    config.setdefault("power", {})["failover"] = failover
    cluster = Cluster(root, config, reconcile=True)
    cluster.start()
    results = []
    try:
        cluster.spot("local", "capacity", "cheap", "0", "--conf-dir", str(cluster.conf_dir))
        for _ in range(runs):
            wait_for(lambda: _all_idle_powered_down(cluster), timeout=180,
                     what="every node idle~ before a run")
            results.append(one_run(cluster, timeout_s))
            print(json.dumps({"failover": failover, **results[-1]}), flush=True)
            cluster.end_cooldowns()
            wait_for(lambda: not cluster.slurm("squeue", "-h", check=False).strip(),
                     timeout=60, what="the job gone")
            cluster.end_cooldowns()  # a cooldown the reconciler wrote meanwhile
    finally:
        subprocess.run(["scancel", "-u", "root"], env=cluster.env, check=False)
        cluster.stop()
    return results


def _median(rows: list[dict[str, object]], key: str) -> str:
    values = [float(v) for r in rows if isinstance(v := r.get(key), (int, float))]
    if not values:
        return "-"
    missed = len(rows) - len(values)
    return f"{statistics.median(values):.1f}" + (f" ({missed} not within the timeout)"
                                                  if missed else "")


def section(after: list[dict[str, object]], before: list[dict[str, object]]) -> str:
    """The BENCHMARKS.md section for the two modes."""
    def row(mode: str, rows: list[dict[str, object]]) -> str:
        each = "; ".join(f"{r['error_to_allocated_s']}/{r['error_to_running_s']}"
                         for r in rows) or "-"
        return (f"| {mode} | {len(rows)} | {_median(rows, 'error_to_allocated_s')} | "
                f"{_median(rows, 'error_to_running_s')} | "
                f"{_median(rows, 'submit_to_running_s')} | {each} |")

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    slurm = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True,
                           check=False).stdout.strip()
    return f"""{BEGIN}
## Capacity failover: the next node set within seconds (issue 24)

A partition of two node sets, `cheap` (Weight 1) with no capacity and `other` (Weight 10); a
1-node `--requeue` job. Seconds from the capacity error (the `launch_failed` event) to the job
allocated on `other`, and to RUNNING there; medians, then each run (allocated/running).

| mode | runs | error -> allocated (s) | error -> RUNNING (s) | sbatch -> RUNNING (s) | each run |
|---|---|---|---|---|---|
{row("slurm-spot failover (power.failover: true)", after)}
{row("before: Slurm's requeue hold (power.failover: false)", before)}

Method: `python benchmarks/capacity_failover.py` ({when}; {slurm}, {os.cpu_count()} CPUs;
other work was running on the machine). Both modes in the same run, one local cluster each,
the reconciler on (interval 5 s), `reconcile.cooldown_s` 600. RUNNING on 22.05 includes the
`other` node's boot (~8 s) and slurmctld's periodic check that ends CONFIGURING (every 30 s).
{END}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs with the failover")
    parser.add_argument("--baseline-runs", type=int, default=2,
                        help="runs without it (~4 minutes each)")
    parser.add_argument("--smoke", action="store_true", help="one run each way, nothing written")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.baseline_runs, args.no_write = 1, 0, True
    after = measure(True, args.runs, timeout_s=120)
    before = measure(False, args.baseline_runs, timeout_s=400) if args.baseline_runs else []
    if not args.no_write:
        write_section(args.output, BEGIN, END, section(after, before))
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
