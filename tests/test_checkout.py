"""slurm-spot runs from a source checkout with no install (``PYTHONPATH=<checkout> python -m
slurm_spot``): templates and the example script are found the way an installed wheel finds
them (slurm_spot/resources.py), not through the install's package mapping."""

from __future__ import annotations

import json
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_from_checkout(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # -S: no site processing, so no .pth file runs and the editable install's finder is
    # absent; the third-party libraries come from site-packages as plain folders.
    path = ":".join([str(ROOT), *site.getsitepackages()])
    return subprocess.run([sys.executable, "-S", *args], cwd=tmp_path, env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120, check=False)


def test_help_render_and_the_demo_script_from_a_checkout(tmp_path: Path) -> None:
    out = run_from_checkout(tmp_path, "-m", "slurm_spot", "--help")
    assert out.returncode == 0, out.stderr
    assert "task-prolog" in out.stdout and "demo" in out.stdout
    out = run_from_checkout(tmp_path, "-m", "slurm_spot", "--config",
                            str(ROOT / "examples" / "spot-local.yaml"), "render")
    assert out.returncode == 0, out.stderr
    assert "ResumeProgram=" in out.stdout
    out = run_from_checkout(tmp_path, "-c", "import json, slurm_spot.localcluster.demo as d, "
                            "slurm_spot.resources as r; p = d.example_script(); "
                            "print(json.dumps([str(p), p.is_file(), str(r.templates())]))")
    assert out.returncode == 0, out.stderr
    script, exists, templates = json.loads(out.stdout)
    assert exists and Path(script).resolve() == (ROOT / "examples" / "train_digits.py").resolve()
    assert Path(templates).resolve() == (ROOT / "templates").resolve()


def test_documents_cited_in_the_code_exist() -> None:
    """Docstrings and comments cite only files of this repository (docs/, tests/data/)."""
    import re

    cited: dict[str, list[str]] = {}
    for path in (ROOT / "slurm_spot").rglob("*.py"):
        if path.is_relative_to(ROOT / "slurm_spot" / "examples"):
            continue
        for ref in re.findall(r"\b((?:docs|tests/data)/[\w./-]+\w)", path.read_text()):
            cited.setdefault(ref, []).append(path.name)
    assert any(ref.startswith("docs/") for ref in cited)
    missing = {ref: where for ref, where in cited.items() if not (ROOT / ref).exists()}
    assert not missing
    assert not re.search(r"(?<![\w/])(DESIGN\.md|cases/)", "\n".join(
        p.read_text() for p in (ROOT / "slurm_spot").rglob("*.py")
        if not p.is_relative_to(ROOT / "slurm_spot" / "examples")).replace("docs/DESIGN.md", ""))
