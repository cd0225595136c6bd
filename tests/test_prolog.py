"""Prolog / TaskProlog: the job's checkpoint directory, created safely as root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.contract import jobenv
from slurm_spot.contract.location import as_location
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.node.prolog import checkpoint_dir, prepare_checkpoint_dir, task_prolog_lines

JOB = {"SLURM_JOB_ID": "777", "SLURM_JOB_USER": "nobody", "SLURM_JOB_UID": "65534",
       "SLURM_JOB_GID": "65534"}


def config(root: Path) -> SpotConfig:
    return parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "checkpoint": {"root": str(root)}, "log_dir": str(root.parent / "log"),
        "preemption": {"signal": "SIGUSR2"}})


def test_directory_is_keyed_by_job_not_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path / "ck")
    first = checkpoint_dir(cfg, JOB)
    again = checkpoint_dir(cfg, {**JOB, "SLURM_RESTART_COUNT": "2"})
    assert first == again == tmp_path / "ck" / "nobody" / "777"
    array = checkpoint_dir(cfg, {**JOB, "SLURM_JOB_ID": "1235", "SLURM_ARRAY_JOB_ID": "1234",
                                 "SLURM_ARRAY_TASK_ID": "2"})
    assert array.name == "1234_2"


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root and chowns")
def test_created_owned_by_the_user_mode_0700(tmp_path: Path) -> None:
    cfg = config(tmp_path / "ck")
    path = prepare_checkpoint_dir(cfg, JOB)
    info = path.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (65534, 0o700)
    assert prepare_checkpoint_dir(cfg, JOB) == path  # a requeued job's prolog: same directory


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root and chowns")
def test_user_dir_symlink_is_refused_and_nothing_written_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "ck", tmp_path / "etc"
    outside.mkdir()
    root.mkdir()
    (root / "nobody").symlink_to(outside)
    before = outside.stat()
    with pytest.raises(BadInputError, match="symlink"):
        prepare_checkpoint_dir(config(root), JOB)
    after = outside.stat()
    assert list(outside.iterdir()) == []
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root and chowns")
def test_job_dir_symlink_planted_by_the_user_is_moved_aside(tmp_path: Path) -> None:
    """A user can plant a symlink in their own directory; the prolog must neither follow it
    nor fail (a failing prolog drains the node): it moves the entry aside."""
    root, outside = tmp_path / "ck", tmp_path / "etc"
    outside.mkdir()
    (root / "nobody").mkdir(parents=True)
    (root / "nobody" / "777").symlink_to(outside)
    path = prepare_checkpoint_dir(config(root), JOB)
    assert path.is_dir() and not path.is_symlink() and path.stat().st_uid == 65534
    aside = [p for p in (root / "nobody").iterdir() if p.name.startswith("777.refused-")]
    assert len(aside) == 1 and aside[0].is_symlink()
    assert list(outside.iterdir()) == [] and outside.stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root and chowns")
def test_world_writable_root_and_foreign_owned_dirs_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir(mode=0o777)
    root.chmod(0o1777)
    with pytest.raises(BadInputError, match="writable by root only"):
        prepare_checkpoint_dir(config(root), JOB)
    root.chmod(0o755)
    (root / "nobody").mkdir()
    os.chown(root / "nobody", 1, 1)  # planted by another user (daemon)
    with pytest.raises(BadInputError, match="owned by uid 1"):
        prepare_checkpoint_dir(config(root), JOB)


@pytest.mark.parametrize("env", [
    {**JOB, "SLURM_JOB_ID": "../../etc"},
    {**JOB, "SLURM_JOB_USER": "../root"},
    {**JOB, "SLURM_JOB_ID": ""},
])
def test_paths_escaping_the_root_are_refused(tmp_path: Path, env: dict) -> None:
    with pytest.raises(BadInputError):
        prepare_checkpoint_dir(config(tmp_path / "ck"), env)
    assert not (tmp_path / "etc").exists()


def test_task_prolog_exports(tmp_path: Path) -> None:
    cfg = config(tmp_path / "ck")
    lines = task_prolog_lines(cfg, {**JOB, "SLURM_RESTART_COUNT": ""})
    assert [line for line in lines if not line.startswith("print ")] == [
        f"export SLURM_SPOT_CHECKPOINT_DIR={tmp_path / 'ck' / 'nobody' / '777'}",
        "export SLURM_SPOT_RESTART_COUNT=0",
        "export SLURM_SPOT_PREEMPT_SIGNAL=USR2",
        "export SLURM_SPOT_REQUEUE_EXIT_CODE=85",
        f"export SLURM_SPOT_SLURM_BIN_DIR={cfg.slurm_bin_dir}",
    ]


def _scontrol_in(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "scontrol"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return tool


def test_task_prolog_says_early_when_scontrol_is_not_on_the_jobs_path(tmp_path: Path) -> None:
    """Issue 25: a job whose PATH had no scontrol found out only when rank 0 tried to requeue
    it at preemption. The TaskProlog now says so in the job's output, before training."""
    cfg = config(tmp_path / "ck")
    on_path = {**JOB, "PATH": str(_scontrol_in(tmp_path / "slurm" / "bin").parent)}
    assert not [line for line in task_prolog_lines(cfg, on_path) if line.startswith("print")]
    empty = tmp_path / "empty"
    empty.mkdir()
    nowhere = {**JOB, "PATH": str(empty)}
    cfg = cfg.model_copy(update={"slurm_bin_dir": tmp_path / "no-slurm"})
    [warning] = [line for line in task_prolog_lines(cfg, nowhere) if line.startswith("print")]
    assert warning.startswith("print slurm-spot: WARNING: scontrol is neither on this job's "
                              "PATH nor in slurm_bin_dir")
    assert "cannot requeue itself on preemption" in warning and "PATH" in warning
    bin_dir = _scontrol_in(tmp_path / "opt" / "slurm" / "bin").parent
    cfg = cfg.model_copy(update={"slurm_bin_dir": bin_dir})
    [notice] = [line for line in task_prolog_lines(cfg, nowhere) if line.startswith("print")]
    assert f"will use {bin_dir / 'scontrol'}" in notice



