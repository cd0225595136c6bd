"""slurm-spot-prolog-slurmctld (slurm_spot/lifecycle/bootwait.py): when it lets slurmctld launch a job,
and what `render` writes for it on each Slurm release."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_spot.config import load_config
from slurm_spot.lifecycle.bootwait import (
    node_flags,
    nodes_given_up,
    nodes_ready,
    slurm_conf_from_parent,
    wait_for_nodes,
)
from slurm_spot.render import render

DATA = Path(__file__).parent / "data"

# `scontrol -o show node` lines of Slurm 22.05.8 (the local cluster), cut after State=: a node
# powering up for job 2, the same node registered, and one that ResumeTimeout marked down.
BOOTING = ("NodeName=spot-1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUEfctv=1 CPUTot=1 "
           "CPULoad=0.00 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) "
           "NodeAddr=127.0.0.1 NodeHostName=localhost Port=17001 RealMemory=1 AllocMem=0 "
           "FreeMem=N/A Sockets=1 Boards=1 State=ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP "
           "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=spot")
UP = BOOTING.replace("State=ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP", "State=ALLOCATED+CLOUD")
POWERED_DOWN = BOOTING.replace("spot-1", "spot-2").replace(
    "State=ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP", "State=IDLE+CLOUD+POWERED_DOWN")
DOWN = BOOTING.replace("spot-1", "spot-2").replace(
    "State=ALLOCATED+CLOUD+NOT_RESPONDING+POWERING_UP",
    "State=DOWN*+CLOUD+POWERED_DOWN") + " Reason=ResumeTimeout reached [slurm@2026-12-02T16:00:00]"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_node_flags_reads_each_state_word() -> None:
    flags = node_flags("\n".join([BOOTING, POWERED_DOWN]))
    assert flags["spot-1"] == {"ALLOCATED", "CLOUD", "NOT_RESPONDING", "POWERING_UP"}
    assert flags["spot-2"] == {"IDLE", "CLOUD", "POWERED_DOWN"}
    assert node_flags(DOWN)["spot-2"] == {"DOWN", "CLOUD", "POWERED_DOWN"}


def test_ready_only_when_no_node_is_powered_down_or_powering_up() -> None:
    assert not nodes_ready(node_flags(BOOTING), ["spot-1"])
    assert nodes_ready(node_flags(UP), ["spot-1"])
    assert not nodes_ready(node_flags("\n".join([UP, POWERED_DOWN])), ["spot-1", "spot-2"])
    assert not nodes_ready(node_flags(UP), ["spot-1", "spot-9"]), "a node Slurm did not list"
    assert nodes_given_up(node_flags(DOWN)) == ["spot-2"]
    assert nodes_given_up(node_flags(BOOTING)) == []


def test_waits_until_the_last_node_registered() -> None:
    answers = iter([BOOTING, BOOTING, BOOTING, UP])
    clock = FakeClock()
    result = wait_for_nodes("2", ["spot-1"], lambda: next(answers), lambda: "CONFIGURING",
                            timeout_s=70, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert (result.outcome, result.polls, result.waited_s) == ("ready", 4, 1.5)


def test_a_job_on_nodes_already_up_costs_one_look() -> None:
    result = wait_for_nodes("2", ["spot-1"], lambda: UP, lambda: "RUNNING", timeout_s=70)
    assert (result.outcome, result.polls) == ("up", 1)


def test_stops_waiting_when_the_job_left_configuring_or_a_node_went_down() -> None:
    clock = FakeClock()
    gone = wait_for_nodes("2", ["spot-1"], lambda: BOOTING, lambda: "PENDING", timeout_s=70,
                          clock=clock, sleep=clock.sleep)
    assert (gone.outcome, gone.detail) == ("gone", "JobState=PENDING")
    down = wait_for_nodes("2", ["spot-1", "spot-2"], lambda: "\n".join([BOOTING, DOWN]),
                          lambda: "CONFIGURING", timeout_s=70, clock=clock, sleep=clock.sleep)
    assert (down.outcome, down.detail) == ("failed", "spot-2")


def test_gives_up_after_the_timeout_and_when_slurm_does_not_answer() -> None:
    clock = FakeClock()
    late = wait_for_nodes("2", ["spot-1"], lambda: BOOTING, lambda: "CONFIGURING",
                          timeout_s=5, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert late.outcome == "timeout" and late.waited_s <= 5
    failed = wait_for_nodes("2", ["spot-1"], lambda: None, lambda: None, timeout_s=5)
    assert failed.outcome == "error"


def test_hook_always_exits_0_and_says_why_it_did_not_wait(tmp_path: Path) -> None:
    # A PrologSlurmctld that exits non-zero gets the job requeued or killed (slurm.conf(5)).
    hook = Path(sys.executable).parent / "slurm-spot-prolog-slurmctld"
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_SPOT_CONFIG": str(tmp_path / "missing.yaml"),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "spot-[1-2]"}
    argv = [str(hook)] if hook.exists() else [sys.executable, "-c",
                                              "import sys; from slurm_spot.hooks import "
                                              "prolog_slurmctld; sys.exit(prolog_slurmctld())"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "job 7" in proc.stderr and "missing.yaml" in proc.stderr and "not waiting" in proc.stderr
    env.pop("SLURM_JOB_ID")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "SLURM_JOB_ID=''" in proc.stderr


def test_hook_exits_0_when_its_output_cannot_be_written_and_for_odd_job_ids(
        tmp_path: Path) -> None:
    """Its stderr a pipe whose reader is gone: Python's flush at exit made it exit 120 (the
    job requeued). A job id of other digits (Arabic-Indic) or bytes is no job id."""
    hook = Path(sys.executable).parent / "slurm-spot-prolog-slurmctld"
    argv = [str(hook)] if hook.exists() else [sys.executable, "-c",
                                              "import sys; from slurm_spot.hooks import "
                                              "prolog_slurmctld; sys.exit(prolog_slurmctld())"]
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_SPOT_CONFIG": str(tmp_path / "missing.yaml"),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "spot-[1-2]"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(argv, env=env, stdout=write_end, stderr=write_end, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    for job in ("\u0667", "7\udcff"):
        env_bytes = {k.encode(): v.encode() for k, v in env.items() if k != "SLURM_JOB_ID"}
        env_bytes[b"SLURM_JOB_ID"] = job.encode("utf-8", "surrogateescape")
        done = subprocess.run(argv, env=env_bytes, capture_output=True, timeout=60)
        assert done.returncode == 0
        assert b"not a job's PrologSlurmctld" in done.stderr, done.stderr


def test_slurm_conf_comes_from_the_parent_process() -> None:
    # slurmctld gives a PrologSlurmctld no SLURM_CONF; its parent (slurmscriptd) has
    # slurmctld's environment.
    code = ("import os, sys; from slurm_spot.lifecycle.bootwait import slurm_conf_from_parent; "
            "print(slurm_conf_from_parent())")
    env = {**os.environ, "SLURM_CONF": "/etc/x/slurm.conf"}
    parent = subprocess.run(
        [sys.executable, "-c", "import os, subprocess, sys; env = {'PATH': os.environ['PATH']}; "
         f"subprocess.run([sys.executable, '-c', {code!r}], env=env)"],
        env=env, capture_output=True, text=True, timeout=60)
    assert parent.stdout.strip() == "/etc/x/slurm.conf", parent.stderr
    # slurmctld -f FILE: its -f argument (parent or grandparent: slurmscriptd renames itself)
    env.pop("SLURM_CONF")
    parent = subprocess.run(
        [sys.executable, "-c", "import os, subprocess, sys; env = {'PATH': os.environ['PATH']}; "
         f"subprocess.run([sys.executable, '-c', {code!r}], env=env)", "-f", "/etc/y/slurm.conf"],
        env=env, capture_output=True, text=True, timeout=60)
    assert parent.stdout.strip() == "/etc/y/slurm.conf", parent.stderr
    assert slurm_conf_from_parent(ppid=2**22 + 12345) is None  # no such process


def _config(tmp_path: Path, **power: object):  # type: ignore[no-untyped-def]
    import yaml

    source = tmp_path / "spot.yaml"
    data = yaml.safe_load((DATA / "render-gpu.yaml").read_text())
    data.setdefault("power", {}).update(power)
    source.write_text(yaml.safe_dump(data))
    return load_config(source)


@pytest.mark.parametrize(("version", "one_only"), [("22.05", True), ("23.02", True),
                                                    ("23.11", True), ("24.05", False),
                                                    ("24.11", False), ("26.05", False)])
def test_every_release_gets_the_prolog_and_the_one_only_warning_before_24_05(
        tmp_path: Path, version: str, one_only: bool) -> None:
    text = render(_config(tmp_path), hooks_dir=Path("/opt/ss/bin"),
                  version=version).files["slurm-spot.conf"]
    assert "\nPrologSlurmctld=/opt/ss/bin/slurm-spot-prolog-slurmctld\n" in text
    assert ("runs one PrologSlurmctld: this replaces" in text) is one_only
    assert text.count("PrologSlurmctld=") == 1


def test_the_setting_off_renders_no_prolog(tmp_path: Path) -> None:
    text = render(_config(tmp_path, prolog_slurmctld=False), version="22.05").files[
        "slurm-spot.conf"]
    assert "PrologSlurmctld" not in text


def test_a_job_on_other_nodes_of_the_site_is_not_held(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # slurmctld runs the PrologSlurmctld for every job: one on nodes spot.yaml does not make
    # returns before asking Slurm anything (its scontrol here is not even there).
    import yaml

    from slurm_spot.lifecycle.bootwait import run

    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "providers": {"lab": {"type": "local"}},
        "node_sets": [{"name": "spot", "provider": "lab", "count": 2, "cpus": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "slurm_bin_dir": str(tmp_path / "no-slurm")}))
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(config))
    result, message = run({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "onprem-[1-4]"})
    assert result is None and message.endswith("job 9 on onprem-[1-4]: no node of spot.yaml")
    result, message = run({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "spot-1"})
    assert result is not None and result.outcome == "error", message  # no scontrol there


def test_a_restarted_jobs_launch_waits_out_the_second_of_its_release() -> None:
    """A restart released with StartTime=now (EligibleTime 16:14:54) and allocated within that
    second launches only from 16:14:55: slurmd refuses a credential of the revocation's
    second ("Job credential revoked", and the job ended with exit 1 in a fresh-clone run). A
    first run, or a restart released earlier, is not held."""
    from datetime import datetime

    from slurm_spot.lifecycle.bootwait import credential_wait_s

    eligible = datetime.fromisoformat("2026-12-03T16:14:54").timestamp()
    restarted = {"Restarts": "1", "EligibleTime": "2026-12-03T16:14:54"}
    assert credential_wait_s(restarted, eligible + 0.56) == pytest.approx(0.44)
    assert credential_wait_s(restarted, eligible + 1.2) == 0.0
    assert credential_wait_s({**restarted, "Restarts": "0"}, eligible + 0.5) == 0.0
    assert credential_wait_s({"Restarts": "2", "EligibleTime": "Unknown"}, eligible) == 0.0
    # Requeued again while the program ran: held by Slurm (~121 s), no launch to protect. A
    # 121 s sleep here kept a failed-over job "Cleaning" past its test's 90 s (fresh clone).
    held = {"Restarts": "1", "EligibleTime": "2026-12-03T16:16:55"}
    assert credential_wait_s(held, eligible + 0.5) == 0.0
