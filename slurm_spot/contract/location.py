"""Where checkpoints live: which store a checkpoint root names, and the per-job layout.

The one home of two facts the prolog, the job environment, the Checkpointer, ``cost``,
``plan`` and ``sbatch`` share (docs/DESIGN.md, "Contract"):

- a *root* (or any checkpoint location) is either a directory of a POSIX file system, kept as a
  :class:`~pathlib.Path`, or an ``s3://bucket/prefix`` URL, kept as the string it is (a
  ``Path`` would fold its ``//`` into ``s3:/bucket``);
- a job's checkpoints live in ``<root>/<user>/<key>``, where the key is the job id, or
  ``<array job id>_<task id>`` for an array task: the same across requeues, never the restart
  count.

Nothing here touches a file system or the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from slurm_spot.errors import CheckpointError

#: A checkpoint location: a directory, or a store's URL (``s3://...``) as a string.
Location = Path | str

S3_SCHEME = "s3://"
_KEY = re.compile(r"[0-9]+(_[0-9]+)?")


def is_s3(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` is an ``s3://bucket/prefix`` URL (it selects the S3 store)."""
    return os.fspath(location).startswith(S3_SCHEME)


#: The URL schemes of checkpoint stores that are not a POSIX directory: a root or location
#: starting with one is kept as a string (never a Path) and joined with ``/``. A new store
#: with a URL scheme adds its scheme here (docs/DESIGN.md, "Adding a checkpoint store").
URL_SCHEMES: tuple[str, ...] = (S3_SCHEME,)


def is_url(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` names a store by URL (:data:`URL_SCHEMES`), not a directory."""
    return os.fspath(location).startswith(URL_SCHEMES)


def local_path(location: Location) -> Path | None:
    """The directory ``location`` names, or None when it names a store by URL
    (:func:`is_url`): how code outside the checkpoint package tells the two apart, with the
    type checker following."""
    return None if is_url(location) else Path(location)


def url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The scheme of :data:`URL_SCHEMES` that ``location`` starts with (``"s3://"``), or None
    for a directory. The checkpoint package opens the store registered for it."""
    raw = os.fspath(location)
    return next((scheme for scheme in URL_SCHEMES if raw.startswith(scheme)), None)


_ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def unknown_url_scheme(location: str | os.PathLike[str]) -> str | None:
    """The ``scheme://`` that ``location`` starts with when it is not one of
    :data:`URL_SCHEMES` (``"gs://"`` while no store has that scheme), else None: such a text
    names a store nobody implements and must be refused, never taken for a directory (a
    :class:`~pathlib.Path` would fold it into the relative ``gs:/bucket``)."""
    match = _ANY_SCHEME.match(os.fspath(location))
    return match[0] if match and not is_url(location) else None


def as_location(text: str | os.PathLike[str]) -> Location:
    """``text`` as a location: a store's URL (``s3://...``, :func:`is_url`) stays the string
    it is, anything else is a :class:`~pathlib.Path`."""
    raw = os.fspath(text)
    return raw if is_url(raw) else Path(raw)


def job_key(job_id: int | str, array_job_id: int | str | None = None,
            array_task_id: int | str | None = None) -> str:
    """The key of a job's checkpoint directory: ``"<array job id>_<task id>"`` for an array
    task (both given), else the job id.

    Raises:
        ValueError: an id that is not a decimal number, or only one of the two array ids.
    """
    if (array_job_id is None) != (array_task_id is None):
        raise ValueError("an array task needs both its array job id and its task id")
    key = f"{array_job_id}_{array_task_id}" if array_job_id is not None else str(job_id)
    if not _KEY.fullmatch(key):
        raise ValueError(f"checkpoint key {key!r} is not a job id or <array job>_<task>")
    return key


def is_job_key(text: str) -> bool:
    """True for a job id or ``<array job id>_<task id>``."""
    return _KEY.fullmatch(text) is not None


def job_directory(root: Location, user: str, key: str) -> Location:
    """``<root>/<user>/<key>``: where the job's checkpoints live (an ``s3://`` URL under an
    S3 root). ``user`` and ``key`` are taken as given: the caller checks them (the prolog
    refuses names that are not plain, :mod:`slurm_spot.jobs.node.prolog`)."""
    if isinstance(root, str) or is_url(root):
        return f"{os.fspath(root).rstrip('/')}/{user}/{key}"
    return root / user / key


def parse_s3_url(url: str) -> tuple[str, str]:
    """``("bucket", "prefix/")`` of ``s3://bucket/prefix`` (the prefix ends with ``/`` or is
    empty; percent-escapes are decoded, other characters kept as they are).

    Raises:
        CheckpointError: not an ``s3://`` URL, or no bucket.
    """
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise CheckpointError(f"{url!r} is not an s3://bucket/prefix URL")
    prefix = unquote(parsed.path).strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""
