"""The wheel carries what an installed slurm-spot needs outside Python modules: the jinja2
templates (render), the hooks slurm.conf points at, the demo's training script, every
subpackage (found automatically), and the admin's files under share/slurm-spot/ (setup.cfg)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".*_cache", ".local-cluster", ".whl")


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    # Built from a copy: setuptools keeps build/ in the source tree, and a stale build/lib
    # (a module deleted since) would end up in the wheel and hide a missing package.
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=SKIP)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--quiet", "--wheel-dir", str(tmp), str(source)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp.glob("slurm_spot-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_wheel_ships_templates_hooks_and_the_demo_script(names: set[str]) -> None:
    for template in (ROOT / "templates").glob("*.j2"):
        assert f"slurm_spot/templates/{template.name}" in names
    for hook in (ROOT / "resume_scripts").iterdir():
        assert any(n.endswith(f".data/scripts/{hook.name}") for n in names), hook.name
    assert "slurm_spot/examples/train_digits.py" in names
    assert "slurm_spot/providers/aws/instance_types.yaml" in names


def test_every_subpackage_and_module_is_in_the_wheel(names: set[str]) -> None:
    package = ROOT / "slurm_spot"
    modules = [p for p in package.rglob("*.py")
               if not any(part in ("templates", "examples") for part in p.relative_to(package).parts)]
    assert len(modules) > 50
    for module in modules:
        assert str(module.relative_to(ROOT)) in names, module


def test_admin_files_are_installed_under_share(names: set[str]) -> None:
    share = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
    role = "share/slurm-spot/ansible/roles/slurm_spot"
    for tracked in (ROOT / "ansible" / "roles" / "slurm_spot").rglob("*"):
        if tracked.is_file():
            assert f"{role}/{tracked.relative_to(ROOT / 'ansible/roles/slurm_spot')}" in share
    for unit in ("slurm-spot-reconcile.service.j2", "slurm-spot-watch.service.j2",
                 "slurm-spot-node.service.j2", "slurmd-slurm-spot.conf.j2"):
        assert f"share/slurm-spot/templates/{unit}" in share
    assert "share/slurm-spot/examples/train_digits.py" in share
    assert "share/slurm-spot/ansible/site.yml" in share
