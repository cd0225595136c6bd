"""Shared by the benchmark scripts: each owns one marked section of BENCHMARKS.md."""

from __future__ import annotations

import re
from pathlib import Path


def write_section(path: Path, begin: str, end: str, text: str) -> None:
    """Replace the section between the ``begin``/``end`` markers of ``path`` with ``text``
    (which includes the markers), or append it; the rest of the file is left alone."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: text, old) if pattern.search(old) else old.rstrip() + "\n\n" + text
    path.write_text(new.rstrip() + "\n")
