"""Restore-side checks: a checkpoint file is verified (size, sha256) while it is loaded, its
tensors are checked against the model's shapes before anything is overwritten, and what
outlives a restore is copied out of the file's memory map.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from slurm_spot.checkpoint.files import FORMAT, CheckpointError
from slurm_spot.checkpoint.hashing import mapped_digest


def check_shapes(where: Path, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Check a saved model ``state_dict`` against the model's before anything is loaded.

    Args:
        where: the checkpoint, for the message.
        saved: the checkpoint's model state (name -> tensor).
        current: the model's ``state_dict()``.

    Raises:
        CheckpointError: keys missing or unexpected, or a tensor of another shape (up to five
            of each are named); nothing was loaded.
    """
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    wrong = [f"{k}: checkpoint {tuple(saved[k].shape)}, model {tuple(current[k].shape)}"
             for k in current if k in saved and isinstance(saved[k], torch.Tensor)
             and tuple(saved[k].shape) != tuple(current[k].shape)]
    if missing or unexpected or wrong:
        parts = ([f"shape mismatch: {'; '.join(wrong[:5])}"] if wrong else []) + \
                ([f"missing in checkpoint: {missing[:5]}"] if missing else []) + \
                ([f"not in the model: {unexpected[:5]}"] if unexpected else [])
        raise CheckpointError(f"{where}: the checkpoint does not fit this model, nothing was "
                              f"loaded ({'; '.join(parts)})")


def check_dcp_shapes(where: Path, loaded: Mapping[str, Any]) -> None:
    """The DCP form of :func:`check_shapes`: the model tensors of ``loaded`` (from
    :func:`~slurm_spot.checkpoint.trainstate.dcp_state_dict`) against the sizes recorded in the
    DCP checkpoint directory ``where`` (its ``.metadata``). Reads only the metadata.

    Raises:
        CheckpointError: a model tensor missing in the checkpoint or of another shape.
        OSError: the metadata cannot be read.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved = FileSystemReader(str(where)).read_metadata().state_dict_metadata
    wrong = []
    for key, tensor in loaded.get("model", {}).items():
        meta = saved.get(f"model.{key}")
        if meta is None:
            wrong.append(f"{key}: missing in checkpoint")
        elif isinstance(meta, TensorStorageMetadata) and isinstance(tensor, torch.Tensor) \
                and tuple(meta.size) != tuple(tensor.shape):
            wrong.append(f"{key}: checkpoint {tuple(meta.size)}, model {tuple(tensor.shape)}")
    if wrong:
        raise CheckpointError(f"{where}: the checkpoint does not fit this model, nothing was "
                              f"loaded ({'; '.join(wrong[:5])})")


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file does not match its manifest (size or sha256): damaged since it was
    written, so restore tries an older one (a plain :class:`CheckpointError` from loading is
    final)."""


def own_tensors(value: Any) -> Any:
    """``value`` with every tensor cloned into memory of its own (out of a memory-mapped
    checkpoint file, which must not stay mapped once restore returns). Dicts (of their own
    type), lists and plain tuples are walked; named tuples and other values are returned as
    they are. Raises nothing but what ``Tensor.clone`` raises (out of memory)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return type(value)((k, own_tensors(v)) for k, v in value.items())
    if isinstance(value, list):
        return [own_tensors(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(own_tensors(v) for v in value)
    return value


def load_payload(path: Path, expected: Mapping[str, Any] | None = None, *,
                 mmap: bool = True) -> dict[str, Any]:
    """Load a slurm-spot payload file (``state.pt`` or ``meta.pt``) onto the CPU with
    ``torch.load(weights_only=True)``. With ``expected`` (its manifest entry, ``{"size": bytes,
    "sha256": hex}``) the file is
    first hashed through a memory map (:func:`~slurm_spot.checkpoint.hashing.mapped_digest`);
    ``torch.load(mmap=True)`` then maps the same page-cache pages, so the file is read from
    the disk once. Tensors of the result live in that map until copied (:func:`own_tensors`).

    Raises:
        CorruptCheckpoint: size or sha256 differ from ``expected``.
        CheckpointError: not loadable with ``weights_only=True``, or not a slurm-spot payload.
    """
    if expected is not None:
        size, sha = mapped_digest(path)
        if size != expected.get("size"):
            raise CorruptCheckpoint(f"{path}: {size} bytes, the manifest says {expected.get('size')}")
        if sha != expected.get("sha256"):
            raise CorruptCheckpoint(f"{path}: sha256 does not match the manifest (damaged since it "
                           "was written)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises UnpicklingError/RuntimeError for refused types
        raise CheckpointError(
            f"{path}: cannot load with weights_only=True ({exc}); keep TrainState.extra to "
            "plain Python values and tensors"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        keys = sorted(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(
            f"{path}: a valid archive but not a slurm-spot checkpoint (holds {keys}); "
            "load it with the code that wrote it"
        )
    return payload
