"""The package's layers (docs/DESIGN.md, "Layers"): each part of ``slurm_spot`` imports only
parts on its own layer or below, except the imports listed in :data:`UPWARD` with their reason;
parts on one layer never import each other in a circle; ``contract/`` imports only the standard
library and ``errors``. Read from the source (AST, nothing imported), so a regression fails
here with the file and line that brought it. Imports under ``if TYPE_CHECKING:`` count too: an
annotation that names a higher part is a dependency on it all the same."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slurm_spot"
#: Folders whose modules (or subfolders) are parts of their own: their members sit on
#: different layers (``jobs/node`` runs in slurmd's hooks, ``jobs/submit`` on the login node).
SPLIT = ("jobs", "lifecycle", "contract")

#: Bottom to top. A part may import parts of its own layer or of any layer below.
LAYERS: list[tuple[str, ...]] = [
    # what every part may use: errors, escaped text, signals, systemd's notify, the JSON
    # envelope, the files the package ships (templates and the engine that renders them);
    # the split folders' own __init__ (a docstring, no import)
    ("errors", "rawtext", "stopsignals", "sdnotify", "jsonenvelope", "resources",
     "contract", "jobs", "lifecycle"),
    # what a job's parts agree on: the standard library and errors only (checked below)
    ("contract/names", "contract/location", "contract/sbatch_options"),
    ("contract/jobenv", "contract/directives"),
    ("config",),
    ("hostlist", "events", "eventfollow", "recovery"),
    ("slurm",),
    ("providers", "checkpoint"),
    ("cost", "jobs/rendezvous_wire"),
    ("jobs/services", "jobs/node", "jobs/interruption"),
    ("jobs/injob", "jobs/submit"),
    ("lifecycle/power", "lifecycle/bootwait", "lifecycle/node_identity", "lifecycle/weights"),
    ("lifecycle/prewarm", "lifecycle/failover", "lifecycle/status"),
    ("lifecycle/spares", "lifecycle/watch"),
    ("reconcile", "render"),
    ("localcluster",),
    ("hooks",),
    ("commands",),
    ("cli", "__main__"),
]

#: The imports that run up the layers, each with why it is there (at most 3: issue 42).
UPWARD: dict[tuple[str, str], str] = {
    ("slurm_spot/hooks.py", "slurm_spot.cli"):
        "a hook called with any argument list but the one Slurm uses (--json, --config, --help) "
        "runs the full command line, which is the same command; imported only then, so the "
        "hooks stay light",
}

STDLIB = set(sys.stdlib_module_names)


def part_of(module: str) -> str | None:
    """The part a ``slurm_spot.`` module belongs to (``slurm_spot.lifecycle.watch`` ->
    ``lifecycle/watch``, ``slurm_spot.cost.plan`` -> ``cost``); None outside the package."""
    words = module.split(".")
    if words[0] != "slurm_spot" or len(words) == 1:
        return None
    if words[1] in SPLIT and len(words) > 2:
        return f"{words[1]}/{words[2]}"
    return words[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    words = list(rel.parts)
    if words[-1] == "__init__":
        words.pop()
    return ".".join(words)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative ones resolved, and for ``from X
    import Y`` also ``X.Y`` (Y may be a module)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if _is_module(f"{base}.{alias.name}")]
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def edges() -> list[tuple[str, str, str, int, str]]:
    """(from part, to part, file, line, module) for every import between two parts."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = part_of(module_name(path))
        for line, module in imports(path):
            target = part_of(module)
            if source and target and target != source:
                found.append((source, target, path.relative_to(ROOT).as_posix(), line, module))
    return found


LAYER_OF = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def test_the_split_folders_own_modules_import_nothing() -> None:
    """``contract``, ``jobs`` and ``lifecycle`` sit on the bottom layer as packages: their
    ``__init__`` only documents (a hook that imports one module of them pays for no other)."""
    assert {f: imports(PACKAGE / f / "__init__.py") for f in SPLIT} == {f: [] for f in SPLIT}


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert sorted(p for p in parts if p and p not in LAYER_OF) == []
    assert sorted(p for p in LAYER_OF if p not in parts) == []  # no layer names a gone part


def test_no_import_runs_up_the_layers_but_the_documented_ones() -> None:
    upward = {(f, m): f"{f}:{line}: {s} (layer {LAYER_OF[s]}) imports {m} (layer {LAYER_OF[t]})"
              for s, t, f, line, m in edges() if LAYER_OF[t] > LAYER_OF[s]}
    undocumented = sorted(text for key, text in upward.items() if key not in UPWARD)
    assert undocumented == []
    assert sorted(set(UPWARD) - set(upward)) == []  # an exception that is no longer needed goes
    assert len(UPWARD) <= 3


def test_parts_of_one_layer_import_each_other_in_no_circle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for s, t, _f, _line, _m in edges():
        if LAYER_OF[s] == LAYER_OF[t]:
            graph[s].add(t)
    circles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def test_the_contract_imports_only_the_standard_library_and_errors() -> None:
    found = []
    for path in sorted((PACKAGE / "contract").rglob("*.py")):
        for line, module in imports(path):
            top = module.split(".")[0]
            if module == "__future__" or top in STDLIB or top == "":
                continue
            if module == "slurm_spot.errors" or module.startswith("slurm_spot.contract"):
                continue
            found.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert found == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The reader resolves what the checks rely on: a relative import, a module named in
    ``from package import module``, and an import inside a function."""
    pkg = tmp_path / "slurm_spot" / "lifecycle"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text("from . import watch\n\ndef f():\n    from slurm_spot.commands import status\n")
    (pkg / "watch.py").write_text("")
    (tmp_path / "slurm_spot" / "commands").mkdir()
    (tmp_path / "slurm_spot" / "commands" / "status.py").write_text("")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = {(line, part_of(m)) for line, m in imports(probe)}
    finally:
        ROOT = saved
    assert (1, "lifecycle/watch") in found and (4, "commands") in found
