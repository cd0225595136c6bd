"""Bad input to the checkpoint library (a user's tries, s4 fix C): each case asserts what the
user sees - a CheckpointError naming the path and what is wrong - and that nothing is lost."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, CheckpointError, TrainState, writer
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


def _save_big_after_small(ckpt_dir: Path, between: Any = None) -> str:
    """Save step 1 (small), call ``between``, then save step 2 (256 KiB of weights); the
    CheckpointError's text."""
    ckpt = Checkpointer(ckpt_dir)
    ckpt.save(TrainState(nn.Linear(2, 2), step=1))
    if between is not None:
        between()
    with pytest.raises(CheckpointError) as info:
        ckpt.save(TrainState(nn.Linear(256, 256), step=2))
    return str(info.value)


def _assert_nothing_lost(ckpt_dir: Path) -> None:
    assert sorted(os.listdir(ckpt_dir)) == ["step_000000001"]  # no staging left, no step 2
    fresh = TrainState(nn.Linear(2, 2))
    found = Checkpointer(ckpt_dir).restore(fresh)
    assert found is not None and fresh.step == 1


def test_a_full_device_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 13952
    vs 13904" and nothing about the disk. The data file is opened on /dev/full here, whose
    writes fail with ENOSPC from the kernel, through the real torch.save."""
    real_open = open

    def open_on_dev_full(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "state.pt" and "w" in mode:
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(path, mode, *args, **kwargs)

    message = _save_big_after_small(tmp_path / "ckpt", lambda: monkeypatch.setattr(
        writer, "open", open_on_dev_full, raising=False))
    assert "checkpoint of step 2" in message and "nothing committed" in message
    assert (f"the device holding {tmp_path / 'ckpt'} is full (No space left on device"
            in message), message
    monkeypatch.undo()
    _assert_nothing_lost(tmp_path / "ckpt")


def test_a_full_tmpfs_says_so(tmp_path: Path) -> None:
    """The user's case on a real 256 KiB tmpfs (needs root to mount; skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                             capture_output=True, text=True, timeout=30, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        message = _save_big_after_small(mnt / "ckpt")
        assert f"the device holding {mnt / 'ckpt'} is full (No space left on device" in message
        assert "bytes free after the failed write" in message
        _assert_nothing_lost(mnt / "ckpt")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30, check=False)


def test_an_extra_that_contains_itself_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Before: RecursionError from the restorability check. (torch.save would store the
    cycle, but restore copies ``extra`` recursively, so it is refused at save time.)"""
    loop: dict[str, Any] = {"epoch": 1}
    loop["self"] = loop
    items: list[Any] = [1]
    items.append({"back": items})
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    shared = {"a": 1}  # the same dict twice is not a cycle: saved and restored
    ckpt = Checkpointer(tmp_path)
    for extra, expected in [
        ({"d": loop}, r"TrainState.extra\['d'\]\['self'\] is TrainState.extra\['d'\] itself "
                      r"\(the dict contains itself\)"),
        ({"l": items}, r"TrainState.extra\['l'\]\[1\]\['back'\] is TrainState.extra\['l'\] "
                       r"itself \(the list contains itself\)"),
        ({"deep": deep}, r"TrainState.extra is nested too deeply"),
    ]:
        state = _state(2)
        state.extra = extra
        with pytest.raises(CheckpointError, match=expected):
            ckpt.save(state)
    assert os.listdir(tmp_path) == []  # nothing written
    state = _state(2)
    state.extra = {"x": shared, "y": shared}
    ckpt.save(state)
    fresh = _state(0)
    Checkpointer(tmp_path).restore(fresh)
    assert fresh.extra == {"x": {"a": 1}, "y": {"a": 1}}


@pytest.mark.parametrize(("keep", "error", "expected"), [
    ("2", TypeError, "keep must be an int >= 1 (how many checkpoints to keep), got '2' (str)"),
    (2.0, TypeError, "got 2.0 (float)"),
    (True, TypeError, "got True (bool)"),
    (0, ValueError, "keep must be an int >= 1 (how many checkpoints to keep), got 0"),
])
def test_a_bad_keep_is_refused_at_construction(tmp_path: Path, keep: Any,
                                               error: type[Exception], expected: str) -> None:
    """Before: ``keep="2"`` gave a bare "TypeError: '<' not supported between instances of
    'str' and 'int'" that named no argument; ``keep=2.0`` and ``keep=True`` were accepted."""
    with pytest.raises(error) as info:
        Checkpointer(tmp_path, keep=keep)
    assert expected in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_numpy_int_keep_is_an_int(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=np.int64(1))
    ckpt.save(_state(1))
    ckpt.save(_state(2))
    assert os.listdir(tmp_path) == ["step_000000002"]


@pytest.mark.parametrize(("attribute", "value", "expected"), [
    ("step", 1.5, "TrainState.step is 1.5 (float); it must be a whole number >= 0"),
    ("step", float("nan"), "TrainState.step is nan (float)"),
    ("step", "3", "TrainState.step is '3' (str)"),
    ("step", -5, "TrainState.step is -5 (int)"),
    ("epoch", 0.5, "TrainState.epoch is 0.5 (float)"),
    ("batch_in_epoch", True, "TrainState.batch_in_epoch is True (bool)"),
])
def test_a_counter_that_is_not_a_whole_number_is_refused_naming_its_type(
    tmp_path: Path, attribute: str, value: Any, expected: str
) -> None:
    """Before: a float step failed with "Unknown format code 'd' for object of type 'float'";
    a fractional epoch was saved and silently truncated on restore."""
    state = _state(1)
    setattr(state, attribute, value)
    with pytest.raises(CheckpointError, match="refusing to save") as info:
        Checkpointer(tmp_path).save(state)
    assert expected in str(info.value)
    assert os.listdir(tmp_path) == []


def test_whole_number_counters_of_other_types_are_saved_as_ints(tmp_path: Path) -> None:
    """An integral float (``100.0``), a numpy integer or a one-element integer tensor is the
    number it holds: what a training loop computing its step that way expects."""
    state = _state(1)
    state.step, state.epoch, state.batch_in_epoch = 100.0, np.int64(3), torch.tensor(7)
    path = Path(Checkpointer(tmp_path).save(state))
    assert path.name == "step_000000100"
    fresh = _state(0)
    Checkpointer(tmp_path).restore(fresh)
    assert (fresh.step, fresh.epoch, fresh.batch_in_epoch) == (100, 3, 7)
    assert all(type(v) is int for v in (fresh.step, fresh.epoch, fresh.batch_in_epoch))
