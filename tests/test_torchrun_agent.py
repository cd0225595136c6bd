"""The torchrun agent wrapper ends fast but completely: atexit handlers run, output is flushed,
and the exit status is the one it chose (the batch script and RequeueExit read it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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


WORKER = """
import signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("worker ready", flush=True)
if sys.argv[1] == "requeue":  # saved its checkpoint: leaves with the requeue code
    time.sleep(0.5)
    sys.exit(85)
if sys.argv[1] in ("rejoin", "crash"):  # stops for a new rendezvous round / crashes
    time.sleep(0.5)
    sys.exit(86 if sys.argv[1] == "rejoin" else 3)
deadline = time.time() + 120
while not stop and time.time() < deadline:
    time.sleep(0.05)
"""

AGENT = """
import sys
from slurm_spot.jobs.torchrun_agent import leave, run_torchrun
leave(run_torchrun(["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=127.0.0.1:0", "--max-restarts=0", sys.argv[1],
                    sys.argv[2]], 85, elastic=sys.argv[3] == "elastic"))
"""


def _agent(tmp_path: Path, mode: str, elastic: bool = False) -> subprocess.Popen[str]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.Popen([sys.executable, "-c", AGENT, str(worker), mode,
                             "elastic" if elastic else "plain"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(agent: subprocess.Popen[str]) -> list[str]:
    assert agent.stdout is not None
    lines = []
    for line in agent.stdout:
        lines.append(line)
        if "worker ready" in line:
            return lines
    raise AssertionError("".join(lines))


@pytest.mark.parametrize(("mode", "code", "said"), [
    ("requeue", 85, "workers stopped for a requeue (exit 85)"),
    ("term", 143, "torchrun agent stopped by SIGTERM"),
])
def test_agent_exit_status(tmp_path: Path, mode: str, code: int, said: str) -> None:
    """A worker that leaves with the requeue code: the agent passes the code on (for the
    batch script and RequeueExit). SIGTERM to the agent (what Slurm sends when the job
    requeued itself or is cancelled): torchrun stops the worker and the agent reports the
    signal (128 + 15). Neither prints a traceback."""
    agent = _agent(tmp_path, mode)
    try:
        lines = _wait_ready(agent)
        if mode == "term":
            agent.send_signal(signal.SIGTERM)
        rest, _ = agent.communicate(timeout=120)
    finally:
        agent.kill()
    output = "".join(lines) + rest
    assert agent.returncode == code, output
    assert said in output and "Traceback" not in output, output


@pytest.mark.parametrize(("mode", "elastic", "code"), [
    ("rejoin", True, 85), ("crash", True, 1), ("rejoin", False, 1)])
def test_elastic_agent_with_its_restart_budget_spent(tmp_path: Path, mode: str, elastic: bool,
                                                     code: int) -> None:
    """An elastic agent whose workers last stopped for a new rendezvous round (exit 86) when
    torchrun's --max-restarts were spent (0 here) falls back to requeue (85): interruptions
    never end an elastic job FAILED. A crash stays a failure (1), and outside elastic mode
    86 means nothing to the agent."""
    agent = _agent(tmp_path, mode, elastic)
    try:
        rest, _ = agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert agent.returncode == code, rest
    assert ("restart budget (--max-restarts) is spent on interruptions" in rest) == (code == 85)
