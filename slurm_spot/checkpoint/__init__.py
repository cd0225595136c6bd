"""What training code imports: ``from slurm_spot.checkpoint import Checkpointer, TrainState,
PreemptionHandler``.

The implementation lives in :mod:`slurm_spot.checkpoint.checkpointer` (atomic, validated checkpoints;
torch.distributed.checkpoint for sharded state) and :mod:`slurm_spot.checkpoint.preemption` (the
signal flag, the collective stop decision, the requeue). Taking a name from this module imports
torch; importing the package itself does not, so :mod:`slurm_spot.checkpoint.files` (manifests,
stdlib only) serves the node-side watcher and the controller without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_spot.checkpoint.checkpointer import (
        Checkpoint,
        Checkpointer,
        CheckpointError,
        SkipSampler,
        TrainState,
        capture_rng_state,
        find_latest_valid,
        restore_rng_state,
    )
    from slurm_spot.checkpoint.preemption import PreemptionHandler

__all__ = [
    "Checkpoint", "CheckpointError", "Checkpointer", "PreemptionHandler", "SkipSampler",
    "TrainState", "capture_rng_state", "find_latest_valid", "restore_rng_state",
]
_HOME = {name: "checkpointer" for name in __all__} | {"PreemptionHandler": "preemption"}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"slurm_spot.checkpoint.{home}"), name)
