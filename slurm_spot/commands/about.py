"""``slurm-spot --version``: this package, the Slurm it finds, and which extras are installed."""

from __future__ import annotations

import importlib.metadata as metadata
import platform
import re

from slurm_spot import __version__

#: Extras for developing slurm-spot itself, not for a site: left out of ``--version``.
_NOT_SHOWN = {"dev"}


def extras_status(dist: str = "slurm-spot") -> dict[str, list[tuple[str, str | None, bool]]]:
    """Per extra of ``dist``'s metadata (``pip install slurm-spot[aws]``): each requirement as
    ``(name, installed version or None, satisfies the requirement)``. Read from the installed
    metadata, so it follows pyproject.toml's ``[project.optional-dependencies]``.

    Returns an empty dict when ``dist`` is not installed (a bare source tree).
    """
    from packaging.requirements import Requirement

    try:
        requires = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return {}
    result: dict[str, list[tuple[str, str | None, bool]]] = {}
    for text in requires:
        req = Requirement(text)
        match = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", str(req.marker or ""))
        if match is None or match.group(1) in _NOT_SHOWN:
            continue
        try:
            found: str | None = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            found = None
        ok = found is not None and req.specifier.contains(found, prereleases=True)
        result.setdefault(match.group(1), []).append((req.name, found, ok))
    return result


def version_text() -> str:
    """The lines ``--version`` prints: slurm-spot's version, Python's, the Slurm found
    (:meth:`~slurm_spot.slurm.version.SlurmVersion.detect`: ``slurmctld -V``, ``scontrol -V``,
    ``sinfo --version``) and one line per extra (installed, or what is missing)."""
    from slurm_spot.slurm.version import SlurmVersion

    slurm = SlurmVersion.detect(timeout_s=5)
    lines = [f"slurm-spot {__version__}", f"Python {platform.python_version()}",
             f"Slurm {slurm}" if slurm else "Slurm: not found (no slurmctld, scontrol or sinfo "
                                            "answered)"]
    for extra, reqs in sorted(extras_status().items()):
        if all(ok for _, _, ok in reqs):
            detail = ", ".join(f"{name} {found}" for name, found, _ in reqs)
            lines.append(f"extra {extra}: installed ({detail})")
        else:
            missing = ", ".join(name if found is None else f"{name} {found} (unsupported)"
                                for name, found, ok in reqs if not ok)
            lines.append(f"extra {extra}: not installed (missing {missing}; "
                         f"pip install 'slurm-spot[{extra}]')")
    return "\n".join(lines)
