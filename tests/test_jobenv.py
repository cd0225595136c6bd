"""The job-environment functions, driven by the field cases in tests/data/job-env.yaml."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from slurm_spot.contract import jobenv
from slurm_spot.contract.jobenv import JobEnvError, SignalSpec, parse_signal
from slurm_spot.errors import BadInputError

CASES = yaml.safe_load((Path(__file__).parent / "data" / "job-env.yaml").read_text())
USR2 = int(signal.SIGUSR2)


@pytest.mark.parametrize("case", CASES["restart_count"], ids=lambda c: repr(c["env"]))
def test_restart_count_field_cases(case: dict) -> None:
    assert jobenv.restart_count(case["env"]) == case["restarts"]


def test_restart_count_ignores_the_torchelastic_count() -> None:
    assert jobenv.restart_count({"TORCHELASTIC_RESTART_COUNT": "4"}) == 0


@pytest.mark.parametrize("value", ["x", "-1", "1.5"])
def test_restart_count_rejects_garbage(value: str) -> None:
    with pytest.raises(ValueError, match="SLURM_RESTART_COUNT"):
        jobenv.restart_count({"SLURM_RESTART_COUNT": value})


@pytest.mark.parametrize("case", CASES["requeue_target"], ids=lambda c: c["target"])
def test_requeue_target_field_cases(case: dict) -> None:
    assert jobenv.requeue_target(case["env"]) == case["target"]


def test_checkpoint_key_field_cases() -> None:
    for case in CASES["checkpoint_key"]:
        key = jobenv.checkpoint_key(case["env"])
        if "same_dir_as" in case:
            assert key == jobenv.checkpoint_key(case["same_dir_as"])
        if "differs_from" in case:
            assert key != jobenv.checkpoint_key(case["differs_from"])


def test_checkpoint_key_never_contains_the_restart_count() -> None:
    env = {"SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "2"}
    assert jobenv.checkpoint_key({**env, "SLURM_RESTART_COUNT": "7"}) == "1234_2"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "12a"}, "not a job id"),
        ({"SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "4"}, "SLURM_ARRAY_TASK_ID"),
    ],
)
def test_job_ids_bad_input(env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jobenv.requeue_target(env)
    with pytest.raises(BadInputError, match=message):
        jobenv.checkpoint_key(env)


ACCEPTED = CASES["signals"][1]["accept"]
EXPECTED = {  # what each field form means
    "USR2": SignalSpec(USR2, "USR2"),
    "SIGUSR2": SignalSpec(USR2, "USR2"),
    "12": SignalSpec(USR2, "USR2"),
    "B:USR2@90": SignalSpec(USR2, "USR2", 90, frozenset("B")),
    "R:SIGUSR2@120": SignalSpec(USR2, "USR2", 120, frozenset("R")),
}


@pytest.mark.parametrize("form", ACCEPTED)
def test_signal_forms_of_the_field_case(form: str) -> None:
    assert parse_signal(form) == EXPECTED[form]


def test_signal_spec_round_trips_to_sbatch() -> None:
    assert parse_signal("b:sigusr2@90").sbatch_value() == "B:USR2@90"
    assert parse_signal("BR:12").sbatch_value(lead_s=30) == "RB:USR2@30"
    assert parse_signal("USR2").batch_only is False
    assert parse_signal("B:USR2").batch_only is True


# Rejected here and by sbatch 22.05.8 ("Invalid --signal specification"), or (marked) rejected
# here only because sbatch's reading is surprising.
REJECTED = {
    "FOO": "unknown signal name 'FOO'",
    "WINCH": "unknown signal name",
    "B:": "expected",
    "USR2@70000": "0..65535",
    "B:USR2@abc": "lead time",
    "0": "not a signal number",
    "B:R:USR2": "expected",
    "X:USR2": "flags before ':'",
    "BB:USR2": "flags before ':'",  # sbatch: reads as B then R?  here: refused
    "USR2@": "lead time",  # sbatch: lead 0;  here: refused as a typo
}


@pytest.mark.parametrize(("form", "message"), REJECTED.items())
def test_bad_signal_forms_name_the_problem(form: str, message: str) -> None:
    with pytest.raises(JobEnvError, match=message) as info:
        parse_signal(form)
    assert isinstance(info.value, ValueError)
    assert repr(form) in str(info.value)


def test_preemption_signal_from_env_and_default() -> None:
    assert jobenv.preemption_signal({}).number == USR2
    assert jobenv.preemption_signal({}, default="USR1").name == "USR1"
    got = jobenv.preemption_signal({"SLURM_SPOT_PREEMPT_SIGNAL": "B:SIGUSR1@60"})
    assert (got.name, got.lead_s, got.batch_only) == ("USR1", 60, True)
    with pytest.raises(ValueError, match="SLURM_SPOT_PREEMPT_SIGNAL: bad signal 'NOPE'"):
        jobenv.preemption_signal({"SLURM_SPOT_PREEMPT_SIGNAL": "NOPE"})


def test_requeue_exit_code_and_checkpoint_dir() -> None:
    assert jobenv.requeue_exit_code({}) == 85
    assert jobenv.requeue_exit_code({"SLURM_SPOT_REQUEUE_EXIT_CODE": "3"}) == 3
    with pytest.raises(ValueError, match=r"0\.\.255"):
        jobenv.requeue_exit_code({"SLURM_SPOT_REQUEUE_EXIT_CODE": "300"})
    assert jobenv.checkpoint_dir({}) is None
    assert jobenv.checkpoint_dir({"SLURM_SPOT_CHECKPOINT_DIR": "/ck/u/7"}) == Path("/ck/u/7")


def _sbatch_verdicts(sbatch: str, conf: Path, forms: list[str]) -> dict[str, bool]:
    """Submit to a controller that is not there, all forms at once: sbatch refuses a bad
    --signal at once, and with a good one goes on to connect (and retries for ~9 s; it is
    stopped after 2 s). Nothing is ever submitted."""
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}
    procs = {
        form: subprocess.Popen(
            [sbatch, f"--signal={form}", "--wrap", "true"], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=env,
        )
        for form in forms
    }
    verdicts = {}
    deadline = time.monotonic() + 2
    for form, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        verdicts[form] = "Invalid --signal specification" not in err
    return verdicts


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not installed")
def test_forms_agree_with_the_real_sbatch(tmp_path: Path) -> None:
    """Every form we accept, sbatch accepts; every form sbatch refuses, we refuse too."""
    with socket.socket() as sock:  # a port nobody listens on: nothing is ever submitted
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"ClusterName=sigcheck\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={port}\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    sbatch = shutil.which("sbatch")
    assert sbatch is not None
    good = [*ACCEPTED, "rb:usr2@5", "BR:12@0", "SIGTERM"]
    bad = ["FOO", "B:", "USR2@70000", "B:USR2@abc", "0", "B:R:USR2"]
    verdicts = _sbatch_verdicts(sbatch, conf, good + bad)
    for form in good:
        assert verdicts[form], f"sbatch refused {form!r}"
        parse_signal(form)
    for form in bad:
        assert not verdicts[form], f"sbatch accepted {form!r}"
        with pytest.raises(ValueError):
            parse_signal(form)
