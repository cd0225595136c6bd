"""Which signal a job on a node under notice gets, and which of its processes get it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_spot.jobs.interruption.signal_choice import (
    JobSignaller,
    ProcInfo,
    parse_status,
    plan_signal,
    read_processes,
)
from tests.fakes.fake_slurm import FakeSlurm

USR1, USR2, TERM, INT = (int(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM,
                                         signal.SIGINT))


def proc(pid: int, step: str, name: str, caught: set[int] = frozenset(),  # type: ignore[assignment]
         ignored: set[int] = frozenset()) -> ProcInfo:  # type: ignore[assignment]
    return ProcInfo(pid, step, name, frozenset(caught), frozenset(ignored))


BASH = proc(10, "batch", "bash", {int(signal.SIGCHLD)})
SRUN = proc(11, "batch", "srun", {USR1, USR2, TERM, INT})

SCRIPT_USR1 = "#!/bin/bash\n#SBATCH --signal=USR1@60\n#SBATCH --requeue\nsrun python train.py\n"


def test_parse_status_reads_the_masks() -> None:
    info = parse_status("Name:\tpython3\nSigBlk:\t0\nSigIgn:\t0000000000001000\n"
                        "SigCgt:\t0000000180000202\n", 7, "0")
    assert info.name == "python3"
    assert info.caught == {2, 10, 32, 33} and info.ignored == {13}
    assert info.survives(USR1) and info.survives(13) and not info.survives(USR2)
    assert info.survives(int(signal.SIGURG))  # default action: ignore
    with pytest.raises(ValueError, match="SigCgt"):
        parse_status("Name:\tx\n", 7, "0")


def test_own_signal_from_the_batch_script_goes_to_the_step_that_catches_it() -> None:
    procs = [BASH, SRUN, proc(20, "0", "python", {USR1, INT})]
    plan = plan_signal(5, SCRIPT_USR1, procs, "USR2")
    assert (plan.signal, plan.steps, plan.pids) == ("USR1", ("0",), ())
    assert "--signal=USR1@60" in plan.why
    # The batch shell does not trap USR1: it is not signalled (its death would end the job).
    assert BASH.pid not in plan.pids


def test_without_a_directive_the_caught_signal_wins_over_spot_yaml() -> None:
    term_only = [BASH, proc(20, "batch", "python", {TERM, INT})]
    plan = plan_signal(5, "#!/bin/bash\npython train.py\n", term_only, "USR2")
    assert (plan.signal, plan.steps, plan.pids) == ("TERM", (), (20,))
    assert "catch SIGTERM" in plan.why
    # SIGINT is caught by every Python process (KeyboardInterrupt): never chosen by probing.
    int_only = [proc(20, "0", "python", {INT})]
    plan = plan_signal(5, None, int_only, "USR2")
    assert plan.signal == "USR2" and not plan.delivers
    assert "no process of the job on this node catches SIGUSR2" in plan.why


def test_spot_yaml_signal_is_preferred_when_several_are_caught() -> None:
    both = [proc(20, "0", "python", {USR1, USR2, TERM})]
    assert plan_signal(5, None, both, "USR2").signal == "USR2"
    assert plan_signal(5, None, both, "TERM").signal == "TERM"
    # srun catches everything only to forward it: it does not count as the job handling it.
    assert plan_signal(5, None, [BASH, SRUN], "USR2").delivers is False


def test_a_process_that_would_die_is_spared_and_its_step_signalled_per_process() -> None:
    # Step 1's trainer (30) catches USR1, its DataLoader worker (31) would die of it: Slurm
    # signals every process of a step, so the trainer alone gets it, by kill(2).
    procs = [proc(20, "0", "python", {USR1}), proc(30, "1", "python", {USR1}),
             proc(31, "1", "pt_data_worker")]
    plan = plan_signal(5, SCRIPT_USR1, procs, "USR2")
    assert (plan.steps, plan.pids) == (("0",), (30,))
    assert plan.spared == ("1: pid 31 (pt_data_worker)",)
    # A torchrun agent that ignores the signal (trap '' USR2) does not stop its step.
    agent = [proc(40, "0", "torchrun", ignored={USR2}), proc(41, "0", "python", {USR2})]
    assert plan_signal(6, None, agent, "USR2").steps == ("0",)


def test_a_job_in_its_prolog_gets_nothing_yet() -> None:
    plan = plan_signal(5, SCRIPT_USR1, [], "USR2")
    assert plan.signal == "USR1" and not plan.delivers


def _slurm(job_id: int, node: str, script: str,
           pids: list[tuple[int, str]] | None = None) -> FakeSlurm:
    """Slurm running job ``job_id`` on ``node`` with batch ``script``; ``pids`` is what
    ``scontrol listpids`` answers (None: no step daemon answers, so the watcher finds the
    processes by their environment)."""
    fake = FakeSlurm()
    fake.add_job(job_id, [node]).script = script
    fake.jobs[job_id].pids = pids
    return fake


HANDLER = """
import signal, sys, time
signal.signal(signal.SIG{sig}, lambda *a: (open(sys.argv[1], "w").write("{sig}"), sys.exit(0)))
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
"""


def test_signaller_kills_only_the_batch_process_that_catches_it(tmp_path: Path) -> None:
    """Real processes of 'job 77 on spot-9': a Python loop that handles SIGTERM only, and a
    plain sleep. The watcher finds them by their environment, reads their real dispositions,
    and only the handler gets SIGTERM; the sleep (which would die of it) is untouched."""
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "spot-9"}
    marker = tmp_path / "got"
    catcher = subprocess.Popen([sys.executable, "-c", HANDLER.format(sig="TERM"), str(marker)],
                               env=env)
    bystander = subprocess.Popen(["sleep", "60"], env=env)
    other_node = subprocess.Popen(["sleep", "60"], env={**env, "SLURMD_NODENAME": "spot-8"})
    try:
        deadline = time.monotonic() + 30
        while not Path(str(marker) + ".ready").exists():
            assert time.monotonic() < deadline, "handler did not start"
            time.sleep(0.05)
        found = read_processes(77, "spot-9", None)
        assert {p.pid for p in found} == {catcher.pid, bystander.pid}
        emitted: list[tuple[str, dict]] = []
        signaller = JobSignaller(_slurm(77, "spot-9", "#!/bin/sh\n").client(),
                                 "spot-9", "USR2", lambda a, **f: emitted.append((a, f)))
        assert signaller.deliver([77]) == []
        assert catcher.wait(timeout=20) == 0 and marker.read_text() == "TERM"
        assert bystander.poll() is None and other_node.poll() is None
        assert signaller.signalled(77)
        action, fields = emitted[-1]
        assert action == "signalled" and fields["extra"]["signal"] == "TERM"
        assert fields["extra"]["pids"] == [catcher.pid]
        assert "catch SIGTERM" in fields["reason"]
        assert signaller.deliver([77]) == [] and len(emitted) == 1  # once per job
    finally:
        for p in (catcher, bystander, other_node):
            p.kill()
            p.wait()


def test_signaller_withholds_then_delivers_once_a_handler_appears(tmp_path: Path) -> None:
    """A job still starting (nothing catches its USR1 yet) gets nothing; once its handler is
    installed, the next call delivers it to the step with scancel."""
    status = tmp_path / "proc" / "50" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython\nSigIgn:\t0\nSigCgt:\t0000000000000002\n")
    fake = _slurm(5, "spot-1", SCRIPT_USR1, pids=[(50, "0")])
    emitted: list[str] = []
    signaller = JobSignaller(fake.client(), "spot-1", "USR2",
                             lambda a, **f: emitted.append(a), proc_root=tmp_path / "proc")
    signaller.deliver([5])
    assert emitted == ["signal_withheld"] and fake.signals == []
    signaller.deliver([5])
    assert emitted == ["signal_withheld"]  # withheld once, not once per poll
    status.write_text("Name:\tpython\nSigIgn:\t0\nSigCgt:\t0000000000000202\n")  # + USR1
    signaller.deliver([5])
    assert emitted == ["signal_withheld", "signalled"]
    assert fake.signals == [["-s", "USR1", "5.0"]]
    assert [c for c in fake.tools() if c[1:3] == ["write", "batch_script"]] == [
        ["scontrol", "write", "batch_script", "5", "-"]]  # the script is read once


def test_a_step_scancel_cannot_reach_gets_the_signal_by_kill_and_the_failure_is_an_event(
        tmp_path: Path) -> None:
    """scancel exits 225 "Invalid job id specified" for the step (what slurmd 22.05 answers
    on a node whose name holds a regex character): the watcher records ``signal_failed`` with
    the error, and the step's real process here that catches SIGUSR2 still gets it by kill(2)."""
    marker = tmp_path / "got"
    catcher = subprocess.Popen([sys.executable, "-c", HANDLER.format(sig="USR2"), str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not Path(str(marker) + ".ready").exists():
            assert time.monotonic() < deadline, "handler did not start"
            time.sleep(0.05)
        fake = _slurm(3, "a+b-1", "#!/bin/sh\nsrun python train.py\n",
                      pids=[(catcher.pid, "0")])
        fake.fail[("scancel", "-s")] = (225, "scancel: error: Kill job error on job step id 3: "
                                             "Invalid job id specified\n")
        emitted: list[tuple[str, dict]] = []
        signaller = JobSignaller(fake.client(), "a+b-1", "USR2",
                                 lambda a, **f: emitted.append((a, f)))
        assert signaller.deliver([3]) == []
        assert catcher.wait(timeout=20) == 0 and marker.read_text() == "USR2"
        assert ["scancel", "-s", "USR2", "3.0"] in fake.tools()  # scancel was tried first
        assert [a for a, _ in emitted] == ["signal_failed", "signalled"]
        failed, done = emitted[0][1], emitted[1][1]
        assert "Invalid job id specified" in failed["reason"]
        assert failed["extra"] == {"signal": "USR2", "step": "0", "fallback_pids": [catcher.pid]}
        assert done["extra"]["steps"] == [] and done["extra"]["pids"] == [catcher.pid]
        assert signaller.signalled(3)
    finally:
        catcher.kill()
        catcher.wait()


ALRM, XCPU = int(signal.SIGALRM), int(signal.SIGXCPU)


@pytest.mark.parametrize(("directive", "name", "number"), [
    ("--signal=ALRM@60", "ALRM", ALRM), ("--signal=B:XCPU@120", "XCPU", XCPU),
    (f"--signal={ALRM}@60", "ALRM", ALRM)])
def test_a_job_asking_for_a_signal_spot_yaml_cannot_name_gets_it(
        tmp_path: Path, directive: str, name: str, number: int) -> None:
    """A plain sbatch job of its own that asks for SIGALRM or SIGXCPU (sbatch takes both) made
    the watcher's delivery raise ValueError (int('ALRM')), so on a notice no job of the node
    after it was signalled either; now it gets its signal, and the next job still gets its."""
    for pid, caught in ((50, 1 << (number - 1)), (60, 1 << (USR1 - 1))):
        status = tmp_path / "proc" / str(pid) / "status"
        status.parent.mkdir(parents=True)
        status.write_text(f"Name:\tpython\nSigIgn:\t0\nSigCgt:\t{caught:016x}\n")
    fake = _slurm(5, "spot-1", f"#!/bin/bash\n#SBATCH {directive}\nsrun python a.py\n",
                  pids=[(50, "batch" if "B:" in directive else "0")])
    fake.add_job(6, ["spot-1"]).script = SCRIPT_USR1
    fake.jobs[6].pids = [(60, "0")]
    killed: list[tuple[int, int]] = []
    emitted: list[tuple[str, dict]] = []
    signaller = JobSignaller(fake.client(), "spot-1", "USR2",
                             lambda a, **f: emitted.append((a, f)), proc_root=tmp_path / "proc",
                             kill=lambda pid, sig: killed.append((pid, sig)))
    assert signaller.deliver([5, 6]) == []
    assert signaller.signalled(5) and signaller.signalled(6)
    assert [f["extra"]["signal"] for a, f in emitted if a == "signalled"] == [name, "USR1"]
    if "B:" in directive:
        assert killed == [(50, number)]
    else:
        assert ["-s", name, "5.0"] in fake.signals
