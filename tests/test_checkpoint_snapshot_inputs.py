"""save_async accepts exactly what save accepts, and its snapshot is the state at the call:
tensors that cannot go into a reused host buffer (quantized, meta, nested) are copied as they
are, every tensor has a buffer of its own even when two dict keys print alike, and dict
subclasses come back as what they were (a defaultdict keeps its default_factory)."""

from __future__ import annotations

import collections
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from slurm_spot.checkpoint import Checkpointer, TrainState
from slurm_spot.checkpoint.snapshot import Snapshotter


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal in type, layout, quantizer and values (meta tensors: shape and dtype); an
    ``nn.Parameter`` counts as the tensor it holds (the snapshot holds its data)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.device, a.layout, a.is_nested) == (b.dtype, b.device, b.layout,
                                                               b.is_nested), where
        if a.is_meta:
            assert a.shape == b.shape, where
        elif a.is_nested:
            assert all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
        elif a.is_quantized:
            assert a.qscheme() == b.qscheme(), where
            assert torch.equal(a.int_repr(), b.int_repr()), where
            assert torch.equal(a.dequantize(), b.dequantize()), where
        elif a.layout != torch.strided:
            assert torch.equal(a.to_dense(), b.to_dense()), where
        else:
            assert torch.equal(a, b), where
        return
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert len(a) == len(b), where
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert ka == kb or (ka != ka and kb != kb), where  # NaN keys: both NaN
            _same(va, vb, f"{where}/{ka!r}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def _quantized_model() -> nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(  # type: ignore[no-any-return]
            nn.Sequential(nn.Linear(8, 4)), {nn.Linear}, dtype=torch.qint8)


def _odd_tensors() -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors' prototype notice
        nested = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0)])
    return {
        "qint8": torch.quantize_per_tensor(torch.linspace(-1, 1, 6), 0.1, 3, torch.qint8),
        "quint8_channel": torch.quantize_per_channel(
            torch.rand(3, 4), torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2]), 0,
            torch.quint8),
        "meta": torch.empty(5, 2, device="meta"),
        "nested": nested,
        "sparse": torch.eye(3).to_sparse(),
        "plain": torch.arange(4.0),
    }


def _saved(path: Path | str) -> dict[str, Any]:
    return torch.load(Path(path) / "state.pt", weights_only=False)  # type: ignore[no-any-return]


@pytest.mark.parametrize("snapshot", ["eager", "deferred"])
def test_save_async_writes_what_save_writes_for_quantized_meta_and_nested(
        tmp_path: Path, snapshot: str) -> None:
    model = _quantized_model()
    state = TrainState(model, step=1, extra={"odd": _odd_tensors()})
    blocking = _saved(Checkpointer(tmp_path / "sync").save(state))
    ckpt = Checkpointer(tmp_path / "async", snapshot=snapshot)  # type: ignore[arg-type]
    handle = ckpt.save_async(state)
    # the snapshot is the state at the call: changing the state now must not reach the file
    state.extra["odd"]["plain"].add_(100)
    state.extra["odd"]["qint8"] = torch.quantize_per_tensor(torch.zeros(6), 0.5, 0, torch.qint8)
    background = _saved(handle.wait(60))
    _same(blocking["model"], background["model"], "model")
    _same(blocking["extra"], background["extra"], "extra")
    assert background["model"]["0._packed_params._packed_params"][0].is_quantized


def test_a_snapshot_of_odd_tensors_is_not_changed_by_changing_them_in_place() -> None:
    state = _odd_tensors()
    expected = {k: v.clone() for k, v in state.items()}
    snapshot, pending = Snapshotter().take(state, 1)
    assert pending is None
    for name in ("plain", "nested", "sparse"):
        state[name].mul_(-3)
    assert snapshot["qint8"].data_ptr() != state["qint8"].data_ptr()
    _same(expected, snapshot, "snapshot")


class _Alike:
    """Two instances print alike (and are different keys)."""

    def __repr__(self) -> str:
        return "<alike>"


def test_keys_that_print_alike_get_a_buffer_each() -> None:
    nan_a, nan_b = float("nan"), float("nan")
    one, two = _Alike(), _Alike()
    state: dict[str, dict[Any, torch.Tensor]] = {"nan": {nan_a: torch.zeros(4), nan_b: torch.ones(4)},
             "alike": {one: torch.full((2,), 3.0), two: torch.full((2,), 4.0)}}
    snap = Snapshotter()
    for step in (1, 2):  # the second take reuses the buffers of the first
        snapshot, _ = snap.take(state, step)
        assert list(snapshot["nan"].keys()) == [nan_a, nan_b]
        _same(list(state["nan"].values()), list(snapshot["nan"].values()), "nan")
        assert list(snapshot["alike"].keys()) == [one, two]
        _same(list(state["alike"].values()), list(snapshot["alike"].values()), "alike")
        for values in state["nan"].values():
            values.add_(10)


def test_save_async_keeps_tensors_under_nan_keys_apart(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    state = TrainState(model, step=3, extra={"by_loss": {math.nan: torch.zeros(3),
                                                         -math.nan: torch.ones(3)}})
    ckpt = Checkpointer(tmp_path)  # held: the writer thread ends with its checkpointer
    saved = _saved(ckpt.save_async(state).wait(60))
    assert [v.tolist() for v in saved["extra"]["by_loss"].values()] == [[0.0] * 3, [1.0] * 3]


class _Tagged(dict):  # type: ignore[type-arg]
    """A dict subclass with an attribute of its own."""

    def __init__(self, *args: Any, tag: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag = tag


class _Frozen(dict):  # type: ignore[type-arg]
    """A dict subclass that cannot be rebuilt item by item."""

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError("frozen")


def test_dict_subclasses_come_back_as_they_were() -> None:
    default: collections.defaultdict[str, Any] = collections.defaultdict(
        list, {"a": torch.arange(3.0)})
    ordered = collections.OrderedDict([("z", torch.ones(1)), ("a", torch.zeros(1))])
    tagged = _Tagged({"w": torch.ones(2)}, tag="ema")
    frozen = _Frozen({"x": torch.ones(2)})
    snapshot, _ = Snapshotter().take(
        {"d": default, "o": ordered, "t": tagged, "f": frozen}, 1)
    assert type(snapshot["d"]) is collections.defaultdict
    assert snapshot["d"].default_factory is list
    _same(dict(default), dict(snapshot["d"]))
    assert snapshot["d"]["missing"] == []
    assert type(snapshot["o"]) is collections.OrderedDict and list(snapshot["o"]) == ["z", "a"]
    assert type(snapshot["t"]) is _Tagged and snapshot["t"].tag == "ema"
    _same(dict(tagged), dict(snapshot["t"]))
    assert type(snapshot["f"]) is dict  # documented fallback: a plain dict of the same items
    _same(dict(frozen), snapshot["f"])
    default["a"].add_(5)
    assert snapshot["d"]["a"].tolist() == [0.0, 1.0, 2.0]
