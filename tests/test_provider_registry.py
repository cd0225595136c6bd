"""The provider registry: one package per provider type, found by type; an unknown type is a
configuration error naming the field; the reconciler's capacity codes are the providers'."""

from __future__ import annotations

from datetime import date

import pytest

from slurm_spot.config import PROVIDER_TYPE_NAMES, SpotConfig, parse_config
from slurm_spot.config.provider_models import node_set_sections
from slurm_spot.errors import ConfigError
from slurm_spot.providers import (
    PROVIDER_TYPES,
    capacity_codes,
    check_config,
    get_provider,
    package_for_type,
)
from slurm_spot.providers.aws.errors import error_kind
from slurm_spot.providers.base import ErrorClass, normalize_code
from slurm_spot.providers.gcp.errors import classify_gcp
from slurm_spot.providers.prices import UnknownPriceError
from slurm_spot.reconcile.history import KNOWN_CAPACITY_CODES


def config(providers: dict, node_set: dict | None = None) -> SpotConfig:
    return parse_config({
        "cluster": "reg", "providers": providers,
        "node_sets": [{"name": "a", "provider": "p", "count": 2, **(node_set or {})}],
        "partitions": [{"name": "part", "node_sets": ["a"]}],
    }, "spot.yaml")


@pytest.mark.parametrize("body, problem", [
    ({"type": "azure"}, "providers.p.type: unknown provider type 'azure'; known types: "),
    ({"region": "x"}, "providers.p.type: missing; known types: "),
])
def test_unknown_or_missing_type_is_a_config_error_naming_the_field(body, problem) -> None:
    with pytest.raises(ConfigError) as err:
        config({"p": body})
    assert problem in str(err.value) and "'gcp'" in str(err.value)
    assert str(err.value).startswith("spot.yaml")


def test_unknown_type_reaching_the_registry_is_an_error_not_a_fallback() -> None:
    with pytest.raises(ConfigError, match=r"providers\.p\.type: unknown provider type 'azure'"):
        package_for_type("azure", "providers.p.type")


def test_every_registered_type_is_a_package_and_builds_its_provider(tmp_path) -> None:
    for provider_type in PROVIDER_TYPES:
        package = package_for_type(provider_type)
        assert package.__name__ == PROVIDER_TYPES[provider_type]  # type: ignore[attr-defined]
    cfg = config({"p": {"type": "local"}}).model_copy(update={"state_dir": tmp_path})
    provider = get_provider(cfg, "p")
    assert type(provider).__name__ == "LocalProvider" and provider.name == "p"
    with pytest.raises(ConfigError, match=r"providers\.nope: not defined"):
        get_provider(cfg, "nope")


def test_checks_go_to_the_node_sets_provider() -> None:
    gcp = config({"p": {"type": "gcp", "project": "pr", "region": "europe-west4"}},
                 {"gcp": {"zones": ["us-central1-a"], "machine_type": "g2-standard-4"}})
    problems = check_config(gcp)
    assert any(p.startswith("node_sets.0.gcp.zones.0") for p in problems), problems
    assert check_config(config({"p": {"type": "local"}})) == []


def test_capacity_codes_are_the_capacity_rows_of_each_providers_table() -> None:
    codes = capacity_codes()
    assert KNOWN_CAPACITY_CODES == codes
    for code in ("InsufficientInstanceCapacity", "InsufficientHostCapacity", "UnfulfillableCapacity",
                 "ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT", "VM_MIN_COUNT_NOT_REACHED"):
        assert normalize_code(code) in codes, code
    # the old hand-written list called SpotMaxPriceTooLow capacity; EC2's table says config
    assert error_kind("SpotMaxPriceTooLow").error_class is ErrorClass.CONFIG
    assert normalize_code("SpotMaxPriceTooLow") not in codes
    assert normalize_code("QUOTA_EXCEEDED") not in codes
    assert classify_gcp("QUOTA_EXCEEDED") is ErrorClass.QUOTA


def test_the_registry_and_the_config_name_the_same_provider_types() -> None:
    """One list of provider types: the registry. The config's union of settings models must
    name the same ones (the config's other lists are derived from that union)."""
    assert set(PROVIDER_TYPE_NAMES) == set(PROVIDER_TYPES)
    assert set(node_set_sections()) <= set(PROVIDER_TYPES)
    for provider_type in PROVIDER_TYPES:  # every type has a price source through the registry
        source = package_for_type(provider_type).price_source(None, None)
        with pytest.raises(UnknownPriceError, match=rf"\({provider_type}\).*set cost\."):
            source.instance("on-demand", "no-such-type", None, None, date(2026, 12, 1))


@pytest.mark.parametrize("provider_type", sorted(PROVIDER_TYPES))
def test_every_registered_type_gets_field_names_and_section_checks(provider_type: str) -> None:
    """What used to be hand-written per type (and silently missed a new one): a bad key under
    a provider is named without pydantic's union tag, and a node set's sections are checked,
    for every registered type."""
    with pytest.raises(ConfigError) as err:
        config({"p": {"type": provider_type, "no_such_key": 1}})
    assert "providers.p.no_such_key: unknown key" in str(err.value)
    assert f"providers.p.{provider_type}." not in str(err.value)
    for section in node_set_sections():
        if section == provider_type:
            continue
        with pytest.raises(ConfigError, match=rf"node_sets\.0\.{section}: only allowed for a "
                                              rf"node set of a '{section}' provider"):
            settings = {"type": provider_type, **_REQUIRED.get(provider_type, {})}
            config({"p": settings}, {section: _SECTIONS[section]})


_REQUIRED = {"aws": {"region": "us-east-1"}, "gcp": {"project": "pr", "region": "us-central1"}}
_SECTIONS = {"aws": {"launch_template": "t", "subnets": ["subnet-1"]},
             "gcp": {"zones": ["us-central1-a"], "machine_type": "g2-standard-4"}}
