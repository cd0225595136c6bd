"""The per-node torchrun agent (slurm_spot/jobs/torchrun_agent.py) with real torch on CPU."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agent_stopped_by_slurm_says_so_in_one_line(tmp_path: Path) -> None:
    """Slurm ends the step with SIGTERM (requeue, cancel, power-down): the job's output shows
    one line naming the signal and exit 128+15, not torchrun's SignalException traceback that
    reads like a crash."""
    started = tmp_path / "started"
    worker = tmp_path / "worker.py"
    worker.write_text("import pathlib, time\n"
                      f"pathlib.Path({str(started)!r}).touch()\n"
                      "time.sleep(120)\n")
    # One node, whose NodeAddr is loopback: no Slurm needed for the rendezvous address.
    code = ("import sys, slurm_spot.jobs.torchrun_agent as agent\n"
            "agent.node_addr = lambda client, node: '127.0.0.1'\n"
            "sys.exit(agent.main(sys.argv[1:]))\n")
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "spot-1",
           "SLURMD_NODENAME": "spot-1", "SLURM_JOB_NUM_NODES": "1",
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, "--port", str(_free_port()), "--",
                             str(worker)], env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert started.exists(), "the worker never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "slurm-spot: torchrun agent stopped by signal 15 (SIGTERM)" in err
    assert "Traceback" not in err
