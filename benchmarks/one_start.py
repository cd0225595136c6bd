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
targets. Before the demo runs, ``--agent-runs`` runs of the agent alone, alternating the same
way (:func:`agent_start`): one node, one worker, no Slurm, from the agent's start to the
training script's first line (the script imports torch and scikit-learn's datasets, as the
demo's does), the node's start-up without Slurm's and the rendezvous partner's share. Medians;
the load average (1 min) is read before each run. Run it in a private network namespace when
other clusters run on the machine (tests/netns.py). Usage:

    python benchmarks/one_start.py [--runs N] [--agent-runs N] [--base REF] [--keep FILE]
                                   [--from-json FILE] [--no-write] [--note TEXT]

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
import time
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


#: The agent as the batch script's job step runs it, with this node's address given (no
#: scontrol): ``python -c AGENT ARGS``.
AGENT = """
import sys
from slurm_spot.jobs.injob import torchrun_agent as a
a.node_addr = lambda client, node: "127.0.0.1"
a.leave(a.main(sys.argv[1:]))
"""

#: The training script of :func:`agent_start`: the demo's heavy imports, then its first line.
TRAIN = """
import time
first = time.time()
import numpy
import torch
from sklearn.datasets import load_digits
print("first-line", first, flush=True)
"""


def agent_start(label: str, port: int, folder: Path) -> dict:
    """One agent (not elastic, one worker, job 1 on ``localhost``) of the working tree's
    code, started now: ``{"label", "load", "start_to_first_line_s", "forked"}`` (seconds from
    the agent's process start, as this process launches it, to the script's first line;
    ``forked``: the agent said its fork server is a fork of itself).

    Raises:
        RuntimeError: the agent failed or the script never printed its first line.
    """
    (folder / "train.py").write_text(TRAIN)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "1",
           "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", AGENT, "--nproc-per-node=1",  # noqa: S603
                           f"--port={port}", "--", str(folder / "train.py")], env=env,
                          cwd=folder, capture_output=True, text=True, timeout=600, check=False)
    first = [float(line.split()[1]) for line in proc.stdout.splitlines()
             if line.startswith("first-line ")]
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"agent ({label}) exit {proc.returncode}: {proc.stderr[-3000:]}")
    return {"label": label, "load": round(load, 2),
            "start_to_first_line_s": round(first[0] - started, 2),
            "forked": "(forked from the agent)" in proc.stderr}


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


def section(runs: list[dict], agents: list[dict], base: str, note: str = "") -> str:
    """The BENCHMARKS.md section of the demo ``runs`` and the :func:`agent_start` results
    ``agents`` (both labels)."""
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

    def alone(label: str) -> str:
        values = [a["start_to_first_line_s"] for a in agents if a["label"] == label]
        if not values:
            return "-"
        return (f"{statistics.median(values):.2f} ({min(values):g}-{max(values):g}), "
                f"{len(values)} runs")

    agent_loads = [a["load"] for a in agents] or [0.0]
    forked = {a["label"]: a["forked"] for a in agents}
    return f"""{BEGIN}
## One Python start per node: the fork server forked from the agent (issue 26)

`python benchmarks/one_start.py --runs {max(count.values())} --base {base}` ({when},
{platform.machine()},
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

The agent alone (one node, one worker, no Slurm, no rendezvous partner: agent start -> the
script's first line; the script imports torch and scikit-learn's datasets; load average
{min(agent_loads):g}-{max(agent_loads):g}), median (range): base {alone('base')}; this
{alone('this')}. Fork server forked from the agent: base {forked.get('base')}, this
{forked.get('this')}.

The demo (2 nodes sharing the machine's CPUs; the agent's part holds the rendezvous, which
waits for the slower node):

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
    parser.add_argument("--agent-runs", type=int, default=5,
                        help="runs of the agent alone, each revision (default 5)")
    parser.add_argument("--base", default="main", help="the revision to compare with")
    parser.add_argument("--steps", type=int, default=170)
    parser.add_argument("--keep", type=Path, help="write every run's result (JSON) here")
    parser.add_argument("--from-json", type=Path, help="render a --keep file instead")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="", help="a paragraph after the tables")
    args = parser.parse_args()
    if args.from_json:
        kept = json.loads(args.from_json.read_text())
        runs, agents = kept["demo"], kept["agent"]
    else:
        runs, agents = [], []
        root = Path(tempfile.mkdtemp(prefix="one-start-"))
        print(f"demo workdirs in {root}", file=sys.stderr, flush=True)
        try:
            for i in range(args.agent_runs):
                for label in (LABELS if i % 2 == 0 else LABELS[::-1]):
                    use(args.base if label == "base" else "HEAD")
                    folder = root / f"agent-{label}-{i}"
                    folder.mkdir()
                    agents.append(agent_start(label, 29400 + 2 * i + (label == "this"), folder))
                    print(f"agent alone: {agents[-1]}", file=sys.stderr, flush=True)
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
                        args.keep.write_text(json.dumps({"demo": runs, "agent": agents},
                                                        indent=1) + "\n")
        finally:
            use("HEAD")
    text = section(runs, agents, args.base, args.note and f"\n{args.note}\n")
    print(text)
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
