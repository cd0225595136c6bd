"""Checkpoint and resume for torch training code, exact across spot interruptions.

Imported by training code only (it imports torch; ``import slurm_spot`` does not)::

    state = TrainState(model, optimizer, scheduler)
    ckpt = Checkpointer(os.environ["SLURM_SPOT_CHECKPOINT_DIR"], keep=2)
    ckpt.restore(state)                # newest valid checkpoint, or nothing on a first run
    while state.step < total:
        ...one step...; state.step += 1
        if state.step % every == 0 or preemption.should_stop():
            ckpt.save(state)

What is saved: model, optimizer and LR scheduler state, ``step``, ``epoch``,
``batch_in_epoch`` (the data-order position), a user ``extra`` dict, and per rank every RNG
state (python ``random``, numpy's global generator, torch CPU, every CUDA device) plus the
named ``torch.Generator`` objects in ``TrainState.generators``. On CPU a run that is interrupted
and resumed ends with the same weights, bit for bit, as one that was not, provided that:

- restore is called after everything that consumes randomness while being built (model
  init, data loaders) and before the first step, as in a fresh run;
- data order is a function of (seed, epoch) - ``DistributedSampler`` with ``set_epoch`` - and
  the loop skips ``batch_in_epoch`` batches of the current epoch on resume
  (:class:`SkipSampler`);
- the DataLoader has its own ``generator=``: creating its iterator otherwise draws from
  torch's global RNG, which a resumed run would draw once more than an uninterrupted one.

Where the checkpoints live is a :class:`~slurm_spot.checkpoint.store.CheckpointStore`: a
directory gives the local POSIX store (:class:`~slurm_spot.checkpoint.store.LocalStore`, layout
in :mod:`slurm_spot.checkpoint.files`). Two ways to write, one staging directory:

- non-sharded (plain or DDP models): rank 0 alone writes ``state.pt`` with ``torch.save``,
  the other ranks wait for the commit; RNG states of all ranks are gathered to rank 0 first;
- sharded (FSDP / DTensor parameters, or ``sharded=True``): every rank writes its shards with
  ``torch.distributed.checkpoint`` (DCP) into the same temporary directory; rank 0 adds
  ``meta.pt`` (step, scheduler, RNG, ...) and commits. The staging directory must be on a
  file system all ranks share.

Loading uses ``torch.load(weights_only=True)``, so ``extra`` must hold plain Python values and
tensors; :func:`check_restorable` refuses anything else at save time, naming the key.

Asynchronous saves (POSIX or ``s3://`` roots)::

    handle = ckpt.save_async(state)        # blocks only for the snapshot (a copy of tensors)
    ...training continues...
    if preemption.should_stop():
        preemption.checkpoint_and_exit(ckpt, state)   # in-flight save commits, final save

The snapshot is eager by default (every tensor copied before ``save_async`` returns); with
``Checkpointer(..., snapshot="deferred")`` parameters and optimizer state are copied by the
writer while the next forward/backward runs and the next ``optimizer.step()`` waits for it
(conditions in :mod:`slurm_spot.checkpoint.snapshot`). Checksums are computed while the file is
written and verified while it is loaded: no file is read twice (BENCHMARKS.md, "Checkpoints").

At most one save is in flight; it counts once every rank's part succeeded (agreed on the
save's own gloo group). Restore refuses to start from step 0 when checkpoints exist but none
is valid (``start_fresh_if_invalid``), checks shapes before loading anything, and takes a
``resume_from`` directory on the first run only.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
import weakref
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from slurm_spot.checkpoint.collectives import SaveGroup
from slurm_spot.checkpoint.files import (
    META_FILE,
    STATE_FILE,
    Checkpoint,
    CheckpointError,
    find_latest_valid,
)
from slurm_spot.checkpoint.restoring import (
    apply_payload,
    check_none_valid,
    explicit_checkpoint,
    read_checkpoint,
    resolve,
)
from slurm_spot.checkpoint.saving import run_save
from slurm_spot.checkpoint.snapshot import PendingCopies, Snapshotter, step_tensors, wait_for
from slurm_spot.checkpoint.store import CheckpointStore, open_store
from slurm_spot.checkpoint.trainstate import (
    SkipSampler,
    TrainState,
    build_payload,
    capture_rank_state,
    capture_rng_state,
    check_restorable,
    counters_of,
    dcp_state_dict,
    is_sharded,
    restore_rng_state,
    unwrap_model,
)
from slurm_spot.checkpoint.writer import SaveHandle, SaveJob, WriterThread
from slurm_spot.contract.location import Location, as_location
from slurm_spot.contract.names import ENV_START_FRESH_IF_INVALID

__all__ = [
    "META_FILE", "STATE_FILE", "Checkpoint", "CheckpointError", "Checkpointer", "SkipSampler",
    "TrainState", "capture_rng_state", "find_latest_valid", "restore_rng_state",
]

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores :class:`TrainState` in one job's checkpoint store.

    Every method must be called by all ranks together when torch.distributed is initialised.
    The save's collectives (state gathering, the plan, the agreement on success) run on a
    process group of their own (gloo, created on the first call), never on the training loop's
    group, so an asynchronous save in a writer thread cannot interleave with the trainer's
    collectives (field case async-dcp-deadlock).

    Args:
        directory: the job's checkpoint directory (created on the first save), an
            ``s3://bucket/prefix`` URL (:class:`~slurm_spot.checkpoint.s3.S3Store`), or a
            :class:`~slurm_spot.checkpoint.store.CheckpointStore`.
        keep: how many valid checkpoints to keep (>= 1); older ones are deleted after a new
            one is committed.
        process_group: the ranks to coordinate (default: the world); the save group spans
            the same ranks.
        verify_checksums: hash files when resolving the newest checkpoint (slower, safer).
        writer_timeout_s: longest wait (seconds) on a writer and on a save collective; a hung
            writer raises :class:`CheckpointError` naming the checkpoint instead of hanging.
        start_fresh_if_invalid: when checkpoints exist but none is valid, start from step 0
            logged at ERROR instead of raising (default False; env
            ``SLURM_SPOT_START_FRESH_IF_INVALID=1`` sets it too).
        snapshot: how :meth:`save_async` copies the state (:mod:`~slurm_spot.checkpoint.snapshot`):
            ``eager`` copies every tensor before it returns; ``deferred`` copies the
            parameters and optimizer state in the writer thread while the next forward and
            backward run, and the next ``optimizer.step()`` waits for that copy (needs
            ``TrainState.optimizer``; plain, non-sharded saves; parameters changed outside
            ``optimizer.step()`` in between fail the save, through ``.data`` go unnoticed).

    Attributes:
        store: where the checkpoints are (the store ``directory`` opened, or the one given).
        directory: the store's location (a :class:`~pathlib.Path`, or an ``s3://`` URL
            string).
        ranks: the save's collectives (:class:`~slurm_spot.checkpoint.collectives.SaveGroup`).
        last_save_s: seconds the last committed save took (None before the first).
        last_snapshot_wait_s: seconds the last deferred snapshot held up ``optimizer.step()``
            (or another call of this checkpointer); 0.0 when it was done in time.

    Raises:
        TypeError: ``keep`` is not an int (``"2"``, ``2.0``, ``True``), ``writer_timeout_s``
            not a number.
        ValueError: ``keep`` < 1, ``writer_timeout_s`` <= 0 (or NaN), an unknown ``snapshot``.
        CheckpointError: ``directory`` is empty, or exists and is not a directory
            (:class:`~slurm_spot.checkpoint.store.LocalStore`); a malformed ``s3://`` URL.
    """

    def __init__(self, directory: str | os.PathLike[str] | CheckpointStore, keep: int = 2, *,
                 process_group: Any = None, verify_checksums: bool = True,
                 writer_timeout_s: float = 1800.0,
                 start_fresh_if_invalid: bool | None = None,
                 snapshot: Literal["eager", "deferred"] = "eager") -> None:
        given: Any = keep  # typed int, but callers pass what they read from a config
        if isinstance(given, bool) or not isinstance(given, numbers.Integral):
            raise TypeError(f"keep must be an int >= 1 (how many checkpoints to keep), got "
                            f"{given!r} ({type(given).__name__})")
        keep = int(given)
        if keep < 1:
            raise ValueError(f"keep must be an int >= 1 (how many checkpoints to keep), got "
                             f"{keep}")
        if snapshot not in ("eager", "deferred"):
            raise ValueError(f"snapshot must be 'eager' or 'deferred', got {snapshot!r}")
        given = writer_timeout_s
        if isinstance(given, bool) or not isinstance(given, numbers.Real):
            raise TypeError(f"writer_timeout_s must be a number of seconds > 0, got "
                            f"{given!r} ({type(given).__name__})")
        if not writer_timeout_s > 0:
            raise ValueError(f"writer_timeout_s must be > 0, got {writer_timeout_s}")
        if isinstance(directory, (str, os.PathLike)):
            self.store: CheckpointStore = open_store(directory)
        else:
            self.store = directory
        self.directory: Location = as_location(self.store.location)
        self.keep = keep
        self.group = process_group
        self.ranks = SaveGroup(process_group, writer_timeout_s)
        self.verify_checksums = verify_checksums
        self.writer_timeout_s = writer_timeout_s
        if start_fresh_if_invalid is None:
            start_fresh_if_invalid = os.environ.get(
                ENV_START_FRESH_IF_INVALID, "").strip().lower() in ("1", "true", "yes")
        self.start_fresh_if_invalid = start_fresh_if_invalid
        self._inflight: SaveHandle | None = None
        self._writer: WriterThread | None = None
        self.snapshot = snapshot
        # host buffers of the last snapshot, reused once its writer is done
        self._snapshots = {"torch": Snapshotter(), "dcp": Snapshotter()}
        self._pending: PendingCopies | None = None  # a deferred snapshot still copying
        self._hooked: dict[int, Any] = {}  # optimizer id -> its step pre-hook's handle
        self.last_snapshot_wait_s = 0.0
        self.last_save_s: float | None = None

    # -- resolving ----------------------------------------------------------------------------
    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint (resolved on rank 0, shared with all ranks). Writes
        nothing in the store."""
        return resolve(self.ranks, self.store, self.verify_checksums)

    # -- saving -------------------------------------------------------------------------------
    def save(self, state: TrainState, *, sharded: bool | None = None) -> Path | str:
        """Commit a checkpoint of ``state`` as ``step_<state.step>`` and prune old ones; returns
        when it is committed (waits for an asynchronous save in flight first).

        The manifest records how long this save took (``save_s``, seconds, from this call until
        the manifest is written) and its size (``size_bytes``): the node-side watcher reads them
        to signal the job early enough before an interruption deadline.

        Args:
            state: what to save.
            sharded: force DCP (True) or plain torch.save (False); None: DCP if
                :func:`is_sharded`.

        Returns:
            The committed checkpoint (a directory, or an ``s3://`` URL string). If a valid
            checkpoint of this step already exists it is left as it is (never overwritten) and
            its location is returned, with a warning logged.

        Raises:
            CheckpointError: on every rank, when the state cannot be restored (names the key),
                ``step``/``epoch``/``batch_in_epoch`` is not a whole number >= 0, writing or
                uploading failed on any rank (nothing is committed, the staging is cleaned up;
                a full device is named as such), or a writer timed out.
        """
        return self._start(state, sharded, background=False).wait(self.writer_timeout_s)

    def save_async(self, state: TrainState, *, sharded: bool | None = None) -> SaveHandle:
        """Snapshot ``state`` (tensors copied, so training may change it at once) and write,
        upload and commit it in a writer thread; returns at once after the snapshot.

        At most one save is in flight: a previous one is waited for first (up to
        ``writer_timeout_s``). The writer is a thread, not a forked process, and owns its
        copies, so it never reads memory the trainer reuses (field case
        async-pinned-memory-fork). The checkpoint counts once :meth:`SaveHandle.wait` returns:
        every rank's part succeeded (agreed on the save group).

        Raises:
            CheckpointError: as :meth:`save` for what fails before the hand-off (unrestorable
                state, a previous save still running after ``writer_timeout_s``). A failure
                of the save itself is logged once at ERROR by its writer and raised by
                :meth:`SaveHandle.wait` / :meth:`wait` to code that waits on it; the next
                save does not raise it again and writes its own checkpoint.
        """
        return self._start(state, sharded, background=True)

    def wait(self, timeout_s: float | None = None) -> Path | str | None:
        """Wait for the save in flight (if any) to commit; returns where it is, or None.

        Raises:
            CheckpointError: it failed, or did not finish within ``timeout_s`` (default
                ``writer_timeout_s``); the message names the checkpoint.
        """
        handle, self._inflight = self._inflight, None
        if handle is None:
            return None
        try:
            return handle.wait(timeout_s)
        except CheckpointError:
            if not handle.done():
                self._inflight = handle  # still running: never start a second writer
            raise

    def save_final(self, state: TrainState, within_s: float, *,
                   sharded: bool | None = None) -> Path | str:
        """On a preemption: wait (at most ``within_s`` seconds, the notice left) for the save in
        flight to commit, then save ``state`` synchronously.

        A failed or late in-flight save is logged and the final save still attempted (the
        previous committed checkpoint remains if that fails too).

        Raises:
            CheckpointError: the final save failed.
        """
        try:
            self.wait(max(0.0, within_s))
        except CheckpointError as exc:
            if self._inflight is not None:  # its writer still runs: never start a second one
                log.error("in-flight checkpoint did not commit before the final save: %s", exc)
                raise
            # it failed, and its writer logged that once: the final save goes on
        # a committed checkpoint of this very step is reported as skipped, not rewritten
        return self.save(state, sharded=sharded)

    def _settle_previous(self) -> None:
        """Before a new save: wait for the one in flight. If it failed, its writer logged the
        failure once at ERROR (:func:`~slurm_spot.checkpoint.saving.run_save`) and this save
        goes on to write its own checkpoint; the old error is not raised again
        (``SaveHandle.wait`` still raises it to code that waits on that save).

        Raises:
            CheckpointError: the save in flight did not finish within ``writer_timeout_s``
                (it still runs: a second writer is never started).
        """
        try:
            self.wait()
        except CheckpointError:
            if self._inflight is not None:
                raise

    def _start(self, state: TrainState, sharded: bool | None, background: bool) -> SaveHandle:
        started_s = time.monotonic()
        if self._inflight is not None:
            self._settle_previous()
        rank, world = self.ranks.rank_world()
        problem, counters = "", (0, 0, 0)
        try:
            counters = counters_of(state)
            check_restorable(state.extra)
        except CheckpointError as exc:
            problem = f"step {state.step!r}: {exc}"
        problem = self.ranks.agree(problem)
        if problem:
            raise CheckpointError(f"refusing to save to {self.store.location}: {problem}")
        step, epoch, batch_in_epoch = counters
        use_dcp = is_sharded(state.model) if sharded is None else sharded
        kind: Literal["torch", "dcp"] = "dcp" if use_dcp else "torch"
        handle = SaveHandle(step, self.store.location, self.writer_timeout_s, owner=self)
        # per_rank is filled in by the writer, after gathering every rank's RNG state
        payload = build_payload(state, counters, [], world, kind) if rank == 0 else None
        dcp_state = dcp_state_dict(state) if use_dcp else None
        pending = None
        if background:  # the snapshot: copies the trainer can no longer change
            defer = (step_tensors(unwrap_model(state.model), state.optimizer)
                     if self.snapshot == "deferred" and kind == "torch"
                     and state.optimizer is not None else [])
            payload, pending = self._snapshots["torch"].take(payload, step, defer)
            dcp_state, _ = self._snapshots["dcp"].take(dcp_state, step)
            if pending is not None and state.optimizer is not None:
                self._hook(state.optimizer)
                self._pending = pending
        meta = {"epoch": epoch, "batch_in_epoch": batch_in_epoch,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT", ""),
                "async": background}
        job = SaveJob(step, "", kind, payload, dcp_state, meta, world, rank, started_s,
                      capture_rank_state(state), pending)
        if not background:
            run_save(self, job, handle)
            return handle
        if self._writer is None:
            self._writer = WriterThread(self, run_save)
        self._inflight = handle
        self._writer.submit(job, handle)
        return handle

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer.step()`` wait for a deferred snapshot (registered once per
        optimizer; a no-op call when nothing is pending)."""
        if id(optimizer) in self._hooked:
            return
        me = weakref.ref(self)

        def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            ckpt = me()
            if ckpt is not None:
                ckpt._wait_snapshot(f"{type(opt).__name__}.step()")

        self._hooked[id(optimizer)] = optimizer.register_step_pre_hook(before_step)

    def _wait_snapshot(self, what: str) -> None:
        """Block until the deferred snapshot in flight (if any) copied its tensors.

        Raises:
            CheckpointError: not within ``writer_timeout_s`` (names the step).
        """
        pending = self._pending
        if pending is None:
            return
        try:
            self.last_snapshot_wait_s = wait_for(pending, self.writer_timeout_s, what)
        except TimeoutError as exc:
            raise CheckpointError(str(exc)) from None
        self._pending = None

    # -- restoring ----------------------------------------------------------------------------
    def restore(self, state: TrainState, *, checkpoint: Checkpoint | None = None,
                resume_from: str | os.PathLike[str] | None = None,
                restore_rng: bool = True) -> Checkpoint | None:
        """Load the newest valid checkpoint (or ``checkpoint``) into ``state`` in place.

        Each file is read once: the newest checkpoint whose manifest and file sizes are right
        is chosen, and the sha256 of its data file is verified while it is loaded (hashed
        through a memory map that ``torch.load(mmap=True)`` then loads from; ``verify_checksums``
        off skips the hash). Only if that fails (on any rank) is every older candidate hashed
        before it is used, the newest that verifies is loaded and a warning names the corrupt
        one. Nothing in ``state`` changes before its checkpoint verified.

        Args:
            checkpoint: load this one (skips resolving; a corrupt one raises).
            resume_from: a checkpoint directory given on the command line: used on the first
                run (``SLURM_RESTART_COUNT`` 0 or unset); after a requeue the newest valid
                checkpoint of the store wins (the job's own progress). A log line says which.

        Returns:
            The checkpoint used, or None when there is none (``state`` is untouched).

        Raises:
            CheckpointError: checkpoints exist but none is valid (unless
                ``start_fresh_if_invalid``); the checkpoint holds a model of another shape
                (raised before any tensor is changed); it is not a slurm-spot one or holds
                types that ``weights_only`` loading refuses; an explicit ``checkpoint`` or
                ``resume_from`` does not verify.
        """
        self._wait_snapshot("restore")  # never overwrite what a snapshot still copies
        found, explicit = checkpoint, checkpoint is not None
        if found is None and resume_from is not None:
            from slurm_spot.contract.jobenv import restart_count

            restarts = restart_count(os.environ)
            if restarts == 0:
                found, explicit = explicit_checkpoint(self.ranks, Path(resume_from)), True
                log.info("resuming from %s (given on the command line; first run)", found.path)
            else:
                log.info("restart %d: resuming from the newest valid checkpoint in %s, not "
                         "from %s given on the command line", restarts, self.store.location,
                         resume_from)
        if found is None:
            found = resolve(self.ranks, self.store, False)  # sha256 below, while loading
        while True:
            if found is None:
                check_none_valid(self.ranks, self.store, self.start_fresh_if_invalid)
                return None
            found, payload, problem, corrupt = read_checkpoint(self.ranks, self.store, found,
                                                               self.verify_checksums)
            if not problem:
                break
            if explicit or not corrupt:
                raise CheckpointError(problem)
            log.warning("checkpoint of step %d in %s is not usable, trying an older one: %s",
                        found.step, self.store.location, problem)
            explicit = True  # hash every older candidate first: a second failure is final
            found = resolve(self.ranks, self.store, self.verify_checksums)
        log.info("resuming from step %d at %s", found.step, found.path)
        apply_payload(state, found, payload, self.ranks, restore_rng)
        del payload
        if self.ranks.active():
            # every rank has read it (ranks may share a copy)
            dist.barrier(group=self.ranks.group())
        self.store.release(found)
        return found
