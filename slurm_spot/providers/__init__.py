"""Cloud providers. :func:`get_provider` builds one by name from the configuration, importing
a cloud library only when a node set of that provider is involved (``import boto3`` costs
~0.4 s, ``google.cloud.compute_v1`` ~1.7 s in a short-lived hook)."""

from __future__ import annotations

from slurm_spot.config import SpotConfig
from slurm_spot.errors import ConfigError
from slurm_spot.providers.base import Provider


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
