"""Where `make test`'s time goes: per test file, from pytest's junit reports of whole runs.

Method: each run is a fresh clone's ``make test`` (what CI runs: apt and pip set-up, ruff, mypy,
then pytest) on this 2-CPU machine, with ``PYTEST_ARGS="--junitxml=FILE"``; its wall time is
measured outside (``/usr/bin/time`` around ``.ci/run``). From each report this script takes the
session's pytest time (the ``testsuite`` element's ``time``) and the seconds of every test,
summed per file. Runs are given side by side, the one-process suite (``TEST_WORKERS=0``, the
baseline) next to the parallel one: a file's sum is its tests' own time; in the parallel run
the sums add up to more than the wall time, since up to ``TEST_WORKERS`` files run at once. A
whole suite takes 30-75 minutes, so each row is one run, not a median: the date and the machine's
load say how comparable two rows are.

Usage::

    python benchmarks/suite_time.py --run "serial=base.xml:73.5:1236" \\
        --run "4 workers=par.xml:38.0:1260" [--no-write]

``NAME=JUNIT:WALL_MIN:TESTS`` per run: the report, the fresh clone's wall time in minutes and
the number of tests collected. Prints the tables; writes the ``make-test`` section of
BENCHMARKS.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- make-test:begin -->", "<!-- make-test:end -->"
TOP_FILES = 25


@dataclass(frozen=True)
class SuiteRun:
    """One whole run: its name, wall minutes of the fresh clone, tests collected, pytest's
    session seconds and the seconds per test file (``tests/test_x.py -> s``)."""

    name: str
    wall_min: float
    tests: int
    pytest_s: float
    per_file_s: dict[str, float]
    failed: int


def read_run(name: str, junit: Path, wall_min: float, tests: int) -> SuiteRun:
    """Read one junit report (pytest ``--junitxml``).

    Raises:
        OSError, xml.etree.ElementTree.ParseError: the report is missing or not XML.
    """
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{junit}: no <testsuite> element")
    per_file: dict[str, float] = defaultdict(float)
    failed = 0
    for case in suite.iter("testcase"):
        parts = case.get("classname", "").split(".")
        split = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        per_file["/".join(parts[:split + 1]) + ".py"] += float(case.get("time", "0"))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
    return SuiteRun(name, wall_min, tests, float(suite.get("time", "0")), dict(per_file),
                    failed)


def tables(runs: list[SuiteRun]) -> str:
    """The section's Markdown: one row per run, then the slowest files side by side."""
    lines = ["| run | tests | failed | fresh clone, wall (min) | pytest (min) |",
             "|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.name} | {run.tests} | {run.failed} | {run.wall_min:.1f} | "
                     f"{run.pytest_s / 60:.1f} |")
    files = sorted({f for run in runs for f in run.per_file_s},
                   key=lambda f: -max(run.per_file_s.get(f, 0.0) for run in runs))
    lines += ["", "| file (slowest first) | " + " | ".join(f"{r.name} (s)" for r in runs) + " |",
              "|---|" + "---|" * len(runs)]
    for name in files[:TOP_FILES]:
        lines.append(f"| `{name}` | " + " | ".join(
            f"{run.per_file_s.get(name, 0.0):.0f}" for run in runs) + " |")
    rest = files[TOP_FILES:]
    if rest:
        lines.append(f"| {len(rest)} other files | " + " | ".join(
            f"{sum(run.per_file_s.get(f, 0.0) for f in rest):.0f}" for run in runs) + " |")
    lines.append("| all files, summed | " + " | ".join(
        f"{sum(run.per_file_s.values()):.0f}" for run in runs) + " |")
    return "\n".join(lines)


def _parse_run(text: str) -> tuple[str, Path, float, int]:
    name, sep, rest = text.partition("=")
    parts = rest.rsplit(":", 2)
    if not sep or len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--run {text!r}: expected NAME=JUNIT:WALL_MIN:TESTS")
    try:
        return name, Path(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--run {text!r}: expected NAME=JUNIT:WALL_MIN:TESTS, WALL_MIN a number of minutes "
            "and TESTS a count") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run", type=_parse_run, action="append", required=True,
                        help="NAME=JUNIT:WALL_MIN:TESTS (repeat; the baseline first)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(*spec) for spec in args.run]
    except (OSError, ValueError, ET.ParseError) as exc:
        print(f"suite_time: {exc}", file=sys.stderr)
        return 2
    text = tables(runs)
    print(text)
    if not args.no_write:
        when = time.strftime("%Y-%m-%d", time.gmtime())
        last = runs[-1]
        body = (f"{BEGIN}\n## `make test`: where the time goes\n\n"
                f"make test (fresh clone): {last.wall_min:.0f} min ({when}, {last.tests} tests, "
                f"{last.name})\n\n"
                f"`python benchmarks/suite_time.py` (method in its docstring), written {when}.\n\n"
                f"{text}\n{END}")
        write_section(args.output, BEGIN, END, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
