"""What training code imports: ``from slurm_spot.checkpoint import Checkpointer, TrainState,
PreemptionHandler``.

The names load on first use (PEP 562), so ``slurm_spot.checkpoint.files`` and
``slurm_spot.checkpoint.store`` (no torch) can be imported without torch; the torch-based
ones import it:

- :mod:`.checkpointer`: :class:`Checkpointer` (atomic, validated checkpoints, sync and async
  save, restore; torch.distributed.checkpoint for sharded state), built from :mod:`.saving`
  (one save written, agreed and committed), :mod:`.restoring` (which checkpoint to resume
  from, loading it) and :mod:`.collectives` (the save's own gloo group);
- :mod:`.trainstate`: :class:`TrainState`, :class:`SkipSampler`, the RNG helpers, the
  restorable-state check (what a checkpoint holds);
- :mod:`.snapshot` and :mod:`.writer`: the asynchronous save (the snapshot, :class:`SaveHandle`,
  the writer thread); :mod:`.verify`: restore-side checks (sha256 while loading, shapes);
- :mod:`.store`: :class:`CheckpointStore` (where checkpoints live; ``committed()`` lists them
  for ``plan`` and ``cost``), :class:`LocalStore` (a POSIX directory, the default) and
  :func:`open_store` (the store a root names, from the URL scheme's entry in ``URL_STORES``);
- :mod:`slurm_spot.contract.location`: whether a root is a directory or a store's URL (kept
  as a string) and the per-job layout ``<root>/<user>/<key>`` (no torch);
- :mod:`.s3`: :class:`S3Store` (``s3://bucket/prefix``, boto3; no torch): the save protocol,
  on :mod:`.s3objects` (client, listing, manifests, downloads) and :mod:`.s3inflight`;
- :mod:`.files`: the on-disk layout, validation, :func:`find_latest_valid`; :mod:`.commit`: the
  commit protocol (manifest last, rename, retention); :mod:`.diskerrors`: a failed save's
  error, a full device named as such;
- :mod:`.preemption`: :class:`PreemptionHandler` (the signal flag, the collective stop
  decision, the requeue).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_spot.checkpoint.checkpointer import Checkpointer
    from slurm_spot.checkpoint.files import Checkpoint, CheckpointError, find_latest_valid
    from slurm_spot.checkpoint.preemption import PreemptionHandler
    from slurm_spot.checkpoint.s3 import S3Store
    from slurm_spot.checkpoint.store import CheckpointStore, LocalStore, open_store
    from slurm_spot.checkpoint.trainstate import (
        SkipSampler,
        TrainState,
        capture_rng_state,
        restore_rng_state,
    )
    from slurm_spot.checkpoint.writer import SaveHandle

_WHERE = {
    "Checkpointer": "checkpointer", "SkipSampler": "trainstate", "TrainState": "trainstate",
    "capture_rng_state": "trainstate", "restore_rng_state": "trainstate",
    "Checkpoint": "files", "CheckpointError": "files", "find_latest_valid": "files",
    "PreemptionHandler": "preemption", "CheckpointStore": "store", "LocalStore": "store",
    "open_store": "store", "S3Store": "s3", "SaveHandle": "writer",
}

__all__ = [
    "Checkpoint", "CheckpointError", "CheckpointStore", "Checkpointer", "LocalStore",
    "PreemptionHandler", "S3Store", "SaveHandle", "SkipSampler", "TrainState",
    "capture_rng_state", "find_latest_valid", "open_store", "restore_rng_state",
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
