"""Writing one save: what the checkpointer's writer does between a snapshot and a committed
(or failed) checkpoint, on every rank.

The steps, each agreed on the save's own gloo group (:class:`~slurm_spot.checkpoint.
collectives.SaveGroup`): every rank's RNG state is gathered; rank 0 asks the store for a
staging plan (``write``, ``skip`` a committed step, or ``error``) and shares it; every rank
writes its files (``state.pt`` or ``meta.pt`` on rank 0, DCP shards on all) into its local
staging and uploads them; the ranks agree; rank 0 writes the manifest (the commit point) or
aborts, then applies retention; every rank learns the outcome. Protocol of the stores:
:mod:`slurm_spot.checkpoint.store`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from slurm_spot.checkpoint.diskerrors import describe_write_error
from slurm_spot.checkpoint.files import META_FILE, STATE_FILE, CheckpointError
from slurm_spot.checkpoint.s3 import CommitOutcomeUnknown
from slurm_spot.checkpoint.writer import SaveHandle, SaveJob, write_payload_file

if TYPE_CHECKING:
    from slurm_spot.checkpoint.checkpointer import Checkpointer

log = logging.getLogger(__name__)


def run_save(ckpt: Checkpointer, job: SaveJob, handle: SaveHandle) -> None:
    """Write, upload, agree, commit (rank 0), prune, then finish ``handle`` on every rank.

    Runs in the writer thread for an asynchronous save, in the caller's for a synchronous
    one; every collective is on ``ckpt.ranks`` (the save group), never the training group.
    On success ``ckpt.last_save_s`` is set to the save's duration (seconds since
    ``job.started_s``).

    Args:
        ckpt: the checkpointer (its ``store``, ``keep`` and ``ranks``).
        job: the save's snapshot (what to write) from :meth:`Checkpointer.save_async` or
            :meth:`Checkpointer.save`.
        handle: finished with the checkpoint's location, with the skipped step's location
            (a warning is logged), or with an error naming the checkpoint and every failing
            rank (logged once at ERROR here).

    Raises:
        Nothing of the save itself (a failure finishes ``handle``); a collective that fails
        (a rank gone past ``writer_timeout_s``) raises its RuntimeError, which the writer
        thread reports on ``handle``.
    """
    store, ranks = ckpt.store, ckpt.ranks
    where = f"checkpoint of step {job.step} to {store.location}"
    if job.pending is not None:
        job.pending.run()  # first: the next optimizer.step() waits for it
    # the gather and the plan run here, on the save group, so the stall is the snapshot
    per_rank = ranks.gather(job.rank_state)
    try:
        plan = store.stage(job.step) if job.rank == 0 else None
    except Exception as exc:
        plan = ("error", store.location, f"cannot prepare {where}: {exc}")
    plan = ranks.from_rank0(plan)
    if plan[0] != "write":
        if plan[0] == "skip":
            log.warning("%s", plan[2])
            handle.finish(plan[1], None, time.monotonic() - job.started_s)
        else:
            log.error("%s", plan[2])  # the one report of this failure in the log
            handle.finish(None, plan[2], time.monotonic() - job.started_s)
        return
    job.token = plan[1]
    if job.payload is not None:
        job.payload["per_rank"] = per_rank
    problem, staging = "", None
    try:
        if job.pending is not None and job.pending.error:
            raise CheckpointError(job.pending.error)
        staging = store.local_staging(job.token)
        if job.kind == "dcp":
            import torch.distributed.checkpoint as dcp

            dcp.save(job.dcp_state, checkpoint_id=staging, process_group=ranks.group())
        known: dict[str, dict[str, Any]] = {}
        if job.rank == 0:
            name = STATE_FILE if job.kind == "torch" else META_FILE
            known[name] = write_payload_file(staging / name, job.payload)
        files = store.upload(staging, job.token, known=known)
    except Exception as exc:  # disk full, upload error, pickling: every rank must hear it
        problem = describe_write_error(
            exc, staging.parent if staging is not None else store.location)
        files = {}
    gathered = ranks.gather((problem, files))
    problem = "; ".join(f"rank {r}: {p}" for r, (p, _f) in enumerate(gathered) if p)
    final, outcome = "", "nothing committed"
    if job.rank == 0:
        if not problem:
            merged: dict[str, dict[str, Any]] = {}
            for _p, f in gathered:
                merged.update(f)
            try:
                final = store.commit_manifest(job.token, job.kind, job.world, job.meta,
                                                   merged, job.started_s)
            except Exception as exc:
                problem = "rank 0: commit failed: " + describe_write_error(
                    exc, store.location)
                if isinstance(exc, CommitOutcomeUnknown):
                    outcome = "commit outcome unknown"
        if problem:
            store.abort(job.token)
        else:
            try:
                removed = store.prune(ckpt.keep, final)
                if removed:
                    log.info("pruned %s", ", ".join(removed))
            except Exception as exc:  # retention failing must not fail a committed save
                log.warning("retention in %s failed: %s", store.location, exc)
    if staging is not None:
        store.discard_staging(staging)
    problem, final, outcome = ranks.from_rank0((problem, final, outcome))
    save_s = time.monotonic() - job.started_s
    if problem:
        log.error("%s failed, %s: %s", where, outcome, problem)
        handle.finish(None, f"{where} failed, {outcome}: {problem}", save_s)
        return
    ckpt.last_save_s = save_s
    handle.finish(final, None, save_s)

