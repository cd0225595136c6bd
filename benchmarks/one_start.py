"""One Python start per node (issue 26): the demo's start-up with the warm worker start's fork
server forked from the torchrun agent (this checkout) against a base revision's (by default
``main`` before the change: the fork server a second interpreter that imports torch again),
and the result in BENCHMARKS.md.

Method: runs of ``slurm-spot demo --json --steps 170`` (benchmarks/demo_recovery.py
``run_demo``: a 2-node torchrun DDP job, gloo on CPU, 2 local spot nodes with a 2 s boot and
prewarm on, one interruption with a 30 s notice, one kill without notice), both with the
default warm worker start. The two revisions differ only in the agent's two files
(:data:`FILES`); between runs this script writes the base revision's version of them into this
checkout (``git show BASE:FILE``) or its own (``git show HEAD:FILE``), alternating (base,
this, this, base, ...) so that both see the same load on the shared machine, and restores
HEAD's at the end. Each run has a cluster of its own (its own --workdir). The parts are
slurm_spot/recovery.py's: ``agent`` is the agent's start line to the workers' start (its
torch import, the rendezvous, the fork server, the workers' start), ``worker start`` the
worker's own start to its first line; ``exit -> first step`` the figure of issue 26's
targets. Medians; the load average (1 min) is read before each run. Run it in a private
network namespace when other clusters run on the machine (tests/netns.py). Usage:

    python benchmarks/one_start.py [--runs N] [--base REF] [--keep FILE] [--from-json FILE]
                                   [--no-write] [--note TEXT]

The working tree's copies of :data:`FILES` must be committed (the script overwrites them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from demo_recovery import run_demo  # benchmarks/demo_recovery.py, beside this script
from report import write_section

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- one-start:begin -->", "<!-- one-start:end -->"
FILES = ("slurm_spot/jobs/injob/torchrun_agent.py", "slurm_spot/jobs/injob/warm_worker.py")
LABELS = ("base", "this")
ROWS = (("agent", ("startup", "agent_s")), ("worker start", ("startup", "worker_s")),
        ("agent + worker start", None),
        ("allocation -> training start", ("allocation_to_start_s",)),
        ("data set, model, DDP", ("startup", "setup_s")),
        ("**exit -> first step**", ("exit_to_first_step_s",)))


def use(ref: str) -> None:
    """Write ``ref``'s version of :data:`FILES` into the working tree.

    Raises:
        subprocess.CalledProcessError: ``ref`` or a file in it does not exist.
    """
    for name in FILES:
        text = subprocess.run(["git", "show", f"{ref}:{name}"], cwd=ROOT, check=True,  # noqa: S603
                              capture_output=True).stdout
        (ROOT / name).write_bytes(text)


def part(interruption: dict, row: tuple[str, ...] | None) -> float | None:
    """One figure of one interruption's breakdown (``row``: keys into it; None: agent +
    worker start)."""
    breakdown = interruption.get("breakdown") or {}
    if row is None:
        startup = breakdown.get("startup") or {}
        agent, worker = startup.get("agent_s"), startup.get("worker_s")
        return None if agent is None or worker is None else round(agent + worker, 2)
    value: object = breakdown
    for key in row:
        value = (value or {}).get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def section(runs: list[dict], base: str, note: str = "") -> str:
    """The BENCHMARKS.md section of ``runs`` (both labels)."""
    def median(label: str, kind: str, row: tuple[str, ...] | None) -> str:
        values = [v for r in runs if r["label"] == label for i in r["interruptions"]
                  if i["kind"] == kind and (v := part(i, row)) is not None]
        return f"{statistics.median(values):.2f}" if values else "-"

    table = "\n".join(f"| {name} | " + " | ".join(median(label, kind, row)
                                                  for kind in ("notice", "kill")
                                                  for label in LABELS) + " |"
                      for name, row in ROWS)
    per_run = "\n".join(
        f"| {n + 1} | {r['label']} | {r['load_before']:g} | " + " | ".join(
            "-" if (v := part(i, row)) is None else f"{v:g}"
            for i in r["interruptions"] for row in (("startup", "agent_s"),
                                                    ("startup", "worker_s"),
                                                    ("exit_to_first_step_s",))) + " |"
        for n, r in enumerate(runs))
    loads = [r["load_before"] for r in runs]
    exact = all(r["exact_resume"] and r["state"] == "COMPLETED" for r in runs)
    count = {label: sum(r["label"] == label for r in runs) for label in LABELS}
    when = max(str(r.get("measured", "")) for r in runs)
    return f"""{BEGIN}
## One Python start per node: the fork server forked from the agent (issue 26)

`python benchmarks/one_start.py --runs {max(count.values())}` ({when}, {platform.machine()},
{os.cpu_count()} CPUs shared with other work: load average (1 min) before the runs
{min(loads):g}-{max(loads):g}, median {statistics.median(loads):g}): the demo (`slurm-spot demo
--json --steps {runs[0]['steps']}`, 2 local spot nodes, 2 s boot, prewarm on, one interruption
with a 30 s notice, one kill without notice), warm worker start both times: {count['base']}
runs of the base (`{base}`: the fork server a second interpreter, started by the agent, that
imports torch and the script's imports again) and {count['this']} of this revision (the fork
server a fork of the agent, taken after the agent's torch import: one interpreter start and
one torch import per node), alternating. Medians, seconds (slurm_spot/recovery.py's parts: the
agent's start line to the workers' start; the worker's start to its first line). Every run
COMPLETED with weights identical to an uninterrupted run: {exact}.

| part | notice, base | notice, this | kill, base | kill, this |
|---|---|---|---|---|
{table}

Each run, in the order run (notice interruption, then kill):

| run | revision | load before | agent | worker | exit -> first step | agent | worker | exit -> first step |
|---|---|---|---|---|---|---|---|---|
{per_run}
{note}
{END}"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3, help="runs of each revision (default 3)")
    parser.add_argument("--base", default="main", help="the revision to compare with")
    parser.add_argument("--steps", type=int, default=170)
    parser.add_argument("--keep", type=Path, help="write every run's result (JSON) here")
    parser.add_argument("--from-json", type=Path, help="render a --keep file instead")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="", help="a paragraph after the tables")
    args = parser.parse_args()
    if args.from_json:
        runs = json.loads(args.from_json.read_text())
    else:
        runs = []
        root = Path(tempfile.mkdtemp(prefix="one-start-"))
        print(f"demo workdirs in {root}", file=sys.stderr, flush=True)
        try:
            for i in range(args.runs):
                for label in (LABELS if i % 2 == 0 else LABELS[::-1]):
                    use(args.base if label == "base" else "HEAD")
                    result = run_demo("after", args.steps, root / f"{label}-{i}")
                    result.update(label=label,
                                  measured=f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
                    runs.append(result)
                    print(f"{label} run {i + 1}: load {result['load_before']}, " + ", ".join(
                        f"{it['kind']}: exit -> first step "
                        f"{part(it, ('exit_to_first_step_s',))} s" for it in result["interruptions"]),
                        file=sys.stderr, flush=True)
                    if args.keep:
                        args.keep.write_text(json.dumps(runs, indent=1) + "\n")
        finally:
            use("HEAD")
    text = section(runs, args.base, args.note and f"\n{args.note}\n")
    print(text)
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
