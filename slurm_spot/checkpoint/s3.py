"""Checkpoints in an S3-compatible object store (AWS S3, MinIO, GCS interoperability, ...).

Why boto3 (not s3torchconnector or fsspec/s3fs): ``benchmarks/checkpoint_io.py --clients``
moved a 200 MB file to and from moto's HTTP server (BENCHMARKS.md, "S3 client throughput"):
boto3's managed transfer 85 MB/s up / 87 MB/s down, s3fs 69 / 155, s3torchconnector 111 / 49
(medians of 3; moto in the same process is the bottleneck, so the spread is mostly moto's).
No client wins both directions, so the rest decided: boto3 is already the project's AWS
client (``[aws]`` extra) and uploads a staged file with parallel multipart parts whose size and
concurrency we set (``TransferConfig``); s3fs's aiobotocore pins an older botocore than boto3
needs (installing it for the measurement broke boto3's own requirement), and
s3torchconnector writes a stream (no part-level control, no upload of a staged file) through
the AWS CRT, a large native dependency for 1.3x on one direction against a test server.

Layout under ``s3://bucket/prefix/``::

    step_000000500/manifest.json          the commit marker, written last
    step_000000500/a1b2c3d4/state.pt      data of attempt a1b2c3d4 (a random id per save)
    _inflight/step_000000750.e5f6a7b8     an upload in progress (deleted after its commit)

A checkpoint exists only if its ``manifest.json`` does: it lists every data object of the
attempt with its size and sha256 (same format as the POSIX manifest, see
:mod:`slurm_spot.checkpoint.files`, plus ``attempt``). Every save uploads into a fresh attempt
id, so a re-save of a step whose earlier attempt died never writes over objects a reader may
be using, and a committed step is never written again (the manifest is put with
``If-None-Match: *`` where the store supports it, after checking that none exists).

Failures (issue 25): a manifest PUT that raised is read back before anything is decided
(:meth:`S3Store.commit_manifest`); data a stored manifest names is never deleted
(:meth:`S3Store.abort`); a checkpoint counts, for a re-save of its step and for retention,
only if it verifies (:meth:`S3Store.verify_sizes`); in-flight markers of dead writers expire
after ``inflight_stale_s`` without progress (rule in :mod:`slurm_spot.checkpoint.s3inflight`).

Credentials come from boto3's standard chain (environment, shared files, instance or
workload metadata); they are never logged. Endpoint and addressing style come from the
arguments, else ``SLURM_SPOT_S3_ENDPOINT_URL`` / ``SLURM_SPOT_S3_ADDRESSING_STYLE`` (exported
by the TaskProlog from ``checkpoint.s3``), else boto3's own ``AWS_ENDPOINT_URL_S3`` handling.

The client, listing, manifests and downloads are :mod:`slurm_spot.checkpoint.s3objects`; this
module is the save protocol on top (staging, upload, commit, abort, retention).

boto3 references: ``S3.Client.upload_file`` / ``download_file`` with
``boto3.s3.transfer.TransferConfig`` (multipart threshold, chunk size, max concurrency),
``list_objects_v2`` (``Delimiter``/``CommonPrefixes``), ``delete_objects`` (at most 1000 keys a
call), ``botocore.config.Config(s3={"addressing_style": ...})``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from slurm_spot.checkpoint.commit import build_manifest
from slurm_spot.checkpoint.files import (
    MANIFEST_NAME,
    Checkpoint,
    CheckpointError,
    file_digest,
    known_digest,
    step_dir_name,
)
from slurm_spot.checkpoint.s3inflight import (
    INFLIGHT,
    INFLIGHT_STALE_S,
    Heartbeat,
    abort_dead_multipart_uploads,
    marker_key,
    markers,
    put_marker,
)
from slurm_spot.checkpoint.s3objects import (
    ENV_ADDRESSING_STYLE,
    ENV_ENDPOINT_URL,
    NOT_FOUND,
    MiB,
    S3Objects,
    error_code,
)
from slurm_spot.checkpoint.store import StagePlan
from slurm_spot.contract.location import parse_s3_url
from slurm_spot.contract.names import ENV_STAGING_DIR

log = logging.getLogger(__name__)

__all__ = ["ENV_ADDRESSING_STYLE", "ENV_ENDPOINT_URL", "ENV_STAGING_DIR", "INFLIGHT",
           "INFLIGHT_STALE_S", "CommitOutcomeUnknown", "S3Store", "parse_s3_url"]


class CommitOutcomeUnknown(CheckpointError):
    """The manifest PUT failed and S3 could not be read back to tell whether it was stored:
    the step may or may not be committed. Its data is kept (a stored manifest may name it);
    the next save or restore finds out (a manifest that does not verify is never used)."""


class S3Store(S3Objects):
    """One job's checkpoints under ``s3://bucket/prefix`` (a
    :class:`~slurm_spot.checkpoint.store.CheckpointStore`).

    Args:
        url: ``s3://bucket/prefix``; keys may hold spaces, ``+``, ``=`` and non-ASCII text.
        endpoint_url: the S3 endpoint (MinIO, a European provider, moto); None: env or AWS.
        addressing_style: ``path``, ``virtual`` or ``auto`` (botocore's S3 option).
        staging_dir: local directory for staging and downloads (``SLURM_SPOT_STAGING_DIR``,
            else the system temp directory); a spot node's local disk is fine.
        part_size: multipart chunk size in bytes (>= 5 MiB, S3's minimum part size).
        max_concurrency: parallel part uploads/downloads per file.
        inflight_stale_s: seconds without progress after which an in-flight save is dead and
            no longer holds retention back (rule: :mod:`slurm_spot.checkpoint.s3inflight`).
        client: a ready boto3 S3 client (tests); credentials otherwise from boto3's chain.
        env: the environment to read (default ``os.environ``).
        clock: seconds since the epoch (default :func:`time.time`; tests move it on).

    Raises:
        CheckpointError: a malformed URL or addressing style, a part size under 5 MiB.
    """

    def __init__(self, url: str, *, endpoint_url: str | None = None,
                 addressing_style: str | None = None, staging_dir: str | None = None,
                 part_size: int = 16 * MiB, max_concurrency: int = 8,
                 inflight_stale_s: float = INFLIGHT_STALE_S,
                 client: Any = None, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        env = os.environ if env is None else env
        super().__init__(url, endpoint_url=endpoint_url, addressing_style=addressing_style,
                         part_size=part_size, max_concurrency=max_concurrency, client=client,
                         env=env)
        self.staging_root = Path(staging_dir or env.get(ENV_STAGING_DIR) or tempfile.gettempdir())
        self.inflight_stale_s = inflight_stale_s
        self._clock = clock
        self._downloaded: Path | None = None

    @property
    def location(self) -> str:
        """The store's URL, ``s3://bucket/prefix`` (no trailing ``/``)."""
        return self.url

    @classmethod
    def options_from_config(cls, settings: Any) -> dict[str, Any]:
        """The keyword arguments spot.yaml's ``checkpoint`` section (``settings``: a
        ``CheckpointConfig`` or its cached view) gives the store: ``endpoint_url`` when
        ``checkpoint.s3.endpoint_url`` is set, ``addressing_style`` when it is not ``auto``
        (:func:`~slurm_spot.checkpoint.store.open_configured_store`). Left out, the store
        reads the environment (``SLURM_SPOT_S3_*``) and boto3's defaults. Raises nothing."""
        s3 = getattr(settings, "s3", None)
        options: dict[str, Any] = {}
        endpoint = getattr(s3, "endpoint_url", None)
        if endpoint:
            options["endpoint_url"] = endpoint
        style = getattr(s3, "addressing_style", "auto")
        if style and style != "auto":
            options["addressing_style"] = style
        return options

    # -- the CheckpointStore protocol ----------------------------------------------------------
    def committed(self) -> list[tuple[int, dict[str, Any]]]:
        """``(step, manifest)`` of every ``step_N/manifest.json`` that parses, newest first
        (an unreadable one is skipped with a warning); nothing is downloaded or verified.

        Raises:
            CheckpointError: S3 could not be listed or read (no such bucket, no credentials,
                a transport error after botocore's retries, boto3 not installed); the message
                starts with the URL.
        """
        transport: tuple[type[BaseException], ...] = (OSError, ImportError)
        try:
            from botocore.exceptions import BotoCoreError, ClientError

            transport += (BotoCoreError, ClientError)
        except ImportError:
            pass  # then creating the client fails with ImportError, reported the same way
        try:
            return super().committed()
        except transport as exc:
            raise CheckpointError(f"{self.url}: cannot list the checkpoints: {exc}") from None

    def latest(self, verify_checksums: bool = True) -> Checkpoint | None:
        """Download the newest committed checkpoint that passes validation (sizes always,
        sha256 with ``verify_checksums``) into a local directory and return it; a corrupt one
        is skipped with a warning and the previous one tried. The previous download of this
        store is deleted. Changes nothing in the bucket."""
        for step, manifest in super().committed():  # transport errors as boto raises them
            local = Path(tempfile.mkdtemp(prefix=f"{step_dir_name(step)}.restore-",
                                          dir=self._staging_root()))
            try:
                problem = self.download(step, manifest, local, verify_checksums)
            except Exception as exc:  # a transport error on one checkpoint: try the older one
                problem = f"download failed: {exc}"
            if problem:
                log.warning("checkpoint %s is not usable, trying an older one: %s",
                            self.url_of(self.key(step_dir_name(step))), problem)
                shutil.rmtree(local, ignore_errors=True)
                continue
            if self._downloaded is not None:
                shutil.rmtree(self._downloaded, ignore_errors=True)
            self._downloaded = local
            return Checkpoint(local, step, "dcp" if manifest.get("kind") == "dcp" else "torch",
                              manifest)
        return None

    def _staging_root(self) -> Path:
        self.staging_root.mkdir(parents=True, exist_ok=True)
        return self.staging_root

    def stage(self, step: int) -> StagePlan:
        """Rank 0: ``skip`` when ``step`` is committed and verifies (:meth:`verify_sizes`),
        else ``write`` with a token ``"<step>:<attempt>"`` (:meth:`local_staging` turns it into
        a directory on each rank) and an in-flight marker for retention to respect. A manifest
        of ``step`` that does not verify (unreadable, or its data missing) is moved aside to
        ``manifest.json.invalid-<random>`` with a warning, as the local store moves an invalid
        directory aside: a step is never reported saved when restore cannot load it."""
        name = step_dir_name(step)
        where = self.url_of(self.key(name))
        try:
            problem = self._committed_problem(step)
            if problem == "":
                return ("skip", where,
                        f"checkpoint {where} already exists; not overwriting it (skipped)")
            if problem is not None:
                self._set_aside(name, problem)
            attempt = secrets.token_hex(4)
            put_marker(self.client, self.bucket, marker_key(self.prefix, name, attempt),
                       self._clock())
        except CheckpointError as exc:
            return ("error", self.url_of(self.key(name)), str(exc))
        except Exception as exc:
            return ("error", self.url_of(self.key(name)),
                    f"cannot prepare checkpoint {self.url_of(self.key(name))}: {exc}")
        return ("write", f"{step}:{attempt}", "")

    def _committed_problem(self, step: int) -> str | None:
        """None: ``step`` has no manifest; "": it has one that verifies; else why not."""
        try:
            manifest = self.manifest(step)
        except CheckpointError as exc:
            return str(exc)
        return None if manifest is None else self.verify_sizes(step, manifest)

    def _set_aside(self, name: str, problem: str) -> None:
        key = self.key(name, MANIFEST_NAME)
        aside = f"{key}.invalid-{secrets.token_hex(4)}"
        self.client.copy_object(Bucket=self.bucket, Key=aside,
                                CopySource={"Bucket": self.bucket, "Key": key})
        self.client.delete_object(Bucket=self.bucket, Key=key)
        log.warning("checkpoint %s is not usable (%s); its manifest is moved aside to %s and "
                    "the step is saved again", self.url_of(self.key(name)), problem,
                    aside.rsplit("/", 1)[1])

    def local_staging(self, token: str) -> Path:
        """This rank's (new, empty) local staging directory for the save ``token``."""
        step, attempt = token.split(":")
        path = self._staging_root() / f"{step_dir_name(int(step))}.tmp-{attempt}-{os.getpid()}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def upload(self, staging: Path, token: str,
               known: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """Upload every file of this rank's ``staging`` directory (parallel multipart) into
        the attempt's prefix; returns ``{relative path: {"size", "sha256"}}`` for the
        manifest. Files in ``known`` (hashed while they were written, same size now) are not
        read to hash them; the upload is their only read. Does not commit anything.

        Raises:
            CheckpointError: a symlink in ``staging``.
            botocore/boto3 errors: the upload failed (throttling after retries, ...).
        """
        step, attempt = token.split(":")
        heartbeat = Heartbeat(self.client, self.bucket,
                              marker_key(self.prefix, step_dir_name(int(step)), attempt),
                              max(1.0, self.inflight_stale_s / 3), self._clock)
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(staging.rglob("*")):
            if path.is_symlink():
                raise CheckpointError(f"{path}: symlinks are not allowed in a checkpoint")
            if not path.is_file() or path.name.startswith(MANIFEST_NAME):
                continue
            rel = path.relative_to(staging).as_posix()
            size, sha = known_digest(path, (known or {}).get(rel)) or file_digest(path)
            self.client.upload_file(str(path), self.bucket,
                                    self.key(step_dir_name(int(step)), attempt, rel),
                                    Callback=heartbeat, Config=self.transfer_config())
            files[rel] = {"size": size, "sha256": sha}
        return files

    def commit_manifest(self, token: str, kind: Literal["torch", "dcp"], world_size: int,
                        meta: dict[str, Any], files: dict[str, dict[str, Any]],
                        started_s: float | None = None) -> str:
        """Rank 0, after every rank's upload succeeded: write the manifest (the commit point)
        and drop the in-flight marker. Returns the checkpoint's URL.

        A PUT that raised is not taken at its word: S3 may have stored the manifest and lost
        the answer (a 500, a dropped connection; botocore's retry of such a PUT then meets
        ``If-None-Match``'s 412). The manifest is read back (:meth:`_read_back`) and the
        save counts when S3 holds exactly the bytes this call put.

        Raises:
            CheckpointError: no files, or the step was committed by another writer.
            CommitOutcomeUnknown: the PUT failed and S3 could not be read back.
            botocore errors: the PUT failed and no manifest is stored (nothing committed).
        """
        step_s, attempt = token.split(":")
        step, name = int(step_s), step_dir_name(int(step_s))
        if not files:
            raise CheckpointError(f"{self.url_of(self.key(name))}: nothing to commit")
        manifest = build_manifest(step, kind, world_size, meta, files, started_s)
        manifest["attempt"] = attempt
        key = self.key(name, MANIFEST_NAME)
        if self.manifest(step) is not None:
            raise CheckpointError(f"{self.url_of(key)} already exists; a checkpoint is never "
                                  "overwritten")
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as exc:
            self._read_back(key, body, exc)
        self._drop_inflight(name, attempt)
        return self.url_of(self.key(name))

    def _read_back(self, key: str, body: bytes, failure: Exception) -> None:
        """After the manifest PUT of ``body`` to ``key`` raised ``failure``: return when S3
        holds exactly ``body`` (stored, answer lost). One GET through the store's client,
        whose standard retry mode retries throttling, 5xx and connection errors with bounded
        jittered back-off (botocore "Retries" guide); S3 reads are strongly consistent after
        a write (Amazon S3 User Guide, "consistency model"), so absent means not stored.

        Raises:
            CheckpointError: another writer's manifest is there.
            CommitOutcomeUnknown: S3 could not be read either.
            ``failure``: no manifest is stored.
        """
        where = self.url_of(key)
        try:
            stored = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if error_code(exc) in NOT_FOUND:
                raise failure from None
            raise CommitOutcomeUnknown(
                f"{where}: commit outcome unknown: the manifest PUT failed ({failure}) and "
                f"reading it back failed too ({exc}); the uploaded data is kept, and the "
                "next save or restore uses the step only if it verifies") from None
        if stored != body:
            raise CheckpointError(f"{where} was committed by another writer; a checkpoint is "
                                  "never overwritten") from None
        log.warning("the manifest PUT of %s failed (%s) but S3 stored it: the checkpoint is "
                    "committed", where, failure)

    def _drop_inflight(self, name: str, attempt: str) -> None:
        with contextlib.suppress(Exception):
            self.client.delete_object(Bucket=self.bucket,
                                      Key=marker_key(self.prefix, name, attempt))

    def _referenced(self, step: int, attempt: str) -> str:
        """Why the data of ``attempt`` must stay ("" when it may go)."""
        try:
            manifest = self.manifest(step)
        except CheckpointError:
            return ""  # unreadable JSON names no attempt
        except Exception as exc:
            return f"cannot tell whether a stored manifest names it ({exc})"
        if manifest is not None and manifest.get("attempt") == attempt:
            return "the stored manifest names this attempt"
        return ""

    def abort(self, token: str) -> None:
        """Forget a failed save: delete its uploaded objects and its in-flight marker. The
        objects are kept when a stored manifest names this attempt, or when the manifest cannot
        be read to tell (a commit whose outcome is unknown): data a manifest references is
        never deleted. Errors are logged, not raised."""
        step, attempt = token.split(":")
        name = step_dir_name(int(step))
        why_kept = self._referenced(int(step), attempt)
        if why_kept:
            log.warning("keeping the uploaded data of %s: %s", self.url_of(self.key(name,
                        attempt)), why_kept)
            self._drop_inflight(name, attempt)
            return
        try:
            keys = [o["Key"] for page in self.list_pages(self.key(name, attempt) + "/")
                    for o in page.get("Contents", [])]
            self.delete_keys(keys)
        except Exception as exc:
            log.warning("could not clean up the failed upload %s: %s",
                        self.url_of(self.key(name, attempt)), exc)
        self._drop_inflight(name, attempt)

    def commit(self, staging: Path, step: int, kind: Literal["torch", "dcp"], world_size: int,
               meta: dict[str, Any], started_s: float | None = None) -> str:
        """Single-writer commit (the protocol's form): upload ``staging`` as a fresh attempt
        and write the manifest. The checkpointer uses :meth:`upload` on every rank and
        :meth:`commit_manifest` on rank 0 instead."""
        plan = self.stage(step)
        if plan[0] != "write":
            raise CheckpointError(plan[2])
        try:
            files = self.upload(staging, plan[1])
            return self.commit_manifest(plan[1], kind, world_size, meta, files, started_s)
        except BaseException:
            self.abort(plan[1])
            raise

    def discard_staging(self, staging: Path) -> None:
        """Delete this rank's local staging directory (its files are in the bucket or lost)."""
        shutil.rmtree(staging, ignore_errors=True)

    def fetch(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` as resolved on rank 0, downloaded on this rank too (a rank on another
        node has no copy of rank 0's download); sizes are checked here, the sha256 by the
        checkpointer while it loads the files (each file is read once).

        Raises:
            CheckpointError: the manifest is gone or a downloaded size is wrong.
        """
        if checkpoint.path.is_dir() and checkpoint.manifest is not None:
            return checkpoint
        manifest = checkpoint.manifest or self.manifest(checkpoint.step)
        if manifest is None:
            raise CheckpointError(f"{self.url}: step {checkpoint.step} is no longer committed")
        local = Path(tempfile.mkdtemp(prefix=f"{step_dir_name(checkpoint.step)}.restore-",
                                      dir=self._staging_root()))
        problem = self.download(checkpoint.step, manifest, local, False)
        if problem:
            shutil.rmtree(local, ignore_errors=True)
            raise CheckpointError(f"{self.url} step {checkpoint.step}: {problem}")
        self._downloaded = local
        return Checkpoint(local, checkpoint.step, checkpoint.kind, manifest)

    def release(self, checkpoint: Checkpoint) -> None:
        """Delete this rank's download of ``checkpoint`` (it is loaded; the bucket keeps it)."""
        if self._downloaded is not None and checkpoint.path == self._downloaded:
            shutil.rmtree(self._downloaded, ignore_errors=True)
            self._downloaded = None

    def has_committed(self) -> bool:
        """True when any ``step_N/manifest.json`` exists, readable or not (so that restore
        refuses to start from step 0 when every manifest is unreadable, as with the local
        store).

        Raises:
            botocore errors: S3 could not be read (after botocore's retries).
        """
        return any(self.exists(self.key(step_dir_name(step), MANIFEST_NAME))
                   for step in self.steps())

    def inflight(self) -> list[str]:
        """Keys of live in-flight markers: saves that made progress within
        ``inflight_stale_s`` seconds (rule: :mod:`slurm_spot.checkpoint.s3inflight`)."""
        return markers(self.client, self.bucket, self.prefix, self.inflight_stale_s,
                       self._clock())[0]

    def prune(self, keep: int, newest: str) -> list[str]:
        """Keep ``newest`` and the ``keep - 1`` newest older checkpoints that verify
        (:meth:`verify_sizes`); delete other committed ones at or below ``newest`` (manifest
        first, so a half-deleted one no longer exists), which includes manifests that do not
        verify (they never count among ``keep``), and abandoned attempts of steps without a
        manifest. Does nothing while a save is live (a live marker under ``_inflight/``);
        otherwise it also deletes stale markers and aborts multipart uploads older than
        ``inflight_stale_s`` (a killed writer's; S3 keeps and bills their parts). Returns the
        deleted checkpoints' URLs.

        Raises:
            ValueError: ``keep`` < 1.
            botocore errors: S3 could not be read or written.
        """
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        live, stale = markers(self.client, self.bucket, self.prefix, self.inflight_stale_s,
                              self._clock())
        if live:
            log.info("retention skipped: an upload to %s is in flight", self.url)
            return []
        if stale:
            log.info("dropping in-flight markers of saves without progress for %g s (their "
                     "writers died): %s", self.inflight_stale_s, ", ".join(stale))
            self.delete_keys(stale)
        newest_step = int(newest.rstrip("/").rsplit("step_", 1)[1])
        removed, kept = [], 1
        for step in self.steps():
            if step >= newest_step:
                continue
            name = step_dir_name(step)
            problem = self._committed_problem(step)
            if problem == "" and kept < keep:
                kept += 1
                continue
            if problem:
                log.warning("retention: deleting checkpoint %s, it is not usable: %s",
                            self.url_of(self.key(name)), problem)
            if problem is not None:
                self.delete_keys([self.key(name, MANIFEST_NAME)])
            self.delete_keys([o["Key"] for page in self.list_pages(self.key(name) + "/")
                          for o in page.get("Contents", [])])
            removed.append(self.url_of(self.key(name)))
        aborted = abort_dead_multipart_uploads(self.client, self.bucket, self.prefix,
                                               self.inflight_stale_s, self._clock())
        if aborted:
            log.info("aborted multipart uploads of dead saves: %s", ", ".join(aborted))
        return removed
