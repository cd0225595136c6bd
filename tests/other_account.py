"""Running a Python process as another account (uid 65534) in the tests that check what such
an account is refused.

The tests' own interpreter is not always one that account can run: a pyenv Python under
``/root`` (mode 0700 on Debian) is out of its reach, and ``subprocess`` then fails with
PermissionError before the process exists. :func:`other_account_python` finds one it can run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

OTHER_UID = 65534
ROOT = Path(__file__).resolve().parent.parent


def _runs(executable: str, env: dict[str, str]) -> bool:
    try:
        done = subprocess.run([executable, "-c", "import slurm_spot"], user=OTHER_UID,
                              env={**os.environ, **env}, capture_output=True, timeout=120,
                              cwd="/", check=False)
    except PermissionError:
        return False
    return done.returncode == 0


@functools.cache
def _find() -> tuple[str, tuple[tuple[str, str], ...]] | None:
    path = os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])
    own = {"PYTHONPATH": str(ROOT)}
    if _runs(sys.executable, own):
        return sys.executable, tuple(own.items())
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    # The same minor version: the virtual environment's packages (compiled ones included)
    # import there, from PYTHONPATH.
    if system and _runs(system, {"PYTHONPATH": path}):
        return system, (("PYTHONPATH", path),)
    return None


def other_account_python() -> tuple[str, dict[str, str]]:
    """``(executable, environment additions)`` with which uid 65534 runs Python and imports
    this checkout's ``slurm_spot`` (and the virtual environment's packages): the tests' own
    interpreter where that account may execute it, else the system's Python of the same
    minor version with ``PYTHONPATH`` set. Skips the calling test (as root only; the callers
    skip otherwise) when there is neither."""
    found = _find()
    if found is None:
        pytest.skip(f"uid {OTHER_UID} can run neither {sys.executable} nor the system's "
                    f"python{sys.version_info[0]}.{sys.version_info[1]} with slurm_spot")
    executable, env = found
    return executable, dict(env)
