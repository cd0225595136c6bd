"""The torchrun agent wrapper ends fast but completely: atexit handlers run, output is flushed,
and the exit status is the one it chose (the batch script and RequeueExit read it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, sys
from slurm_spot.jobs.torchrun_agent import leave
atexit.register(lambda: print("atexit handler ran", flush=True))
print("unflushed stdout", end="")
sys.stderr.write("unflushed stderr")
leave({code})
print("never reached")
"""


@pytest.mark.parametrize("code", [0, 1, 85])
def test_leave_runs_atexit_flushes_and_keeps_the_exit_code(code: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(code=code)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "unflushed stdoutatexit handler ran\n"
    assert proc.stderr == "unflushed stderr"
