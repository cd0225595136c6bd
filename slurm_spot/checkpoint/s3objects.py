"""The objects of one ``s3://bucket/prefix`` as the S3 checkpoint store reads them: the boto3
client (endpoint, addressing style, retries), object keys and URLs, listing, JSON reads, batch
deletes, the committed steps and their manifests, and the download of one checkpoint.

:class:`~slurm_spot.checkpoint.s3.S3Store` builds the save protocol (staging, upload, commit,
abort, retention) on top of it; the layout of the prefix and the choice of boto3 are described
there. Nothing here writes to the bucket except :meth:`S3Objects.delete_keys`. No torch.

boto3 references: ``S3.Client.download_file`` with ``boto3.s3.transfer.TransferConfig``,
``list_objects_v2`` (``Delimiter``/``CommonPrefixes``), ``delete_objects`` (at most 1000 keys a
call), ``botocore.config.Config(s3={"addressing_style": ...})``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from slurm_spot.checkpoint.files import (
    FORMAT,
    MANIFEST_NAME,
    Candidate,
    CheckpointError,
    step_dir_name,
    validate,
)
from slurm_spot.contract.location import parse_s3_url
from slurm_spot.contract.names import ENV_S3_ADDRESSING_STYLE, ENV_S3_ENDPOINT_URL

log = logging.getLogger(__name__)

#: The job contract's S3 pair (:mod:`slurm_spot.contract.names`), under this module's names.
ENV_ENDPOINT_URL = ENV_S3_ENDPOINT_URL
ENV_ADDRESSING_STYLE = ENV_S3_ADDRESSING_STYLE
MiB = 1 << 20

#: S3 error codes that mean "no such object" (``get_object`` and ``head_object``).
NOT_FOUND = ("NoSuchKey", "404", "NotFound")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` ("" for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class S3Objects:
    """The objects under ``s3://bucket/prefix``.

    Args:
        url: ``s3://bucket/prefix``; keys may hold spaces, ``+``, ``=`` and non-ASCII text.
        endpoint_url: the S3 endpoint (MinIO, a European provider, moto); None:
            ``SLURM_SPOT_S3_ENDPOINT_URL`` in ``env``, else boto3's own handling.
        addressing_style: ``path``, ``virtual`` or ``auto`` (botocore's S3 option); None:
            ``SLURM_SPOT_S3_ADDRESSING_STYLE`` in ``env``, else ``auto``.
        part_size: multipart chunk size in bytes (>= 5 MiB, S3's minimum part size).
        max_concurrency: parallel part uploads/downloads per file.
        client: a ready boto3 S3 client (tests); credentials otherwise from boto3's chain.
        env: the environment to read (default ``os.environ``).

    Attributes:
        url: the URL without a trailing ``/``; ``bucket`` and ``prefix`` its parts.

    Raises:
        CheckpointError: a malformed URL or addressing style, a part size under 5 MiB.
    """

    def __init__(self, url: str, *, endpoint_url: str | None = None,
                 addressing_style: str | None = None, part_size: int = 16 * MiB,
                 max_concurrency: int = 8, client: Any = None,
                 env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(url)
        self.endpoint_url = endpoint_url or env.get(ENV_ENDPOINT_URL) or None
        style = addressing_style or env.get(ENV_ADDRESSING_STYLE) or "auto"
        if style not in ("auto", "path", "virtual"):
            raise CheckpointError(f"S3 addressing style {style!r}: use auto, path or virtual")
        self.addressing_style = style
        if part_size < 5 * MiB:
            raise CheckpointError(f"S3 part size {part_size} bytes is under S3's 5 MiB minimum")
        self.part_size = part_size
        self.max_concurrency = max_concurrency
        self._client = client

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use; credentials from boto3's chain)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint_url,
                config=Config(s3={"addressing_style": self.addressing_style},  # type: ignore[arg-type]
                              retries={"max_attempts": 5, "mode": "standard"},
                              max_pool_connections=max(10, 2 * self.max_concurrency)))
        return self._client

    def transfer_config(self) -> Any:
        """boto3's ``TransferConfig`` for one file: multipart above ``part_size`` bytes, parts
        of ``part_size``, ``max_concurrency`` threads."""
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.part_size,
                              multipart_chunksize=self.part_size,
                              max_concurrency=self.max_concurrency, use_threads=True)

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` under the prefix (``prefix + "/".join(parts)``)."""
        return self.prefix + "/".join(parts)

    def url_of(self, key: str) -> str:
        """``s3://bucket/key``, for messages and for what the store returns."""
        return f"s3://{self.bucket}/{key}"

    def list_pages(self, prefix: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        """Pages of ``list_objects_v2`` under the key prefix ``prefix`` (``Contents``, and
        ``CommonPrefixes`` with a ``delimiter``).

        Raises:
            botocore errors: the listing failed (after botocore's retries).
        """
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        yield from self.client.get_paginator("list_objects_v2").paginate(**kwargs)

    def get_json(self, key: str) -> dict[str, Any] | None:
        """The JSON object at ``key``, None when it does not exist.

        Raises:
            CheckpointError: it exists but is not a JSON object.
            botocore errors: S3 could not be read (anything but "not found").
        """
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if error_code(exc) in NOT_FOUND:
                return None
            raise
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise CheckpointError(f"{self.url_of(key)}: unreadable manifest: {exc}") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{self.url_of(key)}: not a manifest")
        return data

    def steps(self) -> list[int]:
        """Step numbers that have a ``step_N/`` prefix (committed or not), newest first.

        Raises:
            botocore errors: the listing failed.
        """
        found: set[int] = set()
        for page in self.list_pages(self.prefix, "/"):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self.prefix):].rstrip("/")
                if name.startswith("step_") and name[5:].isdigit():
                    found.add(int(name[5:]))
        return sorted(found, reverse=True)

    def manifest(self, step: int) -> dict[str, Any] | None:
        """The manifest of ``step``, or None when the step is not committed.

        Raises:
            CheckpointError: the manifest is not a JSON object.
            botocore errors: S3 could not be read.
        """
        return self.get_json(self.key(step_dir_name(step), MANIFEST_NAME))

    def committed(self) -> list[tuple[int, dict[str, Any]]]:
        """``(step, manifest)`` of every committed checkpoint, newest first (unreadable
        manifests are skipped with a warning)."""
        out = []
        for step in self.steps():
            try:
                manifest = self.manifest(step)
            except CheckpointError as exc:
                log.warning("skipping %s", exc)
                continue
            if manifest is not None:
                out.append((step, manifest))
        return out

    @staticmethod
    def manifest_problem(step: int, manifest: dict[str, Any]) -> str:
        """What makes ``manifest`` unusable as the manifest of ``step`` ("" when nothing):
        another format or step, no attempt id, no files, a file name that is not a plain
        relative path. Reads nothing."""
        attempt = manifest.get("attempt")
        if manifest.get("format") != FORMAT or manifest.get("step") != step:
            return "not a slurm-spot manifest of this step"
        if not isinstance(attempt, str) or not attempt or "/" in attempt:
            return "the manifest names no attempt"
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "the manifest lists no files"
        for rel in files:
            parts = Path(rel).parts
            if not parts or Path(rel).is_absolute() or ".." in parts:
                return f"manifest entry {rel!r} is not a plain relative path"
        return ""

    def verify_sizes(self, step: int, manifest: dict[str, Any]) -> str:
        """Why the checkpoint of ``step`` described by ``manifest`` cannot be loaded, judged
        from one listing of its attempt's prefix (every file present, with the manifest's size
        in bytes; nothing is downloaded), or "" when it can. The sha256 is checked when it is
        downloaded (:meth:`latest`). Used by :meth:`stage` and :meth:`prune`.

        Raises:
            botocore errors: the listing failed (after botocore's retries).
        """
        problem = self.manifest_problem(step, manifest)
        if problem:
            return problem
        base = self.key(step_dir_name(step), manifest["attempt"]) + "/"
        sizes = {o["Key"][len(base):]: o["Size"] for page in self.list_pages(base)
                 for o in page.get("Contents", [])}
        for rel, entry in sorted(manifest["files"].items()):
            if rel not in sizes:
                return f"{rel} named by the manifest is missing"
            if not isinstance(entry, dict) or sizes[rel] != entry.get("size"):
                return f"{rel} has {sizes[rel]} bytes, not the manifest's"
        return ""

    def download(self, step: int, manifest: dict[str, Any], local: Path,
                  verify_checksums: bool) -> str:
        """Download the checkpoint of ``step`` that ``manifest`` describes into the empty
        directory ``local`` (parallel multipart), write its manifest there and validate the
        copy by the POSIX rules (:func:`~slurm_spot.checkpoint.files.validate`: sizes, sha256
        with ``verify_checksums``). Returns why it is not usable, "" when it is.

        Raises:
            botocore/boto3 errors: a download failed.
        """
        problem = self.manifest_problem(step, manifest)
        if problem:
            return problem
        attempt = manifest["attempt"]
        for rel in manifest["files"]:
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, self.key(step_dir_name(step), attempt, rel),
                                      str(target), Config=self.transfer_config())
        # the local copy now has the POSIX layout: validate it with the POSIX rules
        (local / MANIFEST_NAME).write_text(json.dumps(manifest))
        return validate(Candidate(local, step, "dir"), verify_checksums)

    def exists(self, key: str) -> bool:
        """True when the object ``key`` exists (a HEAD request).

        Raises:
            botocore errors: S3 could not be read (anything but "not found").
        """
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            if error_code(exc) in NOT_FOUND:
                return False
            raise
        return True

    def delete_keys(self, keys: list[str]) -> None:
        """Delete the objects ``keys`` (``delete_objects``, at most 1000 keys a call; a
        missing key is no error).

        Raises:
            botocore errors: a call failed (the keys of earlier calls are gone).
        """
        for i in range(0, len(keys), 1000):
            chunk = keys[i:i + 1000]
            if chunk:
                self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": k} for k in chunk], "Quiet": True})
