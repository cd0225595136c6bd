"""A powered-up node's registration -> its batch script's start, with and without
slurm-spot's PrologSlurmctld (``power.prolog_slurmctld``, slurm_spot/lifecycle/bootwait.py).

Method: a fresh local cluster (tests/cluster.py: 4 one-CPU local nodes, local boot of
``--boot`` s, no reconciler) per setting, slurmctld at ``debug`` (``scontrol setdebug``). Each
repetition submits ``sbatch -w <node> --wrap 'date +%s.%N'`` to a powered-down node (the
four nodes in turn, each waited for until it is ``idle~`` again) and reads:

- ``register``: slurmctld.log's first "Node <node> now responding" after the submission (the
  node's slurmd registered; log time, ms);
- ``start``: the time the batch script printed (its first command);
- ``configured``: slurmctld.log's "Configuration for JobId=<id> [is] complete" (the moment
  slurmctld launched the job: ``job_time_limit`` without the prolog, ``prolog_running_decr``
  with it); ``slurmd_launch``: the node's slurmd log "Launching batch job <id>" (the rest,
  up to ``start``, is slurmd's batch launch with the node Prolog).

The table gives the median and range of ``start - register`` over the repetitions, the
setting off (Slurm's own path) and on, side by side. Run it in a private network namespace
(docs: helper rules) or alone on the host; it holds the test-cluster lock while a cluster runs.

Usage (repository root)::

    python benchmarks/batch_launch.py [--reps 6] [--boot 3] [--only off,on] [--json-out F]
        [--from-json F ...] [--no-write]

``--from-json`` merges runs made elsewhere (e.g. in the 24.11 and 26.05 roots:
``python -m tests.slurmroots run trixie -- .venv/bin/python benchmarks/batch_launch.py
--no-write --json-out /tmp/bl-24.11.json``) into one table; benchmarks/batch_launch.json holds
the runs of the table in BENCHMARKS.md (``--no-run --from-json benchmarks/batch_launch.json``
writes it again).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import write_section  # noqa: E402 - benchmarks/report.py, beside this script

from tests.cluster import Cluster, base_config, wait_for  # noqa: E402

BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- batch-launch:begin -->", "<!-- batch-launch:end -->"
NODES = ["spot-1", "spot-2", "spot-3", "spot-4"]
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")


def log_times(log: Path, pattern: re.Pattern[str], after: float) -> list[float]:
    """Epoch times of slurmctld.log lines matching ``pattern`` logged at/after ``after``."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = _STAMP.match(line)
        if not match or not pattern.search(match.group(2)):
            continue
        stamp = datetime.fromisoformat(match.group(1)).timestamp()  # local time, as logged
        if stamp >= after - 0.5:
            found.append(stamp)
    return found


def one_run(cluster: Cluster, node: str, out_dir: Path) -> dict[str, float]:
    """Submit to powered-down ``node``; the run's times (epoch s) and differences."""
    wait_for(lambda: "POWERED_DOWN" in cluster.node(node).get("State", "")
             and "POWERING_DOWN" not in cluster.node(node).get("State", ""), 120)
    out = out_dir / f"{node}-{time.time_ns()}.out"
    submitted = time.time()
    job = cluster.sbatch("-w", node, "-N", "1", "-o", str(out), "--wrap", "date +%s.%N")
    wait_for(lambda: out.exists() and out.read_text().strip(), 180, interval=0.2)
    start = float(out.read_text().split()[0])
    log = cluster.log_dir / "slurmctld.log"
    register = log_times(log, re.compile(rf"Node {re.escape(node)} now responding"), submitted)
    configured = log_times(log, re.compile(rf"Configuration for JobId={job} (is )?complete"),
                           submitted)
    slurmd_log = cluster.log_dir / f"slurmd-{node}.log"
    received = (log_times(slurmd_log, re.compile(rf"Launching batch job {job}\b"), submitted)
                if slurmd_log.exists() else [])
    if not register:
        raise RuntimeError(f"no 'Node {node} now responding' in {log} after job {job}")
    return {"job": job, "submitted": submitted, "register": register[0], "start": start,
            "configured": configured[0] if configured else float("nan"),
            "slurmd_launch": received[0] if received else float("nan"),
            "register_to_configured_s": (configured[0] if configured else float("nan"))
            - register[0],
            "register_to_start_s": start - register[0],
            "submit_to_start_s": start - submitted}


