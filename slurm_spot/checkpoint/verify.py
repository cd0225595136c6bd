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


def _check_shapes(where: Path, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise before loading when ``saved`` does not fit the model (keys or shapes)."""
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


def _check_dcp_shapes(where: Path, loaded: Mapping[str, Any]) -> None:
    """The DCP form of :func:`_check_shapes`, from the checkpoint's ``.metadata``."""
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


class _Corrupt(CheckpointError):
    """A checkpoint file does not match its manifest (size or sha256): try an older one."""


def _own(value: Any) -> Any:
    """``value`` with every tensor cloned into memory of its own (out of a memory-mapped
    checkpoint file, which must not stay mapped once restore returns)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return type(value)((k, _own(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_own(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_own(v) for v in value)
    return value


def _load(path: Path, expected: Mapping[str, Any] | None = None, *,
          mmap: bool = True) -> dict[str, Any]:
    """Load a slurm-spot payload file. With ``expected`` (its manifest entry) the file is
    first hashed through a memory map (:func:`~slurm_spot.checkpoint.hashing.mapped_digest`);
    ``torch.load(mmap=True)`` then maps the same page-cache pages, so the file is read from
    the disk once. Tensors of the result live in that map until copied (:func:`_own`).

    Raises:
        _Corrupt: size or sha256 differ from ``expected``.
        CheckpointError: not loadable with ``weights_only=True``, or not a slurm-spot payload.
    """
    if expected is not None:
        size, sha = mapped_digest(path)
        if size != expected.get("size"):
            raise _Corrupt(f"{path}: {size} bytes, the manifest says {expected.get('size')}")
        if sha != expected.get("sha256"):
            raise _Corrupt(f"{path}: sha256 does not match the manifest (damaged since it "
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
