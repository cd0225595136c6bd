"""In-flight markers of S3 saves, and what a killed save leaves behind.

A save puts ``_inflight/step_<N>.<attempt>`` before it writes anything and deletes it after
its commit (:mod:`slurm_spot.checkpoint.s3`); retention does nothing while a *live* marker
exists, because it could delete what that writer is uploading. A writer killed mid-save
(SIGKILL, a reclaimed spot node) never deletes its marker, so liveness is decided from
progress, not from the marker's mere existence:

**The rule.** A marker is live while the newest of these is younger than ``stale_after_s``
(default :data:`INFLIGHT_STALE_S`, 15 minutes): the marker's own ``LastModified`` (the writer
re-puts it at least every ``stale_after_s / 3`` while it uploads: :class:`Heartbeat`), the
``LastModified`` of any object under its attempt's prefix ``step_<N>/<attempt>/``, and the
``Initiated`` time of any multipart upload under that prefix. Older than that, the writer is
dead: its marker no longer holds retention back, and retention deletes it and aborts its
multipart uploads (:func:`abort_dead_multipart_uploads`).

Facts used (Amazon S3 API reference): ``ListObjectsV2`` returns ``LastModified`` per key;
``ListMultipartUploads`` returns ``Key``, ``UploadId`` and ``Initiated`` per upload in progress
and takes a ``Prefix``; ``AbortMultipartUpload`` frees the parts (S3 stores and bills parts of
an upload that is never completed or aborted, until a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` removes them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)

INFLIGHT = "_inflight"
#: Seconds without any progress (see the module docstring) after which a save is dead.
INFLIGHT_STALE_S = 15 * 60.0


def marker_key(prefix: str, name: str, attempt: str) -> str:
    """The key of the in-flight marker of ``attempt`` of step directory ``name``."""
    return f"{prefix}{INFLIGHT}/{name}.{attempt}"


def put_marker(client: Any, bucket: str, key: str, now_s: float) -> None:
    """Put (or refresh) an in-flight marker; its body says who wrote it and when (seconds
    since the epoch), for a human reading the bucket."""
    client.put_object(Bucket=bucket, Key=key,
                      Body=json.dumps({"started_unix_s": now_s, "pid": os.getpid()}).encode())


def _pages(client: Any, operation: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    yield from client.get_paginator(operation).paginate(**kwargs)


def _uploads(client: Any, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    for page in _pages(client, "list_multipart_uploads", Bucket=bucket, Prefix=prefix):
        yield from page.get("Uploads", [])


def _newest_progress_s(client: Any, bucket: str, attempt_prefix: str, marker_s: float) -> float:
    """The newest of the marker's time and its attempt's object and upload times (seconds
    since the epoch)."""
    times = [marker_s]
    for page in _pages(client, "list_objects_v2", Bucket=bucket, Prefix=attempt_prefix):
        times += [o["LastModified"].timestamp() for o in page.get("Contents", [])]
    times += [u["Initiated"].timestamp() for u in _uploads(client, bucket, attempt_prefix)]
    return max(times)


def markers(client: Any, bucket: str, prefix: str, stale_after_s: float,
            now_s: float) -> tuple[list[str], list[str]]:
    """``(live, stale)`` marker keys under ``prefix`` by the rule of this module.

    Args:
        prefix: the job's prefix (``""`` or ending with ``/``).
        stale_after_s: seconds without progress after which a save is dead.
        now_s: the time to judge at (seconds since the epoch).

    Raises:
        botocore errors: listing failed (after botocore's own retries).
    """
    live: list[str] = []
    stale: list[str] = []
    for page in _pages(client, "list_objects_v2", Bucket=bucket, Prefix=f"{prefix}{INFLIGHT}/"):
        for obj in page.get("Contents", []):
            key, marker_s = obj["Key"], obj["LastModified"].timestamp()
            if now_s - marker_s < stale_after_s:
                live.append(key)
                continue
            name, _, attempt = key.rsplit("/", 1)[1].partition(".")
            progress_s = _newest_progress_s(client, bucket, f"{prefix}{name}/{attempt}/",
                                            marker_s) if attempt else marker_s
            (live if now_s - progress_s < stale_after_s else stale).append(key)
    return live, stale


def abort_dead_multipart_uploads(client: Any, bucket: str, prefix: str,
                                 older_than_s: float, now_s: float) -> list[str]:
    """Abort every multipart upload under ``prefix`` initiated more than ``older_than_s``
    seconds before ``now_s`` (call it only when no save is live: a live writer's uploads are
    younger than that by the rule of this module). Returns the aborted keys; a failure to
    abort one is logged and the others still tried."""
    aborted = []
    for upload in _uploads(client, bucket, prefix):
        initiated: datetime = upload["Initiated"]
        if now_s - initiated.timestamp() < older_than_s:
            continue
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"],
                                          UploadId=upload["UploadId"])
        except Exception as exc:
            log.warning("could not abort the dead multipart upload of s3://%s/%s: %s",
                        bucket, upload["Key"], exc)
            continue
        aborted.append(upload["Key"])
    return aborted


class Heartbeat:
    """A boto3 transfer ``Callback`` (called with bytes transferred, from transfer threads)
    that re-puts the save's in-flight marker at most every ``every_s`` seconds, so a long
    upload is never taken for a dead one. A failed refresh is ignored (the next one retries;
    the attempt's objects count as progress too)."""

    def __init__(self, client: Any, bucket: str, key: str, every_s: float,
                 clock: Callable[[], float]) -> None:
        self._client, self._bucket, self._key = client, bucket, key
        self._every_s, self._clock = every_s, clock
        self._last_s = clock()
        self._lock = threading.Lock()

    def __call__(self, bytes_transferred: int = 0) -> None:
        now_s = self._clock()
        with self._lock:
            if now_s - self._last_s < self._every_s:
                return
            self._last_s = now_s
        with contextlib.suppress(Exception):
            put_marker(self._client, self._bucket, self._key, now_s)
