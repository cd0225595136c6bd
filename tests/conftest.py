"""Shared fixtures. End-to-end tests get a real local Slurm cluster from tests/cluster.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, base_config

DATA = Path(__file__).parent / "data"


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
