"""The asynchronous side of a save: :class:`SaveHandle` (a save that may still be running),
the long-lived :class:`WriterThread` that runs a checkpointer's saves one at a time, the
:class:`SaveJob` handed to it, and the hashed, fsynced write of one payload file
(:func:`write_payload_file`). What a save does once written: :mod:`slurm_spot.checkpoint.saving`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, cast

import torch

from slurm_spot.checkpoint.files import CheckpointError
from slurm_spot.checkpoint.hashing import HashingWriter
from slurm_spot.checkpoint.snapshot import PendingCopies
from slurm_spot.contract.location import as_location

if TYPE_CHECKING:
    from slurm_spot.checkpoint.checkpointer import Checkpointer

log = logging.getLogger(__name__)


class SaveHandle:
    """A save that may still be running (from :meth:`Checkpointer.save_async`).

    Attributes:
        step: the step being saved.
        location: the store's location (for messages).
        save_s: seconds from the call until it committed or failed (None while running).
    """

    def __init__(self, step: int, location: str, default_timeout_s: float,
                 owner: object = None) -> None:
        self.step = step
        # The checkpointer, kept alive until the save finished: its writer thread ends when
        # the checkpointer is collected, so ``Checkpointer(d).save_async(s).wait()`` with no
        # other reference to it would otherwise wait out the whole timeout.
        self._owner = owner
        self.location = location
        self._default_timeout_s = default_timeout_s
        self._finished = threading.Event()
        self._result: str | None = None
        self._error: str | None = None
        self.save_s: float | None = None

    def finish(self, result: str | None, error: str | None, save_s: float) -> None:
        """Record the outcome, once, and wake every :meth:`wait`: ``result`` is where the
        checkpoint is (a committed or skipped step), else ``error`` says why it failed;
        ``save_s`` is the save's duration in seconds. Called by the checkpointer's writer
        (:func:`~slurm_spot.checkpoint.saving.run_save`), not by training code."""
        self._result, self._error, self.save_s = result, error, save_s
        self._owner = None
        self._finished.set()

    def done(self) -> bool:
        """True once the save committed or failed (never blocks)."""
        return self._finished.is_set()

    def wait(self, timeout_s: float | None = None) -> Path | str:
        """Wait for the save to commit on every rank; returns where it is (a directory, or an
        ``s3://`` URL).

        Args:
            timeout_s: seconds to wait (default: the checkpointer's ``writer_timeout_s``).

        Raises:
            CheckpointError: the writer did not finish within ``timeout_s`` (the message names
                the checkpoint), or the save failed on some rank (nothing was committed).
        """
        limit = self._default_timeout_s if timeout_s is None else timeout_s
        if not self._finished.wait(max(0.0, limit)):
            raise CheckpointError(
                f"checkpoint of step {self.step} to {self.location}: the writer did not "
                f"finish within {limit:g} s (hung or dead writer; the checkpoint does "
                "not count)")
        if self._error is not None:
            raise CheckpointError(self._error)
        assert self._result is not None
        return as_location(self._result)


class WriterThread:
    """One long-lived writer thread per checkpointer: handing a save over is a queue put, not
    a thread start (starting a thread cost milliseconds of the stall on a busy machine). It
    ends when its checkpointer is garbage-collected (it holds only a weak reference).

    Args:
        owner: the checkpointer whose saves it runs.
        run: runs one save, ``run(owner, job, handle)``
            (:func:`~slurm_spot.checkpoint.saving.run_save`); whatever it raises fails that
            save's handle (logged once at ERROR), and the thread goes on with the next.
    """

    def __init__(self, owner: Checkpointer,
                 run: Callable[[Checkpointer, SaveJob, SaveHandle], None]) -> None:
        self._save = run
        self._queue: queue.SimpleQueue[tuple[SaveJob, SaveHandle] | None] = queue.SimpleQueue()
        ref = weakref.ref(owner)
        self._thread = threading.Thread(target=self._run, args=(ref,), daemon=True,
                                        name="slurm-spot-checkpoint-writer")
        self._thread.start()
        weakref.finalize(owner, self._queue.put, None)

    def _run(self, ref: weakref.ref[Checkpointer]) -> None:
        while (item := self._queue.get()) is not None:
            job, handle = item
            owner = ref()
            if owner is None:
                return
            try:
                self._save(owner, job, handle)
            except BaseException as exc:  # a failed collective or a bug: the save failed
                error = (f"checkpoint of step {job.step} to {handle.location} failed: "
                         f"{type(exc).__name__}: {exc}")
                log.error("%s", error)  # the one report of this failure in the log
                handle.finish(None, error, time.monotonic() - job.started_s)
            del owner, job, handle, item

    def submit(self, job: SaveJob, handle: SaveHandle) -> None:
        """Queue ``job``; the thread runs it after the saves queued before it."""
        self._queue.put((job, handle))


@dataclass
class SaveJob:
    """One save between its snapshot (main thread) and its commit (writer).

    Attributes:
        step: the step saved.
        token: the store's name for this save (from ``CheckpointStore.stage``; "" until then).
        kind: ``torch`` (one ``state.pt``) or ``dcp`` (shards plus ``meta.pt``).
        payload: what rank 0 writes (:func:`~slurm_spot.checkpoint.trainstate.build_payload`,
            snapshotted); None on other ranks.
        dcp_state: the sharded state for ``dcp.save`` (snapshotted), None for ``torch``.
        meta: the manifest's extra fields (epoch, Slurm job id, restart count, async).
        world: the number of ranks that save.
        rank: this rank.
        started_s: ``time.monotonic()`` when the save was called (its ``save_s`` counts from
            here).
        rank_state: this rank's RNG and generator states
            (:func:`~slurm_spot.checkpoint.trainstate.capture_rank_state`).
        pending: a deferred snapshot's copies still to run, or None.
    """

    step: int
    token: str
    kind: Literal["torch", "dcp"]
    payload: dict[str, Any] | None
    dcp_state: dict[str, Any] | None
    meta: dict[str, Any]
    world: int
    rank: int
    started_s: float
    rank_state: dict[str, Any]
    pending: PendingCopies | None = None


def write_payload_file(path: Path, payload: Any) -> dict[str, Any]:
    """``torch.save`` ``payload`` into ``path`` and fsync it; returns its manifest entry
    ``{"size": bytes, "sha256": hex}``, hashed while it was written (the file is not read
    back).

    Raises:
        OSError: the write or fsync failed (a full disk: ENOSPC).
        Exception: what ``torch.save`` raises for a payload it cannot pickle.
    """
    with open(path, "wb") as fh, HashingWriter(fh) as writer:
        torch.save(payload, cast(IO[bytes], writer))  # a write-only file object
        fh.flush()
        os.fsync(fh.fileno())
    return writer.digest()
