"""One home for each piece of knowledge (docs/DESIGN.md, "Adding a provider" and "Adding a
checkpoint store"): the source is read (AST, no imports) for the ways a second home creeps
back in, so a regression fails here with the module and line that brought it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from slurm_spot.providers import PROVIDER_TYPES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slurm_spot"
#: The built-in provider: its cluster tooling (localcluster/, ``local`` commands, render's
#: slurmd ports) is about it by name, and a new provider type needs none of it.
LOCAL = "local"
CLOUD_TYPES = sorted(set(PROVIDER_TYPES) - {LOCAL})


def modules(under: Path = PACKAGE) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(under.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module


def test_providers_do_not_import_the_cost_package() -> None:
    found = [f"{name}:{line}: {module}" for name, tree in modules(PACKAGE / "providers")
             for line, module in imported(tree)
             if module == "slurm_spot.cost" or module.startswith("slurm_spot.cost.")]
    assert found == []


def _cloud_type_uses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Comparisons with a cloud provider type's name, isinstance with its settings model, and
    imports of its package: the ways a module dispatches on a provider type."""
    models = {f"{t.capitalize()}ProviderConfig" for t in CLOUD_TYPES}
    packages = tuple(f"slurm_spot.providers.{t}" for t in CLOUD_TYPES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            sides += [e for c in node.comparators if isinstance(c, ast.Tuple | ast.Set | ast.List)
                      for e in c.elts]
            if any(isinstance(s, ast.Constant) and s.value in CLOUD_TYPES for s in sides):
                yield node.lineno, ast.unparse(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "isinstance" and len(node.args) == 2
              and set(re.findall(r"\w+", ast.unparse(node.args[1]))) & models):
            yield node.lineno, ast.unparse(node)
    for line, module in imported(tree):
        if module.startswith(packages):
            yield line, f"import {module}"


def test_only_providers_and_the_config_models_dispatch_on_a_cloud_provider_type() -> None:
    """Adding a provider touches its package, the registry and the config models (and the
    build file): nothing else may branch on an existing cloud type, or it would need a branch
    for the new one too."""
    allowed = ("slurm_spot/providers/", "slurm_spot/config/provider_models.py")
    found = [f"{name}:{line}: {what}" for name, tree in modules()
             if not name.startswith(allowed) for line, what in _cloud_type_uses(tree)]
    assert found == []


def test_only_the_location_module_tests_for_an_s3_root() -> None:
    """Which store a root names is answered by slurm_spot/checkpoint/location.py alone
    (``is_s3``, ``as_location``); the S3 store parses its own URLs (``parse_s3_url``)."""
    found = []
    for name, tree in modules():
        if name == "slurm_spot/checkpoint/location.py":
            continue
        for node in ast.walk(tree):
            args: list[ast.expr] = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "removeprefix", "endswith", "partition"):
                args = list(node.args)
            elif isinstance(node, ast.Compare):
                args = [node.left, *node.comparators]
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and a.value.startswith("s3:") for a in args):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def _listed(section: str) -> list[str]:
    """The files a docs/DESIGN.md "Adding ..." section lists (its ``- `path` ...`` lines)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    body = text.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\d+\. `([^`]+)`", body, re.M)


def test_design_lists_at_most_three_files_outside_a_providers_package() -> None:
    files = _listed("Adding a provider")
    assert 1 <= len(files) <= 3, files
    for path in files:
        assert (ROOT / path).is_file(), path
    registry = (ROOT / "slurm_spot/providers/__init__.py").read_text()
    assert "slurm_spot/providers/__init__.py" in files and "PROVIDER_TYPES" in registry


def test_design_lists_at_most_three_files_outside_checkpoint_store_modules() -> None:
    files = _listed("Adding a checkpoint store")
    assert 1 <= len(files) <= 3, files
    for path in files:
        assert (ROOT / path).is_file(), path
        assert not Path(path).name.startswith("store"), path
