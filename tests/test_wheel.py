"""The sdist is the whole project (tests and their data, the Ansible role, templates, examples,
docs, LICENSE); the wheel, built from that sdist as ``python -m build`` does, carries what an
installed slurm-spot needs outside Python modules: the jinja2 templates (render), the hooks
slurm.conf points at (console_scripts entry points), the demo's training script, every
subpackage (found automatically), and the admin's files under share/slurm-spot/ (setup.cfg)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".*_cache", ".local-cluster", ".whl")


HOOKS = {"slurm-spot-resume": "resume", "slurm-spot-suspend": "suspend",
         "slurm-spot-resume-fail": "resume_fail", "slurm-spot-prolog": "prolog",
         "slurm-spot-task-prolog": "task_prolog", "slurm-spot-epilog": "epilog",
         "slurm-spot-prolog-slurmctld": "prolog_slurmctld"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel built from the extracted sdist), as ``python -m build`` makes them."""
    # Built from a copy: setuptools keeps build/ in the source tree, and a stale build/lib
    # (a module deleted since) would end up in the wheel and hide a missing package.
    tmp = tmp_path_factory.mktemp("dist")
    source = tmp / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=SKIP)
    # --no-isolation: the build backend of this environment (no index needed in CI).
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                    "--outdir", str(tmp), str(source)],
                   check=True, capture_output=True, timeout=300)
    (sdist,) = tmp.glob("slurm_spot-*.tar.gz")
    with tarfile.open(sdist) as tar:
        # filter= came with Python 3.11.4 (PEP 706); Debian 12's python3 is 3.11.2.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp / "unpacked", filter="data")
        else:
            tar.extractall(tmp / "unpacked")
    (unpacked,) = (tmp / "unpacked").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(tmp), str(unpacked)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp.glob("slurm_spot-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def names(dists: tuple[Path, Path]) -> set[str]:
    return set(zipfile.ZipFile(dists[1]).namelist())


def test_sdist_is_the_whole_project(dists: tuple[Path, Path]) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("compares the sdist with `git ls-files`: needs a git checkout")
    with tarfile.open(dists[0]) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True, timeout=60).stdout.split()
    # The two symlinks into templates/ and examples/ arrive as the files they point at.
    missing = [f for f in tracked if f not in members and f != ".gitignore"
               and not (ROOT / f).is_symlink()]
    assert not missing, f"not in the sdist: {missing}"
    for needed in ("LICENSE", "tests/test_wheel.py", "ansible/roles/slurm_spot/tasks/main.yml",
                   "templates/slurm-spot-watch.service.j2", "examples/train_digits.py",
                   "docs/DESIGN.md", "slurm_spot/templates/slurm.conf.j2"):
        assert needed in members, needed
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as whl:
        (member,) = [n for n in whl.namelist() if n.endswith(f".dist-info/{name}")]
        return whl.read(member).decode()


def test_license_is_the_apache_2_text_the_metadata_names(dists: tuple[Path, Path]) -> None:
    text = _dist_info(dists[1], "licenses/LICENSE")
    assert text == (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    info = _dist_info(dists[1], "METADATA")
    assert "License-Expression: Apache-2.0" in info and "License-File: LICENSE" in info


def test_hooks_are_entry_points_not_script_stubs(dists: tuple[Path, Path], names: set[str]) -> None:
    parser = configparser.ConfigParser()
    parser.read_string(_dist_info(dists[1], "entry_points.txt"))
    scripts = dict(parser["console_scripts"])
    for script, function in HOOKS.items():
        assert scripts[script] == f"slurm_spot.hooks:{function}"
    assert scripts["slurm-spot"] == "slurm_spot.cli:main"
    assert not [n for n in names if ".data/scripts/" in n]


def test_wheel_ships_templates_and_the_demo_script(names: set[str]) -> None:
    for template in (ROOT / "templates").glob("*.j2"):
        assert f"slurm_spot/templates/{template.name}" in names
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


def _requires(metadata: str) -> dict[str | None, dict[str, Requirement]]:
    """extra (None: the base) -> package name -> requirement, from the wheel's METADATA."""
    out: dict[str | None, dict[str, Requirement]] = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist: "):
            req = Requirement(line.removeprefix("Requires-Dist: "))
            extra = None
            if req.marker is not None:
                extra = next(e for e in ("train", "examples", "aws", "gcp", "plot", "ft", "dev")
                             if req.marker.evaluate({"extra": e}))
            out.setdefault(extra, {})[canonicalize_name(req.name)] = req
    return out


def test_dependency_ranges_are_honest(dists: tuple[Path, Path]) -> None:
    requires = _requires(_dist_info(dists[1], "METADATA"))
    # train: torch as a range that the CPU wheel the Makefile installs first satisfies, so pip
    # keeps an installed torch instead of replacing it; the example's data set apart.
    pinned = re.search(r"^TORCH := torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned is not None
    torch = requires["train"]["torch"]
    assert not any(s.operator == "==" for s in torch.specifier)
    for version in (pinned.group(1), f"{pinned.group(1)}+cpu", "2.15.0"):
        assert torch.specifier.contains(version), (torch, version)
    # ft: torchft 0.2 (issue 27), with a torch range the pinned CPU wheel satisfies too
    assert requires["ft"]["torchft"].specifier.contains("0.2.0")
    assert requires["ft"]["torch"].specifier.contains(f"{pinned.group(1)}+cpu")
    assert "scikit-learn" not in requires["train"]
    assert "scikit-learn" in requires["examples"]
    assert "slurm-spot" in requires["examples"]  # examples = train + its data set
    # PyYAML 6.0.3 is the first with wheels for CPython 3.10 to 3.14 (6.0.2 has no 3.14 wheel).
    pyyaml = requires[None]["pyyaml"]
    assert not pyyaml.specifier.contains("6.0.2") and pyyaml.specifier.contains("6.0.3")
