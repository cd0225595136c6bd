"""The one shape of every ``--json`` output (docs/cli.md, "JSON output"):

``{"meta": {"schema": 1, "version": "<slurm-spot version>", "command": "<command run>"},
"data": <what the command reports>}``

:func:`envelope` builds it (``commands.common.print_json`` prints it); :func:`read_envelope`
takes it apart again, for code that runs ``slurm-spot ... --json`` itself (the demos, tests).
"""

from __future__ import annotations

import json
from typing import Any

#: Version of the envelope's shape itself (not of ``data``): raised only if ``meta`` or
#: ``data`` change meaning, so that a script can refuse a shape it does not know.
JSON_SCHEMA = 1


def envelope(data: object, command: str) -> dict[str, object]:
    """``data`` wrapped as ``{"meta": {"schema", "version", "command"}, "data": data}``;
    ``command`` is the command without the program name (``plan``, ``local status``)."""
    from slurm_spot import __version__

    return {"meta": {"schema": JSON_SCHEMA, "version": __version__, "command": command},
            "data": data}


def read_envelope(text: str | bytes, command: str | None = None) -> Any:
    """The ``data`` of one ``--json`` document.

    Raises:
        ValueError: ``text`` is not JSON, not an envelope of schema :data:`JSON_SCHEMA`, or
            (``command`` given) comes from another command; the message says which.
    """
    doc = json.loads(text)
    meta = doc.get("meta") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or "data" not in doc:
        raise ValueError(f"not a slurm-spot --json envelope (no meta/data): {str(text)[:80]!r}")
    if meta.get("schema") != JSON_SCHEMA:
        raise ValueError(f"--json envelope schema {meta.get('schema')!r}: this code reads "
                         f"schema {JSON_SCHEMA}")
    if command is not None and meta.get("command") != command:
        raise ValueError(f"--json output of {meta.get('command')!r}, expected {command!r}")
    return doc["data"]
