"""What training code imports: ``from slurm_spot.checkpoint import Checkpointer, TrainState,
PreemptionHandler``.

The implementation lives in :mod:`slurm_spot.checkpoint.checkpointer` (atomic, validated checkpoints;
torch.distributed.checkpoint for sharded state) and :mod:`slurm_spot.checkpoint.preemption` (the
signal flag, the collective stop decision, the requeue). Importing this module imports torch.
"""

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
