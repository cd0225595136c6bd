"""The checkpoint cost C that ``slurm-spot plan --checkpoint-dir`` takes from a job's own saves.

Every checkpoint the library commits records in its manifest how long the save took
(``save_s``, seconds, from the start of the save until the manifest was written) and how big it
is (``size_bytes``); :func:`slurm_spot.checkpoint.commit.build_manifest` writes them (inside
``meta`` for checkpoints of older code, which :func:`~slurm_spot.checkpoint.files.save_costs`
reads the same way). This module reads the manifests of every committed checkpoint of one job
directory, local (``<root>/<user>/<job key>``) or in any store a URL names (``s3://...``),
through the store's own listing (:meth:`~slurm_spot.checkpoint.store.CheckpointStore.committed`
of :func:`~slurm_spot.checkpoint.store.open_store`), and gives their median ``save_s``: one
slow save (a cold file system cache, a throttled upload) does not set the checkpoint interval
for the whole job. Nothing is written, no checksum is computed.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Any

from slurm_spot.errors import BadInputError, CheckpointError

#: ``save_s`` values outside [0, MAX_SAVE_S) are not believed (the manifest is the job's).
MAX_SAVE_S = 86400.0


@dataclass(frozen=True)
class RecordedSave:
    """One committed checkpoint's recorded save: its step, ``save_s`` (seconds) and
    ``size_bytes`` (None when not recorded)."""

    step: int
    save_s: float
    size_bytes: int | None


def _field(manifest: dict[str, Any], name: str) -> Any:
    meta = manifest.get("meta")
    value = manifest.get(name)
    return meta.get(name, value) if isinstance(meta, dict) else value


def _recorded(step: int, manifest: dict[str, Any]) -> RecordedSave | None:
    save_s, size = _field(manifest, "save_s"), _field(manifest, "size_bytes")
    if isinstance(save_s, bool) or not isinstance(save_s, int | float) \
            or not 0 <= save_s < MAX_SAVE_S:
        return None
    size_ok = isinstance(size, int) and not isinstance(size, bool) and size >= 0
    return RecordedSave(step, float(save_s), size if size_ok else None)


def recorded_saves(location: str | os.PathLike[str], settings: Any = None,
                   **store_options: Any) -> list[RecordedSave]:
    """The recorded saves of every committed checkpoint in ``location`` (a job's checkpoint
    directory, or a store's URL such as ``s3://bucket/prefix``), newest step first;
    checkpoints whose manifest has no plausible ``save_s`` are left out. ``store_options`` go
    to the store (:func:`~slurm_spot.checkpoint.store.open_store`; S3: ``endpoint_url``,
    ``addressing_style``); without them, ``settings`` (spot.yaml's ``checkpoint`` section,
    or None) gives the store its options
    (:func:`~slurm_spot.checkpoint.store.open_configured_store`).

    Raises:
        BadInputError: the directory does not exist, no store handles the URL, or the store
            cannot be read (the message names the location and the cause).
    """
    from slurm_spot.checkpoint.store import StoreNotFound, open_configured_store, open_store

    text = os.fspath(location)
    try:
        store = open_store(text, **store_options) if store_options \
            else open_configured_store(text, settings)
        committed = store.committed()
    except StoreNotFound:
        raise BadInputError(f"--checkpoint-dir {text}: no such directory") from None
    except CheckpointError as exc:  # its message starts with the location
        raise BadInputError(f"--checkpoint-dir {text}: {exc}") from None
    found = (_recorded(step, manifest) for step, manifest in committed)
    return [save for save in found if save is not None]


def median_save_s(location: str | os.PathLike[str], settings: Any = None,
                  **store_options: Any) -> tuple[float, list[RecordedSave]]:
    """The median ``save_s`` (seconds) of the checkpoints in ``location`` and the saves it
    is the median of (see :func:`recorded_saves`, which takes ``settings`` and
    ``store_options``).

    Raises:
        BadInputError: ``location`` cannot be read, or no checkpoint there records a save
            time (the message says what to do instead).
    """
    saves = recorded_saves(location, settings, **store_options)
    if not saves:
        raise BadInputError(
            f"--checkpoint-dir {os.fspath(location)}: no committed checkpoint there records "
            "its save time (save_s in step_N/manifest.json, written by slurm_spot.checkpoint); "
            "give --checkpoint-s instead")
    return statistics.median(s.save_s for s in saves), saves
