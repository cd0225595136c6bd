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
tensors.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from slurm_spot.checkpoint.files import (
    FORMAT,
    Checkpoint,
    CheckpointError,
    find_latest_valid,
)
from slurm_spot.checkpoint.store import CheckpointStore, LocalStore, StagePlan

__all__ = [
    "Checkpoint", "CheckpointError", "Checkpointer", "SkipSampler", "TrainState",
    "capture_rng_state", "find_latest_valid", "restore_rng_state",
]

log = logging.getLogger(__name__)
STATE_FILE = "state.pt"
META_FILE = "meta.pt"


@dataclass
class TrainState:
    """Everything a resumed run needs; :meth:`Checkpointer.restore` updates it in place.

    Attributes:
        model: the module (a DDP wrapper is unwrapped; FSDP goes through DCP).
        optimizer: its optimizer, or None.
        scheduler: an LR scheduler (anything with ``state_dict``/``load_state_dict``), or None.
        step: optimizer steps done so far.
        epoch: the current epoch (feed it to ``DistributedSampler.set_epoch``).
        batch_in_epoch: batches of ``epoch`` already consumed (skip them on resume).
        extra: user values (plain Python types and tensors) saved and restored as they are.
        generators: named ``torch.Generator`` objects whose states are saved per rank.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    generators: dict[str, torch.Generator] = field(default_factory=dict)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: ``python``, ``numpy`` (None without numpy), ``torch`` (a
    uint8 tensor) and ``cuda`` (one uint8 tensor per device, or None without CUDA)."""
    numpy_state: dict[str, Any] | None = None
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
        numpy_state = {"kind": str(kind), "keys": [int(k) for k in keys], "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)}
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"python": random.getstate(), "numpy": numpy_state,
            "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set this process's RNGs from :func:`capture_rng_state` output (missing parts are
    skipped; CUDA states only if CUDA is available here)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("numpy") is not None:
        import numpy as np

        ns = state["numpy"]
        np.random.set_state((ns["kind"], np.asarray(ns["keys"], dtype=np.uint32), ns["pos"],
                             ns["has_gauss"], ns["gauss"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class SkipSampler(Sampler[int]):
    """Wrap a sampler so that its next iteration skips the first ``skip`` indices (to resume
    mid-epoch); later iterations are complete. ``set_epoch`` is passed through.

    Args:
        base: the sampler (e.g. ``DistributedSampler``); its order must depend only on its
            seed and epoch.
    """

    def __init__(self, base: Sampler[int]) -> None:
        self.base = base
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Forward to ``base.set_epoch`` (if it has one)."""
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def skip(self, count: int) -> None:
        """Skip ``count`` indices (batches done x batch size) in the next iteration only."""
        self._skip = max(0, count)

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        for i, index in enumerate(self.base):
            if i >= skip:
                yield index

    def __len__(self) -> int:
        return max(0, len(self.base) - self._skip)  # type: ignore[arg-type]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def is_sharded(model: torch.nn.Module) -> bool:
    """True if ``model`` has DTensor parameters (FSDP2, tensor parallel) or is wrapped in
    FSDP1: those go through torch.distributed.checkpoint. Runs no collective."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return True
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - FSDP is part of every distributed build
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


class Checkpointer:
    """Saves and restores :class:`TrainState` in one job's checkpoint store.

    Every method must be called by all ranks together when torch.distributed is initialised.

    Args:
        directory: the job's checkpoint directory (created on the first save), or a
            :class:`~slurm_spot.checkpoint.store.CheckpointStore`.
        keep: how many valid checkpoints to keep (>= 1); older ones are deleted after a new
            one is committed.
        process_group: the group to coordinate over (default: the world).
        verify_checksums: hash files when resolving the newest checkpoint (slower, safer).
    """

    def __init__(self, directory: str | os.PathLike[str] | CheckpointStore, keep: int = 2, *,
                 process_group: Any = None, verify_checksums: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if isinstance(directory, (str, os.PathLike)):
            self.store: CheckpointStore = LocalStore(directory)
            self.directory = Path(directory)
        else:
            self.store = directory
            self.directory = Path(directory.location)
        self.keep = keep
        self.group = process_group
        self.verify_checksums = verify_checksums

    # -- collective plumbing -----------------------------------------------------------------
    def _dist(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _rank_world(self) -> tuple[int, int]:
        if not self._dist():
            return 0, 1
        return dist.get_rank(self.group), dist.get_world_size(self.group)

    def _from_rank0(self, value: Any) -> Any:
        if not self._dist():
            return value
        box = [value]
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def _gather(self, value: Any) -> list[Any]:
        if not self._dist():
            return [value]
        out: list[Any] = [None] * self._rank_world()[1]
        dist.all_gather_object(out, value, group=self.group)
        return out

    # -- resolving ----------------------------------------------------------------------------
    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint (resolved on rank 0, shared with all ranks). Writes
        nothing."""
        found = None
        if self._rank_world()[0] == 0:
            found = self.store.latest(self.verify_checksums)
        return self._from_rank0(found)

    # -- saving -------------------------------------------------------------------------------
    def save(self, state: TrainState, *, sharded: bool | None = None) -> Path:
        """Commit a checkpoint of ``state`` as ``step_<state.step>`` and prune old ones.

        Args:
            state: what to save.
            sharded: force DCP (True) or plain torch.save (False); None: DCP if
                :func:`is_sharded`.

        Returns:
            The committed directory. If a valid checkpoint of this step already exists it is
            left as it is (never overwritten) and its path is returned, with a warning logged.

        Raises:
            CheckpointError: on any rank, when writing failed on rank 0 (disk full, ...).
        """
        rank, world = self._rank_world()
        use_dcp = is_sharded(state.model) if sharded is None else sharded
        per_rank = self._gather(_rank_state(state))
        plan = self._from_rank0(self._plan(state.step) if rank == 0 else None)
        if plan[0] == "error":
            raise CheckpointError(plan[2])
        if plan[0] == "skip":
            log.warning("%s", plan[2])
            return Path(plan[1])
        temp = Path(plan[1])
        if use_dcp:
            import torch.distributed.checkpoint as dcp

            dcp.save(_dcp_state(state), checkpoint_id=temp, process_group=self.group)
        error, final = "", ""
        if rank == 0:
            try:
                final = self._write_rank0(state, temp, per_rank, world,
                                          "dcp" if use_dcp else "torch")
            except (OSError, RuntimeError, CheckpointError) as exc:
                error = f"saving step {state.step} into {temp} failed: {exc}"
                log.error("%s", error)
        error, final = self._from_rank0((error, final))
        if error:
            raise CheckpointError(error)
        return Path(final)

    def _plan(self, step: int) -> StagePlan:
        """Rank 0: the store's plan for ``step`` (``write`` into a new staging directory,
        ``skip`` or ``error``)."""
        return self.store.stage(step)

    def _write_rank0(self, state: TrainState, temp: Path, per_rank: list[Any], world: int,
                     kind: Literal["torch", "dcp"]) -> str:
        payload: dict[str, Any] = {
            "format": FORMAT, "step": state.step, "epoch": state.epoch,
            "batch_in_epoch": state.batch_in_epoch, "extra": state.extra,
            "world_size": world, "per_rank": per_rank,
            "scheduler": state.scheduler.state_dict() if state.scheduler is not None else None,
        }
        if kind == "torch":
            payload["model"] = _unwrap(state.model).state_dict()
            payload["optimizer"] = state.optimizer.state_dict() if state.optimizer else None
        with open(temp / (STATE_FILE if kind == "torch" else META_FILE), "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        meta = {"epoch": state.epoch, "batch_in_epoch": state.batch_in_epoch,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT", "")}
        final = self.store.commit(temp, state.step, kind, world, meta)
        removed = self.store.prune(self.keep, final)
        if removed:
            log.info("pruned %s", ", ".join(Path(p).name for p in removed))
        return final

    # -- restoring ----------------------------------------------------------------------------
    def restore(self, state: TrainState, *, checkpoint: Checkpoint | None = None,
                restore_rng: bool = True) -> Checkpoint | None:
        """Load the newest valid checkpoint (or ``checkpoint``) into ``state`` in place.

        Returns:
            The checkpoint used, or None when there is none (``state`` is untouched).

        Raises:
            CheckpointError: the checkpoint is not a slurm-spot one or holds types that
                ``weights_only`` loading refuses.
        """
        found = checkpoint if checkpoint is not None else self.latest()
        if found is None:
            return None
        rank, world = self._rank_world()
        if found.kind == "dcp":
            payload = _load(found.path / META_FILE)
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_state_dict

            loaded = _dcp_state(state)
            dcp.load(loaded, checkpoint_id=found.path, process_group=self.group)
            set_state_dict(state.model, _optimizers(state), model_state_dict=loaded["model"],
                           optim_state_dict=loaded.get("optim", {}))
        else:
            payload = _load(found.path / STATE_FILE if found.kind == "torch" else found.path)
            _unwrap(state.model).load_state_dict(payload["model"])
            if state.optimizer is not None and payload.get("optimizer") is not None:
                state.optimizer.load_state_dict(payload["optimizer"])
        if state.scheduler is not None and payload.get("scheduler") is not None:
            state.scheduler.load_state_dict(payload["scheduler"])
        state.step, state.epoch = int(payload["step"]), int(payload["epoch"])
        state.batch_in_epoch = int(payload.get("batch_in_epoch", 0))
        state.extra = dict(payload.get("extra") or {})
        per_rank = payload["per_rank"]
        if len(per_rank) != world:
            log.warning("checkpoint %s was written by %d ranks, this run has %d: RNG streams "
                        "are reused round-robin and the run is no longer bit-exact",
                        found.path, len(per_rank), world)
        mine = per_rank[rank % len(per_rank)]
        for name, gen in state.generators.items():
            if name in mine["generators"]:
                gen.set_state(mine["generators"][name])
        if restore_rng:
            restore_rng_state(mine["rng"])
        return found


def _rank_state(state: TrainState) -> dict[str, Any]:
    return {"rng": capture_rng_state(),
            "generators": {name: g.get_state() for name, g in state.generators.items()}}


def _optimizers(state: TrainState) -> list[torch.optim.Optimizer]:
    return [state.optimizer] if state.optimizer is not None else []


def _dcp_state(state: TrainState) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(state.model, _optimizers(state))
    return {"model": model_sd, "optim": optim_sd} if state.optimizer else {"model": model_sd}


def _load(path: Path) -> dict[str, Any]:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
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

