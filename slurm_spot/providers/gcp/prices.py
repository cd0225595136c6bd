"""The ``gcp`` provider's prices: the shipped catalogue ``providers/gcp/prices.yaml`` (machine
type plus its GPUs; GCE spot prices change up to once every 30 days, and the Cloud Billing
Catalog API is not asked). spot.yaml's ``cost`` wins over it
(:func:`slurm_spot.providers.prices.price_of`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from slurm_spot.config import GcpProviderConfig, SpotConfig
from slurm_spot.providers.prices import CataloguePrices, read_catalogue


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The shipped GCP price catalogue (``slurm_spot/providers/gcp/prices.yaml``) as a dict
    (:func:`~slurm_spot.providers.prices.read_catalogue` says its keys)."""
    return read_catalogue(__package__ or "slurm_spot.providers.gcp")


def price_source(config: SpotConfig | None, name: str | None) -> CataloguePrices:
    """The prices of the ``gcp`` provider ``name`` of ``config``: the catalogue, for its
    region (a catalogue price of another region carries a warning). Without ``config`` or
    ``name``: the catalogue, region not known.

    Raises:
        ConfigError: ``name`` is not a ``gcp`` provider of ``config``.
    """
    region = None
    if config is not None and name is not None:
        from slurm_spot.providers.base import expect_settings

        region = expect_settings(config.providers[name], GcpProviderConfig, name).region
    return CataloguePrices("gcp", lambda: catalogue(), region)
