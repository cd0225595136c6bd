"""The restore side of a checkpointer, step by step: which checkpoint to resume from (rank 0
decides for every rank), reading and verifying it on every rank, and putting what it holds
into a :class:`~slurm_spot.checkpoint.trainstate.TrainState`.

:meth:`Checkpointer.restore <slurm_spot.checkpoint.checkpointer.Checkpointer.restore>` strings
them together (the fallback to an older checkpoint, ``resume_from``, the store's release).
Every function here that takes a :class:`~slurm_spot.checkpoint.collectives.SaveGroup` must be
called by all its ranks together.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slurm_spot.checkpoint.collectives import SaveGroup
from slurm_spot.checkpoint.files import (
    META_FILE,
    STATE_FILE,
    Candidate,
    Checkpoint,
    CheckpointError,
    as_checkpoint,
    validate,
)
from slurm_spot.checkpoint.store import CheckpointStore
from slurm_spot.checkpoint.trainstate import (
    TrainState,
    dcp_state_dict,
    optimizers_of,
    restore_rng_state,
    unwrap_model,
)
from slurm_spot.checkpoint.verify import (
    CorruptCheckpoint,
    check_dcp_shapes,
    check_shapes,
    load_payload,
    own_tensors,
)

log = logging.getLogger(__name__)


def resolve(ranks: SaveGroup, store: CheckpointStore,
            verify_checksums: bool) -> Checkpoint | None:
    """The newest checkpoint of ``store`` that passes validation on rank 0 (sha256 too with
    ``verify_checksums``), shared with every rank; None when there is none. Writes nothing in
    the store. Raises what the store's ``latest`` raises (on rank 0)."""
    found = None
    if ranks.rank_world()[0] == 0:
        found = store.latest(verify_checksums)
    return ranks.from_rank0(found)


def check_none_valid(ranks: SaveGroup, store: CheckpointStore,
                     start_fresh_if_invalid: bool) -> None:
    """No usable checkpoint was found: fine for a first run (an empty store). If the store holds
    committed checkpoints, none of them valid, that is an error unless
    ``start_fresh_if_invalid`` (then it is logged at ERROR and the run starts from step 0).

    Raises:
        CheckpointError: checkpoints exist, none is valid, and ``start_fresh_if_invalid`` is
            False (the message says how to start over).
    """
    exists = ranks.from_rank0(
        store.has_committed() if ranks.rank_world()[0] == 0 else False)
    if exists:
        msg = (f"{store.location} holds checkpoints but none is valid "
               "(see the warnings above)")
        if not start_fresh_if_invalid:
            raise CheckpointError(
                f"{msg}; refusing to start from step 0 (pass "
                "start_fresh_if_invalid=True or set "
                "SLURM_SPOT_START_FRESH_IF_INVALID=1 to start over)")
        log.error("%s; starting from step 0 as configured", msg)


def read_checkpoint(ranks: SaveGroup, store: CheckpointStore, found: Checkpoint,
                    verify_checksums: bool) -> tuple[Checkpoint, dict[str, Any], str, bool]:
    """Every rank: fetch ``found`` (a download for S3 on ranks other than 0), verify it while
    loading its payload (:func:`~slurm_spot.checkpoint.verify.load_payload`; sha256 with
    ``verify_checksums``), and agree.

    Returns:
        ``(local checkpoint, payload, problem, corrupt)``: ``problem`` is "" when every rank
        succeeded (else every failing rank's message, ``payload`` empty and this rank's
        download released); ``corrupt`` says that some rank found it damaged (size, sha256,
        unreadable: try an older one) rather than unloadable (a final error).
    """
    rank = ranks.rank_world()[0]
    local, payload, problem, corrupt = found, {}, "", False
    try:
        if not found.path.exists():
            local = store.fetch(found)
        if local.kind == "dcp":
            if verify_checksums and (rank == 0 or local is not found):
                why = validate(Candidate(local.path, local.step, "dir"), True)
                if why:
                    raise CorruptCheckpoint(f"{local.path}: {why}")
            payload = load_payload(local.path / META_FILE)
        elif local.kind == "torch":
            entry = (local.manifest or {}).get("files", {}).get(STATE_FILE)
            payload = load_payload(local.path / STATE_FILE,
                                   entry if verify_checksums else None)
        else:  # a single archive of other code, given explicitly
            payload = load_payload(local.path, mmap=False)
    except CorruptCheckpoint as exc:
        problem, corrupt = str(exc), True
    except CheckpointError as exc:
        problem = str(exc)
    except OSError as exc:
        problem, corrupt = f"{found.path}: cannot read it: {exc}", True
    gathered = ranks.gather((problem, corrupt))
    if len(gathered) > 1:
        problem = "; ".join(f"rank {r}: {p}" for r, (p, _c) in enumerate(gathered) if p)
    corrupt = any(c for _p, c in gathered)
    if problem:
        payload = {}
        store.release(local)
    return local, payload, problem, corrupt


