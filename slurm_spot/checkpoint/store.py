"""Where checkpoints are kept: the :class:`CheckpointStore` seam and the local POSIX store.

:class:`~slurm_spot.checkpoint.checkpointer.Checkpointer` writes every checkpoint into a
*staging* directory on a file system its ranks share (``torch.save`` or the shards of
``torch.distributed.checkpoint``), then asks the store to publish it; to resume it asks the
store for the newest valid checkpoint as a local directory it can load. A store decides where
the bytes live and what "committed" means:

- :class:`LocalStore` (this module): the job's checkpoint directory on a local or shared POSIX
  file system; staging is a temporary directory beside the checkpoints and the commit is an
  atomic ``rename`` (protocol in :mod:`slurm_spot.checkpoint.commit`, layout in
  :mod:`slurm_spot.checkpoint.files`).
- :class:`~slurm_spot.checkpoint.s3.S3Store`: staging on each rank's local disk, every rank
  uploads its own files, rank 0 writes the manifest last once all ranks agreed that their
  uploads succeeded; ``latest`` lists the prefix and downloads the newest valid checkpoint.

A save goes ``stage`` (rank 0: a token) -> ``local_staging`` (every rank: where to write) ->
``upload`` (every rank: its files' sizes and checksums) -> the ranks agree -> ``commit_manifest``
(rank 0) or ``abort``. No torch here. :func:`open_store` picks the store for a root.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, Protocol

from slurm_spot.checkpoint.commit import (
    commit,
    new_temp_dir,
    prune,
    remove_checkpoint_dir,
    write_manifest,
)
from slurm_spot.checkpoint.files import (
    Candidate,
    Checkpoint,
    CheckpointError,
    as_checkpoint,
    list_candidates,
    root_problem,
    step_dir_name,
    symlinked_steps,
    validate,
)
from slurm_spot.checkpoint.location import is_s3

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
        """Rank 0: prepare a save of ``step``: ``("write", token, "")``, where the token is
        what :meth:`local_staging` turns into each rank's staging directory (for the local
        store, a new empty directory beside the checkpoints). Reports ``skip`` when a valid
        checkpoint of ``step`` already exists (a committed checkpoint is never overwritten;
        an invalid one is moved out of the way) and ``error`` when the store cannot be
        prepared (the message says why)."""
        ...

    def commit(self, staging: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
               meta: dict[str, Any], started_s: float | None = None) -> str:
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

    def local_staging(self, token: str) -> Path:
        """Every rank: the directory this rank writes its files of save ``token`` into."""
        ...

    def upload(self, staging: Path, token: str,
               known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """Every rank: make this rank's files durable in the store; returns
        ``{relative path: {"size": bytes, "sha256": hex}}`` (entries the commit computes itself
        may be left out). ``known``: entries of files this rank hashed while writing them
        (:class:`~slurm_spot.checkpoint.hashing.HashingWriter`), so that no file is read again
        only to hash it."""
        ...

    def commit_manifest(self, token: str, kind: Literal["torch", "dcp"], world_size: int,
                        meta: dict[str, Any], files: dict[str, dict[str, Any]],
                        started_s: float | None = None) -> str:
        """Rank 0, after all ranks' uploads succeeded: the commit point; returns where the
        checkpoint is. ``started_s`` (time.monotonic() when the save began) gives ``save_s``."""
        ...

    def abort(self, token: str) -> None:
        """Rank 0: remove what the failed save ``token`` left (never a committed checkpoint)."""
        ...

    def discard_staging(self, staging: Path) -> None:
        """Every rank: drop this rank's local staging directory after a save."""
        ...

    def fetch(self, checkpoint: Checkpoint) -> Checkpoint:
        """A copy of ``checkpoint`` (resolved on rank 0) readable on this rank."""
        ...

    def has_committed(self) -> bool:
        """True when the store holds at least one committed checkpoint of ours (valid or not)."""
        ...

    def release(self, checkpoint: Checkpoint) -> None:
        """Every rank, after loading ``checkpoint``: drop a local copy made for it (a download);
        never the store's own checkpoint."""
        ...


def open_store(root: str | os.PathLike[str], **s3_options: Any) -> CheckpointStore:
    """The store for a checkpoint root: :class:`~slurm_spot.checkpoint.s3.S3Store` for
    ``s3://bucket/prefix`` (``s3_options`` go to it), else :class:`LocalStore`."""
    if is_s3(root):
        from slurm_spot.checkpoint.s3 import S3Store

        return S3Store(str(root), **s3_options)
    return LocalStore(root)


