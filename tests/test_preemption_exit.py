"""How a training process leaves for its requeue: exit code, files and atexit handlers intact,
and the interpreter's final full garbage collections skipped (they cost ~1 s with torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
import atexit, gc, sys
from slurm_spot.checkpoint.preemption import PreemptionHandler

log = open(sys.argv[1], "w")  # left open, as training scripts do with their logs
log.write("step 41\\nstep 42\\n")
atexit.register(lambda: print(f"atexit: frozen objects {gc.get_freeze_count()}", flush=True))
try:
    PreemptionHandler(env={}).install().exit_for_requeue()
finally:
    print("finally ran", flush=True)
"""


def test_exit_for_requeue_leaves_with_the_code_and_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 85, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "finally ran"
    assert lines[1].startswith("atexit: frozen objects ") and int(lines[1].split()[-1]) > 0
    assert log.read_text() == "step 41\nstep 42\n"  # flushed and closed by the teardown