def run_setting(setting: str, reps: int, boot_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix=f"bl-{setting}-") as tmp:
        root = Path(tmp)
        config = base_config(root)
        config["providers"]["local"]["boot_delay_s"] = boot_s
        config["power"] = {**config["power"], "prolog_slurmctld": setting == "on",
                           "suspend_time_s": 5, "suspend_timeout_s": 5}
        cluster = Cluster(root, config)
        cluster.start()
        try:
            cluster.slurm("scontrol", "setdebug", "debug")
            version = cluster.slurm("scontrol", "-V").strip()
            runs = [one_run(cluster, NODES[i % len(NODES)], root) for i in range(reps)]
            for r in runs:
                print(f"{version} {setting}: job {r['job']:.0f} register->start "
                      f"{r['register_to_start_s']:.2f} s, submit->start "
                      f"{r['submit_to_start_s']:.2f} s", flush=True)
        finally:
            cluster.stop()
    return {"slurm": version, "setting": setting, "boot_s": boot_s, "runs": runs}


def summary(result: dict[str, object]) -> dict[str, float]:
    runs = result["runs"]
    assert isinstance(runs, list)
    values = [r["register_to_start_s"] for r in runs]
    configured = [r["register_to_configured_s"] for r in runs]
    submit = [r["submit_to_start_s"] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "submit_median": statistics.median(submit),
            "configured_median": statistics.median(configured)}


def table(results: list[dict[str, object]]) -> str:
    rows = ["| Slurm | PrologSlurmctld | runs | registration -> batch start, median (min-max) "
            "| registration -> slurmctld launches, median | submit -> batch start, median |",
            "|---|---|---|---|---|---|"]
    for result in sorted(results, key=lambda r: (str(r["slurm"]), str(r["setting"]))):
        s = summary(result)
        rows.append(f"| {result['slurm']} | {result['setting']} | {s['n']:.0f} | "
                    f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}) | "
                    f"{s['configured_median']:.2f} s | "
                    f"{s['submit_median']:.1f} s |")
    return "\n".join(rows)


def section(results: list[dict[str, object]]) -> str:
    boot = sorted({str(r["boot_s"]) for r in results})
    return "\n".join([
        BEGIN,
        "## Batch launch on a freshly powered-up node (registration -> batch script start)",
        "",
        f"`python benchmarks/batch_launch.py` ({datetime.now(timezone.utc):%Y-%m-%d}, "
        f"{platform.node() or 'this machine'}, 2 CPUs; local boot {', '.join(boot)} s). A "
        "fresh local cluster per setting; each run submits a 1-node job to a powered-down "
        "node; `register` is slurmctld.log's \"Node X now responding\", `start` the batch "
        "script's first command (`date +%s.%N`). `off`: Slurm's own path, the job launched by "
        "slurmctld's periodic `job_time_limit()` (every 30 s); `on`: "
        "`PrologSlurmctld=slurm-spot-prolog-slurmctld` (power.prolog_slurmctld, the default) "
        "waits for the registration and slurmctld launches the job when it exits "
        "(docs/admin.md, \"Batch launch on powered-up nodes\"). The 24.11/26.05 rows ran in "
        "the Debian roots of tests/slurmroots.py. `off` depends on where the registration falls "
        "in slurmctld's 30 s period (uniform: 15 s on average, 30 s at worst); back-to-back "
        "runs as here fall at a similar phase each time, so its range is narrower than that. "
        "What remains with `on` is the hook's 0.5 s poll (registration -> slurmctld launches) "
        "and slurmd's batch launch on a node that just started, with the node Prolog.",
        "",
        table(results),
        END,
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--boot", type=float, default=3.0)
    parser.add_argument("--only", default="off,on")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--from-json", type=Path, action="append", default=[])
    parser.add_argument("--no-run", action="store_true", help="only merge --from-json files")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, object]] = []
    for path in args.from_json:
        results.extend(json.loads(path.read_text()))
    if not args.no_run:
        fresh = [run_setting(s, args.reps, args.boot) for s in args.only.split(",")]
        results.extend(fresh)
        if args.json_out:
            args.json_out.write_text(json.dumps(fresh, indent=1))
    print(table(results))
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
