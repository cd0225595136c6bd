"""What a failed save is reported as: the error chain searched for a full device or an
exceeded quota (ENOSPC, EDQUOT), and the free space read after the failure, so that the
message leads with what a user must act on. No torch here.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from slurm_spot.contract.location import is_url

#: Free space (bytes) under which a failed write is reported as a full device even when the
#: error itself does not say so.
NEARLY_FULL_BYTES = 1 << 20


def _free_bytes(path: Path) -> int | None:
    """Bytes this process may still write on the file system of ``path`` (or of its nearest
    existing parent): ``f_bavail`` (``f_bfree`` for root, who may use the reserved blocks)
    times ``f_frsize``, from statvfs(3); None if that cannot be read."""
    for candidate in (path, *path.parents):
        try:
            info = os.statvfs(candidate)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        blocks = info.f_bfree if os.geteuid() == 0 else info.f_bavail
        return blocks * info.f_frsize
    return None


def describe_write_error(exc: BaseException, path: str | os.PathLike[str] | None) -> str:
    """``"<Type>: <message>"`` for a failed save, led by what a user must act on when the
    device holding ``path`` is full.

    A full disk often surfaces as a secondary error: ``torch.save`` into a file object that
    raised ``OSError(ENOSPC)`` fails in its zip writer with ``RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos``, the OSError only in ``__context__``. So the chain
    (``__cause__``/``__context__``) is searched for ENOSPC or EDQUOT (errno(3)), and otherwise
    the free space after the failure is read with statvfs(3): under
    :data:`NEARLY_FULL_BYTES` the device counts as full too.
    """
    text = f"{type(exc).__name__}: {exc}"
    seen: set[int] = set()
    cause: BaseException | None = exc
    code = None
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            code = cause.errno
            break
        cause = cause.__cause__ or cause.__context__
    if path is None or is_url(path):
        free = None
    else:
        free = _free_bytes(Path(path))
    if code is None and (free is None or free >= NEARLY_FULL_BYTES):
        return text
    what = ("is over its disk quota" if code == errno.EDQUOT else
            "is full" if code == errno.ENOSPC else "is nearly full")
    why = "; ".join(([os.strerror(code)] if code else [])
                    + ([f"{free} bytes free after the failed write"] if free is not None else []))
    return f"the device holding {path} {what} ({why}); free space or checkpoint elsewhere ({text})"
