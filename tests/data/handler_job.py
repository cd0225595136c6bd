"""A tiny "training" job for the end-to-end signal tests, written the way other frameworks'
users write theirs: it handles only the signal named by --handle (or none), and on it saves
its step to its own checkpoint file and exits with --exit-code.

Events go to --log as JSON lines: start (step resumed from, restart count), preempted (step,
signal), done (step). Usage:

    python handler_job.py --handle USR1|TERM|USR2|none --dir DIR --steps N [--exit-code C]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--handle", default="none")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-sleep", type=float, default=0.25)
    parser.add_argument("--exit-code", type=int, default=None)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    log = args.dir / "events.jsonl"
    ckpt = args.dir / "checkpoint"

    def event(name: str, **fields: object) -> None:
        with open(log, "a") as fh:
            fh.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")

    step = int(ckpt.read_text()) if ckpt.exists() else 0
    caught: list[int] = []
    if args.handle != "none":
        signal.signal(getattr(signal, f"SIG{args.handle}"), lambda signum, _: caught.append(signum))
    event("start", step=step, restart=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
          node=os.environ.get("SLURMD_NODENAME"), pid=os.getpid())
    while step < args.steps:
        if caught:
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(str(step))
            os.replace(tmp, ckpt)
            event("preempted", step=step, signal=caught[0])
            # 128 + signal number, the shell's convention for "ended by this signal"
            return args.exit_code if args.exit_code is not None else 128 + caught[0]
        time.sleep(args.step_sleep)
        step += 1
        event("step", step=step)
    event("done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
