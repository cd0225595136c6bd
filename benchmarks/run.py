"""Run every benchmark and rewrite BENCHMARKS.md (``make bench``), or each one once in a tiny
size (``--smoke``, what ``make test`` runs so that none rots).

Each script in :data:`BENCHMARKS` measures one thing, with its method in its docstring, and
owns one marked section of BENCHMARKS.md (benchmarks/report.py); this runner starts them one
after another as ``python benchmarks/<script>.py <arguments>`` (a fresh process each, a time
limit each), then writes the ``bench-run`` section at the top: the machine, the versions, and
per script its arguments, outcome, wall and CPU time. A script that fails does not stop the
others; the runner exits 1 if any failed.

Scripts that need the local Slurm cluster (``slurm-spot local up``: root, slurm-wlm, munge;
they hold /tmp/slurm-spot-test-cluster.lock while their cluster runs) are marked
``cluster``; ``--no-cluster`` leaves them out. ``make bench`` runs every script with its
``bench`` arguments, chosen so that the whole run stays under 20 minutes on a 2-CPU machine:
the recovery scripts with fewer repetitions and scenarios than their own defaults (prewarm:
the 5 s-boot, prewarm-on scenario once; recovery_without_notice measures the no-notice case),
the baselines only where they take seconds (the tree before issue 18 needs ~2 minutes of CPU
for one 10k-node pass), the clouds up to 1000 nodes (moto's own time; GCE at 5000 ~1 min),
2 runs where the spread of 3 was already small, the 1 GB checkpoint through moto's S3 (~2.5
min: moto keeps it in memory) not at all. What a script leaves out is kept
from its JSON file beside it (cloud_scale.json, reconcile_scale.json, prewarm_recovery.json,
recovery_without_notice.json) and shown with the date it was measured; run a script alone
with its defaults (or the sizes named in its docstring) to measure it again. ``--smoke``
passes ``--smoke`` (one tiny run, no BENCHMARKS.md update) and skips the cluster scripts,
each of which needs minutes for a cluster and a job.

Usage (repository root)::

    python benchmarks/run.py [--smoke] [--no-cluster] [--only NAME,...] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench-run:begin -->", "<!-- bench-run:end -->"


@dataclass(frozen=True)
class Bench:
    """One benchmark script: its arguments for ``make bench`` and for the smoke, whether it
    needs the local Slurm cluster, its time limit (seconds) and what it measures."""

    name: str
    bench: tuple[str, ...] = ()
    smoke: tuple[str, ...] = ("--smoke",)
    cluster: bool = False
    limit_s: int = 600
    what: str = ""


BENCHMARKS: tuple[Bench, ...] = (
    Bench("aws_launch_calls", what="EC2 API calls to launch 1000 nodes and re-run"),
    Bench("reconcile_scale", ("--runs", "2", "--big-runs", "1", "--baseline-max-nodes", "1000",
                              "--baseline-max-lines", "100000"), limit_s=900,
          what="a pass over 1k-50k nodes; the events file to 1M lines; before/after"),
    Bench("events_tail", what="the reconciler's read of a growing events file"),
    Bench("hook_startup", ("--runs", "5"), limit_s=600,
          what="hook start-up vs python -c pass, before/after issue 10"),
    Bench("cost_simulation", what="simulated goodput of the recovery strategies"),
    Bench("checkpoint_io", ("--sizes", "10,100,1000", "--runs", "3", "--big-runs", "1",
                            "--s3-big-runs", "0"),
          limit_s=900, what="checkpoint save stall and restore vs plain torch.save/load (1 GB "
                            "through moto's S3: kept from its last run)"),
    Bench("ft_lighthouse_relay", ("--runs", "300", "--connects", "15"),
          what="what the authenticated lighthouse's relay + front door add per torchft quorum"),
    Bench("cuda_resume_check", ("--device", "cpu", "--steps", "120", "--stop-at", "57"),
          what="bit-exact resume (CPU here; CUDA where a GPU is)"),
    Bench("recovery_without_notice", ("--skip-baseline",), cluster=True, limit_s=600,
          what="recovery without notice, reconciler (plain Slurm: run the script alone, ~12 min)"),
    Bench("elastic_vs_requeue", ("--runs", "2"), cluster=True, limit_s=900,
          what="training time lost per interruption with notice, elastic vs requeue"),
    Bench("capacity_failover", ("--runs", "3", "--baseline-runs", "1"), cluster=True,
          limit_s=900, what="capacity error -> the job on the next node set, failover vs "
                            "Slurm's requeue hold"),
    Bench("demo_recovery", ("--runs", "1"), cluster=True, limit_s=1200,
          what="the demo job interrupted twice, warm worker start vs --no-preload (one run "
               "each; the table's medians: --runs 3)"),
    Bench("market_soak", ("--seeds", "2,28,32"), cluster=True, limit_s=1500,
          what="the demo job under the chaos market: interruptions, failovers, goodput "
               "measured vs simulated"),
    Bench("prewarm_recovery", ("--reps", "1", "--only", "5s-on",
                               "--keep", "benchmarks/prewarm_recovery.json"),
          ("--reps", "1", "--only", "5s-on", "--no-write"), cluster=True, limit_s=900,
          what="recovery part by part, prewarm on (the other scenarios, no notice among them: "
               "run the script alone)"),
    Bench("cloud_scale", ("--aws-sizes", "1,100,1000", "--gce-sizes", "1,100,1000",
                          "--runs", "2", "--big-runs", "1", "--baseline-ops", "pass"),
          limit_s=900, what="resume/suspend 1-1000 nodes (5000: kept), AWS and GCE fakes; a pass "
                            "with orphans; before/after"),
)


def versions() -> str:
    """Python, the main libraries and Slurm, as installed here."""
    parts = [f"Python {platform.python_version()}"]
    for dist in ("torch", "boto3", "moto", "google-cloud-compute", "pydantic"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    slurmctld = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
    try:
        out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True,  # noqa: S603
                             timeout=10, check=False).stdout.strip()
        parts.append(out.replace("slurm ", "Slurm ") or "Slurm: none")
    except OSError:
        parts.append("Slurm: none")
    return ", ".join(parts)


def machine() -> str:
    """CPU model and count, memory, kernel, load average."""
    model = ""
    try:
        found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        model = found.group(1).strip() if found else ""
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()} {model}, {os.cpu_count()} CPUs, {memory:.0f} GiB, Linux "
            f"{platform.release()}")


def run_one(bench: Bench, smoke: bool, cluster_wait_s: float = 600.0) -> dict[str, object]:
    """Run one script; its outcome, wall and CPU time (of it and its children).

    A cluster script runs while this process holds the machine-wide cluster lock
    (tests/cluster.py; the script sees ``SLURM_SPOT_LOCK_HELD_BY`` and does not take it
    again), so it never meets another user's cluster on Slurm's ports; when the lock stays
    held by other work for ``cluster_wait_s`` seconds the script is skipped and says so.
    """
    script = HERE / f"{bench.name}.py"
    args = list(bench.smoke if smoke else bench.bench)
    argv = [sys.executable, str(script), *args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"}
    print(f">> {' '.join(argv[1:])}", flush=True)
    lock = None
    if bench.cluster:
        sys.path.insert(0, str(ROOT))
        from tests.cluster import LOCK_HELD_ENV, acquire_cluster_lock

        waited = time.perf_counter()
        try:
            lock = acquire_cluster_lock(timeout=cluster_wait_s)
        except AssertionError:
            status = (f"skipped: the cluster lock was held by other work for "
                      f"{cluster_wait_s / 60:.0f} min")
            print(f"   {status}", flush=True)
            return {"name": bench.name, "args": args, "status": status,
                    "wall_s": time.perf_counter() - waited, "cpu_s": 0.0, "what": bench.what,
                    "tail": ""}
        env[LOCK_HELD_ENV] = str(os.getpid())
    try:
        return _run(bench, args, argv, env)
    finally:
        if lock is not None:
            lock.close()


def _run(bench: Bench, args: list[str], argv: list[str], env: dict[str, str]) -> dict[str, object]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, timeout=bench.limit_s,  # noqa: S603
                              capture_output=True, text=True, check=False)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"no result within {bench.limit_s} s: {str(exc.stderr or '')[-2000:]}"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - started
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    status = "ok" if code == 0 else ("timeout" if code is None else f"exit {code}")
    print(f"   {status} in {wall:.0f} s" + ("" if code == 0 else f"\n{tail}"), flush=True)
    return {"name": bench.name, "args": args, "status": status, "wall_s": wall, "cpu_s": cpu,
            "what": bench.what, "tail": tail if code != 0 else ""}


def section(results: list[dict[str, object]], started: datetime, total_s: float) -> str:
    rows = "\n".join(
        f"| `{' '.join([str(r['name']) + '.py', *map(str, r['args'])])}` | {r['what']} | "  # type: ignore[call-overload]
        f"{r['status']} | {float(r['wall_s']):.0f} | {float(r['cpu_s']):.0f} |"  # type: ignore[arg-type]
        for r in results)
    return f"""{BEGIN}