def test_what_the_task_prolog_exports_the_job_reads_back(tmp_path: Path) -> None:
    """The job contract (slurm_spot.contract.names) from both ends: a task whose environment is
    the TaskProlog's ``export`` lines (as slurmd sets it) finds in jobenv the checkpoint
    directory the prolog created, the preemption signal and requeue code of spot.yaml, and
    the scontrol of its slurm_bin_dir; an S3 root's endpoint reaches the job the same way."""
    bin_dir = _scontrol_in(tmp_path / "opt" / "slurm" / "bin").parent
    cfg = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "checkpoint": {"root": str(tmp_path / "ck")}, "log_dir": str(tmp_path / "log"),
        "slurm_bin_dir": str(bin_dir),
        "preemption": {"signal": "SIGUSR1", "requeue_exit_code": 77}})
    empty = tmp_path / "empty"
    empty.mkdir()
    job = {**JOB, "SLURM_RESTART_COUNT": "3", "PATH": str(empty)}
    task = {**job, **_exports(task_prolog_lines(cfg, job))}
    assert jobenv.checkpoint_dir(task) == as_location(prepare_checkpoint_dir(cfg, job))
    assert jobenv.preemption_signal(task).name == "USR1"
    assert jobenv.requeue_exit_code(task) == 77
    assert jobenv.find_scontrol(task) == str(bin_dir / "scontrol")
    assert task["SLURM_SPOT_RESTART_COUNT"] == "3"
    s3_job = {**job, "SLURM_SPOT_CHECKPOINT_ROOT": "s3://mine/runs",
              "SLURM_SPOT_S3_ENDPOINT_URL": "http://127.0.0.1:9000"}
    s3_task = {**s3_job, **_exports(task_prolog_lines(cfg, s3_job))}
    assert jobenv.checkpoint_dir(s3_task) == as_location("s3://mine/runs/nobody/777")
    assert s3_task["SLURM_SPOT_S3_ENDPOINT_URL"] == "http://127.0.0.1:9000"


def _exports(lines: list[str]) -> dict[str, str]:
    """The environment slurmd gives a task from TaskProlog output (slurm.conf(5), TaskProlog:
    ``export NAME=value``, the value taken literally)."""
    pairs = [line.removeprefix("export ").split("=", 1) for line in lines
             if line.startswith("export ")]
    return {name: value for name, value in pairs}


