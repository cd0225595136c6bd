"""Run the demo (`slurm-spot demo --json`) and record its figures in BENCHMARKS.md.

Method: one run of the README's main job on this machine: a 2-node torchrun DDP job
(gloo, CPU) on the local spot cluster, interrupted once with a 30 s notice and once by a
kill without notice; recovery is timed from the interruption the demo caused to the first
training event of the resumed run; lost steps are steps computed twice. Usage:

    python benchmarks/demo_recovery.py [--from-json FILE] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from report import write_section  # benchmarks/report.py, beside this script

from slurm_spot.jsonenvelope import read_envelope

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
BEGIN, END = "<!-- demo:begin -->", "<!-- demo:end -->"


def section(result: dict) -> str:
    rows = "\n".join(
        f"| {i['kind']} | {i['node']} | {i['at_step']} | {i['resumed_from']} | "
        f"{i['lost_steps']} | {i['recovery_s']} | "
        f"{(i.get('breakdown') or {}).get('exit_to_first_step_s', '-')} | "
        f"{i.get('prewarmed', '-')} |" for i in result["interruptions"])
    return f"""{BEGIN}
## The demo: a torchrun job interrupted twice

`python benchmarks/demo_recovery.py` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, \
{platform.machine()}, 2 CPUs): `slurm-spot demo --json`, {result['steps']} steps on 2 local
spot nodes, one interruption with a 30 s notice, one kill without notice.

| interruption | node | at step | resumed from | recomputed | recovery (s) | exit -> step (s) | prewarmed |
|---|---|---|---|---|---|---|---|
{rows}

Job {result['state']} after {result['wall_s']} s with {result['restarts']} restarts; final
weights identical to an uninterrupted run: {result['exact_resume']} (loss {result['final_loss']}).
With notice the job checkpoints at the next step boundary and loses nothing; with prewarm it
trains on while its replacement boots and is signalled when it is up (recovery, timed from
the notice, then includes that training time; the part after the job's exit is the column
beside it; the full breakdown is in the prewarm section). Without notice the reconciler
(interval 5 s here) requeues and expedites; the steps since the last periodic checkpoint are computed again.
{END}"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-json", type=Path, help="record an earlier demo --json result")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.from_json:
        recorded = json.loads(args.from_json.read_text())
        # a result recorded before --json had its envelope (docs/cli.md) is the bare data
        result = read_envelope(args.from_json.read_text(), "demo") if "meta" in recorded \
            else recorded
    else:
        proc = subprocess.run([sys.executable, "-m", "slurm_spot", "demo", "--json"],
                              capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        result = read_envelope(proc.stdout, "demo")
    text = section(result)
    print(text)
    if not args.no_write:
        write_section(BENCHMARKS, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