## This run

`make bench` (`python benchmarks/run.py`) ran every benchmark below on {started:%Y-%m-%d %H:%M}
UTC in {total_s / 60:.1f} minutes: {machine()}; {versions()}; load average
{os.getloadavg()[0]:.1f} at the end (the machine is shared with other work: compare the
columns of one table, each measured side by side in the same run, rather than absolute times
across tables). Each section below gives its method, runs, median and spread; its script's
docstring has the details. Rows this run left out to stay under 20 minutes (AWS and GCE at
5000 nodes, the slowest baselines, the 1 GB checkpoint through moto's S3, the 90 s-boot,
prewarm-off and no-notice prewarm scenarios, plain Slurm's recovery) are kept from earlier
runs of the same script and say when they were measured.

| script | measures | outcome | wall (s) | CPU (s) |
|---|---|---|---|---|
{rows}
{END}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="each script once, tiny, no BENCHMARKS.md update; no cluster ones")
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave out the scripts that need the local Slurm cluster")
    parser.add_argument("--only", default="", help="comma list of script names")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md",
                        help="where the bench-run section goes (each script writes its own)")
    parser.add_argument("--json-out", type=Path, help="also write the outcomes here (JSON)")
    parser.add_argument("--cluster-wait-s", type=float, default=600.0,
                        help="how long a cluster script waits for the machine-wide cluster "
                             "lock before it is skipped")
    args = parser.parse_args(argv)
    only = {n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()}
    unknown = only - {b.name for b in BENCHMARKS}
    if unknown:
        parser.error(f"--only: unknown benchmark(s) {', '.join(sorted(unknown))}; known: "
                     f"{', '.join(b.name for b in BENCHMARKS)}")
    chosen = [b for b in BENCHMARKS if (not only or b.name in only)
              and not (b.cluster and (args.smoke or args.no_cluster))]
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    results = [run_one(b, args.smoke, args.cluster_wait_s) for b in chosen]
    total = time.perf_counter() - t0
    summary = [{k: v for k, v in r.items() if k != "tail"} for r in results]
    print(json.dumps(summary, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=1) + "\n")
    if not args.smoke:
        sys.path.insert(0, str(HERE))
        from report import write_section

        write_section(args.output, BEGIN, END, section(results, started, total))
    return 0 if all(r["status"] == "ok" or str(r["status"]).startswith("skipped")
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