def _swap_forever(user_fd: int, target: str) -> None:
    """Child, as the job's user (uid 65534): turn ``777`` into nothing, a directory, a symlink
    to ``target`` and a file, over and over, as fast as it can."""
    os.setgid(65534)
    os.setuid(65534)
    i = 0
    while True:
        i += 1
        for step in ("rm", "dir", "rm", "link", "rm", "file"):
            try:
                if step == "rm":
                    try:
                        os.rmdir("777", dir_fd=user_fd)
                    except NotADirectoryError:
                        os.unlink("777", dir_fd=user_fd)
                elif step == "dir":
                    os.mkdir("777", dir_fd=user_fd)
                elif step == "link":
                    os.symlink(target, "777", dir_fd=user_fd)
                else:
                    os.close(os.open("777", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=user_fd))
            except OSError:
                pass
        if i % 50 == 0:  # keep the moved-aside entries from piling up
            for entry in os.listdir(user_fd):
                if ".refused-" in entry:
                    try:
                        os.rmdir(entry, dir_fd=user_fd)
                    except OSError:
                        try:
                            os.unlink(entry, dir_fd=user_fd)
                        except OSError:
                            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root; the swapper as nobody")
def test_prolog_never_fails_while_the_user_swaps_the_job_dir(tmp_path: Path) -> None:
    """Issue 11, section 5: the user swaps their checkpoint directory between nothing, a
    directory and a symlink (and a file) while the prolog runs: 400 prologs, none fails, none
    touches anything outside the root, and once the user stops, the directory is right."""
    import signal

    root, outside = tmp_path / "ck", tmp_path / "etc"
    outside.mkdir(mode=0o755)
    (outside / "shadow").write_text("secret")
    cfg = config(root)
    prepare_checkpoint_dir(cfg, JOB)  # the user dir exists, owned by nobody
    before = [(p.name, p.stat().st_uid, p.stat().st_mode) for p in [outside, *outside.iterdir()]]
    user_fd = os.open(root / "nobody", os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _swap_forever(user_fd, str(outside))
        finally:
            os._exit(0)
    failures: list[str] = []
    try:
        for _ in range(400):
            try:
                assert prepare_checkpoint_dir(cfg, JOB) == root / "nobody" / "777"
            except Exception as exc:
                failures.append(repr(exc))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(user_fd)
    assert failures == []
    after = [(p.name, p.stat().st_uid, p.stat().st_mode) for p in [outside, *outside.iterdir()]]
    assert after == before
    prepare_checkpoint_dir(cfg, JOB)
    final = root / "nobody" / "777"
    assert final.is_dir() and not final.is_symlink()
    assert (final.stat().st_uid, stat.S_IMODE(final.stat().st_mode)) == (65534, 0o700)


def test_s3_root_exports_the_url_and_creates_nothing(tmp_path: Path) -> None:
    cfg = parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "checkpoint": {"root": "s3://team-ckpt/runs", "s3": {
            "endpoint_url": "https://s3.example.eu", "addressing_style": "path"}},
        "log_dir": str(tmp_path / "log"), "state_dir": str(tmp_path / "state")})
    assert prepare_checkpoint_dir(cfg, JOB) == "s3://team-ckpt/runs/nobody/777"
    assert list(tmp_path.iterdir()) == []  # no local directory for an S3 root
    lines = task_prolog_lines(cfg, JOB)
    assert "export SLURM_SPOT_CHECKPOINT_DIR=s3://team-ckpt/runs/nobody/777" in lines
    assert "export SLURM_SPOT_S3_ENDPOINT_URL=https://s3.example.eu" in lines
    assert "export SLURM_SPOT_S3_ADDRESSING_STYLE=path" in lines
    assert not [line for line in lines if "SECRET" in line or "KEY_ID" in line]


def test_a_job_may_choose_an_s3_root_but_not_a_directory(tmp_path: Path) -> None:
    cfg = config(tmp_path / "ck")
    job = {**JOB, "SLURM_SPOT_CHECKPOINT_ROOT": "s3://mine/a b+c=ü",
           "SLURM_SPOT_S3_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert checkpoint_dir(cfg, job) == "s3://mine/a b+c=ü/nobody/777"
    lines = task_prolog_lines(cfg, job)
    assert "export SLURM_SPOT_S3_ENDPOINT_URL=http://127.0.0.1:9000" in lines
    assert "export SLURM_SPOT_S3_ADDRESSING_STYLE=auto" in lines
    for bad in ("/tmp/elsewhere", "s3://x", "s3://ok-bucket/p\nexport X=1"):
        with pytest.raises(BadInputError, match="SLURM_SPOT_CHECKPOINT_ROOT"):
            checkpoint_dir(cfg, {**JOB, "SLURM_SPOT_CHECKPOINT_ROOT": bad})
    with pytest.raises(Exception, match=r"checkpoint\.root"):
        parse_config({"cluster": "c", "node_sets": [{"name": "s", "provider": "local",
                                                     "count": 1}],
                      "partitions": [{"name": "s", "node_sets": ["s"]}],
                      "checkpoint": {"root": "relative/dir"}})
