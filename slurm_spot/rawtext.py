"""Text from outside slurm-spot that need not be UTF-8, read without loss and shown escaped.

Slurm passes a user's bytes through unchanged: a job name, a comment, a node reason or a batch
script holding an invalid UTF-8 byte (``sbatch -J $'bad\\xff'``) comes back as that byte in
``squeue --json`` and ``scontrol -o show job``. Such bytes are read with
:data:`DECODE_ERRORS` (``surrogateescape``, PEP 383): every byte is kept (``\\xff`` becomes the
lone surrogate ``\\udcff``), so the text parses like any other and gives the same bytes back
when passed to a command again. Where text leaves slurm-spot (the events file, ``--json``,
the terminal, the log), :func:`escaped` shows each such byte as ``\\xff``: the output stays
valid UTF-8 and JSON, and nobody's bytes can make a writer fail.

slurm-spot acts on jobs by their id, never by a name read back from Slurm.
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Mapping

DECODE_ERRORS = "surrogateescape"
"""The ``errors`` with which bytes from outside are decoded (UTF-8): nothing is lost."""

OUTPUT_ERRORS = "slurm-spot-escape"
"""The ``errors`` of slurm-spot's stdout and stderr once :func:`use_escaped_output` ran: an
undecodable byte is written as ``\\xff``, any other character the stream cannot encode as
``backslashreplace`` writes it."""


def decode(raw: bytes) -> str:
    """``raw`` (bytes a command printed, a file another user wrote) as UTF-8 text, every
    invalid byte kept as a surrogate (:data:`DECODE_ERRORS`). Never raises."""
    return raw.decode("utf-8", DECODE_ERRORS)


def _escape_char(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escaped(text: str) -> str:
    """``text`` with every undecodable byte kept by :func:`decode` shown as ``\\xNN`` (and
    any other lone surrogate as ``\\uXXXX``): valid UTF-8, safe to write anywhere. Text that
    is valid already is returned unchanged. Never raises."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_escape_char(c) if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def escaped_all(value: object) -> object:
    """``value`` (a JSON-like tree: dicts, lists, tuples, strings, numbers) with every string,
    keys included, passed through :func:`escaped`; anything else unchanged. For writing
    text read from outside as JSON that every reader accepts."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, Mapping):
        return {escaped_all(k): escaped_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escaped_all(v) for v in value]
    return value


def _escape_error(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(_escape_char(c) for c in exc.object[exc.start:exc.end]), exc.end


def use_escaped_output() -> None:
    """Make this process's stdout and stderr write what they cannot encode escaped
    (:data:`OUTPUT_ERRORS`) instead of raising UnicodeEncodeError: a job name holding an
    invalid byte printed by any command, or logged, shows as ``bad\\xff``. Streams that are
    not text files (replaced by a test) are left as they are."""
    try:
        codecs.lookup_error(OUTPUT_ERRORS)
    except LookupError:
        codecs.register_error(OUTPUT_ERRORS, _escape_error)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors=OUTPUT_ERRORS)
