"""Progress on long waits: a spinner at a terminal, nothing in a pipe, never in --json output
(issue 16)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slurm_spot.commands.progress import waiting
from slurm_spot.jsonenvelope import read_envelope
from tests.netns import host_network
from tests.terminal import run_in_terminal
from tests.test_reconcile_daemon import write_config


def test_node_name_wait_shows_a_spinner_at_a_terminal_only(tmp_path: Path) -> None:
    """No Slurm answers (no scontrol there) and the host is no node: it waits out --wait."""
    path = write_config(tmp_path, slurm_bin_dir=str(tmp_path / "no-slurm"))
    argv = [sys.executable, "-m", "slurm_spot", "--config", str(path), "node-name", "--wait", "3"]
    # On the host's network: the host has an address there to ask Slurm about (a parallel
    # test worker's own namespace has loopback only, and node-name then never asks Slurm).
    with host_network():
        code, shown, _ = run_in_terminal(argv)
        piped = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert code == 1, shown
    assert "node-name: waiting up to 3 s for this host's address in Slurm" in shown
    assert "0:00:0" in shown  # the elapsed time
    assert piped.returncode == 1
    assert "waiting up to" not in piped.stderr and piped.stdout == ""
    assert "slurm-spot: failed:" in piped.stderr


def test_off_a_terminal_steps_go_to_echo_or_nowhere(capsys) -> None:  # type: ignore[no-untyped-def]
    said: list[str] = []
    with waiting("x: starting", echo=said.append) as shown:
        assert not shown.live
        shown.step("x: step 1")
        shown.line("a result line")
    with waiting("quiet") as silent:
        silent.step("nothing")
        silent.line("nothing")
    assert said == ["x: step 1", "a result line"]
    assert capsys.readouterr() == ("", "")


_STUB_DEMO = """
import sys, time
import slurm_spot.commands.demo as demo

class StubDemo:  # the real one runs a cluster for minutes (tests/test_checkpoint_s3_e2e.py)
    def __init__(self, settings, progress):
        self.say = progress
    def run(self):
        for line in ("starting the local spot cluster", "submitted job 1", "job 1 finished"):
            self.say(line)
            time.sleep(0.3)
        return {"state": "COMPLETED", "exact_resume": True, "job": 1}

demo.Demo = StubDemo
from slurm_spot.cli import main
main(sys.argv[1:])
"""


def test_demo_json_keeps_progress_off_stdout_with_a_spinner_on_a_terminal(tmp_path: Path) -> None:
    """stdout (piped) carries only the JSON result; stderr, a terminal, gets the stage lines
    and the spinner."""
    code, shown, out = run_in_terminal([sys.executable, "-c", _STUB_DEMO, "demo", "--json",
                                        "--workdir", str(tmp_path)], on_terminal=("stderr",))
    assert code == 0
    assert read_envelope(out) == {"state": "COMPLETED", "exact_resume": True, "job": 1}
    assert "submitted job 1" in shown and "demo: job 1 finished" in shown  # line, then spinner
    piped = subprocess.run([sys.executable, "-c", _STUB_DEMO, "demo", "--json", "--workdir",
                            str(tmp_path)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert read_envelope(piped.stdout)["state"] == "COMPLETED"
    assert piped.stderr.splitlines() == ["starting the local spot cluster", "submitted job 1",
                                         "job 1 finished"]
