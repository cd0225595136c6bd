"""benchmarks/suite_time.py: the "where make test's time goes" tables from junit reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "suite_time.py"
REPORT = ('<testsuites><testsuite name="pytest" time="{total}">'
          '<testcase classname="tests.test_a" name="t1" time="100"/>'
          '<testcase classname="tests.test_a" name="t2" time="20"><failure/></testcase>'
          '<testcase classname="tests.test_b.TestX" name="t" time="3"/>'
          '</testsuite></testsuites>')


def test_runs_side_by_side_and_the_fresh_clone_row(tmp_path: Path) -> None:
    serial, parallel = tmp_path / "serial.xml", tmp_path / "parallel.xml"
    serial.write_text(REPORT.format(total=3600))
    parallel.write_text(REPORT.format(total=1500))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--run", f"serial={serial}:65:3",
                           "--run", f"4 workers={parallel}:30.4:3", "--output", str(out)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "kept" in text  # other sections untouched
    assert "make test (fresh clone): 30 min (" in text and "3 tests, 4 workers)" in text
    assert "| serial | 3 | 1 | 65.0 | 60.0 |" in text
    assert "| 4 workers | 3 | 1 | 30.4 | 25.0 |" in text
    assert "| `tests/test_a.py` | 120 | 120 |" in text
    assert text.index("tests/test_a.py") < text.index("tests/test_b.py")  # slowest first


def test_a_malformed_run_is_a_usage_error(tmp_path: Path) -> None:
    for bad in ("serial", f"serial={tmp_path}/x.xml:ten:3"):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--run", bad, "--no-write"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and "NAME=JUNIT:WALL_MIN:TESTS" in proc.stderr + proc.stdout
    proc = subprocess.run([sys.executable, str(SCRIPT), "--run", f"s={tmp_path}/none.xml:1:1",
                           "--no-write"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "none.xml" in proc.stderr
