"""What training code imports: ``from slurm_spot.checkpoint import Checkpointer, TrainState,
PreemptionHandler``.

The names load on first use (PEP 562), so ``slurm_spot.checkpoint.files`` and
``slurm_spot.checkpoint.store`` (no torch) can be imported without torch; the torch-based
ones import it:

- :mod:`.checkpointer`: :class:`Checkpointer`, :class:`TrainState`, :class:`SkipSampler`,
  the RNG helpers (atomic, validated checkpoints; torch.distributed.checkpoint for sharded
  state);
- :mod:`.store`: :class:`CheckpointStore` (where checkpoints live) and :class:`LocalStore`
  (a POSIX directory, the default);
- :mod:`.files`: the on-disk layout, validation, :func:`find_latest_valid`;
- :mod:`.preemption`: :class:`PreemptionHandler` (the signal flag, the collective stop
  decision, the requeue).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_spot.checkpoint.checkpointer import (
        Checkpointer,
        SkipSampler,
        TrainState,
        capture_rng_state,
        restore_rng_state,
    )
    from slurm_spot.checkpoint.files import Checkpoint, CheckpointError, find_latest_valid
    from slurm_spot.checkpoint.preemption import PreemptionHandler
    from slurm_spot.checkpoint.store import CheckpointStore, LocalStore

_WHERE = {
    "Checkpointer": "checkpointer", "SkipSampler": "checkpointer", "TrainState": "checkpointer",
    "capture_rng_state": "checkpointer", "restore_rng_state": "checkpointer",
    "Checkpoint": "files", "CheckpointError": "files", "find_latest_valid": "files",
    "PreemptionHandler": "preemption", "CheckpointStore": "store", "LocalStore": "store",
}

__all__ = [
    "Checkpoint", "CheckpointError", "CheckpointStore", "Checkpointer", "LocalStore",
    "PreemptionHandler", "SkipSampler", "TrainState", "capture_rng_state", "find_latest_valid",
    "restore_rng_state",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
