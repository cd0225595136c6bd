"""The price book of a site: every price a cost figure needs, asked of the providers.

Instance-hour prices are each provider type's (:mod:`slurm_spot.providers.prices` has the
record, the precedence and the catalogue reader; ``providers/<type>/prices.py`` the cloud's
own: the AWS spot price history and Price List API, the shipped catalogues), found through the
provider registry (:meth:`~slurm_spot.providers.base.ProviderPackage.price_source`);
checkpoint storage and egress prices are spot.yaml's only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any

from slurm_spot.config import CostConfig, NodeSetConfig, SpotConfig
from slurm_spot.providers import instance_types, package_for, package_for_type
from slurm_spot.providers.prices import Market, Price, PriceSource, UnknownPriceError, price_of, utc_today

log = logging.getLogger(__name__)


@dataclass
class PriceBook:
    """All prices a cost figure needs, for one site.

    Args:
        cost: the ``cost`` section of spot.yaml.
        sources: provider type -> its price source (the site's first provider of that type);
            a type not here is priced from its shipped catalogue alone (region not known).
        provider_types: provider name (a key of ``providers``) -> type (aws, gcp, local).
        checkpoint_keep: how many checkpoints a job keeps (``checkpoint.keep``).
        today: the date prices are judged old against (UTC), injectable for tests.
    """

    cost: CostConfig
    sources: dict[str, PriceSource] = field(default_factory=dict)
    provider_types: dict[str, str] = field(default_factory=dict)
    checkpoint_keep: int = 2
    today: Callable[[], date] = field(default=utc_today)

    @property
    def regions(self) -> dict[str, str]:
        """Provider type -> the cluster's region for it (its source's), where known."""
        return {t: s.region for t, s in self.sources.items() if s.region}

    def source(self, provider: str) -> PriceSource:
        """The price source of provider type ``provider`` (the registry's catalogue-only one
        when the site has none of that type).

        Raises:
            ConfigError: no such provider type.
        """
        if provider not in self.sources:
            self.sources[provider] = package_for_type(provider).price_source(None, None)
        return self.sources[provider]

    def instance(self, provider: str, market: Market, instance_type: str,
                 zone: str | None = None, region: str | None = None) -> Price:
        """USD per instance-hour of ``instance_type`` on provider type ``provider`` (``aws``,
        ``gcp``, ``local``) in ``market``, for ``region`` (default: the cluster's,
        :attr:`regions`): spot.yaml's price, else the provider's
        (:func:`~slurm_spot.providers.prices.price_of`). A catalogue price for another region
        or read long ago carries ``warning``.

        Raises:
            UnknownPriceError: no price anywhere (message names the type and zone and, for AWS
                spot, why the live lookup gave none: not configured, or the botocore error
                such as missing credentials).
            ConfigError: no such provider type.
        """
        return price_of(self.cost, self.source(provider), market, instance_type, zone, region,
                        self.today())

    def storage_usd_per_gb_month(self, provider_name: str) -> float:
        """Checkpoint storage price of a provider (config only).

        Raises:
            UnknownPriceError: not configured."""
        return self._configured("storage", "storage_usd_per_gb_month", provider_name)

    def egress_usd_per_gb(self, provider_name: str) -> float:
        """Egress price of a provider (config only).

        Raises:
            UnknownPriceError: not configured."""
        return self._configured("egress", "egress_usd_per_gb", provider_name)

    def _configured(self, what: str, setting: str, provider_name: str) -> float:
        """spot.yaml's ``cost.<setting>.<provider_name>`` (a per-provider price in USD, of
        the unit the setting's name says); ``what`` names the price in the error.

        Raises:
            UnknownPriceError: not configured (the message names the setting to set)."""
        prices: Mapping[str, float] = getattr(self.cost, setting)
        if provider_name not in prices:
            raise UnknownPriceError(
                f"no {what} price for provider {provider_name!r}: set "
                f"cost.{setting}.{provider_name} in spot.yaml")
        return prices[provider_name]


def price_dict(price: Price) -> dict[str, Any]:
    """``price`` as a JSON-ready dict."""
    return asdict(price)


def site_prices(config: SpotConfig, live_spot: bool = True) -> PriceBook:
    """The price book of a site: its ``cost`` settings and, for each provider type, its first
    provider's price source (:meth:`~slurm_spot.providers.base.ProviderPackage.price_source`;
    with ``live_spot`` live prices: for ``aws`` DescribeSpotPriceHistory and the Price List
    API through the provider's own session, ``credentials_file`` included, cached under
    ``<state_dir>/cost/``). Nothing is asked of a cloud until a price is.

    Raises:
        ConfigError: a provider's type has no package.
    """
    sources: dict[str, PriceSource] = {}
    for name, settings in config.providers.items():
        if settings.type not in sources:
            sources[settings.type] = package_for(config, name).price_source(
                config, name, live=live_spot, live_on_demand=live_spot)
    return PriceBook(config.cost, sources, {name: p.type for name, p in config.providers.items()},
                     config.checkpoint.keep)


#: A node set -> its price in USD per node-hour, or None when none can be had.
PriceOf = Callable[[NodeSetConfig], "float | None"]


def price_books(config: SpotConfig, live: bool) -> dict[str, PriceBook]:
    """One :class:`PriceBook` per provider name, for that provider's region; with ``live``,
    AWS spot prices come from ``DescribeSpotPriceHistory`` of each AWS provider (its profile,
    credentials file, region and endpoint; boto3 is imported only when a price is first
    asked); on-demand prices are never asked of the Price List API here (the reconciler would
    ask it every pass where it is refused).

    Raises:
        ConfigError: a provider's type has no package."""
    books = {}
    for name, settings in config.providers.items():
        source = package_for(config, name).price_source(config, name, live=live)
        books[name] = PriceBook(config.cost, {settings.type: source}, {name: settings.type})
    return books


def price_lookup(config: SpotConfig, live: bool,
                 known: MutableMapping[str, float] | None = None) -> PriceOf:
    """A :data:`PriceOf` over :func:`price_books`: the cheapest of the node set's types in its
    market; a type without a price anywhere is skipped; a node set with none at all gets
    ``known``'s last price (when given: it is updated with every price found), else None."""
    books = price_books(config, live)

    def price_of(ns: NodeSetConfig) -> float | None:
        book = books[ns.provider]
        kind = config.providers[ns.provider].type
        prices = []
        for instance_type in instance_types(config, ns):
            try:
                prices.append(book.instance(kind, ns.market, instance_type).usd_per_h)
            except UnknownPriceError as exc:
                log.info("cost order: %s: %s", ns.name, exc)
        if prices:
            if known is not None:
                known[ns.name] = min(prices)
            return min(prices)
        return known.get(ns.name) if known is not None else None

    return price_of