def explicit_checkpoint(ranks: SaveGroup, path: Path) -> Checkpoint:
    """A checkpoint directory named on the command line (``resume_from``), validated by rank 0
    for every rank: its name is ``step_<N>``, its manifest and file sizes are right (the sha256
    is verified while it is loaded).

    Raises:
        CheckpointError: it is not a valid slurm-spot checkpoint directory (names ``path`` and
            why).
    """
    result: tuple[str, Checkpoint | None] = ("", None)
    if ranks.rank_world()[0] == 0:
        name = path.name
        step = int(name.removeprefix("step_")) if name.removeprefix("step_").isdigit() else -1
        # sizes and structure here; the sha256 is verified while it is loaded
        problem = (f"{path}: not a step_<N> checkpoint directory" if step < 0 or
                   not path.is_dir() else
                   validate(Candidate(path, step, "dir"), verify_checksums=False))
        result = (f"{path}: {problem}" if problem else "",
                  None if problem else as_checkpoint(Candidate(path, step, "dir")))
    problem, found = ranks.from_rank0(result)
    if problem or found is None:
        raise CheckpointError(f"cannot resume from {path}: {problem}")
    return found


def apply_payload(state: TrainState, found: Checkpoint, payload: dict[str, Any],
                  ranks: SaveGroup, restore_rng: bool) -> None:
    """Put the checkpoint ``found`` (its verified ``payload`` from :func:`read_checkpoint`)
    into ``state`` in place: the model (DCP shards loaded here for a ``dcp`` checkpoint), the
    optimizer, the scheduler, ``step``/``epoch``/``batch_in_epoch``/``extra``, this rank's named
    generators and, with ``restore_rng``, its RNG states. A checkpoint of another world size
    reuses the ranks' RNG streams round-robin (logged: no longer bit-exact).

    Shapes are checked before any tensor of the model changes. What outlives the call is
    copied out of the file's memory map. Every rank calls it together for a ``dcp``
    checkpoint (``dcp.load`` runs on the save group).

    Raises:
        CheckpointError: the checkpoint holds a model of other keys or shapes (nothing
            loaded).
    """
    rank, world = ranks.rank_world()
    if found.kind == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        loaded = dcp_state_dict(state)
        check_dcp_shapes(found.path, loaded)
        dcp.load(loaded, checkpoint_id=found.path, process_group=ranks.group())
        set_state_dict(state.model, optimizers_of(state), model_state_dict=loaded["model"],
                       optim_state_dict=loaded.get("optim", {}))
    else:
        model = unwrap_model(state.model)
        check_shapes(found.path, payload["model"], model.state_dict())
        model.load_state_dict(payload["model"])  # copies out of the file's pages
    # what outlives this call gets its own memory, not the file's mapped pages
    payload = {k: v if k == "model" else own_tensors(v) for k, v in payload.items()}
    if found.kind != "dcp" and state.optimizer is not None \
            and payload.get("optimizer") is not None:
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
