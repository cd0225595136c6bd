"""Checksums computed while writing and verified while reading: the manifest's sha256 is the
file's, a save reads nothing back, a restore reads the file from the disk once, and a damaged
file (one flipped byte, a torn tail, a short file) is still caught at restore, which then uses
the previous checkpoint with a warning."""

from __future__ import annotations

import hashlib
import io
import logging
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, CheckpointError, TrainState
from slurm_spot.checkpoint.hashing import PARALLEL_MIN_BYTES, HashingWriter, mapped_digest
from tests.test_checkpoint import _state


def _big_state(step: int, mb: int = 24) -> TrainState:
    torch.manual_seed(step)
    model = nn.Module()
    model.register_parameter("w", nn.Parameter(torch.rand(mb * 10**6 // 4)))
    model.register_buffer("small", torch.arange(10))
    return TrainState(model, step=step, extra={"note": "x" * 100})


def _io() -> dict[str, int]:
    """This process's I/O counters (``rchar``: bytes through read(); ``read_bytes``: bytes
    fetched from storage, page faults of memory maps included), Linux ``/proc/self/io``."""
    lines = Path("/proc/self/io").read_text().splitlines()
    return {k: int(v) for k, v in (line.split(": ") for line in lines)}


def _evict(path: Path) -> None:
    """Drop the (clean, fsynced) pages of ``path`` from the page cache: the next read goes to
    the disk (a no-op on file systems without a page cache, e.g. tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("parallel", [True, False])
def test_the_digest_of_what_torch_save_wrote_is_the_files_sha256(tmp_path: Path,
                                                                 parallel: bool) -> None:
    # records below and above the size hashed in the helper thread
    payload = {"big": torch.rand(3 * PARALLEL_MIN_BYTES // 4), "small": torch.arange(7),
               "meta": {"step": 3, "name": "ä b"}}
    path = tmp_path / "state.pt"
    with open(path, "wb") as fh, HashingWriter(fh, parallel=parallel) as writer:
        torch.save(payload, writer)
    data = path.read_bytes()
    assert writer.digest() == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert mapped_digest(path) == (len(data), hashlib.sha256(data).hexdigest())
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["big"], payload["big"]) and loaded["meta"] == payload["meta"]


def test_hashing_writer_passes_write_errors_on(tmp_path: Path) -> None:
    class Full(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: object) -> int:
            raise OSError(28, "No space left on device")

    with HashingWriter(Full()) as writer, pytest.raises(OSError, match="No space left"):
        writer.write(b"x" * (2 * PARALLEL_MIN_BYTES))
    (tmp_path / "empty").touch()
    assert mapped_digest(tmp_path / "empty") == (0, hashlib.sha256(b"").hexdigest())


def test_a_save_reads_nothing_back_and_its_manifest_holds_the_files_sha256(
        tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    state = _big_state(5)
    ckpt.save(state)  # warm-up: imports, first-use allocations
    state.step = 6
    before = _io()
    path = Path(ckpt.save(state))
    read = _io()["rchar"] - before["rchar"]
    size = (path / "state.pt").stat().st_size
    assert size > 24 * 10**6
    assert read < 10**6, f"the save read {read} bytes back (file: {size})"
    manifest = (path / "manifest.json").read_text()
    assert mapped_digest(path / "state.pt")[1] in manifest


def test_a_restore_reads_the_file_once(tmp_path: Path) -> None:
    path = Path(Checkpointer(tmp_path).save(_big_state(7)))
    size = (path / "state.pt").stat().st_size
    fresh = _big_state(0)
    Checkpointer(tmp_path).restore(_big_state(0))  # warm-up (imports), then from the disk
    _evict(path / "state.pt")
    before = _io()
    found = Checkpointer(tmp_path).restore(fresh)
    after = _io()
    assert found is not None and fresh.step == 7
    assert torch.equal(fresh.model.w, _big_state(7).model.w)
    # read() calls: the manifest, no data; storage reads: at most the file once (+ slack)
    assert after["rchar"] - before["rchar"] < 10**6
    assert after["read_bytes"] - before["read_bytes"] < size + 4 * 10**6


@pytest.mark.parametrize("damage", ["flipped_byte", "torn_tail", "short"])
def test_a_damaged_newest_checkpoint_is_caught_at_restore_and_the_previous_one_used(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(_state(100))
    data = Path(ckpt.save(_state(200))) / "state.pt"
    raw = bytearray(data.read_bytes())
    if damage == "flipped_byte":
        raw[len(raw) // 2] ^= 0x01
    elif damage == "torn_tail":  # what a crash before the data reached the disk can leave
        raw[len(raw) // 3:] = bytes(len(raw) - len(raw) // 3)
    else:
        del raw[len(raw) // 2:]
    data.write_bytes(bytes(raw))
    fresh = _state(0)
    with caplog.at_level(logging.WARNING):
        found = Checkpointer(tmp_path).restore(fresh)
    assert found is not None and found.step == 100 and fresh.step == 100
    assert torch.equal(fresh.model.state_dict()["weight"], _state(100).model.state_dict()["weight"])
    if damage != "short":  # a short file fails the size check before anything is read
        assert "step 200" in caplog.text and "sha256 does not match" in caplog.text


def test_an_explicit_damaged_checkpoint_raises_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = Path(Checkpointer(tmp_path / "given").save(_state(9)))
    raw = bytearray((given / "state.pt").read_bytes())
    raw[-200] ^= 0x80
    (given / "state.pt").write_bytes(bytes(raw))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    fresh = _state(0)
    before = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="sha256 does not match"):
        Checkpointer(tmp_path / "job").restore(fresh, resume_from=given)
    assert fresh.step == 0
    for name, tensor in before.items():
        assert torch.equal(fresh.model.state_dict()[name], tensor), name


def test_without_checksum_verification_a_flipped_byte_goes_unnoticed(tmp_path: Path) -> None:
    """``verify_checksums=False`` trades the hash for speed: sizes and structure only."""
    data = Path(Checkpointer(tmp_path).save(_big_state(3, mb=1))) / "state.pt"
    raw = bytearray(data.read_bytes())
    weights = _big_state(3, mb=1).model.w.detach().numpy().tobytes()
    at = raw.find(weights[:64])
    assert at > 0
    raw[at + len(weights) // 2] ^= 0x01  # inside the tensor's bytes
    data.write_bytes(bytes(raw))
    fresh = _big_state(0, mb=1)
    assert Checkpointer(tmp_path, verify_checksums=False).restore(fresh) is not None
    assert not torch.equal(fresh.model.w, _big_state(3, mb=1).model.w)
    with pytest.raises(CheckpointError, match="none is valid"):
        Checkpointer(tmp_path).restore(_big_state(0, mb=1))
