"""The wheel carries what an installed slurm-spot needs outside Python modules: the jinja2
templates (render), the hooks slurm.conf points at, and the demo's training script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_templates_hooks_and_the_demo_script(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--quiet", "--wheel-dir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("slurm_spot-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").glob("*.j2"):
        assert f"slurm_spot/templates/{template.name}" in names
    for hook in (ROOT / "resume_scripts").iterdir():
        assert any(n.endswith(f".data/scripts/{hook.name}") for n in names), hook.name
    assert "slurm_spot/examples/train_digits.py" in names
    assert "slurm_spot/providers/aws/instance_types.yaml" in names
