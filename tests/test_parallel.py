"""How ``make test`` spreads the suite over workers (tests/parallel.py, tests/netns.py): a small
suite run the way the Makefile runs the real one, recording where each test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import parallel

REPO = Path(__file__).resolve().parent.parent

SUITE = '''
import json, os, pytest
from pathlib import Path

OUT = Path(os.environ["PROBE_OUT"])

def record(name, **extra):
    net = os.readlink("/proc/thread-self/ns/net")
    entry = {"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "net": net, **extra}
    with open(OUT / f"{name}.json", "w") as f:
        json.dump(entry, f)

@pytest.fixture(scope="module")
def shared():
    with open(OUT / "setups", "a") as f:
        f.write("x")
    return object()

def test_first_with_shared(shared):
    record("first", shared=id(shared))

def test_second_with_shared(shared):
    record("second", shared=id(shared))

def test_alone():
    record("alone")

def test_host_network():
    from tests.netns import host_network
    with host_network():
        record("host")
'''


def _run_probe(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, dict]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (suite / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (suite / "test_probe.py").write_text(textwrap.dedent(SUITE))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE_OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadscope", "--no-loadscope-reorder", "--rootdir", str(suite), str(suite)],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    records = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    records["_setups"] = {"count": len((out / "setups").read_text())
                          if (out / "setups").exists() else 0}
    return proc, records


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_workers_get_private_networks_and_a_shared_fixture_is_set_up_once(tmp_path: Path) -> None:
    proc, records = _run_probe(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout
    host_net = os.readlink("/proc/self/ns/net")
    # The two tests of the module-scoped fixture ran on one worker, with one set-up.
    assert records["first"]["worker"] == records["second"]["worker"]
    assert records["first"]["shared"] == records["second"]["shared"]
    assert records["_setups"]["count"] == 1
    # Every worker is off the host's network, each in its own namespace.
    nets = {r["worker"]: r["net"] for k, r in records.items() if k in ("first", "alone")}
    assert host_net not in nets.values()
    if len(nets) == 2:
        assert len(set(nets.values())) == 2
    # host_network() puts the test back on the host's network for its body.
    assert records["host"]["net"] == host_net


def test_groups_join_what_shares_a_module_fixture_and_the_slurm_versions(
        tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
         "-p", "tests.test_parallel", "tests/test_slurm_matrix.py", "tests/test_slurm_smoke.py",
         "tests/test_local_e2e.py",
         "tests/test_hostlist.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "GROUPS_OUT": str(tmp_path / "groups.json")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    groups = json.loads((tmp_path / "groups.json").read_text())
    versions = {g for n, g in groups.items()
                if n.startswith(("tests/test_slurm_matrix.py", "tests/test_slurm_smoke.py"))}
    assert versions == {"slurm-versions"}  # one worker: they share a state folder
    local = {g for n, g in groups.items() if n.startswith("tests/test_local_e2e.py")}
    assert len(local) == 1  # one module-scoped cluster
    hostlist = [g for n, g in groups.items() if n.startswith("tests/test_hostlist.py")]
    assert len(set(hostlist)) == len(hostlist)  # no shared fixture: each test alone


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Loaded with ``-p tests.test_parallel`` by the test above: write the groups the workers
    would use for the collected items."""
    out = os.environ.get("GROUPS_OUT")
    if out:
        Path(out).write_text(json.dumps(parallel.groups_of(items)))


def test_longest_group_first_and_file_order_within_a_group() -> None:
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

        def get_closest_marker(self, name: str) -> None:
            return None

    items = [Item(n) for n in ("tests/test_a.py::t1", "tests/test_b.py::t1",
                               "tests/test_c.py::t1")]
    durations = {"tests/test_a.py::t1": 1.0, "tests/test_b.py::t1": 30.0,
                 "tests/test_c.py::t1": 5.0}
    parallel.schedule(items, durations)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/test_b.py::t1", "tests/test_c.py::t1",
                                         "tests/test_a.py::t1"]


def test_durations_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_x" name="test_a[p-1]" time="12.345"/>'
        '<testcase classname="tests.test_y.TestZ" name="test_b" time="0.1"/>'
        '</testsuite></testsuites>')
    assert parallel.durations_from_junit(report) == {
        "tests/test_x.py::test_a[p-1]": 12.35, "tests/test_y.py::TestZ::test_b": 0.1}
