"""Cloud providers. :func:`get_provider` builds one by name from the configuration, importing
a cloud library only when a node set of that provider is involved (``import boto3`` costs
~0.4 s, ``google.cloud.compute_v1`` ~1.7 s in a short-lived hook)."""

from __future__ import annotations

from slurm_spot.config import SpotConfig
from slurm_spot.errors import ConfigError
from slurm_spot.providers.base import ErrorClass, Provider, normalize_code

#: Codes slurm-spot's own launchers use (local provider; EC2's spelling).
LOCAL_ERROR_CLASSES = {"InsufficientInstanceCapacity": ErrorClass.CAPACITY}


def error_classes(provider_type: str) -> dict[str, ErrorClass]:
    """The one code -> class table of a provider type (``local``, ``aws``, ``gcp``): what the
    hooks classify launch errors with, and what the reconciler reads reasons' codes with.

    Raises:
        KeyError: an unknown provider type.
    """
    if provider_type == "aws":
        from slurm_spot.providers.aws.errors import error_classes as aws_classes

        return aws_classes()
    if provider_type == "gcp":
        from slurm_spot.providers.gcp.errors import GCP_ERROR_CLASSES

        return dict(GCP_ERROR_CLASSES)
    if provider_type == "local":
        return dict(LOCAL_ERROR_CLASSES)
    raise KeyError(provider_type)


def codes_of_class(error_class: ErrorClass, provider_types: tuple[str, ...] = (
        "local", "aws", "gcp")) -> frozenset[str]:
    """Normalized codes (:func:`~slurm_spot.providers.base.normalize_code`) that the providers'
    tables put in ``error_class``."""
    return frozenset(normalize_code(code) for kind in provider_types
                     for code, cls in error_classes(kind).items() if cls is error_class)


def get_provider(config: SpotConfig, name: str) -> Provider:
    """The provider called ``name`` under ``providers:`` in the config.

    Raises:
        ConfigError: no such provider.
    """
    settings = config.providers.get(name)
    if settings is None:
        raise ConfigError("<config>", [f"providers.{name}: not defined"])
    if settings.type == "local":
        from slurm_spot.providers.local.provider import LocalProvider

        return LocalProvider(config, name, settings)
    if settings.type == "aws":
        from slurm_spot.providers.aws.provider import AwsProvider

        return AwsProvider(config, name, settings)
    from slurm_spot.providers.gcp.provider import GcpProvider

    return GcpProvider(config, name, settings)