class LocalStore:
    """Checkpoints as ``step_<N>`` directories in ``directory`` (local or shared POSIX file
    system; created on the first save). See :mod:`slurm_spot.checkpoint.files`.

    Raises:
        CheckpointError: ``directory`` exists but is not a directory (a regular file, a symlink
            to one, a dangling symlink) or lies under such an entry
            (:func:`~slurm_spot.checkpoint.files.root_problem`); checked again by
            :meth:`latest`, :meth:`has_committed` and :meth:`stage`, so a file put there later
            never reads as "no checkpoints yet".
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._check_root(directory)  # the text as given: Path("") is "."

    def _check_root(self, directory: str | os.PathLike[str] | None = None) -> None:
        problem = root_problem(self.directory if directory is None else directory)
        if problem:
            raise CheckpointError(f"checkpoint directory {problem}")

    @property
    def location(self) -> str:
        return str(self.directory)

    def latest(self, verify_checksums: bool = True) -> Checkpoint | None:
        """The newest valid ``step_N`` checkpoint. Single archives of other code
        (``ckpt_000750.pt``) are not ours and are ignored (logged once). A newer ``step_N``
        that is invalid, or a symlink (never followed:
        :func:`~slurm_spot.checkpoint.files.symlinked_steps`), is skipped with a warning."""
        self._check_root()
        found: Checkpoint | None = None
        for candidate in list_candidates(self.directory):
            problem = validate(candidate, verify_checksums)
            if candidate.kind == "file":
                if not problem:
                    log.info("ignoring %s: not a slurm-spot checkpoint", candidate.path)
                continue
            if problem:
                log.warning("checkpoint %s is not usable, trying an older one: %s",
                            candidate.path, problem)
                continue
            found = as_checkpoint(candidate)
            break
        for link in symlinked_steps(self.directory):
            if found is None or link.step > found.step:
                log.warning("checkpoint %s is not usable, %s: it is a symlink (to %s), and "
                            "checkpoints are never followed through symlinks", link.path,
                            "trying an older one" if found is None else f"using {found.path}",
                            os.readlink(link.path))
        return found

    def stage(self, step: int) -> StagePlan:
        final = self.directory / step_dir_name(step)
        problem = root_problem(self.directory)
        if problem:
            return ("error", str(self.directory), f"cannot save: checkpoint directory {problem}")
        try:
            if os.path.islink(final):  # the link moves aside, never what it points to
                aside = final.with_name(f"{final.name}.symlink-{os.getpid()}")
                os.rename(final, aside)
                log.warning("moved the symlink %s aside to %s (a checkpoint is never written "
                            "or read through a symlink)", final, aside.name)
            elif os.path.lexists(final):
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
               meta: dict[str, Any], started_s: float | None = None) -> str:
        if staging.parent != self.directory:
            raise CheckpointError(f"{staging} is not a staging directory of {self.directory}")
        write_manifest(staging, step, kind, world_size, meta, started_s=started_s)
        return str(commit(staging, step))

    def prune(self, keep: int, newest: str) -> list[str]:
        return [str(p) for p in prune(self.directory, keep, Path(newest))]

    # the staging directory is shared by all ranks: the token is its path
    def local_staging(self, token: str) -> Path:
        return Path(token)

    def upload(self, staging: Path, token: str,
               known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        # the files stay where they are; the commit hashes what the writers did not
        return dict(known or {})

    def commit_manifest(self, token: str, kind: Literal["torch", "dcp"], world_size: int,
                        meta: dict[str, Any], files: dict[str, dict[str, Any]],
                        started_s: float | None = None) -> str:
        staging = Path(token)
        step = int(staging.name.split(".", 1)[0].removeprefix("step_"))
        if staging.parent != self.directory:
            raise CheckpointError(f"{staging} is not a staging directory of {self.directory}")
        write_manifest(staging, step, kind, world_size, meta, started_s=started_s, known=files)
        return str(commit(staging, step))

    def abort(self, token: str) -> None:
        remove_checkpoint_dir(Path(token))

    def discard_staging(self, staging: Path) -> None:
        return None

    def fetch(self, checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint

    def has_committed(self) -> bool:
        """True with any ``step_N`` directory, valid or not, or a ``step_N`` symlink (counted as
        a checkpoint that exists but is not valid, so restore refuses to start from step 0)."""
        self._check_root()
        return any(c.kind == "dir" for c in list_candidates(self.directory)) \
            or bool(symlinked_steps(self.directory))

    def release(self, checkpoint: Checkpoint) -> None:
        return None
