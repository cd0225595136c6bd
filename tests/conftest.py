"""Shared fixtures. End-to-end tests get a real local Slurm cluster from tests/cluster.py.

``make test`` runs the suite on pytest-xdist workers (tests/parallel.py): each worker moves into
a private network namespace of its own (tests/netns.py) before its first test, so the local
clusters of different workers run side by side; the controller starts munged once for all of
them (a cluster's ``local down`` stops munged only if its ``local up`` started it) and the
background build of the version matrix's Debian roots, which needs the host's network.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns, parallel
from tests.cluster import Cluster, base_config

DATA = Path(__file__).parent / "data"

_prebuild: subprocess.Popen[bytes] | None = None
_munged_pid: int | None = None


def _worker_id(config: pytest.Config) -> str | None:
    """The xdist worker this process is (``gw0``...), from xdist's ``workerinput``: not from
    $PYTEST_XDIST_WORKER, which a pytest started by a test (the matrix's, in a root) inherits."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput else None


def _is_xdist_controller(config: pytest.Config) -> bool:
    return (_worker_id(config) is None and getattr(config.option, "dist", "no") != "no"
            and bool(getattr(config.option, "numprocesses", None)))


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: enter the worker's private network namespace (as root, outside a
    Slurm root). On the controller: start munged unless one answers, for every worker."""
    global _munged_pid
    from tests import slurmroots

    worker = _worker_id(config)
    if worker is not None:
        if os.geteuid() == 0 and not os.environ.get(slurmroots.INSIDE_ENV):
            netns.enter_private_network(worker)
        return
    if _is_xdist_controller(config):
        if config.option.basetemp is None:
            config.option.basetemp = _short_basetemp()
        folder = Path(tempfile.mkdtemp(prefix="slurm-spot-test-groups-"))
        os.environ[parallel.GROUPS_ENV] = str(folder / "groups.json")
    # Serial runs too: the rendezvous tests authenticate with MUNGE without a cluster.
    if os.geteuid() == 0 and _slurm_available() and not os.environ.get(slurmroots.INSIDE_ENV):
        from slurm_spot.localcluster.cluster import start_munge
        _munged_pid = start_munge()


BASETEMP_PREFIX = "ss-"
BASETEMP_KEEP_S = 24 * 3600


def _short_basetemp() -> str:
    """A short, new base for the workers' tmp paths (``/tmp/ss-XXXXXXXX``; xdist adds
    ``popen-gwN/``). pytest's own ``/tmp/pytest-of-root/pytest-N/popen-gwN/`` is 39 characters
    before a test's folder, and a local cluster's slurmstepd sockets live under it
    (``<state>/slurmd/<node>/<node>_<job>.<step>``): unix(7) allows 108 bytes, and a longer path
    made slurmstepd fail and the demo's job requeue for ever. Bases older than a day are
    removed (earlier runs'; a run's own is kept for reading its logs)."""
    now = time.time()
    for old in Path(tempfile.gettempdir()).glob(f"{BASETEMP_PREFIX}*"):
        try:
            if old.is_dir() and not old.is_symlink() and now - old.stat().st_mtime > BASETEMP_KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue
    return tempfile.mkdtemp(prefix=BASETEMP_PREFIX)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller stops the munged it started (and nothing else) and removes the groups."""
    global _munged_pid
    groups = os.environ.get(parallel.GROUPS_ENV)
    if groups and _worker_id(config) is None:
        shutil.rmtree(Path(groups).parent, ignore_errors=True)
    if _munged_pid is not None:
        try:
            os.kill(_munged_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _munged_pid = None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: order the tests longest group first and write the groups for the
    controller's scheduler (tests/parallel.py)."""
    if _worker_id(config) is not None:
        parallel.schedule(items, parallel.load_durations())
        groups = os.environ.get(parallel.GROUPS_ENV)
        if groups:
            parallel.write_groups(items, Path(groups))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """The controller schedules by the workers' groups (tests/parallel.py) under
    ``--dist loadscope``; other modes keep xdist's own scheduler."""
    if config.getvalue("dist") == "loadscope" and os.environ.get(parallel.GROUPS_ENV):
        return parallel.make_scheduler(config, log)
    return None


def _wants_roots(nodeids: list[str]) -> bool:
    from tests import slurmroots
    if not any(nodeid.startswith("tests/test_slurm_matrix.py") for nodeid in nodeids):
        return False
    return not (os.geteuid() != 0 or os.environ.get(slurmroots.INSIDE_ENV)
                or os.environ.get("SLURM_SPOT_MATRIX") == "0")


def _start_prebuild() -> None:
    """Start building the matrix's Debian roots in the background (tests/slurmroots.py), so
    debootstrap overlaps the rest of the suite rather than adding minutes to the matrix test."""
    global _prebuild
    if _prebuild is None:
        from tests import slurmroots
        _prebuild = slurmroots.start_prebuild()


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run without xdist: start the roots' build when the matrix is among the tests."""
    if (_worker_id(session.config) is None
            and _wants_roots([item.nodeid for item in session.items])):
        _start_prebuild()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """The xdist controller (on the host's network): start the roots' build when a worker's
    collection holds the matrix."""
    if _wants_roots(ids):
        _start_prebuild()


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


@pytest.fixture(scope="module", autouse=True)
def _no_cluster_outlives_its_module() -> Iterator[None]:
    """On a worker in a private network namespace: once a module's own fixtures are torn down,
    stop any local cluster its tests left running in the namespace (a demo killed at its
    timeout), so the next module's cluster can listen on the same ports (tests/cluster.py,
    _stop_namespace_strays). Autouse, so it is set up first and torn down last."""
    yield
    if netns.in_private_network():
        from tests.cluster import _stop_namespace_strays
        _stop_namespace_strays()
