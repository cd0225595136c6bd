"""What a new provider type costs (issue 42, item 5; docs/DESIGN.md, "Adding a provider"):
its package, and at most three edits outside it, none silent.

A throwaway type, ``toycloud``, is made here the documented way: a package (written to
tmp_path, put on ``sys.path``), its line in the registry (:data:`PROVIDER_TYPES`) and its
settings model in the config's union (``ProviderSettings``; what every module sees once
provider_models.py names it), both monkeypatched; its extra in pyproject.toml (the third edit)
only matters to pip and the Ansible role, which are checked against the real registry below.
Then config parsing, ``render``, ``config check``/``config iam``, the cost order and the role's
choice of SDKs must take it with no other change. A module that keeps its own list of types
(a fourth place to edit) fails here, or in the scans of non-provider code below and in
tests/test_one_home.py.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib
import json
import operator
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, get_args

import pytest
import yaml
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import Field, create_model

import slurm_spot.config.provider_models as provider_models
from slurm_spot.cli import cli
from slurm_spot.config import ProviderSettings, SpotConfig, load_config
from slurm_spot.errors import ConfigError
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.lifecycle.weights import static_weights
from slurm_spot.providers import (
    PROVIDER_TYPES,
    capacity_codes,
    check_config,
    check_online,
    cloud_permissions,
    get_provider,
    package_for_type,
)
from slurm_spot.providers.base import normalize_code
from slurm_spot.render import render

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "ansible" / "roles" / "slurm_spot"
#: The built-in provider type: its nodes are processes on this machine, it needs no cloud
#: library (no extra), and the Ansible role names it as the one type that is no cloud.
LOCAL = "local"
#: What docs/DESIGN.md, "Adding a provider", lists outside the package: the three edits
#: :func:`toy` makes (the registry, the union) or the checks below stand for (the extra).
EDITS = ("slurm_spot/providers/__init__.py", "slurm_spot/config/provider_models.py",
         "pyproject.toml")

TOY = "toycloud"
TOY_MODULE = "slurm_spot_test_toycloud"
TOY_PACKAGE = textwrap.dedent('''
    """A provider type made up by tests/test_change_cost_provider.py: nothing behind it."""

    from __future__ import annotations

    from typing import Literal

    from slurm_spot.config.base import ConfigModel
    from slurm_spot.providers.base import LaunchResult, expect_settings, normalize_code
    from slurm_spot.providers.prices import CataloguePrices

    #: instance type -> (CPUs, MiB)
    SHAPES = {"toy.small": (2, 3800), "toy.large": (16, 61000)}
    #: a catalogue in the shape of providers/<type>/prices.yaml
    CATALOGUE = {"region": "toy-1", "as_of": "2026-01-01",
                 "on_demand": {"toy.small": 1.0, "toy.large": 6.0},
                 "spot": {"toy.small": 0.40, "toy.large": 1.50}}
    CAPACITY_CODE = "TOY_SOLD_OUT"


    class ToyProviderConfig(ConfigModel):
        type: Literal["toycloud"] = "toycloud"
        region: str


    class ToyProvider:
        def __init__(self, name):
            self.name = name

        def launch(self, request):
            return LaunchResult()

        def terminate(self, nodes):
            return []

        def terminate_instances(self, instance_ids):
            return None

        def list_instances(self):
            return []


    class NoNotices:
        name = "toycloud"
        interval_s = 1.0

        def poll(self):
            return None


    def make_provider(config, name, settings):
        expect_settings(settings, ToyProviderConfig, name)
        return ToyProvider(name)


    def check_node_set(config, index):
        ns = config.node_sets[index]
        return [f"node_sets.{index}.instance_types.{i}: {t!r} is not a toycloud type"
                for i, t in enumerate(ns.instance_types) if t not in SHAPES]


    def node_shape(config, index):
        ns = config.node_sets[index]
        cpus, memory = SHAPES[ns.instance_types[0]]
        return ns.model_copy(update={"cpus": cpus, "memory_mib": memory})


    def notice_source(config, node, settings):
        return NoNotices()


    def event_source(config, name, settings):
        return None


    def capacity_codes():
        return frozenset({normalize_code(CAPACITY_CODE)})


    def check_online(config, name):
        return []


    def price_source(config, name, live=False, live_on_demand=False):
        return CataloguePrices("toycloud", lambda: CATALOGUE)


    def permissions(config, name):
        return {"controller": {"attach": "the controller's toycloud role",
                               "permissions": ["toy.instances.create"]}}


    def instance_types(config, node_set):
        return list(node_set.instance_types)


    def instance_identity(config, node, settings):
        return None
''')


def _modules_of_the_package() -> Iterator[ModuleType]:
    for name, module in list(sys.modules.items()):
        if name == "slurm_spot" or name.startswith("slurm_spot."):
            yield module


def _add_to_the_union(monkeypatch: pytest.MonkeyPatch, model: type) -> None:
    """What naming ``model`` in provider_models.py's ``ProviderSettings`` does: the
    ``providers:`` entries of spot.yaml are validated against the wider union, and
    :data:`~slurm_spot.config.PROVIDER_TYPE_NAMES` (what the config derives its other lists
    from) has the type; every module's name for either is patched."""
    models = (*get_args(ProviderSettings), model)
    union = Annotated[functools.reduce(operator.or_, models), Field(discriminator="type")]
    factory = SpotConfig.model_fields["providers"].default_factory
    wider = create_model("SpotConfig", __base__=SpotConfig,
                         providers=(dict[str, union], Field(default_factory=factory)))
    names = tuple(str(m.model_fields["type"].default) for m in models)
    old_names = provider_models.PROVIDER_TYPE_NAMES
    for module in _modules_of_the_package():
        for attr, value in list(vars(module).items()):
            if value is SpotConfig:
                monkeypatch.setattr(module, attr, wider)
            elif value is old_names:
                monkeypatch.setattr(module, attr, names)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The ``toycloud`` package, registered and in the config's union."""
    package = tmp_path / "site" / TOY_MODULE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(TOY_PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    module = importlib.import_module(TOY_MODULE)
    try:
        monkeypatch.setitem(PROVIDER_TYPES, TOY, TOY_MODULE)  # edit 1: the registry
        _add_to_the_union(monkeypatch, module.ToyProviderConfig)  # edit 2: the union
        yield module
    finally:
        sys.modules.pop(TOY_MODULE, None)


def _site(tmp_path: Path, **changes: Any) -> Path:
    """spot.yaml of a toycloud site: two spot node sets of one partition, the dearer one
    first, and a local provider no node set uses; Slurm's commands faked."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for command in ("scontrol", "sinfo", "squeue", "scancel", "sbatch"):
        (bin_dir / command).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / command).chmod(0o755)
    data: dict[str, Any] = {
        "cluster": "toy", "slurm_bin_dir": str(bin_dir),
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
        "providers": {"tc": {"type": TOY, "region": "toy-1"}, "here": {"type": LOCAL}},
        "node_sets": [
            {"name": "large", "provider": "tc", "count": 3, "instance_types": ["toy.large"]},
            {"name": "small", "provider": "tc", "count": 2, "instance_types": ["toy.small"]},
        ],
        "partitions": [{"name": "burst", "node_sets": ["large", "small"]}],
        **changes,
    }
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_new_type_parses_and_its_errors_name_the_field(tmp_path: Path, toy: ModuleType) -> None:
    config = load_config(_site(tmp_path))
    assert isinstance(config.providers["tc"], toy.ToyProviderConfig)
    assert package_for_type(TOY) is toy
    # the config's derived lists know it: the known types, field names without the union tag
    data = yaml.safe_load(_site(tmp_path).read_text())
    data["providers"]["tc"]["no_such_key"] = 1
    data["providers"]["bad"] = {"type": "azure"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "bad.yaml")
    assert "providers.tc.no_such_key: unknown key" in str(err.value)
    assert f"providers.tc.{TOY}." not in str(err.value)
    assert f"unknown provider type 'azure'; known types: 'local', 'aws', 'gcp', '{TOY}'" \
        in str(err.value)
    # a node-set section of another type is refused for it, as for every registered type
    data = yaml.safe_load(_site(tmp_path).read_text())
    data["node_sets"][0]["gcp"] = {"zones": ["us-central1-a"], "machine_type": "g2-standard-4"}
    (tmp_path / "section.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"node_sets\.0\.gcp: only allowed for a node set of "
                                          r"a 'gcp' provider"):
        load_config(tmp_path / "section.yaml")


def test_a_new_type_is_rendered_checked_priced_and_ordered(tmp_path: Path, toy: ModuleType) -> None:
    config = load_config(_site(tmp_path))
    assert check_config(config) == [] and check_online(config) == []
    assert type(get_provider(config, "tc")).__name__ == "ToyProvider"
    assert normalize_code(toy.CAPACITY_CODE) in capacity_codes()
    # the cost order, from the package's prices: the small type (0.40 USD/h on spot) first
    assert static_weights(config) == {"small": 1, "large": 2}
    text = render(config, hooks_dir=Path("/opt/slurm-spot/bin"), version=(23, 11)).files[
        "slurm-spot.conf"]
    assert ("NodeName=small-[1-2] CPUs=2 RealMemory=3800 Feature=small,spot Weight=1 "
            "State=CLOUD") in text
    assert "NodeName=large-[1-3] CPUs=16 RealMemory=61000 Feature=large,spot Weight=2" in text
    assert cloud_permissions(config, ["tc", "here"]) == {"tc": toy.permissions(config, "tc")}


def test_config_check_iam_and_render_commands_take_a_new_type(tmp_path: Path, toy: ModuleType) -> None:
    site = _site(tmp_path)
    checked = CliRunner().invoke(cli, ["--config", str(site), "config", "check", "--json"])
    assert checked.exit_code == 0, checked.output
    assert read_envelope(checked.stdout, "config check")["nodes"] == 5
    iam = CliRunner().invoke(cli, ["--config", str(site), "config", "iam", "--json"])
    assert iam.exit_code == 0, iam.output
    assert read_envelope(iam.stdout, "config iam") == {"tc": toy.permissions(None, "tc")}
    rendered = CliRunner().invoke(cli, ["--config", str(site), "render", "--slurm-version",
                                        "23.11", "--output-dir", str(tmp_path / "out")])
    assert rendered.exit_code == 0, rendered.output
    assert "NodeName=large-[1-3] CPUs=16" in (tmp_path / "out" / "slurm-spot.conf").read_text()
    # the package's own check runs through the registry, and fails the command
    bad = _site(tmp_path, node_sets=[{"name": "small", "provider": "tc", "count": 1,
                                      "instance_types": ["toy.huge"]}],
                partitions=[{"name": "burst", "node_sets": ["small"]}])
    failed = CliRunner().invoke(cli, ["--config", str(bad), "config", "check"])
    assert failed.exit_code == 2
    assert "node_sets.0.instance_types.0: 'toy.huge' is not a toycloud type" in failed.output


# ---- the Ansible role: which cloud libraries it installs -----------------------------------

ROLE_VARS_PLAY = """
- name: Evaluate the role's derived variables
  hosts: localhost
  gather_facts: false
  vars_files:
    - "{{ role_dir }}/defaults/main.yml"
    - "{{ role_dir }}/vars/main.yml"
  tasks:
    - name: Write them
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0644"
        content: >-
          {{ {'extras': __slurm_spot_extras, 'suffix': __slurm_spot_extras_suffix,
              'cloud': __slurm_spot_cloud_providers | map(attribute='key') | list,
              'online': __slurm_spot_check_online | bool,
              'instance_args': __slurm_spot_slurmd_instance_args | bool} | to_json }}
"""


def role_choice(tmp_path: Path, providers: dict[str, Any],
                credentials: dict[str, str] | None = None) -> dict[str, Any]:
    """What the role derives from ``slurm_spot_providers``: the package extras pip installs
    (``extras``, ``suffix``), the cloud providers (``cloud``: their names), whether
    ``config check --online`` runs (``online``) and whether slurmd registers the instance's
    id (``instance_args``); evaluated by ansible-playbook from the role's own vars files."""
    playbook = shutil.which("ansible-playbook", path=f"{Path(sys.executable).parent}:/usr/bin")
    if playbook is None:
        pytest.fail("ansible-playbook not found: `make test` installs it (the dev extra)")
    (tmp_path / "role-vars.yml").write_text(ROLE_VARS_PLAY)
    out = tmp_path / "role-vars.json"
    (tmp_path / "role-vars-input.json").write_text(json.dumps({
        "slurm_spot_providers": providers, "slurm_spot_credentials": credentials or {},
        "role_dir": str(ROLE), "out": str(out), "ansible_python_interpreter": sys.executable}))
    proc = subprocess.run(
        [playbook, "-i", "localhost,", "-c", "local", str(tmp_path / "role-vars.yml"),
         "-e", f"@{tmp_path / 'role-vars-input.json'}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
             "ANSIBLE_HOME": str(tmp_path / "ansible-home")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_role_installs_a_new_types_extra_with_no_change(tmp_path: Path) -> None:
    choice = role_choice(tmp_path, {"tc": {"type": TOY, "region": "toy-1"},
                                    "here": {"type": LOCAL}}, {"key.json": "{}"})
    assert choice == {"extras": [TOY], "suffix": f"[{TOY}]", "cloud": ["tc"], "online": True,
                      "instance_args": True}
    assert role_choice(tmp_path, {"here": {"type": LOCAL}}, {"key.json": "{}"}) == {
        "extras": [], "suffix": "", "cloud": [], "online": False, "instance_args": False}


# ---- the third edit: pyproject.toml's extra, which pip, the role and `make` install ----------

def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _extras() -> dict[str, list[Requirement]]:
    return {canonicalize_name(name): [Requirement(r) for r in reqs]
            for name, reqs in _pyproject()["project"]["optional-dependencies"].items()}


def _expand(extras: set[str]) -> set[str]:
    """``extras`` and every extra they pull in through a ``slurm-spot[...]`` requirement."""
    table, found = _extras(), set()
    todo = {canonicalize_name(e) for e in extras}
    while todo:
        extra = todo.pop()
        found.add(extra)
        for req in table.get(extra, []):
            if canonicalize_name(req.name) == "slurm-spot":
                todo |= {canonicalize_name(e) for e in req.extras} - found
    return found


CLOUD_TYPES = sorted(set(PROVIDER_TYPES) - {LOCAL})


@pytest.mark.parametrize("provider_type", CLOUD_TYPES)
def test_every_cloud_type_has_the_extra_of_its_name(provider_type: str) -> None:
    """The role installs ``slurm-spot[<type>]`` for each configured type but local: a type
    registered without that extra would get no cloud library, so it fails here."""
    assert canonicalize_name(provider_type) in _extras(), (
        f"pyproject.toml [project.optional-dependencies] has no {provider_type!r} extra (the "
        f"cloud library of provider type {provider_type!r})")


def test_only_local_has_no_extra() -> None:
    """The role's one named type (``reject('equalto', 'local')``) is the one without an extra."""
    assert {t for t in PROVIDER_TYPES if canonicalize_name(t) not in _extras()} == {LOCAL}


def test_the_role_installs_the_extra_of_every_registered_cloud_type(tmp_path: Path) -> None:
    choice = role_choice(tmp_path, {f"p-{t}": {"type": t} for t in PROVIDER_TYPES})
    assert choice["extras"] == CLOUD_TYPES
    assert choice["cloud"] == [f"p-{t}" for t in PROVIDER_TYPES if t != LOCAL]


def test_make_and_the_dev_extra_install_every_cloud_library() -> None:
    """``make`` installs the dev extra, which pulls in every cloud type's (each provider's
    tests import its library); the Makefile's own list of extras needs no new entry."""
    assert set(map(canonicalize_name, CLOUD_TYPES)) <= _expand({"dev"}), _extras()["dev"]
    installed = re.search(r'\$\(PIP\) install [^\n]*-e "\.\[([^\]]+)\]"',
                          (ROOT / "Makefile").read_text())
    assert installed is not None, "the Makefile's editable install of the venv"
    assert set(map(canonicalize_name, CLOUD_TYPES)) <= _expand(set(installed.group(1).split(",")))


def test_every_providers_data_file_is_package_data() -> None:
    """A provider package's data (its prices.yaml) is in the wheel without an edit to
    pyproject.toml: one glob covers every provider package."""
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    providers = ROOT / "slurm_spot" / "providers"
    files = [p for p in providers.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
             and "__pycache__" not in p.parts]
    assert any(p.suffix == ".yaml" for p in files)
    for path in files:
        rel = path.relative_to(providers).as_posix()
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in data.get("slurm_spot.providers", [])), \
            f"{path.relative_to(ROOT)}: not package data"


# ---- no fourth place: nothing else lists provider types --------------------------------------

def _listed(section: str) -> list[str]:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    body = text.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\d+\. `([^`]+)`", body, re.M)


def test_the_design_lists_the_three_edits_this_file_makes_or_checks() -> None:
    assert tuple(_listed("Adding a provider")) == EDITS


def test_no_module_outside_the_providers_and_the_union_lists_provider_types() -> None:
    """A literal list, tuple, set or dict with two registered type names or more (``("aws",
    "gcp")``) outside the registry's package and provider_models.py is a second list that a
    new type would have to join."""
    allowed = ("slurm_spot/providers/", "slurm_spot/config/provider_models.py")
    found = []
    for path in sorted((ROOT / "slurm_spot").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, ast.List | ast.Tuple | ast.Set):
                elements = node.elts
            elif isinstance(node, ast.Dict):
                elements = [k for k in node.keys if k is not None]
            else:
                continue
            types = {e.value for e in elements if isinstance(e, ast.Constant)
                     and isinstance(e.value, str) and e.value in PROVIDER_TYPES}
            if len(types) >= 2:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert found == []


def test_the_role_and_the_templates_name_no_cloud_type() -> None:
    """The role's tasks, variables and templates (and the package's templates) derive the
    cloud types from the configured providers: none names one outside a comment."""
    files = [p for part in ("tasks", "vars", "defaults", "handlers", "templates")
             for p in sorted((ROLE / part).rglob("*")) if p.is_file()]
    files += sorted((ROOT / "templates").glob("*.j2"))
    pattern = re.compile(rf"\b({'|'.join(map(re.escape, CLOUD_TYPES))})\b")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), start=1)
             if not line.lstrip().startswith("#") and pattern.search(line)]
    assert found == []
