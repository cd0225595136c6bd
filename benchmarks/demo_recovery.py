"""Run the demo (`slurm-spot demo --json`) with and without the warm worker start, and record
its recovery, part by part, in BENCHMARKS.md.

Method: runs of the README's main job on this machine: a 2-node torchrun DDP job (gloo, CPU)
on the local spot cluster (local boot 2 s, prewarm on), interrupted once with a 30 s notice
and once by a kill without notice. "Before" is ``--no-preload`` (each worker starts as
``python -u SCRIPT``: the agent and every worker start Python and import torch), "after" the
default (workers forked from a fork server, itself a fork of the agent after its torch import,
that preloaded the script's imports). The two
alternate (before, after, after, before, ...) so that both see the same load on the shared
machine; each run has a cluster of its own (its own --workdir). Every part is the median over
the runs (slurm_spot/recovery.py says which source times it); ``exit -> first step`` is the
figure of issue 26's targets (with notice <= 5 s quiet, <= 10 s under load). The load
average (1 min) is read before each run. Usage:

    python benchmarks/demo_recovery.py [--runs N] [--steps S] [--spares N] [--keep FILE]
                                       [--from-json FILE] [--no-write]

``--spares N`` runs every demo with N hot spares (``slurm-spot demo --spares N``: the job
requeued after the kill starts on a spare instead of waiting for a boot; issue 26's target
for that case is kill -> first step <= 20 s) and writes its own section.

``--keep FILE`` writes every run's result (JSON) there; ``--from-json FILE`` renders such a
file again instead of running.
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

from report import write_section  # benchmarks/report.py, beside this script

from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.recovery import PARTS, STARTUP_PARTS

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
BEGIN, END = "<!-- demo:begin -->", "<!-- demo:end -->"
MODES = ("before", "after")  # --no-preload, warm (the default)


def run_demo(mode: str, steps: int, workdir: Path, spares: int = 0) -> dict:
    """One ``slurm-spot demo --json`` run; its result with ``mode`` and the load average.

    Raises:
        RuntimeError: the demo failed (its stderr's end in the message).
    """
    load = os.getloadavg()[0]
    argv = [sys.executable, "-m", "slurm_spot", "demo", "--json", "--workdir", str(workdir),
            "--steps", str(steps), *(["--no-preload"] if mode == "before" else []),
            *(["--spares", str(spares)] if spares else [])]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800,  # noqa: S603
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"demo ({mode}) exit {proc.returncode}: {proc.stderr[-3000:]}")
    result = read_envelope(proc.stdout, "demo")
    result.update(mode=mode, load_before=round(load, 2), load_after=round(os.getloadavg()[0], 2),
                  run_s=round(time.monotonic() - started, 1), spares=spares)
    return result


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 2) if known else None


def medians(runs: list[dict], mode: str, kind: str) -> dict[str, float | None]:
    """Each part's median over the ``mode`` runs' ``kind`` interruptions (None: never known)."""
    items = [i for r in runs if r["mode"] == mode for i in r["interruptions"]
             if i["kind"] == kind]
    out: dict[str, float | None] = {}
    for part in (*PARTS, "exit_to_first_step_s"):
        out[part] = _median([(i.get("breakdown") or {}).get(part) for i in items])
    for part in STARTUP_PARTS:
        out[part] = _median([((i.get("breakdown") or {}).get("startup") or {}).get(part)
                             for i in items])
    out["recovery_s"] = _median([i.get("recovery_s") for i in items])
    return out


LABELS = {
    "notice_to_signal_s": "notice -> signal", "signal_to_exit_s": "signal -> job exit",
    "exit_to_requeue_s": "exit -> requeue", "requeue_to_allocation_s": "requeue -> allocation",
    "allocation_to_start_s": "allocation -> training start",
    "start_to_first_step_s": "training start -> first step",
    "allocation_to_launch_s": "  slurmd batch launch (RPC, Prolog on the batch node)",
    "launch_to_batch_s": "  batch step (slurmstepd, TaskProlog, bash)",
    "batch_to_step_s": "  srun: job step created",
    "step_to_agent_s": "  step -> agent (Prolog elsewhere, TaskProlog, Python start)",
    "agent_s": "  agent (imports torch, rendezvous, starts workers)",
    "worker_s": "  worker start (interpreter + imports, or fork)",
    "gloo_s": "  gloo init_process_group", "setup_s": "  data set, model, DDP",
    "restore_s": "  checkpoint restore", "first_step_s": "  first step",
    "exit_to_first_step_s": "**exit -> first step**", "recovery_s": "interruption -> resumed",
}


def markers(spares: int) -> tuple[str, str]:
    """The BENCHMARKS.md markers of the section of runs with ``spares`` hot spares."""
    return (BEGIN, END) if not spares else ("<!-- demo-spares:begin -->",
                                            "<!-- demo-spares:end -->")


def section(runs: list[dict], note: str = "") -> str:
    """The BENCHMARKS.md section of ``runs`` (both modes, the same ``spares`` each); ``note``:
    a paragraph of the person who ran them (what else ran on the machine), after the
    tables."""
    spares = int(runs[0].get("spares", 0))
    begin, end = markers(spares)
    opt = f" --spares {spares}" if spares else ""
    with_spares = (f", with {spares} hot spare(s) kept up (`--spares {spares}`: the job requeued "
                   "after the kill starts on one)") if spares else ""
    count = {m: sum(r["mode"] == m for r in runs) for m in MODES}
    table = {(m, k): medians(runs, m, k) for m in MODES for k in ("notice", "kill")}
    order = ["notice_to_signal_s", "signal_to_exit_s", "exit_to_requeue_s",
             "requeue_to_allocation_s", "allocation_to_start_s", *STARTUP_PARTS[:6],
             "start_to_first_step_s", *STARTUP_PARTS[6:], "exit_to_first_step_s", "recovery_s"]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    rows = "\n".join(
        f"| {LABELS[p]} | " + " | ".join(cell(table[(m, k)][p]) for k in ("notice", "kill")
                                          for m in MODES) + " |" for p in order)
    loads = [r["load_before"] for r in runs]
    exact = all(r["exact_resume"] and r["state"] == "COMPLETED" for r in runs)
    notice_after = table[("after", "notice")]["exit_to_first_step_s"]
    verdict = ("-" if notice_after is None else
               f"{notice_after:g} s with notice, warm: "
               + ("meets" if notice_after <= 5 else "misses") + " the <= 5 s quiet target, "
               + ("meets" if notice_after <= 10 else "misses") + " the <= 10 s loaded one")
    start = {m: [table[(m, "notice")][p] for p in ("agent_s", "worker_s")] for m in MODES}
    start_sums = {m: None if None in v else round(sum(v), 2)  # type: ignore[arg-type]
                  for m, v in start.items()}
    per_run = "\n".join(
        f"| {n + 1} | {r['mode']} | {r['load_before']:g} | "
        + " | ".join(cell(((r["interruptions"][0].get("breakdown") or {}) if k is None else
                           ((r["interruptions"][0].get("breakdown") or {}).get("startup")
                            or {})).get(p))
                     for k, p in ((None, "exit_to_first_step_s"), (1, "agent_s"),
                                  (1, "worker_s"), (1, "setup_s"))) + " |"
        for n, r in enumerate(runs))
    when = max(str(r.get("measured", "")) for r in runs) or \
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    return f"""{begin}
## The demo: a torchrun job interrupted twice, warm worker start vs. --no-preload{with_spares}

`python benchmarks/demo_recovery.py --runs {count['after']}{opt}` ({when}, {platform.machine()},
{os.cpu_count()} CPUs; load average (1 min) before the runs
{min(loads):g}-{max(loads):g}, median {statistics.median(loads):g}): `slurm-spot demo --json
--steps {runs[0]['steps']}{opt}` on 2 local spot nodes (2 s boot, prewarm on), one interruption with a
30 s notice, one kill without notice; {count['before']} runs with `--no-preload` (before: the
agent and each worker start Python and import torch) and {count['after']} with the default
warm start (after: workers forked from a fork server, a fork of the agent after its torch
import, that preloaded the script's imports while the agent formed the rendezvous),
alternating. Medians, seconds; the indented rows split the row above them
(slurm_spot/recovery.py: slurmd's log lines, the batch script's and the agents' start lines,
the training's `--timestamps`; Slurm's StartTime/EligibleTime have 1 s resolution, so the
rows next to them carry up to 1 s each). Every run COMPLETED with weights
identical to an uninterrupted run: {exact}.

| part | notice, before | notice, after | kill, before | kill, after |
|---|---|---|---|---|
{rows}

Target (issue 26): exit -> first step {verdict}.

Each run, in the order run (the load moved more between runs than the mode did):

| run | mode | load before | notice: exit -> first step | agent | worker start | data set, model, DDP |
|---|---|---|---|---|---|---|
{per_run}

Agent + worker start (notice, medians): before {start_sums['before']} s, after
{start_sums['after']} s. Warm, the worker itself starts in a fraction of a second, and its fork
server is a fork of the agent taken after the agent's torch import, which imports only the
script's own imports (scikit-learn here) while the agent forms the rendezvous: one torch
import per node (benchmarks/one_start.py compares it with a second-interpreter server). The rest of
allocation -> first step is Slurm's launch (slurmd, Prolog, TaskProlog, srun: a few seconds
under this load) and `data set, model, DDP`, which holds the wait for the other node's rank
(DDP's first broadcast) on this machine where both nodes share the same 2 CPUs.
{note}
{end}"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    parser.add_argument("--steps", type=int, default=170,
                        help="training steps of each demo (default 170, as the e2e test)")
    parser.add_argument("--spares", type=int, default=0, choices=(0, 1, 2),
                        help="hot spares in every demo (its own section; default 0)")
    parser.add_argument("--keep", type=Path, help="write every run's result (JSON) here")
    parser.add_argument("--from-json", type=Path, help="render a --keep file instead")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="", help="a paragraph for the section: what else "
                        "ran on the machine meanwhile")
    args = parser.parse_args()
    if args.from_json:
        runs = json.loads(args.from_json.read_text())
    else:
        runs = []
        # Each run's cluster, state and logs stay there (its cluster is stopped when the
        # demo ends): for a look at the slurmd logs and job output behind a figure.
        root = Path(tempfile.mkdtemp(prefix="demo-recovery-"))
        print(f"demo workdirs in {root}", file=sys.stderr, flush=True)
        for i in range(args.runs):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                result = run_demo(mode, args.steps, root / f"{mode}-{i}", args.spares)
                result["measured"] = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
                runs.append(result)
                notice = result["interruptions"][0]["breakdown"]
                print(f"{mode} run {i + 1}: exit -> first step "
                      f"{notice.get('exit_to_first_step_s')} s (notice), load "
                      f"{result['load_before']}", file=sys.stderr, flush=True)
                if args.keep:
                    args.keep.write_text(json.dumps(runs, indent=1) + "\n")
    text = section(runs, args.note and f"\n{args.note}\n")
    print(text)
    if not args.no_write:
        write_section(BENCHMARKS, *markers(int(runs[0].get("spares", 0))), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
