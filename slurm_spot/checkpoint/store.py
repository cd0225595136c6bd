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
(rank 0) or ``abort``. No torch here. :func:`open_store` picks the store for a root
(:data:`URL_STORES`: the store of each URL scheme), :func:`open_configured_store` with the
site's settings for it; readers of a job's history (``plan --checkpoint-dir``, ``cost``) list
it with :meth:`CheckpointStore.committed`, whatever the store.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
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
    read_manifest,
    root_problem,
    step_dir_name,
    symlinked_steps,
    validate,
)
from slurm_spot.contract.location import (
    S3_SCHEME,
    URL_SCHEMES,
    unknown_url_scheme,
    url_scheme,
)

log = logging.getLogger(__name__)

#: What :meth:`CheckpointStore.stage` decided: write into the staging ``path``, ``skip`` (a
#: valid checkpoint of that step exists at ``path``) or ``error`` (``message`` says why).
StagePlan = tuple[Literal["write", "skip", "error"], str, str]

#: What :meth:`CheckpointStore.committed` lists: ``(step, manifest)``, newest step first.
Committed = list[tuple[int, dict[str, Any]]]


class StoreNotFound(CheckpointError):
    """:meth:`CheckpointStore.committed`: the store's location does not exist at all (a local
    directory never created), as opposed to existing and holding no checkpoint."""


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

    def committed(self) -> Committed:
        """``(step, manifest)`` of every committed checkpoint, newest step first: what a reader
        of the job's history needs (``plan --checkpoint-dir``: ``save_s``; ``cost``:
        ``created_unix_s`` and the ``size`` of each entry of ``files``; format:
        :mod:`slurm_spot.checkpoint.files`). A manifest is only parsed, not verified (no
        sizes, no checksums); one that cannot be read is skipped. Never changes the store.

        Raises:
            StoreNotFound: the store's location does not exist (a directory never created).
            CheckpointError: the store cannot be read (a listing refused, a transport error
                after the client's retries); the message starts with the location.
        """
        ...


#: The store class of each URL scheme (:data:`~slurm_spot.contract.location.URL_SCHEMES`), as
#: ``"module:Class"``: imported only when a root of that scheme is opened (boto3 is not
#: loaded for a directory). A store with a URL scheme adds its line here (docs/DESIGN.md,
#: "Adding a checkpoint store"); any other root is a :class:`LocalStore` directory.
URL_STORES: dict[str, str] = {S3_SCHEME: "slurm_spot.checkpoint.s3:S3Store"}

#: A store class: called with the root (the URL as a string) and the store's own options.
StoreClass = Callable[..., CheckpointStore]


def store_class(root: str | os.PathLike[str]) -> StoreClass:
    """The class of the store ``root`` names: the one :data:`URL_STORES` registers for its
    URL scheme, else :class:`LocalStore`.

    Raises:
        CheckpointError: ``root`` starts with a ``scheme://`` no store implements (it is never
            taken for a directory), or its scheme's entry names no importable class.
    """
    scheme = url_scheme(root)
    if scheme is None:
        foreign = unknown_url_scheme(root)
        if foreign is not None:
            raise CheckpointError(
                f"{os.fspath(root)}: no checkpoint store handles {foreign} roots (known: "
                f"{', '.join(URL_SCHEMES)}, or a directory)")
        return LocalStore
    where = URL_STORES.get(scheme)
    if where is None:
        raise CheckpointError(f"{os.fspath(root)}: no checkpoint store is registered for "
                              f"{scheme} roots (slurm_spot.checkpoint.store.URL_STORES)")
    module, _, name = where.partition(":")
    try:
        found: StoreClass = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise CheckpointError(f"the checkpoint store of {scheme} roots ({where}) cannot be "
                              f"loaded: {exc}") from None
    return found


def open_store(root: str | os.PathLike[str], **options: Any) -> CheckpointStore:
    """The store for a checkpoint root (:func:`store_class`): for a URL the store of its
    scheme, e.g. :class:`~slurm_spot.checkpoint.s3.S3Store` for ``s3://bucket/prefix``, built
    with the URL as a string and ``options`` (S3: ``endpoint_url``, ``addressing_style``,
    ...); else :class:`LocalStore` (``options`` are not used).

    Raises:
        CheckpointError: no store handles the root's URL scheme, the store refuses the root
            (a malformed URL, a path that is not a directory) or its options.
    """
    cls = store_class(root)
    if cls is LocalStore:
        return LocalStore(root)
    return cls(os.fspath(root), **options)


def open_configured_store(root: str | os.PathLike[str], settings: Any = None) -> CheckpointStore:
    """The store for ``root`` (:func:`open_store`) with the options the site's checkpoint
    settings give it: ``settings`` is spot.yaml's ``checkpoint`` section (a
    :class:`~slurm_spot.config.models.CheckpointConfig` or its cached view), passed to the
    store class's ``options_from_config`` where it has one (S3: ``checkpoint.s3``'s endpoint
    and addressing style); None, or a class without it: no options (the store's defaults and
    environment).

    Raises:
        CheckpointError: as :func:`open_store`.
    """
    cls = store_class(root)
    from_config = getattr(cls, "options_from_config", None)
    options: dict[str, Any] = from_config(settings) if settings is not None and from_config \
        else {}
    return open_store(root, **options)


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

    def committed(self) -> Committed:
        """``(step, manifest)`` of every ``step_N`` directory with a readable slurm-spot
        manifest (:func:`~slurm_spot.checkpoint.files.read_manifest`), newest first; symlinks,
        staging directories, foreign archives and directories without a readable manifest are
        left out. Reads only the listing and the manifests.

        Raises:
            StoreNotFound: the directory does not exist.
            CheckpointError: it is not a directory (or lies under a file), or cannot be listed.
        """
        self._check_root()
        if not os.path.isdir(self.directory):
            raise StoreNotFound(f"{self.directory}: no such directory")
        found: Committed = []
        for candidate in list_candidates(self.directory):
            if candidate.kind != "dir":
                continue
            try:
                found.append((candidate.step, read_manifest(candidate.path)))
            except CheckpointError:
                continue  # not committed (no manifest yet), or not ours
        return found
