"""How ``make test`` spreads the suite over pytest-xdist workers (``-n N --dist loadscope``).

Each worker runs in a private network namespace (tests/netns.py), so end-to-end tests of
different workers run their local clusters at the same time; most of an end-to-end test is
waiting on Slurm (boot delays, power saving, requeue), which leaves the CPUs to the others.

Groups: the tests of one module that share a module-scoped fixture (a local cluster, a moto
server) form one group and run on one worker, in file order, so the fixture is set up once; a
test that shares none is a group of its own. The version matrix and the host's Slurm smoke are
one group (:data:`ONE_GROUP`). Only a worker sees the fixtures, so each worker writes the
groups of what it collected to the file named by :data:`GROUPS_ENV`, and the controller's
scheduler (:class:`GroupScheduling`, through xdist's ``pytest_xdist_make_scheduler`` hook) reads
them. Not xdist's own ``--dist loadgroup``: it marks a group by rewriting ``item._nodeid``,
which pytest 9 no longer reads, so its groups are silently lost.

Order: groups are queued longest first (LPT scheduling), from the durations measured in a
fresh-clone run and kept in ``tests/data/durations.json`` (``nodeid -> seconds``; written by
``python -m tests.parallel JUNIT_XML``). A test not listed there counts as
:data:`DEFAULT_E2E_S` (end-to-end) or :data:`DEFAULT_UNIT_S`. xdist hands each worker the next
group in that order when it is almost out of work (xdist's LoadScopeScheduling).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parent / "data" / "durations.json"
GROUPS_ENV = "SLURM_SPOT_TEST_GROUPS"
"""Names the file where workers write ``nodeid -> group`` for the controller (set by the
controller before it starts the workers, which inherit it)."""
DEFAULT_E2E_S = 90.0
DEFAULT_UNIT_S = 0.5
SHARED_SCOPES = ("module", "package", "session")
NOT_SHARED = frozenset({"_no_cluster_outlives_its_module"})
"""Module-scoped fixtures that every test uses (autouse, tests/conftest.py) and that hold
nothing worth keeping tests together for."""
SPLIT_BY_PARAM: dict[str, str] = {}
"""Modules whose tests are grouped by one parameter's value instead of by module."""
ONE_GROUP = {"tests/test_slurm_matrix.py": "slurm-versions",
             "tests/test_slurm_smoke.py": "slurm-versions"}
"""Modules whose tests all run on one worker, one after the other: the version matrix and the
host's smoke share one state folder on purpose (/tmp/slurm-spot-versions-state, each Slurm in
its own slurmctld-<series>; test_slurm_smoke.py), and two of them at once on two workers
stopped each other's slurmctld through its pid file there."""


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """``nodeid -> seconds`` from ``path``; empty when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _shared_fixtures(item: pytest.Item) -> set[str]:
    """Names of the module/package/session-scoped fixtures ``item`` uses (pytest's own
    fixture closure of the item)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    shared = set()
    for name, defs in info.name2fixturedefs.items():
        if (defs and defs[-1].scope in SHARED_SCOPES and defs[-1].baseid != ""
                and name not in NOT_SHARED):
            shared.add(name)
    return shared


def groups_of(items: list[pytest.Item]) -> dict[str, str]:
    """``nodeid -> group name``: tests of one module joined when they share a module-scoped
    (or wider, defined in that module or a conftest) fixture, transitively; the matrix by series."""
    by_module: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_module[_module(item)].append(item)
    groups: dict[str, str] = {}
    for module, members in by_module.items():
        if module in ONE_GROUP:
            for item in members:
                groups[item.nodeid] = ONE_GROUP[module]
            continue
        param = SPLIT_BY_PARAM.get(module)
        if param is not None:
            for item in members:
                callspec = getattr(item, "callspec", None)
                value = callspec.params.get(param) if callspec is not None else None
                groups[item.nodeid] = f"{module}[{value}]"
            continue
        parent = {item.nodeid: item.nodeid for item in members}
        owner: dict[str, str] = {}
        for item in members:
            for name in _shared_fixtures(item):
                if name in owner:
                    parent[_find(parent, item.nodeid)] = _find(parent, owner[name])
                else:
                    owner[name] = item.nodeid
        for item in members:
            groups[item.nodeid] = _find(parent, item.nodeid)
    return groups


def _find(parent: dict[str, str], key: str) -> str:
    """The representative of ``key``'s set in the union-find forest ``parent``."""
    while parent[key] != key:
        parent[key] = parent[parent[key]]
        key = parent[key]
    return key



def write_groups(items: list[pytest.Item], path: Path) -> None:
    """Write ``nodeid -> group`` of ``items`` to ``path`` atomically (every worker writes the
    same content; the controller may read it at any time after a worker's collection)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(groups_of(items)))
    os.replace(partial, path)


def make_scheduler(config: pytest.Config, log: object) -> object:
    """The controller's scheduler: xdist's LoadScopeScheduling with the workers' groups as its
    scopes (a test missing from the file is a scope of its own)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Scopes are the groups of :func:`groups_of`, read from the workers' file."""

        def __init__(self, config: pytest.Config, log: object, path: Path) -> None:
            super().__init__(config, log)
            self._path = path
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                try:
                    self._groups = json.loads(self._path.read_text())
                except (OSError, ValueError):
                    self._groups = {}
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log, Path(os.environ[GROUPS_ENV]))


def estimate(item: pytest.Item, durations: dict[str, float]) -> float:
    """Seconds ``item`` is expected to take: measured, else the default of its kind."""
    if item.nodeid in durations:
        return durations[item.nodeid]
    return DEFAULT_E2E_S if item.get_closest_marker("e2e") else DEFAULT_UNIT_S


def schedule(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder ``items`` in place: groups longest first, each group's tests in file order.
    Deterministic, as xdist requires every worker to collect the same list."""
    groups = groups_of(items)
    total: dict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        group = groups[item.nodeid]
        total[group] += estimate(item, durations)
        first.setdefault(group, index)
    order = {item.nodeid: index for index, item in enumerate(items)}
    items.sort(key=lambda it: (-total[groups[it.nodeid]], first[groups[it.nodeid]],
                               order[it.nodeid]))


def durations_from_junit(xml_path: Path) -> dict[str, float]:
    """``nodeid -> seconds`` from a junit XML report of pytest (``--junitxml``): the
    ``classname`` (``tests.test_x`` or ``tests.test_x.Class``) and ``name`` of each testcase."""
    result: dict[str, float] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # tests.test_x -> tests/test_x.py ; tests.test_x.TestY -> tests/test_x.py::TestY
        split = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        module = "/".join(parts[:split + 1]) + ".py"
        nodeid = "::".join([module, *parts[split + 1:], name])
        result[nodeid] = round(float(case.get("time", "0")), 2)
    return result


def main(argv: list[str]) -> int:
    """``python -m tests.parallel JUNIT_XML``: write :data:`DURATIONS` from a junit report."""
    if len(argv) != 1:
        print("usage: python -m tests.parallel JUNIT_XML", file=sys.stderr)
        return 2
    durations = durations_from_junit(Path(argv[0]))
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    print(f"{len(durations)} durations written to {DURATIONS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
