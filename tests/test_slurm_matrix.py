"""The Slurm version matrix: the smoke (tests/test_slurm_smoke.py) and the demo on every Slurm
of tests/slurmroots.py other than the host's, each in its debootstrapped Debian root.

The roots are built once (cached under /var/cache/slurm-spot/roots) from the host's Debian
mirror, so a fresh machine needs network access to it. Inside a root the same checkout, venv
and tests run against that root's slurmctld/slurmd/scontrol; each test there takes the
machine-wide test-cluster lock itself, so this test holds none. A failure names the Slurm
version. ``make test-slurm VERSION=24.11`` runs the whole end-to-end suite in one root.

Skipped inside a root (no roots within roots) and where SLURM_SPOT_MATRIX=0.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import slurmroots
from tests.cluster import LOCK_HELD_ENV, acquire_cluster_lock
from tests.netns import host_network

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

SMOKE = ["tests/test_slurm_smoke.py",
         "tests/test_jobs_e2e.py::test_demo_survives_two_interruptions_bit_exact"]


def _skip_reason() -> str | None:
    if os.environ.get(slurmroots.INSIDE_ENV):
        return "already inside a Slurm root"
    if os.environ.get("SLURM_SPOT_MATRIX") == "0":
        return "SLURM_SPOT_MATRIX=0"
    if os.geteuid() != 0:
        return "building and mounting Debian roots needs root"
    return None


@pytest.fixture(scope="module")
def machine_lock() -> Iterator[None]:
    """The test-cluster lock, held once for every version of the matrix (each root's run then
    takes none): other test runs on the machine wait for the whole matrix, not in between."""
    if _skip_reason():
        yield
        return
    with acquire_cluster_lock():
        before = os.environ.get(LOCK_HELD_ENV)
        os.environ[LOCK_HELD_ENV] = str(os.getpid())
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(LOCK_HELD_ENV, None)
            else:
                os.environ[LOCK_HELD_ENV] = before


@pytest.mark.parametrize("series", sorted(slurmroots.SUITES))
def test_smoke_and_demo_on_other_slurm(series: str, machine_lock: None) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    suite = slurmroots.SUITES[series]
    host = slurmroots.host_series()
    if host == series:
        pytest.skip(f"Slurm {series} is the host's own: the rest of the suite tests it")
    try:
        with host_network():  # debootstrap reaches the Debian mirror
            slurmroots.build(suite)
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"Slurm {series} ({suite.name}): building the root failed: {exc}")
    result = slurmroots.run_pytest(suite, ["-m", "e2e", *SMOKE])
    assert result.returncode == 0, (
        f"Slurm {result.version} ({suite.name} root): smoke/demo failed "
        f"(rerun: make test-slurm VERSION={series})\n{result.output[-6000:]}")
