"""The root Epilog appends to ``events.jsonl`` in a log directory another account owns
(SlurmUser's): a link planted there never makes root write elsewhere (issue 25)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from slurm_spot import events
from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.jobs.node.prolog import epilog

NOBODY = 65534
ENV = {"SLURM_JOB_ID": "777", "SLURMD_NODENAME": "spot-1", "SLURM_RESTART_COUNT": "0"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")


def config(log_dir: Path) -> SpotConfig:
    return parse_config({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "checkpoint": {"root": str(log_dir.parent / "ck")}, "log_dir": str(log_dir)})


def log_dir_of_nobody(tmp_path: Path) -> Path:
    """A log directory owned by another account (nobody), as SlurmUser owns the real one."""
    tmp_path.chmod(0o755)
    log_dir = tmp_path / "log"
    log_dir.mkdir(mode=0o750)
    os.chown(log_dir, NOBODY, NOBODY)
    return log_dir


@needs_root
def test_epilog_does_not_append_through_a_planted_symlink(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_dir = log_dir_of_nobody(tmp_path)
    target = tmp_path / "outside"
    target.write_text("root's file\n")
    os.symlink(target, log_dir / events.EVENTS_FILE)
    os.lchown(log_dir / events.EVENTS_FILE, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING):
        epilog(config(log_dir), ENV)
    assert target.read_text() == "root's file\n"
    assert "refusing to append" in caplog.text and "symlink" in caplog.text


@needs_root
def test_epilog_does_not_create_a_file_through_a_dangling_symlink(tmp_path: Path) -> None:
    log_dir = log_dir_of_nobody(tmp_path)
    target = tmp_path / "created-by-root"
    os.symlink(target, log_dir / events.EVENTS_FILE)
    epilog(config(log_dir), ENV)
    assert not target.exists()


@needs_root
def test_epilog_does_not_append_to_a_hard_link(tmp_path: Path) -> None:
    log_dir = log_dir_of_nobody(tmp_path)
    target = tmp_path / "outside"
    target.write_text("root's file\n")
    os.link(target, log_dir / events.EVENTS_FILE)
    epilog(config(log_dir), ENV)
    assert target.read_text() == "root's file\n"


def test_events_dir_that_is_a_symlink_or_world_writable_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    events.emit(tmp_path / "link", events.Event(events.Action.JOB_END, "epilog"))
    assert not (real / events.EVENTS_FILE).exists()
    real.chmod(0o777)
    events.emit(real, events.Event(events.Action.JOB_END, "epilog"))
    assert not (real / events.EVENTS_FILE).exists()

