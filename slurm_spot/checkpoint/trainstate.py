"""What a checkpoint holds and how it is taken from a training run: :class:`TrainState`, the
RNG helpers, :class:`SkipSampler`, the restorable-state check (:func:`check_restorable`) and
the payload a save writes.

Imported by training code through ``slurm_spot.checkpoint`` (it imports torch).
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils.data import Sampler

from slurm_spot.checkpoint.files import FORMAT, CheckpointError


@dataclass
class TrainState:
    """Everything a resumed run needs; :meth:`Checkpointer.restore` updates it in place.

    Attributes:
        model: the module (a DDP wrapper is unwrapped; FSDP goes through DCP).
        optimizer: its optimizer, or None.
        scheduler: an LR scheduler (anything with ``state_dict``/``load_state_dict``), or None.
        step: optimizer steps done so far.
        epoch: the current epoch (feed it to ``DistributedSampler.set_epoch``).
        batch_in_epoch: batches of ``epoch`` already consumed (skip them on resume).
        extra: user values (plain Python types and tensors) saved and restored as they are.
        generators: named ``torch.Generator`` objects whose states are saved per rank.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    generators: dict[str, torch.Generator] = field(default_factory=dict)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: ``python``, ``numpy`` (None without numpy), ``torch`` (a
    uint8 tensor) and ``cuda`` (one uint8 tensor per device, or None without CUDA)."""
    numpy_state: dict[str, Any] | None = None
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        numpy_state = {"kind": str(kind), "keys": [int(k) for k in keys], "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)}
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": numpy_state,
            "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set this process's RNGs from :func:`capture_rng_state` output (missing parts are
    skipped; CUDA states only if CUDA is available here)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("numpy") is not None:
        import numpy as np

        ns = state["numpy"]
        np.random.set_state((ns["kind"], np.asarray(ns["keys"], dtype=np.uint32), ns["pos"],
                             ns["has_gauss"], ns["gauss"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class SkipSampler(Sampler[int]):
    """Wrap a sampler so that its next iteration skips the first ``skip`` indices (to resume
    mid-epoch); later iterations are complete. ``set_epoch`` is passed through.

    Args:
        base: the sampler (e.g. ``DistributedSampler``); its order must depend only on its
            seed and epoch.
    """

    def __init__(self, base: Sampler[int]) -> None:
        self.base = base
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Forward to ``base.set_epoch`` (if it has one)."""
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def skip(self, count: int) -> None:
        """Skip ``count`` indices (batches done x batch size) in the next iteration only."""
        self._skip = max(0, count)

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        for i, index in enumerate(self.base):
            if i >= skip:
                yield index

    def __len__(self) -> int:
        return max(0, len(self.base) - self._skip)  # type: ignore[arg-type]


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose ``state_dict`` is saved: ``model.module`` of a
    ``DistributedDataParallel`` wrapper, else ``model`` itself (so a checkpoint of a DDP run
    loads into a plain model and back). Raises nothing."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_sharded(model: torch.nn.Module) -> bool:
    """True if ``model`` has DTensor parameters (FSDP2, tensor parallel) or is wrapped in
    FSDP1: those go through torch.distributed.checkpoint. Runs no collective."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return True
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - FSDP is part of every distributed build
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def check_restorable(extra: Mapping[str, Any], where: str = "TrainState.extra") -> None:
    """Refuse values that ``torch.load(weights_only=True)`` would refuse on restore.

    Containers (dict, list, tuple) are walked and tensors accepted as they are; every other
    value is round-tripped through ``torch.save`` / ``torch.load(weights_only=True)`` alone,
    so the error names the first refused key (``TrainState.extra['when']``).

    Raises:
        CheckpointError: a value (numpy scalar or array, datetime, enum, Path, Decimal, UUID,
            a lambda, ...) that could be saved but never restored, or not pickled at all; a
            container that contains itself (a cycle: restoring copies ``extra`` recursively);
            nesting deeper than Python's recursion limit.
    """
    import io

    def walk(value: Any, path: str, outer: dict[int, str]) -> None:
        if isinstance(value, torch.Tensor) or value is None or type(value) in (
                bool, int, float, str, bytes, complex):
            return
        if type(value) in (dict, list, tuple):
            if id(value) in outer:
                raise CheckpointError(
                    f"{path} is {outer[id(value)]} itself (the {type(value).__name__} contains "
                    "itself); store plain, acyclic values")
            inner = {**outer, id(value): path}
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(value, dict) and type(key) not in (str, int, float, bool):
                    raise CheckpointError(f"{path}: key {key!r} of type {type(key).__name__} "
                                          "cannot be restored; use str or int keys")
                walk(item, f"{path}[{key!r}]", inner)
            return
        buf = io.BytesIO()
        try:
            torch.save(value, buf)
            buf.seek(0)
            torch.load(buf, weights_only=True)
        except Exception as exc:
            raise CheckpointError(
                f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which "
                f"torch.load(weights_only=True) cannot restore ({type(exc).__name__}); store "
                "plain Python values (int, float, str, list, dict) or tensors instead") from None

    try:
        walk(dict(extra), where, {})
    except RecursionError:
        raise CheckpointError(f"{where} is nested too deeply to save (over Python's recursion "
                              "limit); flatten it") from None


def counters_of(state: TrainState) -> tuple[int, int, int]:
    """``(step, epoch, batch_in_epoch)`` of ``state`` as ints.

    Whole numbers of any type are accepted: ``int``, numpy integers, a one-element integer
    tensor, and an integral float (``100.0``, as ``epoch * steps_per_epoch / 1`` gives); the
    checkpoint stores them as ``int`` (restore reads them back with ``int()``).

    Raises:
        CheckpointError: a counter is not a whole number >= 0 (``1.5``, NaN, ``"3"``, a bool,
            negative), naming the attribute, its value and its type.
    """
    out = []
    for name in ("step", "epoch", "batch_in_epoch"):
        value = getattr(state, name)
        number: int | None = None
        if isinstance(value, float):
            number = int(value) if value.is_integer() else None
        elif not isinstance(value, bool):
            try:
                number = operator.index(value)
            except TypeError:
                number = None
        if number is None or number < 0:
            kind = type(value).__qualname__ if type(value).__module__ == "builtins" else \
                f"{type(value).__module__}.{type(value).__qualname__}"
            raise CheckpointError(
                f"TrainState.{name} is {value!r} ({kind}); it must be a whole number >= 0")
        out.append(number)
    return out[0], out[1], out[2]


def build_payload(state: TrainState, counters: tuple[int, int, int], per_rank: list[Any],
             world: int, kind: Literal["torch", "dcp"]) -> dict[str, Any]:
    """What rank 0 writes (``state.pt``, or ``meta.pt`` beside DCP shards): the format tag,
    ``counters`` (``(step, epoch, batch_in_epoch)`` from :func:`counters_of`), ``extra``,
    ``world_size``, ``per_rank`` (one :func:`capture_rank_state` per rank, filled in by the
    writer after its gather), the scheduler's ``state_dict``; for ``kind == "torch"`` also the
    model's (unwrapped) and the optimizer's ``state_dict``. The tensors are the live ones, not
    copies (the snapshot copies them). Raises what ``state_dict()`` raises."""
    step, epoch, batch_in_epoch = counters
    payload: dict[str, Any] = {
        "format": FORMAT, "step": step, "epoch": epoch,
        "batch_in_epoch": batch_in_epoch, "extra": state.extra,
        "world_size": world, "per_rank": per_rank,
        "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
    }
    if kind == "torch":
        payload["model"] = unwrap_model(state.model).state_dict()
        payload["optimizer"] = state.optimizer.state_dict() if state.optimizer else None
    return payload


def capture_rank_state(state: TrainState) -> dict[str, Any]:
    """This rank's part of a checkpoint: ``{"rng": capture_rng_state(), "generators": {name:
    uint8 state tensor}}`` for every named generator of ``state``. Runs no collective."""
    return {"rng": capture_rng_state(),
            "generators": {name: g.get_state() for name, g in state.generators.items()}}


def optimizers_of(state: TrainState) -> list[torch.optim.Optimizer]:
    """``[state.optimizer]``, or ``[]`` without one (the form DCP's state-dict helpers take)."""
    return [state.optimizer] if state.optimizer is not None else []


def dcp_state_dict(state: TrainState) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` (``optim`` only with an optimizer) from
    ``torch.distributed.checkpoint.state_dict.get_state_dict``: the sharded state DCP saves
    and loads in place. With FSDP it runs collectives on the model's process group, so every
    rank calls it together."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(state.model, optimizers_of(state))
    return {"model": model_sd, "optim": optim_sd} if state.optimizer else {"model": model_sd}
