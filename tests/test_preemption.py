"""The preemption handler: signals to a flag, agreement across ranks, requeue and exit."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from slurm_spot.checkpoint.preemption import (
    PreemptionHandler,
    PreemptionSignalMismatch,
    ignore_signals_in_worker,
)
from slurm_spot.slurm.client import SlurmClient
from tests.fakes.fake_slurm import FakeSlurm

USR2 = int(signal.SIGUSR2)


def _slurm(job_state: str | None = "RUNNING") -> FakeSlurm:
    """Slurm holding job 1235 (task 2 of array job 1234) in ``job_state``; None: no such job."""
    fake = FakeSlurm()
    if job_state is not None:
        job = fake.add_job(1235, ["spot-1"] if job_state == "RUNNING" else [], job_state)
        job.array_job_id, job.array_task_id, job.name = 1234, 2, "train"
    return fake


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Any:
    """exit_for_requeue() leaves the handled signals ignored; give pytest its handlers back."""
    saved = {n: signal.getsignal(n) for n in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


ARRAY_JOB = {"SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "2"}


def _handler(fake: FakeSlurm, env: dict[str, str]) -> PreemptionHandler:
    return PreemptionHandler(env=env, client=SlurmClient("/opt/slurm/bin", runner=fake))


def test_signal_sets_a_flag_and_nothing_else() -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    with PreemptionHandler(env={}) as handler:
        assert not handler.should_stop()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert handler.stop_requested and handler.should_stop()
        assert handler.received_signal == USR2
        os.kill(os.getpid(), signal.SIGTERM)  # the process survives SIGTERM too
        assert handler.received_signal == int(signal.SIGTERM)
    assert signal.getsignal(signal.SIGUSR2) == previous


def test_signal_from_env_in_sbatch_form() -> None:
    handler = PreemptionHandler(env={"SLURM_SPOT_PREEMPT_SIGNAL": "B:USR1@90"})
    assert handler.signals == (int(signal.SIGUSR1), int(signal.SIGTERM))
    same = PreemptionHandler("10", env={"SLURM_SPOT_PREEMPT_SIGNAL": "B:SIGUSR1@90"})
    assert same.spec.number == int(signal.SIGUSR1)


def test_handler_signal_differing_from_sbatch_is_a_startup_error() -> None:
    with pytest.raises(PreemptionSignalMismatch) as info:
        PreemptionHandler("USR1", env={"SLURM_SPOT_PREEMPT_SIGNAL": "B:USR2@90"})
    assert "SIGUSR1" in str(info.value) and "SIGUSR2" in str(info.value)
    assert "'B:USR2@90'" in str(info.value)
    with pytest.raises(ValueError, match="cannot be caught"):
        PreemptionHandler("KILL", env={})


def test_requeue_of_a_running_array_task_then_exit_85(caplog: pytest.LogCaptureFixture) -> None:
    fake = _slurm("RUNNING")
    handler = _handler(fake, ARRAY_JOB)
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as info:
        handler.exit_for_requeue()
    assert info.value.code == 85
    assert fake.tools() == [["squeue", "--json", "--jobs", "1235"],
                            ["scontrol", "requeue", "1234_2"]]
    assert fake.calls[1][0] == "/opt/slurm/bin/scontrol"
    assert (fake.job("1234_2").state, fake.job("1234_2").restarts) == ("PENDING", 1)
    assert "requeued job 1234_2; exiting with code 85" in caplog.text
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a late SIGTERM cannot kill it


@pytest.mark.parametrize("state", ["PENDING", "REQUEUED"])
def test_already_requeued_by_the_watcher_is_left_alone(state: str) -> None:
    fake = _slurm(state)
    handler = _handler(fake, {"SLURM_JOB_ID": "1235", "SLURM_SPOT_REQUEUE_EXIT_CODE": "86"})
    with pytest.raises(SystemExit) as info:
        handler.exit_for_requeue()
    assert info.value.code == 86
    assert [a[0] for a in fake.tools()] == ["squeue"]  # looked, did not requeue
    assert handler.requeue_outcome == f"job 1235 is already {state} (requeued by the node watcher)"


def test_requeue_race_answered_already_pending_is_fine() -> None:
    fake = _slurm("RUNNING")

    def watcher_requeues_first(argv: list[str]) -> None:  # between squeue and scontrol requeue
        if argv[1:2] == ["requeue"]:
            fake.jobs[1235].state, fake.jobs[1235].nodes = "PENDING", []

    fake.on_command = watcher_requeues_first
    handler = _handler(fake, {"SLURM_JOB_ID": "1235"})
    with pytest.raises(SystemExit) as info:
        handler.exit_for_requeue()
    assert info.value.code == 85
    assert handler.requeue_outcome == "job 1235 was already pending"


def test_slurm_failures_still_exit_with_the_requeue_code() -> None:
    fake = _slurm("RUNNING")
    fake.fail[("squeue",)] = (1, "slurm_load_jobs error: Unable to contact slurm controller")
    fake.fail[("scontrol", "requeue")] = (1, "Unable to contact slurm controller")
    handler = _handler(fake, {"SLURM_JOB_ID": "1235"})
    with pytest.raises(SystemExit) as info:
        handler.exit_for_requeue()
    assert info.value.code == 85
    assert [a[0] for a in fake.tools()] == ["squeue", "scontrol"]
    assert handler.requeue_outcome.startswith("requeue of job 1235 failed")
    assert "Unable to contact slurm controller" in handler.requeue_outcome


def test_outside_slurm_exits_without_scontrol() -> None:
    fake = _slurm(None)
    handler = _handler(fake, {"SLURM_SPOT_REQUEUE_EXIT_CODE": "3"})
    with pytest.raises(SystemExit) as info:
        handler.exit_for_requeue()
    assert info.value.code == 3
    assert fake.calls == []
    assert "no SLURM_JOB_ID" in handler.requeue_outcome


# -- DataLoader workers ------------------------------------------------------------------------


class _SlowPids(Dataset[int]):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        time.sleep(0.05)
        return os.getpid()


def _iterate_and_signal(worker_init_fn: Any) -> list[int]:
    loader = DataLoader(_SlowPids(), batch_size=1, num_workers=1,
                        worker_init_fn=worker_init_fn, multiprocessing_context="fork")
    pids: list[int] = []
    for i, batch in enumerate(loader):
        pids.append(int(batch[0]))
        if i == 1:  # the worker is running: signal it as Slurm signals every process
            os.kill(pids[0], signal.SIGUSR2)
            os.kill(pids[0], signal.SIGTERM)
    return pids


def test_dataloader_workers_ignore_the_signals() -> None:
    handler = PreemptionHandler(env={})
    pids = _iterate_and_signal(handler.worker_init_fn)
    assert len(pids) == 12 and len(set(pids)) == 1 and pids[0] != os.getpid()
    pids = _iterate_and_signal(ignore_signals_in_worker)
    assert len(pids) == 12


def test_without_the_worker_init_fn_a_worker_dies() -> None:
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        _iterate_and_signal(None)


# -- two ranks over gloo: the signal reaches one rank, both stop after the same step ----------


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    fake = FakeSlurm()
    fake.add_job(777, ["spot-1"])
    handler = PreemptionHandler(env={"SLURM_JOB_ID": "777"},
                                client=SlurmClient(runner=fake)).install()
    step = 0
    while True:
        step += 1
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGUSR2)
        if handler.should_stop():
            break
        assert step < 50
    try:
        handler.exit_for_requeue()
    finally:  # record what this rank did, then let SystemExit end the process
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps({"stop_step": step, "own_flag_from_signal": handler.received_signal,
                        "argv": fake.tools()}))


def test_ranks_agree_on_the_stop_step_and_only_rank0_requeues(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [85, 85]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["stop_step"] == r1["stop_step"] == 3
    assert r0["own_flag_from_signal"] is None and r1["own_flag_from_signal"] == USR2
    assert r0["argv"] == [["squeue", "--json", "--jobs", "777"], ["scontrol", "requeue", "777"]]
    assert r1["argv"] == []
    assert torch.distributed.is_available()


def _rank_signalled_once_its_flag_is_sent(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 gets SIGUSR2 right after the all-reduce of its 3rd step boundary (the flag it
    sent there was 0): the moment of the elastic demo's hang. ``signal.raise_signal`` runs the
    handler before it returns, so the moment is exact, not a matter of timing."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    handler = PreemptionHandler(env={}).install()
    real_all_reduce = dist.all_reduce
    boundaries: list[int] = []

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = real_all_reduce(tensor, *args, **kwargs)
        boundaries.append(1)
        if rank == 1 and len(boundaries) == 3:
            signal.raise_signal(signal.SIGUSR2)
        return work

    dist.all_reduce = all_reduce  # should_stop's collective, in this process only
    answers: list[bool | str] = []
    try:
        while len(answers) < 6 and True not in answers:
            answers.append(handler.should_stop())
    except RuntimeError as exc:  # the peer stopped at another boundary and went away
        answers.append(f"{type(exc).__name__}: {str(exc)[:80]}")
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"answers": answers, "signal": handler.received_signal}))
    # Leave as a training script does (examples/train_elastic.py): both ranks past the last
    # collective, then the group torn down. Rank 0 hosts the TCPStore; when it exited while
    # rank 1 still held the group, rank 1's gloo threads were destroyed at interpreter exit
    # and it aborted ("terminate called without an active exception", exit -6; CI, stop 31).
    if True in answers:
        dist.barrier()
    dist.destroy_process_group()


def test_a_signal_during_the_all_reduce_counts_at_the_next_boundary_on_every_rank(
        tmp_path: Path) -> None:
    """The signal reaches rank 1 after its flag went into a boundary's all-reduce: that
    boundary's answer is the agreed "go on" on both ranks, and both stop at the next one
    (examples/train_elastic.py: both save that step and leave). Before, rank 1 alone
    answered "stop" from its own flag and saved while rank 0 went on to the next step's
    collectives, each waiting for the other (the elastic demo's hang after a notice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_signalled_once_its_flag_is_sent,
                         args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["answers"] == r1["answers"] == [False, False, False, True], (r0, r1)
    assert r0["signal"] is None and r1["signal"] == USR2


def test_a_handler_without_scontrol_says_so_when_built_not_at_requeue(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 25: scontrol missing from the job's PATH was found only at requeue time."""
    from slurm_spot.contract.jobenv import find_scontrol

    env = {"SLURM_JOB_ID": "12", "PATH": str(tmp_path), "SLURM_SPOT_SLURM_BIN_DIR": ""}
    with caplog.at_level("WARNING"):
        PreemptionHandler(env=env)
    assert "scontrol is neither on this job's PATH" in caplog.text
    tool = tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert find_scontrol({**env, "SLURM_SPOT_SLURM_BIN_DIR": str(tool.parent)}) == str(tool)
    caplog.clear()
    with caplog.at_level("WARNING"):
        PreemptionHandler(env={**env, "SLURM_SPOT_SLURM_BIN_DIR": str(tool.parent)})
    assert "scontrol" not in caplog.text
