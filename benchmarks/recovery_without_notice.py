"""Recovery without notice: how long a running job is lost when its spot instance vanishes
with no interruption notice, with the reconciler and with plain Slurm.

Method (same cluster, same job, one run per mode):

1. ``slurm-spot local up`` a local cluster (tests/cluster.py ``base_config``: 4 one-CPU nodes,
   SlurmdTimeout 300 s = Slurm's default, reconcile interval 5 s), with or without the
   reconciler (``--no-reconcile``).
2. ``sbatch -p spot -N 2 --requeue --wrap 'srun sleep 3600'``; wait until it is RUNNING.
3. ``slurm-spot local preempt <its first node> --notice 0``: the instance is SIGKILLed, no
   notice, as a spot reclaim without warning. The clock starts when that command returns.
4. Poll ``scontrol show job`` every 0.5 s: *requeued* is the first time Restarts > 0,
   *running again* the first time JobState=RUNNING with Restarts > 0.

Plain Slurm notices the dead node only after SlurmdTimeout, then holds the requeued job
~121 s (BeginTime), so the baseline takes ~8-12 minutes: ``--skip-baseline`` leaves it out.
Results go to stdout (JSON) and into BENCHMARKS.md between the recovery markers.

Run from the repository root on a machine with slurm-wlm and munge (see docs):
``python benchmarks/recovery_without_notice.py [--skip-baseline] [--no-write]``.
It holds /tmp/slurm-spot-test-cluster.lock while a cluster runs, like the e2e tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from slurm_spot.hostlist import expand  # noqa: E402
from tests.cluster import Cluster, base_config, wait_for  # noqa: E402

BEGIN, END = "<!-- recovery:begin -->", "<!-- recovery:end -->"


def measure(reconcile: bool, timeout_s: float) -> dict[str, object]:
    """One run: start a cluster, run the job, kill a node silently, time the recovery."""
    root = Path(tempfile.mkdtemp(prefix="recovery-"))
    cluster = Cluster(root, base_config(root), reconcile=reconcile)
    cluster.start()
    try:
        job = cluster.sbatch("-p", "spot", "-N", "2", "--requeue", "-o", "/dev/null",
                             "--wrap", "srun sleep 3600")
        wait_for(lambda: cluster.job(job).get("JobState") == "RUNNING", timeout=120,
                 what="job running")
        before = cluster.job(job)["NodeList"]
        victim = expand(before)[0]
        cluster.spot("local", "preempt", victim, "--notice", "0", "--conf-dir",
                     str(cluster.conf_dir))
        killed = time.monotonic()
        requeued_s = running_s = None
        while time.monotonic() - killed < timeout_s:
            info = cluster.job(job)
            restarted = info.get("Restarts", "0") not in ("0", "")
            if restarted and requeued_s is None:
                requeued_s = time.monotonic() - killed
            if restarted and info.get("JobState") == "RUNNING":
                running_s = time.monotonic() - killed
                after = info.get("NodeList", "")
                break
            time.sleep(0.5)
        else:
            after = ""
        return {"mode": "reconciler" if reconcile else "plain Slurm", "requeued_s": requeued_s,
                "running_s": running_s, "killed_node": victim, "nodes_before": before,
                "nodes_after": after, "victim_state": cluster.node(victim).get("State")}
    finally:
        cluster.slurm("scancel", "-u", "root", check=False)
        cluster.stop()


def slurm_version() -> str:
    """``22.05.8`` from ``slurmctld -V`` (``sinfo --version`` of 22.05 needs a reachable
    config), or ``?``."""
    try:
        out = subprocess.run(["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.split()[-1] if out.strip() else "?"


def _seconds(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else "not within the timeout"


def section(results: list[dict[str, object]], slurm_version: str) -> str:
    """The BENCHMARKS.md section (between the markers) for ``results``."""
    rows = "\n".join(
        f"| {r['mode']} | {_seconds(r['requeued_s'])} | {_seconds(r['running_s'])} | "
        f"{r['nodes_before']} -> {r['nodes_after'] or '-'} | {r['victim_state']} | "
        f"{r.get('measured', '')} |"
        for r in results)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{BEGIN}
## Recovery without notice (reconciler vs. plain Slurm)

A running 2-node `--requeue` batch job loses one node's instance with no interruption notice
(`slurm-spot local preempt NODE --notice 0`: SIGKILL). Seconds from the kill until the job is
requeued (Restarts > 0) and until it is RUNNING again on fresh nodes.

| mode | requeued after (s) | running again after (s) | nodes | killed node afterwards | measured |
|---|---|---|---|---|---|
{rows}

Method: `python benchmarks/recovery_without_notice.py` ({when}; Slurm {slurm_version},
{os.cpu_count()} CPUs, {platform.system()} {platform.release()}). Same local cluster config for
both modes (tests/cluster.py `base_config`: SlurmdTimeout 300 s, Slurm's default;
reconcile interval 5 s; SuspendTime 10 s); one run each, so expect a few seconds of noise.
With the reconciler, detection waits for the next pass (interval 5 s here, 30-60 s in
production), `DOWN` + `POWER_DOWN_FORCE` requeue the job at once and `StartTime=now` clears
the ~121 s requeue hold; most of the rest is a fresh node booting and slurmctld's periodic
check that notices the finished boot. Plain Slurm waits for SlurmdTimeout, then the hold.
{END}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-baseline", action="store_true",
                        help="only the reconciler run (the baseline takes ~8-12 minutes)")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--baseline-timeout-s", type=float, default=1200.0)
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, default=HERE / "recovery_without_notice.json",
                        help="results kept here; a mode this run skips is taken from it, "
                             "with when it was measured")
    args = parser.parse_args(argv)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = [{**measure(reconcile=True, timeout_s=300.0), "measured": stamp}]
    print(json.dumps(results[-1]), flush=True)
    if not args.skip_baseline:
        results.append({**measure(reconcile=False, timeout_s=args.baseline_timeout_s),
                        "measured": stamp})
        print(json.dumps(results[-1]), flush=True)
    if not args.no_write:
        kept = json.loads(args.json.read_text()) if args.json.exists() else []
        ran = {r["mode"] for r in results}
        results += [r for r in kept if r["mode"] not in ran]
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        write_section(args.output, BEGIN, END, section(results, slurm_version()))


if __name__ == "__main__":
    main()
