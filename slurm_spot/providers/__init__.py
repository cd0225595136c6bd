"""Cloud providers, behind a registry keyed by the ``type`` of a ``providers:`` entry.

Each type is a package (``providers/<type>/``) whose ``__init__`` implements
:class:`~slurm_spot.providers.base.ProviderPackage`: it builds the provider, checks a node set,
resolves a node set's shape, makes the interruption-notice source and lists the error codes
that mean "no capacity". Those functions import the provider's modules (and its cloud
library) only when called, so a hook or a check that involves only ``local`` node sets never
imports boto3 (~0.4 s) or ``google.cloud.compute_v1`` (~1.7 s).

This registry is the one list of provider types. The only other place a type is named is its
settings model in :mod:`slurm_spot.config.provider_models` (the ``ProviderSettings`` union, which
spot.yaml is validated against); the config's own lists (the known types an error names, the
node-set sections, ``PROVIDER_TYPE_NAMES``) are derived from that union, and
tests/test_provider_registry.py fails when the union and :data:`PROVIDER_TYPES` differ. Either
way round a mismatch is loud at run time too: a type the config accepts but the registry lacks
is a ConfigError here, a type registered without a model is rejected by the config.

Adding a provider type (docs/DESIGN.md, "Adding a provider"): a package under ``providers/``,
one line in :data:`PROVIDER_TYPES`, its settings model (and node-set section, if it has one)
in :mod:`slurm_spot.config.provider_models`, and its cloud library as the pyproject.toml extra
named after the type (the Ansible role installs ``slurm-spot[<type>]`` for every configured
type but ``local``, so it lists none). tests/test_change_cost_provider.py registers a made-up
type this way and fails when anything else would need an edit. An unknown type is a
configuration error that names the field, never a fallback to another provider.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.errors import ConfigError
from slurm_spot.providers.base import Finding, Instance, Provider, ProviderPackage
from slurm_spot.slurm.reasons import parse_slurm_time

if TYPE_CHECKING:
    from slurm_spot.slurm.client import Node

#: provider type (``providers.<name>.type`` in spot.yaml) -> package implementing it.
PROVIDER_TYPES: dict[str, str] = {
    "local": "slurm_spot.providers.local",
    "aws": "slurm_spot.providers.aws",
    "gcp": "slurm_spot.providers.gcp",
}


def package_for_type(provider_type: str, where: str = "providers.<name>.type",
                     path: str = "<config>") -> ProviderPackage:
    """The package of provider type ``provider_type``.

    Raises:
        ConfigError: no such type; the message names ``where`` (the field) and the known types.
    """
    module = PROVIDER_TYPES.get(provider_type)
    if module is None:
        raise ConfigError(path, [f"{where}: unknown provider type {provider_type!r}; "
                                 f"known types: {', '.join(sorted(PROVIDER_TYPES))}"])
    return cast(ProviderPackage, importlib.import_module(module))


def package_for(config: SpotConfig, name: str) -> ProviderPackage:
    """The package of the provider called ``name`` under ``providers:`` in the config.

    Raises:
        ConfigError: no such provider, or a type with no package.
    """
    settings = config.providers.get(name)
    path = str(config.source_path)
    if settings is None:
        raise ConfigError(path, [f"providers.{name}: not defined"])
    return package_for_type(settings.type, f"providers.{name}.type", path)


def get_provider(config: SpotConfig, name: str) -> Provider:
    """The provider called ``name`` under ``providers:`` in the config.

    Raises:
        ConfigError: no such provider, or an unknown provider type.
    """
    return package_for(config, name).make_provider(config, name, config.providers[name])


def check_config(config: SpotConfig) -> list[str]:
    """Problems the schema cannot see, from each node set's provider (empty list: fine):
    its own checks, then, for a node set they pass, its shape
    (:meth:`ProviderPackage.node_shape`: machine types that differ, a written shape beyond a
    type's, a type whose shape nobody knows), so that ``config check`` refuses what ``render``
    would. Each problem is one line naming the field (``node_sets.0.aws.subnets``) and the
    reason.

    Raises:
        ConfigError: a node set's provider has an unknown type.
    """
    problems: list[str] = []
    for index, ns in enumerate(config.node_sets):
        package = package_for(config, ns.provider)
        found = package.check_node_set(config, index)
        problems.extend(found)
        if found:
            continue
        try:
            package.node_shape(config, index)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def check_online(config: SpotConfig) -> list[Finding]:
    """``config check --online``: every provider that one of the node sets uses is asked
    about them (:meth:`ProviderPackage.check_online`), in the order of ``providers:``.

    Raises:
        ConfigError: a node set's provider has an unknown type.
    """
    used = {ns.provider for ns in config.node_sets}
    findings: list[Finding] = []
    for name in config.providers:
        if name in used:
            findings.extend(package_for(config, name).check_online(config, name))
    return findings


def capacity_codes() -> frozenset[str]:
    """Every registered provider's codes that mean "no capacity in this pool now",
    normalized (:func:`~slurm_spot.providers.base.normalize_code`); from their error tables."""
    codes: set[str] = set()
    for provider_type in PROVIDER_TYPES:
        codes.update(package_for_type(provider_type).capacity_codes())
    return frozenset(codes)


def cloud_permissions(config: SpotConfig, names: list[str]) -> dict[str, dict[str, dict[str, object]]]:
    """``config iam``: provider name -> what it needs granted
    (:meth:`ProviderPackage.permissions`), for each of ``names`` that needs anything.

    Raises:
        ConfigError: a name is not a provider, or its type has no package.
    """
    found = {}
    for name in names:
        grants = package_for(config, name).permissions(config, name)
        if grants is not None:
            found[name] = grants
    return found


def instance_types(config: SpotConfig, node_set: NodeSetConfig) -> list[str]:
    """The instance types ``node_set`` may launch, as its provider names them
    (:meth:`ProviderPackage.instance_types`).

    Raises:
        ConfigError: the node set's provider is not defined, or its type has no package.
    """
    return package_for(config, node_set.provider).instance_types(config, node_set)


def assign_listings(config: SpotConfig,
                    listings: Mapping[str, Sequence[Instance]]) -> dict[str, list[Instance]]:
    """Each listed instance under one provider only (pure): ``listings`` is provider name ->
    its ``list_instances()``; the result has the same keys.

    Two providers may list the same instance: a provider lists every instance labelled with the
    cluster that its API shows, and two ``gcp`` providers of one project (two regions) both see
    every zone's (``aggregatedList``), as do two ``aws`` providers of one account and region.
    Counted twice, one instance would look like a duplicate of itself to the reconciler, which
    terminates all but one of a node's instances. An instance goes to the provider of its node
    set when that provider listed it, else (an orphan, a node set no longer in spot.yaml) to
    the first of its listers by name. An instance id listed twice by one provider is kept once.
    """
    owner = {ns.name: ns.provider for ns in config.node_sets}
    chosen: dict[str, str] = {}
    for name in sorted(listings):
        for inst in listings[name]:
            chosen.setdefault(inst.instance_id, name)
    for name in sorted(listings):
        for inst in listings[name]:
            if owner.get(inst.node_set or "") == name:
                chosen[inst.instance_id] = name
    result: dict[str, list[Instance]] = {}
    for name, listed in listings.items():
        seen: set[str] = set()
        kept = result[name] = []
        for inst in listed:
            if chosen[inst.instance_id] == name and inst.instance_id not in seen:
                seen.add(inst.instance_id)
                kept.append(inst)
    return result


#: A node's BootTime (second precision) is a little later than its instance's launch.
BOOT_SLACK = timedelta(seconds=2)

def pick_kept(node: Node, alive: Sequence[Instance]) -> Instance:
    """The instance Slurm knows among several alive ones for ``node``.

    On Slurm 23.11+ the resume hook records the node's InstanceId, and the instance with that
    id is the one (an id is never reused; an address can be recycled by the cloud or reported
    late). Otherwise (older Slurm, or no id recorded) instances whose private IP is the node's
    NodeAddr are preferred (all of them when none matches, or when all share one address as
    local instances do). Among those, the newest launched no later than the node's BootTime
    (+2 s) registered last; without a BootTime, or with every candidate newer, the oldest is
    kept: it is the first to have booted.
    """
    by_id = [i for i in alive if node.instance_id and i.instance_id == node.instance_id]
    if by_id:
        return by_id[0]
    matching = [i for i in alive if i.private_ip and i.private_ip == node.addr] or list(alive)
    boot = parse_slurm_time(node.boot_time)
    if boot is not None:
        before = [i for i in matching if i.launch_time <= boot + BOOT_SLACK]
        if before:
            return max(before, key=lambda i: i.launch_time)
    return min(matching, key=lambda i: i.launch_time)
