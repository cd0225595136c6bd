"""Shared fixtures. End-to-end tests get a real local Slurm cluster from tests/cluster.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, base_config

DATA = Path(__file__).parent / "data"

_prebuild: subprocess.Popen[bytes] | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """When the version matrix is among the selected tests and can run here, start building its
    Debian roots in the background now (tests/slurmroots.py), so debootstrap overlaps the rest
    of the suite rather than adding minutes to the matrix test."""
    global _prebuild
    if not any(item.nodeid.startswith("tests/test_slurm_matrix.py") for item in session.items):
        return
    from tests import slurmroots
    if (os.geteuid() != 0 or os.environ.get(slurmroots.INSIDE_ENV)
            or os.environ.get("SLURM_SPOT_MATRIX") == "0"):
        return
    _prebuild = slurmroots.start_prebuild()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the background root builder if the session ends before it does (a half-built root
    is removed by the next build)."""
    if _prebuild is not None and _prebuild.poll() is None:
        os.killpg(_prebuild.pid, signal.SIGTERM)  # the builder and its debootstrap, nothing else
        try:
            _prebuild.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(_prebuild.pid, signal.SIGKILL)
            _prebuild.wait()


def _slurm_available() -> bool:
    return shutil.which("slurmctld") is not None or Path("/usr/sbin/slurmctld").exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running local cluster (no reconciler) for the tests of one module."""
    if not _slurm_available():
        pytest.fail("slurmctld is not installed: run 'make test', which installs slurm-wlm")
    root = tmp_path_factory.mktemp("cluster")
    c = Cluster(root, base_config(root))
    c.start()
    try:
        yield c
    finally:
        c.stop()
