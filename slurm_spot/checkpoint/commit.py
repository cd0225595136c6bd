"""The commit protocol of a checkpoint directory on a POSIX file system (layout in
:mod:`slurm_spot.checkpoint.files`): write the data files into a temporary directory, fsync
them, write ``manifest.json`` (itself through a temporary name) as the last file, fsync the
directory, rename it to ``step_<9 digits>`` and fsync the parent. The rename is the commit
point. Retention (:func:`prune`) deletes the manifest first, so a half-deleted directory is
never taken for a valid one. No torch here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from slurm_spot.checkpoint.files import (
    FORMAT,
    MANIFEST_NAME,
    TEMP_DIR_RE,
    CheckpointError,
    file_digest,
    known_digest,
    list_candidates,
    step_dir_name,
    validate,
)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a file's data (for files written by code that did not fsync them itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_temp_dir(directory: str | os.PathLike[str], step: int) -> Path:
    """Create (and return) ``<directory>/step_<N>.tmp-<random>/``; creates ``directory`` too."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{step_dir_name(step)}.tmp-{secrets.token_hex(4)}"
    path.mkdir()
    return path


def build_manifest(
    step: int, kind: Literal["torch", "dcp"], world_size: int, meta: dict[str, Any] | None,
    files: dict[str, dict[str, Any]], started_s: float | None = None,
) -> dict[str, Any]:
    """The manifest of a checkpoint (every store writes this, see :func:`write_manifest`):
    format, step, kind, world size, ``created_unix_s``, ``meta``, ``files``, ``size_bytes``
    (their total, bytes) and, with ``started_s`` (a :func:`time.monotonic` reading from when
    the save began), ``save_s`` (seconds until now). The one place that records a save's
    duration and size."""
    manifest: dict[str, Any] = {
        "format": FORMAT, "step": step, "kind": kind, "world_size": world_size,
        "created_unix_s": round(time.time(), 3), "meta": meta or {}, "files": files,
        "size_bytes": sum(int(f["size"]) for f in files.values()),
    }
    if started_s is not None:
        manifest["save_s"] = round(max(0.0, time.monotonic() - started_s), 3)
    return manifest


def write_manifest(
    temp_dir: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
    meta: dict[str, Any] | None = None, started_s: float | None = None,
    known: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """fsync every file under ``temp_dir``, then write its manifest as the last file.

    ``known`` holds entries (``{relative path: {"size", "sha256"}}``) that the writer computed
    while writing the file (:class:`~slurm_spot.checkpoint.hashing.HashingWriter`): such a file
    is not read again, only its size is compared with the file's (a mismatch means the entry is
    stale, and the file is hashed). Files not in ``known`` (DCP shards) are read and hashed.

    The manifest records format, step, kind, world size, ``created_unix_s`` (seconds since the
    epoch), optional ``meta`` (must be JSON-serialisable), ``files``: ``{relative path:
    {"size": bytes, "sha256": hex}}``, ``size_bytes`` (their total) and, when ``started_s`` (a
    :func:`time.monotonic` reading taken when the save began) is given, ``save_s``: seconds
    from then until the manifest is written (state gathering, serialisation, fsync, hashing).
    The node-side watcher reads ``save_s`` to know how long before an interruption deadline a
    job must be signalled (:func:`save_costs`). Returns the manifest.

    Raises:
        CheckpointError: ``temp_dir`` holds no data file or a symlink.
    """
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(temp_dir.rglob("*")):
        if path.is_symlink():
            raise CheckpointError(f"{path}: symlinks are not allowed in a checkpoint")
        if not path.is_file() or path.name.startswith(MANIFEST_NAME):
            continue
        fsync_file(path)
        rel = path.relative_to(temp_dir).as_posix()
        size, sha = known_digest(path, (known or {}).get(rel)) or file_digest(path)
        files[rel] = {"size": size, "sha256": sha}
    if not files:
        raise CheckpointError(f"{temp_dir}: nothing to commit")
    manifest = build_manifest(step, kind, world_size, meta, files, started_s)
    partial = temp_dir / f"{MANIFEST_NAME}.tmp"
    with open(partial, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, temp_dir / MANIFEST_NAME)
    fsync_dir(temp_dir)
    return manifest


def commit(temp_dir: Path, step: int) -> Path:
    """Rename a finished ``temp_dir`` to ``step_<N>`` beside it and fsync the parent.

    Raises:
        CheckpointError: ``step_<N>`` already exists (a committed checkpoint is never replaced).
    """
    final = temp_dir.parent / step_dir_name(step)
    if os.path.lexists(final):
        raise CheckpointError(f"{final} already exists; a checkpoint is never overwritten")
    os.rename(temp_dir, final)
    fsync_dir(temp_dir.parent)
    return final


def remove_checkpoint_dir(path: Path) -> None:
    """Delete a ``step_N`` or temp directory: the manifest goes first, so a half-deleted
    directory is never mistaken for a valid one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path / MANIFEST_NAME)
        fsync_dir(path)
    shutil.rmtree(path, ignore_errors=True)


def prune(directory: str | os.PathLike[str], keep: int, newest: Path) -> list[Path]:
    """After ``newest`` was committed: keep the ``keep`` newest valid ``step_N`` directories
    (always including ``newest``), delete older ``step_N`` directories and stale temp
    directories. Single files and anything newer than ``newest`` are left alone.

    Returns the deleted paths.

    Raises:
        ValueError: ``keep`` < 1.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(directory)
    newest_step = int(newest.name.removeprefix("step_"))
    ours = [c for c in list_candidates(root) if c.kind == "dir" and c.step <= newest_step]
    kept = [newest]
    for cand in ours:
        if len(kept) >= keep:
            break
        if cand.path != newest and not validate(cand, verify_checksums=False):
            kept.append(cand.path)
    removed = [c.path for c in ours if c.path not in kept]
    removed += [root / e.name for e in os.scandir(root)
                if TEMP_DIR_RE.match(e.name) and e.is_dir(follow_symlinks=False)]
    for path in removed:
        remove_checkpoint_dir(path)
    if removed:
        fsync_dir(root)
    return removed
