"""Checksums computed while a checkpoint file is written and while it is read, so that no file
is read twice (once to hash, once to load). No torch here.

- :class:`HashingWriter` wraps the open data file that ``torch.save`` writes into: every
  ``write`` updates a sha256 of the bytes in the order they go to the file. ``torch.save`` to a
  file object writes strictly sequentially (its zip writer refuses a write at any offset other
  than the current end), so the digest is the file's sha256. The bytes hashed are the bytes
  handed to the kernel, the content the manifest vouches for; a re-read right after the write
  would hash the same page-cache copy. Large writes are hashed in a helper thread while the
  calling thread writes the same buffer (``hashlib`` and ``write`` both release the GIL), so on
  two or more cores the hash costs about the longer of the two, not their sum.
- :func:`mapped_digest` hashes a file through a read-only memory map: the pages it faults in
  are the page-cache pages that ``torch.load(mmap=True)`` maps next, so verifying a checkpoint
  and loading it read the file from the disk once.

References: Python's :mod:`hashlib` (update releases the GIL for data over 2047 bytes),
:mod:`mmap` (``madvise``, ``MADV_SEQUENTIAL``), ``torch.save``/``torch.load(mmap=True)`` in
torch's ``torch/serialization.py``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from typing import IO, Any

#: Writes of at least this many bytes are hashed in the helper thread (smaller ones inline:
#: starting the hand-off costs more than hashing them).
PARALLEL_MIN_BYTES = 1 << 20


class _Hasher:
    """A helper thread that runs ``digest.update`` for the writer, one buffer at a time."""

    def __init__(self, digest: Any) -> None:
        self._digest = digest
        self._todo: memoryview | None = None
        self._ready = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="slurm-spot-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._todo is None and not self._closed:
                    self._ready.wait()
                if self._todo is None:
                    return
                todo = self._todo
            self._digest.update(todo)
            with self._ready:
                self._todo, self._busy = None, False
                self._ready.notify_all()

    def start(self, data: memoryview) -> None:
        with self._ready:
            self._todo, self._busy = data, True
            self._ready.notify_all()

    def join(self) -> None:
        with self._ready:
            while self._busy:
                self._ready.wait()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self._thread.join()


class HashingWriter:
    """A write-only file object that hashes (sha256) and counts what it writes to ``raw``.

    Give it to ``torch.save`` (or any writer that writes sequentially) instead of the file;
    :meth:`digest` then gives the manifest entry of the file. Use as a context manager (or call
    :meth:`close`) to stop the helper thread; ``raw`` is not closed.

    Args:
        raw: a binary file opened for writing at offset 0.
        parallel: hash large writes in a helper thread while ``raw`` writes them.
    """

    def __init__(self, raw: IO[bytes], *, parallel: bool = True) -> None:
        self.raw = raw
        self.size = 0
        self._sha = hashlib.sha256()
        self._parallel = parallel and (os.cpu_count() or 1) > 1
        self._hasher: _Hasher | None = None  # started on the first large write

    def write(self, data: Any) -> int:
        """Hash ``data`` (bytes-like) and write all of it to ``raw``; returns its length."""
        view = memoryview(data).cast("B")
        if self._parallel and view.nbytes >= PARALLEL_MIN_BYTES:
            if self._hasher is None:
                self._hasher = _Hasher(self._sha)
            self._hasher.start(view)
            try:
                self._write_all(view)
            finally:
                self._hasher.join()  # the caller may reuse its buffer once write returns
        else:
            self._sha.update(view)
            self._write_all(view)
        self.size += view.nbytes
        return view.nbytes

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:
            written = self.raw.write(view[done:])
            if written is None:  # a non-blocking raw stream: never for regular files
                raise OSError(f"short write to {getattr(self.raw, 'name', self.raw)!r}")
            done += written

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def digest(self) -> dict[str, Any]:
        """``{"size": bytes written, "sha256": hex}``: the manifest entry of the file."""
        return {"size": self.size, "sha256": self._sha.hexdigest()}

    def close(self) -> None:
        if self._hasher is not None:
            self._hasher.close()
            self._hasher = None

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mapped_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of a regular file, hashed through a read-only memory map
    (no copy into a user buffer; the pages stay in the page cache for a following
    ``torch.load(mmap=True)`` of the same file). An empty file is hashed without a map.

    Raises:
        OSError: the file cannot be opened or mapped.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                if hasattr(mapped, "madvise"):
                    mapped.madvise(mmap.MADV_SEQUENTIAL)  # a larger read-ahead window
                digest.update(mapped)
    return size, digest.hexdigest()
