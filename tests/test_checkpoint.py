"""Checkpoints: exact resume, atomic commit, validation, pruning, multi-rank (plain and DCP)."""

from __future__ import annotations

import io
import json
import logging
import multiprocessing as mp
import os
import random
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from slurm_spot.checkpoint import (
    Checkpointer,
    CheckpointError,
    TrainState,
    find_latest_valid,
)
from slurm_spot.checkpoint import files as checkpoint_files
from slurm_spot.checkpoint.files import scan

DATA = Path(__file__).parent / "data"


def _snapshot(directory: Path) -> list[tuple[Any, ...]]:
    """Names, kinds, sizes, mtimes (ns) and link targets of everything under ``directory``."""
    rows = []
    for path in sorted(directory.rglob("*")):
        st = os.lstat(path)
        target = os.readlink(path) if path.is_symlink() else None
        rows.append((str(path.relative_to(directory)), st.st_mode, st.st_size, st.st_mtime_ns,
                     target))
    return rows


def _archive_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"weights": torch.arange(2000, dtype=torch.float32)}, buffer)
    return buffer.getvalue()


def test_field_case_resumes_from_the_newest_complete_archive(tmp_path: Path) -> None:
    """tests/data/checkpoint-dir.yaml, scaled down: real torch.save archives, the truncated one
    cut at the same fraction of its size, a temp file, and ``last.ckpt`` -> the truncated one."""
    case = yaml.safe_load((DATA / "checkpoint-dir.yaml").read_text())
    archive = _archive_bytes()
    sizes = [row[1] for row in case["listing"] if isinstance(row[1], int)]
    full = max(sizes)
    for name, size, third in case["listing"]:
        path = tmp_path / name
        if size == "symlink":
            os.symlink(third, path)
            continue
        path.write_bytes(archive[: max(1, len(archive) * size // full)])
        os.utime(path, (third, third))
    before = _snapshot(tmp_path)

    found = find_latest_valid(tmp_path)

    assert found is not None
    assert found.path.name == case["expect"]["resume_from"] == "ckpt_000750.pt"
    assert (found.step, found.kind) == (750, "file")
    verdicts = {v.candidate.path.name: v.reason for v in scan(tmp_path)}
    assert set(verdicts) == {"ckpt_001000.pt", "ckpt_000750.pt", "ckpt_000500.pt"}
    assert "truncated" in verdicts["ckpt_001000.pt"]
    assert _snapshot(tmp_path) == before  # resolving wrote, renamed and touched nothing


def test_order_is_by_step_not_mtime(tmp_path: Path) -> None:
    archive = _archive_bytes()
    for name, mtime in [("ckpt_20.pt", 1_000), ("ckpt_3.pt", 9_000)]:
        (tmp_path / name).write_bytes(archive)
        os.utime(tmp_path / name, (mtime, mtime))
    found = find_latest_valid(tmp_path)
    assert found is not None and found.path.name == "ckpt_20.pt"
    assert find_latest_valid(tmp_path / "missing") is None
    assert not (tmp_path / "missing").exists()


# -- an exact resume ----------------------------------------------------------------------


def _train(directory: Path | None, total: int, stop_at: int | None = None,
           restore_rng: bool = True) -> dict[str, torch.Tensor] | None:
    """A tiny run: shuffled batches (seeded per epoch), dropout, Adam, StepLR, and noise from
    python's random, numpy and a named torch.Generator. Returns the final weights, or None
    when stopped (after saving) at ``stop_at``."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data_gen = torch.Generator().manual_seed(1)
    x_all = torch.randn(40, 8, generator=data_gen)
    y_all = (x_all.sum(dim=1) > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.5)
    noise = torch.Generator().manual_seed(5)
    state = TrainState(model, optimizer, scheduler, generators={"noise": noise})
    ckpt = Checkpointer(directory, keep=2) if directory else None
    if ckpt:
        ckpt.restore(state, restore_rng=restore_rng)
    while state.step < total:
        order = torch.randperm(40, generator=torch.Generator().manual_seed(100 + state.epoch))
        for batch in range(state.batch_in_epoch, 5):
            idx = order[batch * 8:(batch + 1) * 8]
            x = x_all[idx] + 0.01 * torch.randn(8, 8, generator=noise)
            x = x + random.gauss(0, 0.01) + float(np.random.normal(0, 0.01))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y_all[idx]).backward()
            optimizer.step()
            scheduler.step()
            state.step, state.batch_in_epoch = state.step + 1, batch + 1
            if state.step == stop_at:
                assert ckpt is not None
                ckpt.save(state)
                return None
            if state.step == total:
                break
        else:
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_interrupted_and_resumed_run_ends_bit_identical(tmp_path: Path) -> None:
    reference = _train(None, total=23)
    assert _train(tmp_path, total=23, stop_at=13) is None  # mid-epoch (5 batches per epoch)
    resumed = _train(tmp_path, total=23)
    assert reference is not None and resumed is not None
    for name, tensor in reference.items():
        assert torch.equal(tensor, resumed[name]), name


def test_without_rng_restore_the_resumed_run_differs(tmp_path: Path) -> None:
    """The exactness above is not an accident: dropout and noise depend on the RNG state."""
    reference = _train(None, total=23)
    _train(tmp_path, total=23, stop_at=13)
    resumed = _train(tmp_path, total=23, restore_rng=False)
    assert reference is not None and resumed is not None
    assert not all(torch.equal(t, resumed[n]) for n, t in reference.items())


# -- commit, validation, pruning -------------------------------------------------------------


def _state(step: int) -> TrainState:
    torch.manual_seed(step)
    model = nn.Linear(3, 2)
    return TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=step,
                      extra={"sampler": {"epoch": 1, "index": 96}})


def test_committed_checkpoint_layout_and_manifest(tmp_path: Path) -> None:
    path = Checkpointer(tmp_path).save(_state(500))
    assert path == tmp_path / "step_000000500"
    assert sorted(os.listdir(tmp_path)) == ["step_000000500"]  # no temp left behind
    manifest = json.loads((path / "manifest.json").read_text())
    size, sha = checkpoint_files.file_digest(path / "state.pt")
    assert manifest["files"] == {"state.pt": {"size": size, "sha256": sha}}
    assert (manifest["step"], manifest["kind"], manifest["world_size"]) == (500, "torch", 1)
    assert manifest["format"] == checkpoint_files.FORMAT and manifest["created_unix_s"] > 0
    restored = _state(0)
    Checkpointer(tmp_path).restore(restored)
    assert restored.step == 500 and restored.extra == {"sampler": {"epoch": 1, "index": 96}}
    weight = restored.model.state_dict()["weight"]
    assert torch.equal(weight, _state(500).model.state_dict()["weight"])


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "no_manifest", "bad_json"])
def test_damaged_newest_checkpoint_is_skipped(tmp_path: Path, damage: str) -> None:
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(_state(100))
    newest = ckpt.save(_state(200))
    data = newest / "state.pt"
    if damage == "flip_byte":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "no_manifest":
        (newest / "manifest.json").unlink()
    else:
        (newest / "manifest.json").write_text("{not json")
    found = find_latest_valid(tmp_path)
    assert found is not None and found.step == 100
    reason = scan(tmp_path)[0].reason
    expected = {"flip_byte": "sha256", "truncate": "bytes", "no_manifest": "no manifest",
                "bad_json": "unreadable manifest"}[damage]
    assert expected in reason


def test_temp_dirs_and_symlinks_are_never_candidates(tmp_path: Path) -> None:
    good = Checkpointer(tmp_path).save(_state(100))
    stale = tmp_path / "step_000000900.tmp-deadbeef"
    stale.mkdir()
    (stale / "state.pt").write_bytes((good / "state.pt").read_bytes())
    os.symlink(good, tmp_path / "step_000000999")
    os.symlink(good, tmp_path / "latest")
    assert [c.path.name for c in checkpoint_files.list_candidates(tmp_path)] == ["step_000000100"]


def test_keeps_the_last_k_and_cleans_stale_temps(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    (tmp_path / "step_000000001.tmp-0badc0de").mkdir(parents=True)
    for step in (10, 20, 30, 40):
        ckpt.save(_state(step))
    assert sorted(os.listdir(tmp_path)) == ["step_000000030", "step_000000040"]


def test_crash_before_commit_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = Checkpointer(tmp_path, keep=1)
    ckpt.save(_state(10))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("slurm_spot.checkpoint.store.write_manifest", disk_full)
    with pytest.raises(CheckpointError, match="No space left"):
        ckpt.save(_state(20))
    found = find_latest_valid(tmp_path)
    assert found is not None and found.step == 10
    monkeypatch.undo()
    ckpt.save(_state(30))
    assert sorted(os.listdir(tmp_path)) == ["step_000000030"]


def test_an_existing_checkpoint_is_never_overwritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = Checkpointer(tmp_path)
    first = ckpt.save(_state(7))
    before = _snapshot(tmp_path)
    changed = _state(7)
    with torch.no_grad():
        changed.model.state_dict()["weight"].add_(1.0)
    with caplog.at_level(logging.WARNING):
        again = ckpt.save(changed)
    assert again == first
    assert _snapshot(tmp_path) == before
    assert "already exists; not overwriting it" in caplog.text


def test_foreign_archive_is_ignored_not_an_error(tmp_path: Path) -> None:
    """Contract: another library's ``ckpt_*.pt`` in the directory is not ours; restore passes
    over it (to ours, or to a fresh start), even when its step is newer."""
    (tmp_path / "ckpt_000750.pt").write_bytes(_archive_bytes())
    fresh = _state(0)
    assert Checkpointer(tmp_path).restore(fresh) is None
    assert fresh.step == 0
    Checkpointer(tmp_path).save(_state(5))
    resumed = _state(0)
    found = Checkpointer(tmp_path).restore(resumed)
    assert found is not None and found.path.name == "step_000000005"
    assert resumed.step == 5


# -- two ranks over gloo: plain torch.save on rank 0, and DCP ------------------------------


def _rank_main(rank: int, world: int, port: int, root: str, out: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    torch.manual_seed(100 + rank)  # each rank its own stream
    report: dict[str, Any] = {"rank": rank}
    for sub, sharded in (("plain", False), ("dcp", True)):
        ckpt = Checkpointer(Path(root) / sub)
        path = ckpt.save(TrainState(model, optimizer, step=7), sharded=sharded)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
        next_draw = torch.rand(3)
        with torch.no_grad():
            model.weight.add_(5.0)
        optimizer.state[model.weight]["momentum_buffer"].zero_()
        torch.manual_seed(12345)
        fresh = TrainState(model, optimizer)
        found = ckpt.restore(fresh)
        assert found is not None
        report[sub] = {
            "path": str(path), "kind": found.kind, "step": fresh.step,
            "weights_equal": all(torch.equal(v, model.state_dict()[k]) for k, v in saved.items()),
            "momentum_equal": torch.equal(
                momentum, optimizer.state_dict()["state"][0]["momentum_buffer"]),
            "rng_equal": torch.equal(next_draw, torch.rand(3)),
            "files": sorted(os.listdir(path)),
        }
    dist.destroy_process_group()
    out.put(report)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_ranks_plain_and_dcp(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, str(tmp_path), out))
             for r in range(2)]
    for p in procs:
        p.start()
    reports = {}
    for _ in procs:
        report = out.get(timeout=120)
        reports[report["rank"]] = report
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for rank in (0, 1):
        plain, dcp = reports[rank]["plain"], reports[rank]["dcp"]
        assert plain["kind"] == "torch" and dcp["kind"] == "dcp"
        for result in (plain, dcp):
            assert result["step"] == 7
            assert result["weights_equal"] and result["momentum_equal"]
            assert result["rng_equal"], f"rank {rank} did not get its own RNG stream back"
    assert reports[0]["plain"]["files"] == ["manifest.json", "state.pt"]
    dcp_files = reports[0]["dcp"]["files"]
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt", "manifest.json"} <= set(
        dcp_files)
    manifest = json.loads((Path(reports[0]["dcp"]["path"]) / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["kind"] == "dcp"
    assert set(manifest["files"]) == set(dcp_files) - {"manifest.json"}
