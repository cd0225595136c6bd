"""The deferred snapshot of an asynchronous save: parameters and optimizer state are copied by
the writer while training goes on, the next optimizer.step() waits for that copy, and every
checkpoint holds exactly the state at its hand-off (never a torn mix); a parameter changed
outside optimizer.step() fails the save instead of committing a torn state."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, CheckpointError, TrainState
from slurm_spot.checkpoint.snapshot import PendingCopies


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 4))


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def test_every_deferred_checkpoint_holds_the_state_at_its_hand_off(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    state = TrainState(model, optimizer)
    ckpt = Checkpointer(tmp_path, keep=100, snapshot="deferred", writer_timeout_s=60)
    gen = torch.Generator().manual_seed(1)
    expected: dict[int, Any] = {}
    for step in range(1, 13):
        x = torch.randn(32, 64, generator=gen)
        optimizer.zero_grad()
        model(x).square().mean().backward()  # forward changes the BatchNorm buffers
        optimizer.step()  # waits for the previous save's deferred copy
        state.step = step
        if step % 3 == 0:
            expected[step] = {"model": _clone(model.state_dict()),
                              "optimizer": _clone(optimizer.state_dict())}
            ckpt.save_async(state)
    ckpt.wait(60)
    for step, want in expected.items():
        saved = torch.load(tmp_path / f"step_{step:09d}" / "state.pt", weights_only=True)
        _same(want["model"], saved["model"], f"step {step} model")
        _same(want["optimizer"], saved["optimizer"], f"step {step} optimizer")
    fresh = TrainState(_model(), torch.optim.Adam(_model().parameters(), lr=0.01))
    found = Checkpointer(tmp_path).restore(fresh)
    assert found is not None and found.step == 12
    _same(expected[12]["model"], fresh.model.state_dict())


def test_a_parameter_changed_outside_the_step_fails_the_save_not_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(tmp_path, snapshot="deferred", writer_timeout_s=60)
    ckpt.save(TrainState(model, optimizer, step=1))
    gate = threading.Event()
    run = PendingCopies.run

    def held_back(self: PendingCopies) -> None:  # the writer starts copying only later
        gate.wait(30)
        run(self)

    monkeypatch.setattr(PendingCopies, "run", held_back)
    handle = ckpt.save_async(TrainState(model, optimizer, step=2))
    with torch.no_grad():
        model[0].weight.mul_(0.5)  # not through optimizer.step(): nothing waits for the copy
    gate.set()
    with pytest.raises(CheckpointError, match=r"step 2: model/0\.weight changed in place"):
        ckpt.wait(60)
    assert handle.done()
    found = Checkpointer(tmp_path).latest()
    assert found is not None and found.step == 1  # nothing torn was committed
    monkeypatch.undo()
    assert ckpt.save(TrainState(model, optimizer, step=3)) == tmp_path / "step_000000003"


def test_deferred_without_an_optimizer_copies_everything_before_returning(
        tmp_path: Path) -> None:
    model = _model()
    expected = _clone(model.state_dict())
    ckpt = Checkpointer(tmp_path, snapshot="deferred")
    handle = ckpt.save_async(TrainState(model, step=4))  # nothing to wait in: eager
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(42.0)
    handle.wait(60)
    saved = torch.load(tmp_path / "step_000000004" / "state.pt", weights_only=True)
    _same(expected, saved["model"])


def test_restore_waits_for_a_deferred_copy_and_a_bad_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="snapshot must be 'eager' or 'deferred'"):
        Checkpointer(tmp_path, snapshot="lazy")  # type: ignore[arg-type]
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = _clone(model.state_dict())
    ckpt = Checkpointer(tmp_path, snapshot="deferred")
    ckpt.save_async(TrainState(model, optimizer, step=5))
    different = _model()
    with torch.no_grad():
        for p in different.parameters():
            p.fill_(3.0)
    Checkpointer(tmp_path / "other").save(TrainState(different, step=9))
    given = Checkpointer(tmp_path / "other").latest()
    # overwrites the parameters in place: only once the deferred copy has them
    ckpt.restore(TrainState(model), checkpoint=given)
    assert torch.equal(model[0].weight, different[0].weight)
    ckpt.wait(60)
    saved = torch.load(tmp_path / "step_000000005" / "state.pt", weights_only=True)
    _same(expected, saved["model"])


def test_copy_into_matches_tensor_copy_for_every_kind_of_tensor() -> None:
    """The memmove fast path gives what Tensor.copy_ gives; what it cannot copy byte for byte
    (strided views, lazy conjugates, other dtypes) falls back to copy_."""
    from slurm_spot.checkpoint.snapshot import copy_into

    base = torch.arange(48, dtype=torch.float64).reshape(6, 8)
    complex_ = torch.randn(5, dtype=torch.complex64)
    sources = {
        "float32": torch.randn(1000), "bfloat16": torch.randn(300).to(torch.bfloat16),
        "int64": torch.arange(-5, 95), "bool": torch.rand(77) > 0.5,
        "offset view": base[2:4], "transposed": base.t(), "strided": base[:, ::3],
        "lazy conjugate": complex_.conj(), "empty": torch.empty(0, 3), "scalar": torch.tensor(7.5),
    }
    for name, source in sources.items():
        target = torch.full_like(source.resolve_conj(), 0).contiguous()
        expected = target.clone().copy_(source)
        copy_into(target, source)
        assert torch.equal(target, expected), name
    widened = torch.zeros(10, dtype=torch.float64)
    copy_into(widened, torch.arange(10, dtype=torch.int32))  # another dtype: converted
    assert widened.tolist() == [float(i) for i in range(10)]


def test_an_eager_save_holds_the_state_at_the_call_not_later(tmp_path: Path) -> None:
    """Every tensor of the state (bf16, int, a view, a transposed parameter, optimizer state,
    an extra tensor) is changed in place right after save_async returns, three saves in a row
    reusing the snapshot's buffers: each checkpoint holds the values at its call."""
    model = _model().to(torch.float64)
    model.register_buffer("bf16", torch.randn(33).to(torch.bfloat16))
    model.register_buffer("counts", torch.arange(17))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    extra = {"table": torch.randn(9, 4).t(), "ids": torch.arange(20)[5:15]}
    state = TrainState(model, optimizer, extra=extra)
    ckpt = Checkpointer(tmp_path, keep=10, writer_timeout_s=60)
    expected: dict[int, Any] = {}
    for step in (1, 2, 3):
        optimizer.zero_grad()
        model(torch.randn(8, 64, dtype=torch.float64)).square().mean().backward()
        optimizer.step()
        state.step = step
        expected[step] = {"model": _clone(model.state_dict()),
                          "optimizer": _clone(optimizer.state_dict()),
                          "extra": _clone(state.extra)}
        handle = ckpt.save_async(state)
        with torch.no_grad():  # the trainer reuses its memory at once
            for tensor in [*model.state_dict().values(), *state.extra.values()]:
                tensor.add_(1) if tensor.dtype != torch.bool else tensor.logical_not_()
            for per_param in optimizer.state.values():
                for value in per_param.values():
                    if isinstance(value, torch.Tensor):
                        value.add_(1)
        handle.wait(60)
    for step, want in expected.items():
        saved = torch.load(tmp_path / f"step_{step:09d}" / "state.pt", weights_only=True)
        for part in ("model", "optimizer", "extra"):
            _same(want[part], saved[part], f"step {step} {part}")


def test_a_checkpointer_nobody_keeps_still_finishes_its_save(tmp_path: Path) -> None:
    """``Checkpointer(d).save_async(state).wait()``: the handle keeps its checkpointer (and so
    its writer thread) alive until the save is done, instead of waiting out the timeout."""
    model = _model()
    handle = Checkpointer(tmp_path, writer_timeout_s=60).save_async(TrainState(model, step=3))
    where = handle.wait(timeout_s=30)
    assert Path(where).name.endswith("3") and handle.save_s is not None and handle.save_s < 30
    restored = Checkpointer(tmp_path).restore(TrainState(_model()))
    assert restored is not None and restored.step == 3
