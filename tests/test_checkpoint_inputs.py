"""Bad input to the checkpoint library (a user's tries, s4 fix C): each case asserts what the
user sees - a CheckpointError naming the path and what is wrong - and that nothing is lost."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from slurm_spot.checkpoint.checkpointer import Checkpointer, CheckpointError
from tests.test_checkpoint import _state


@pytest.mark.parametrize("shape", ["file", "symlink-to-file", "dangling-symlink", "under-a-file"])
def test_a_checkpoint_directory_that_is_not_a_directory_is_refused(tmp_path: Path,
                                                                   shape: str) -> None:
    """Before: restore() returned None (training silently started at step 0) and the first
    save failed later with "[Errno 17] File exists"."""
    target = tmp_path / "weights.bin"
    target.write_bytes(b"not a directory")
    where = {"file": target, "symlink-to-file": tmp_path / "link",
             "dangling-symlink": tmp_path / "dangling", "under-a-file": target / "ckpt"}[shape]
    if shape == "symlink-to-file":
        os.symlink(target, where)
    elif shape == "dangling-symlink":
        os.symlink(tmp_path / "nowhere", where)
    expected = {"file": f"{target} is a regular file, not a directory",
                "symlink-to-file": f"{where} is a symlink to {target}, which is a regular file",
                "dangling-symlink": f"{where} is a symlink to {tmp_path / 'nowhere'}, which "
                                    "does not exist",
                "under-a-file": f"{where}: {target} is a regular file, not a directory"}[shape]
    with pytest.raises(CheckpointError, match="checkpoint directory") as info:
        Checkpointer(where)
    assert expected in str(info.value)
    assert target.read_bytes() == b"not a directory"  # nothing touched


def test_a_file_put_in_place_of_the_directory_later_is_refused_too(tmp_path: Path) -> None:
    where = tmp_path / "ckpt"
    ckpt = Checkpointer(where)  # missing is fine: the first save creates it
    where.write_text("x")
    fresh = _state(0)
    with pytest.raises(CheckpointError, match=f"{where} is a regular file, not a directory"):
        ckpt.restore(fresh)
    with pytest.raises(CheckpointError, match=f"cannot save: checkpoint directory {where} is a "
                                              "regular file"):
        ckpt.save(_state(1))
    assert where.read_text() == "x" and fresh.step == 0


def test_a_symlink_to_a_directory_is_a_fine_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "scratch").mkdir()
    os.symlink(tmp_path / "scratch", tmp_path / "ckpt")
    Checkpointer(tmp_path / "ckpt").save(_state(3))
    fresh = _state(0)
    assert Checkpointer(tmp_path / "ckpt").restore(fresh) is not None and fresh.step == 3
    assert os.listdir(tmp_path / "scratch") == ["step_000000003"]


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_path_is_an_error_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty: str
) -> None:
    """Before: ``Checkpointer("")`` saved ``step_000000000`` into the current directory (an
    unset ``$SLURM_SPOT_CHECKPOINT_DIR`` read as "")."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=f"checkpoint directory {empty!r} is an empty "
                                              "path"):
        Checkpointer(empty)
    assert os.listdir(tmp_path) == []


def test_a_symlinked_step_directory_is_invalid_not_a_fresh_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the only checkpoint's ``step_N`` being a symlink made restore() return None with
    no warning and no "refusing to start from step 0". It is never followed (the watcher reads
    the same listing as root; pruning would delete through it): it counts as a checkpoint that
    exists but is not valid."""
    ckpt_dir = tmp_path / "ckpt"
    saved = Checkpointer(ckpt_dir).save(_state(5))
    elsewhere = tmp_path / "elsewhere"
    os.rename(saved, elsewhere)
    os.symlink(elsewhere, saved)
    fresh = _state(0)
    with caplog.at_level(logging.WARNING), pytest.raises(
            CheckpointError, match=r"none is valid.*refusing to start from step 0"):
        Checkpointer(ckpt_dir).restore(fresh)
    assert fresh.step == 0
    assert f"checkpoint {saved} is not usable" in caplog.text
    assert f"it is a symlink (to {elsewhere})" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert Checkpointer(ckpt_dir, start_fresh_if_invalid=True).restore(fresh) is None
    assert "starting from step 0 as configured" in caplog.text
    # a save of that step moves the link aside and never writes through it
    before = sorted(os.listdir(elsewhere))
    ckpt = Checkpointer(ckpt_dir, keep=1)
    assert ckpt.save(_state(5)) == saved and not saved.is_symlink()
    ckpt.save(_state(6))  # pruning deletes step 5, never what the old link pointed to
    assert sorted(os.listdir(elsewhere)) == before
    assert sorted(os.listdir(ckpt_dir)) == [f"step_000000005.symlink-{os.getpid()}",
                                            "step_000000006"]


def test_a_symlink_newer_than_a_valid_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(_state(1))
    other = Checkpointer(tmp_path / "other").save(_state(9))
    os.symlink(other, tmp_path / "step_000000009")
    fresh = _state(0)
    with caplog.at_level(logging.WARNING):
        found = Checkpointer(tmp_path).restore(fresh)
    assert found is not None and fresh.step == 1
    assert f"{tmp_path / 'step_000000009'} is not usable, using {found.path}" in caplog.text
