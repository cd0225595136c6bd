"""A spot.yaml that would make reading it recurse or expand without bound (a recursive alias,
thousands of nested lists, an alias bomb) is refused at once with the file, the line and
the reason, exit code 2, instead of a RecursionError traceback or minutes of CPU and
hundreds of MB."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_spot.config.yamlfile import MAX_DEPTH, MAX_VALUES


def _bomb(levels: int, copies: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * copies)}]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * copies)}]")
    return "\n".join(lines) + "\n"


def _deep_through_aliases() -> str:
    # each anchor nests 40 levels and holds the previous one: 160 levels once expanded
    lines = []
    for i in range(4):
        inner = f"*l{i - 1}" if i else "x"
        lines.append(f"l{i}: &l{i} " + "[" * 40 + inner + "]" * 40)
    return "\n".join(lines) + "\n"


CASES = [
    pytest.param("cluster_name: spot\nx: &a [*a]\n", 2, "recursive alias *a", id="recursive-seq"),
    pytest.param("cluster_name: spot\nm: &m\n  k: *m\n", 3, "recursive alias *m",
                 id="recursive-map"),
    pytest.param("x: " + "[" * 3000 + "]" * 3000 + "\n", 1, f"more than {MAX_DEPTH} levels",
                 id="3000-brackets"),
    pytest.param("a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)), 101,
                 f"more than {MAX_DEPTH} levels", id="block-nesting"),
    pytest.param(_deep_through_aliases(), 3, f"more than {MAX_DEPTH} levels",
                 id="deep-via-aliases"),
    pytest.param(_bomb(8, 9), 6, f"more than {MAX_VALUES} values", id="alias-bomb-8x9"),
]


@pytest.mark.parametrize(("text", "line", "reason"), CASES)
def test_config_check_refuses_unbounded_yaml_naming_file_and_line(
        tmp_path: Path, text: str, line: int, reason: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    config.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(config),
                           "config", "check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert str(config) in proc.stderr or "bad.yaml" in proc.stderr
    assert reason in proc.stderr
    if line:
        assert f"line {line}:" in proc.stderr, proc.stderr


def test_an_aliased_value_is_still_checked_and_reported_once(tmp_path: Path) -> None:
    config = tmp_path / "spot.yaml"
    config.write_text("cluster_name: spot\nbase: &b {subnet: '@SUBNET_ID@'}\n"
                      "one: *b\ntwo: *b\nthree: *b\n")
    config.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(config),
                           "config", "check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("@SUBNET_ID@") == 1, proc.stderr
    assert "line 2:" in proc.stderr
