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
    """Which store a root names is answered by slurm_spot/contract/location.py alone
    (``is_s3``, ``as_location``); the S3 store parses its own URLs (``parse_s3_url``)."""
    found = []
    for name, tree in modules():
        if name == "slurm_spot/contract/location.py":
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


CHECKPOINT = "slurm_spot/checkpoint/"
#: The one module outside the checkpoint package that answers which store a root names.
LOCATION = "slurm_spot/contract/location.py"


def _store_classes() -> tuple[set[str], set[str]]:
    """(class names, module names) of the checkpoint stores' implementations: classes under
    slurm_spot/checkpoint/ with a ``latest`` and a ``committed`` method (the protocol's read
    side), the package's own classes they derive from (``S3Objects``), and the modules holding
    them, except ``store.py`` (the seam: ``open_store``, the protocol)."""
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for name, tree in modules(PACKAGE / "checkpoint"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (name, node)
    found: set[str] = set()
    for cls, (_, node) in classes.items():
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if {"latest", "committed"} <= methods and not any(
                ast.unparse(b) == "Protocol" for b in node.bases):
            found.add(cls)
    grown = True
    while grown:  # the package's own base classes of a store are part of it
        bases = {ast.unparse(b) for c in found for b in classes[c][1].bases} & set(classes)
        grown = not bases <= found
        found |= bases
    files = {classes[c][0] for c in found} - {f"{CHECKPOINT}store.py"}
    return found, {f.removesuffix(".py").replace("/", ".") for f in files}


def test_nothing_outside_the_checkpoint_package_names_a_store_class() -> None:
    """Issue 42: ``cost/`` built ``S3Store`` itself, so a new store was priced 0 or read as a
    directory there. Outside slurm_spot/checkpoint/ a store is reached through
    ``open_store``/``open_configured_store`` and the ``CheckpointStore`` protocol only: no
    store class is named, no store module imported."""
    classes, store_modules = _store_classes()
    assert {"LocalStore", "S3Store"} <= classes and "slurm_spot.checkpoint.s3" in store_modules
    found = []
    for name, tree in modules():
        if name.startswith(CHECKPOINT):
            continue
        for node in ast.walk(tree):
            used = (node.id if isinstance(node, ast.Name) else
                    node.attr if isinstance(node, ast.Attribute) else None)
            if used in classes:
                found.append(f"{name}:{node.lineno}: {used}")
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [a.name for a in node.names]
                module = node.module if isinstance(node, ast.ImportFrom) else None
                for what in [*names, *([module] if module else []),
                             *([f"{module}.{n}" for n in names] if module else [])]:
                    if what in classes or what in store_modules:
                        found.append(f"{name}:{node.lineno}: import {what}")
    assert found == []


def _members(annotation: ast.expr) -> list[ast.expr]:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return [*_members(annotation.left), *_members(annotation.right)]
    return [annotation]


def _is_location_type(annotation: ast.expr | None) -> bool:
    """``Location`` (contract/location.py), or a union of ``str`` and a path type."""
    if annotation is None:
        return False
    members = [ast.unparse(m) for m in _members(annotation)]
    if any(re.search(r"\bLocation\b", m) for m in members):
        return True
    return "str" in members and any(re.fullmatch(r"(\w+\.)*(Path|PathLike\[str\])", m)
                                    for m in members)


#: A name or attribute that holds a checkpoint root or location by its name.
_ROOTISH = re.compile(r"root|location", re.I)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _root_type_tests(tree: ast.Module, location_functions: set[str]) -> Iterator[tuple[int, str]]:
    """``isinstance(x, str)`` (any type test naming ``str``) where ``x`` is a checkpoint
    location: a parameter or variable annotated as one, a variable assigned from a function
    that returns one (``location_functions``), or a name/attribute called ``*root*`` or
    ``*location*``. Such a test decides "a store's URL, not a directory" by type: which store
    a root names is contract/location.py's answer (``is_url``, ``url_scheme``, ``is_s3``)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, Function):
            continue
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        held = {a.arg for a in args if _is_location_type(a.annotation)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                called = (func.id if isinstance(func, ast.Name) else
                          func.attr if isinstance(func, ast.Attribute) else None)
                if called in location_functions:
                    held |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and _is_location_type(node.annotation):
                held.add(node.target.id)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2
                    and "str" in re.findall(r"\w+", ast.unparse(node.args[1]))):
                continue
            tested = node.args[0]
            ident = (tested.id if isinstance(tested, ast.Name) else
                     tested.attr if isinstance(tested, ast.Attribute) else None)
            if ident and (ident in held or _ROOTISH.search(ident)):
                yield node.lineno, ast.unparse(node)


def test_only_the_checkpoint_package_and_the_location_module_test_a_roots_type() -> None:
    """Which store a root names is asked of slurm_spot/contract/location.py, never read off
    its Python type (a str root was "S3" in four places, so a second URL store would have been
    taken for S3 there)."""
    trees = list(modules())
    location_functions = {n.name for _, tree in trees for n in ast.walk(tree)
                          if isinstance(n, Function) and _is_location_type(n.returns)}
    assert {"as_location", "job_directory", "checkpoint_dir"} <= location_functions
    found = [f"{name}:{line}: {what}" for name, tree in trees
             if not name.startswith(CHECKPOINT) and name != LOCATION
             for line, what in _root_type_tests(tree, location_functions)]
    assert found == []


def test_the_root_type_check_finds_what_it_is_for() -> None:
    """The check above is no empty net: each way it knows a location is caught."""
    source = '''
def a(root: Location) -> None:
    isinstance(root, str)
def b(x: str | os.PathLike[str]) -> None:
    isinstance(x, (str, bytes))
def c(env) -> None:
    where = checkpoint_dir(env)
    isinstance(where, str)
def d(self) -> None:
    isinstance(self.checkpoint.root, str)
def e(text: str) -> None:
    isinstance(text, str)
'''
    hits = [what for _, what in _root_type_tests(ast.parse(source), {"checkpoint_dir"})]
    assert hits == ["isinstance(root, str)", "isinstance(x, (str, bytes))",
                    "isinstance(where, str)", "isinstance(self.checkpoint.root, str)"]


def test_one_reader_of_the_checkpoint_layout() -> None:
    """Outside slurm_spot/checkpoint/ nobody reads the layout (``step_N/manifest.json``)
    itself: ``cost`` reads a store's ``committed()``, the watcher ``files.save_costs``
    (``cost/accounting.py`` had a second reader, and missed a store that is not a directory)."""
    low_level = {"list_candidates", "read_manifest", "symlinked_steps", "scan", "iter_valid"}
    found = []
    for name, tree in modules():
        if name.startswith(CHECKPOINT):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "manifest.json":
                found.append(f"{name}:{node.lineno}: 'manifest.json'")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("startswith", "removeprefix") and any(
                        isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and a.value.startswith("step_") for a in node.args):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "slurm_spot.checkpoint"):
                found += [f"{name}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name in low_level]
    assert found == []
