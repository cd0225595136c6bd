"""Where checkpoints are kept: the :class:`CheckpointStore` seam and the local POSIX store.

:class:`~slurm_spot.checkpoint.checkpointer.Checkpointer` writes every checkpoint into a
*staging* directory on a file system its ranks share (``torch.save`` or the shards of
``torch.distributed.checkpoint``), then asks the store to publish it; to resume it asks the
store for the newest valid checkpoint as a local directory it can load. A store decides where
the bytes live and what "committed" means:

- :class:`LocalStore` (this module): the job's checkpoint directory on a local or shared POSIX
  file system; staging is a temporary directory beside the checkpoints and the commit is an
  atomic ``rename`` (protocol in :mod:`slurm_spot.checkpoint.files`).
- an object store (next): staging on local disk, the commit uploads the data files and the
  manifest last; ``latest`` lists the prefix and downloads the newest valid checkpoint.

Stores run on rank 0 only (the checkpointer broadcasts what they return); no torch here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, Protocol

from slurm_spot.checkpoint.files import (
    Candidate,
    Checkpoint,
    CheckpointError,
    commit,
    find_latest_valid,
    new_temp_dir,
    prune,
    step_dir_name,
    validate,
    write_manifest,
)

log = logging.getLogger(__name__)

#: What :meth:`CheckpointStore.stage` decided: write into the staging ``path``, ``skip`` (a
#: valid checkpoint of that step exists at ``path``) or ``error`` (``message`` says why).
StagePlan = tuple[Literal["write", "skip", "error"], str, str]


class CheckpointStore(Protocol):
    """The storage of one job's checkpoints."""

    @property
    def location(self) -> str:
        """Where the checkpoints are, for messages (a directory, a URL)."""
        ...

    def latest(self, verify_checksums: bool = True) -> Checkpoint | None:
        """The newest valid checkpoint, as a local path this rank can load (``Checkpoint.path``),
        or None when there is none. Never changes the store."""
        ...

    def stage(self, step: int) -> StagePlan:
        """Prepare a new, empty staging directory for a checkpoint of ``step`` on a file system
        all ranks share. Reports ``skip`` when a valid checkpoint of ``step`` already exists (a
        committed checkpoint is never overwritten); an invalid one is moved out of the way."""
        ...

    def commit(self, staging: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
               meta: dict[str, Any]) -> str:
        """Publish the finished ``staging`` directory as the checkpoint of ``step`` (manifest
        last, with ``meta``); returns where it now is.

        Raises:
            CheckpointError: nothing to commit, or the step exists already.
            OSError: the storage failed (disk full, ...).
        """
        ...

    def prune(self, keep: int, newest: str) -> list[str]:
        """Keep the ``keep`` newest valid checkpoints (always ``newest``), delete older ones and
        abandoned staging directories; returns what was deleted."""
        ...


class LocalStore:
    """Checkpoints as ``step_<N>`` directories in ``directory`` (local or shared POSIX file
    system; created on the first save). See :mod:`slurm_spot.checkpoint.files`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    @property
    def location(self) -> str:
        return str(self.directory)

    def latest(self, verify_checksums: bool = True) -> Checkpoint | None:
        return find_latest_valid(self.directory, verify_checksums)

    def stage(self, step: int) -> StagePlan:
        final = self.directory / step_dir_name(step)
        try:
            if os.path.lexists(final):
                problem = validate(Candidate(final, step, "dir"), verify_checksums=False)
                if not problem:
                    return ("skip", str(final),
                            f"checkpoint {final} already exists; not overwriting it (skipped)")
                aside = final.with_name(f"{final.name}.corrupt-{os.getpid()}")
                os.rename(final, aside)
                log.warning("moved invalid %s aside to %s (%s)", final, aside.name, problem)
            return ("write", str(new_temp_dir(self.directory, step)), "")
        except OSError as exc:
            return ("error", str(final), f"cannot prepare checkpoint {final}: {exc}")

    def commit(self, staging: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
               meta: dict[str, Any]) -> str:
        if staging.parent != self.directory:
            raise CheckpointError(f"{staging} is not a staging directory of {self.directory}")
        write_manifest(staging, step, kind, world_size, meta)
        return str(commit(staging, step))

    def prune(self, keep: int, newest: str) -> list[str]:
        return [str(p) for p in prune(self.directory, keep, Path(newest))]
