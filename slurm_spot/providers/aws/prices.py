"""The ``aws`` provider's prices: spot from ``DescribeSpotPriceHistory`` (cached), on-demand
from the Price List API's ``GetProducts`` for a region the catalogue does not cover (cached),
else the shipped catalogue ``providers/aws/prices.yaml``; every client comes from the
provider's one session builder (:func:`~slurm_spot.providers.aws.session.boto_session`:
``profile``, ``credentials_file``, ``endpoint_url``). The precedence around these
(spot.yaml's ``cost`` first) is :func:`slurm_spot.providers.prices.price_of`.

API reference: Amazon EC2 API Reference (DescribeSpotPriceHistory); AWS Price List Query API
(GetProducts, answered in us-east-1 for every region).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from slurm_spot.config import AwsProviderConfig, SpotConfig
from slurm_spot.providers.prices import (
    CataloguePrices,
    JsonCache,
    Market,
    Price,
    UnknownPriceError,
    catalogue_warning,
    read_catalogue,
)

PRODUCT = "Linux/UNIX"
#: The AWS Price List API answers in us-east-1 for every region's prices (filter: regionCode).
PRICE_LIST_REGION = "us-east-1"
#: Cached on-demand prices are asked again after this long (they change rarely).
ON_DEMAND_MAX_AGE_S = 7 * 86_400.0


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The shipped AWS price catalogue (``slurm_spot/providers/aws/prices.yaml``) as a dict
    (:func:`~slurm_spot.providers.prices.read_catalogue` says its keys)."""
    return read_catalogue(__package__ or "slurm_spot.providers.aws")


def parse_price_list(items: list[str], instance_type: str, region: str) -> tuple[float, str]:
    """The Linux on-demand USD per hour of ``instance_type`` in ``region`` from the
    ``PriceList`` of a Price List API ``GetProducts`` answer (each item a JSON string: a
    ``product`` with ``attributes``, and ``terms.OnDemand.<offer>.priceDimensions.<rate>``
    with ``unit`` ``Hrs`` and ``pricePerUnit.USD``), and the answer's ``publicationDate``
    (``YYYY-MM-DD``). Items for other types, regions, operations than ``RunInstances``
    (Linux/UNIX, no licence) or capacity than ``Used`` are ignored.

    Raises:
        UnknownPriceError: no hourly price in the answer, or several different ones (named).
    """
    found: dict[float, str] = {}
    for text in items:
        item = json.loads(text) if isinstance(text, str) else text
        attrs = (item.get("product") or {}).get("attributes") or {}
        if (attrs.get("instanceType") != instance_type or attrs.get("regionCode") != region
                or attrs.get("operation", "RunInstances") != "RunInstances"
                or attrs.get("capacitystatus", "Used") != "Used"):
            continue
        for offer in ((item.get("terms") or {}).get("OnDemand") or {}).values():
            for dim in (offer.get("priceDimensions") or {}).values():
                usd = (dim.get("pricePerUnit") or {}).get("USD")
                if dim.get("unit") == "Hrs" and usd is not None and float(usd) > 0:
                    found[float(usd)] = str(item.get("publicationDate") or "")[:10]
    if len(found) != 1:
        what = "no hourly Linux on-demand price" if not found else \
            f"several prices ({', '.join(f'{p:g}' for p in sorted(found))} USD/h)"
        raise UnknownPriceError(f"AWS Price List: {what} for {instance_type} in {region}")
    ((usd, published),) = found.items()
    return usd, published



class AwsOnDemandPrices:
    """AWS on-demand prices of one region from the Price List API (``pricing`` client in
    :data:`PRICE_LIST_REGION`, ``GetProducts`` filtered by instance type and ``regionCode``,
    parsed by :func:`parse_price_list`), cached in a JSON file for :data:`ON_DEMAND_MAX_AGE_S`.

    Args:
        client_factory: returns a boto3 ``pricing`` client (called only on a cache miss).
        region: the cluster's region whose prices are asked (``eu-west-1``).
        cache_file: where the cache lives, or None for no cache.
        clock: ``datetime``-returning now (UTC), injectable for tests.
    """

    FILTERS = (("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
               ("capacitystatus", "Used"), ("licenseModel", "No License required"))

    def __init__(self, client_factory: Callable[[], Any], region: str, cache_file: Path | None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.client_factory = client_factory
        self.region = region
        self.cache = JsonCache(cache_file)
        self.clock = clock

    def price(self, instance_type: str) -> Price:
        """The on-demand price of ``instance_type`` in :attr:`region`.

        Raises:
            UnknownPriceError: the answer has no (or no single) Linux on-demand price.
            botocore exceptions: the API call failed (no credentials, no network).
        """
        data = self.cache.load()
        key = f"{self.region}/{instance_type}"
        now = self.clock()
        entry = data.get(key)
        age = None
        if isinstance(entry, dict):
            try:
                age = (now - datetime.fromisoformat(entry["fetched"])).total_seconds()
            except (KeyError, TypeError, ValueError):
                age = None
        if not isinstance(entry, dict) or age is None or not 0 <= age <= ON_DEMAND_MAX_AGE_S:
            client = self.client_factory()
            items: list[str] = []
            filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in
                       (("instanceType", instance_type), ("regionCode", self.region),
                        *self.FILTERS)]
            for page in client.get_paginator("get_products").paginate(
                    ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"):
                items += page.get("PriceList", [])
            usd, published = parse_price_list(items, instance_type, self.region)
            entry = {"usd_per_h": usd, "published": published, "fetched": now.isoformat()}
            data[key] = entry
            self.cache.save(data)
            age = 0.0
        return Price(float(entry["usd_per_h"]), f"aws-price-list {self.region}", age_s=age,
                     region=self.region, as_of=entry.get("published") or None)


class AwsSpotPrices:
    """Current AWS spot prices from ``DescribeSpotPriceHistory`` (EC2 API reference:
    one record per type and zone; with ``StartTime`` = now it returns the price in force),
    cached in a JSON file with the time each was fetched.

    Args:
        client_factory: returns a boto3 EC2 client of the region (called only on a cache miss).
        region: the client's region (the cache key).
        cache_file: where the cache lives (created with its directory), or None for no cache.
        max_age_s: cached entries older than this are fetched again.
        clock: ``datetime``-returning now (UTC), injectable for tests.
    """

    def __init__(self, client_factory: Callable[[], Any], region: str, cache_file: Path | None,
                 max_age_s: float = 3600,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.client_factory = client_factory
        self.region = region
        self.cache = JsonCache(cache_file)
        self.max_age_s = max_age_s
        self.clock = clock

    def _fetch(self, instance_type: str) -> dict[str, Any]:
        client = self.client_factory()
        now = self.clock()
        zones: dict[str, dict[str, Any]] = {}
        paginator = client.get_paginator("describe_spot_price_history")
        for page in paginator.paginate(InstanceTypes=[instance_type],
                                       ProductDescriptions=[PRODUCT], StartTime=now):
            for rec in page.get("SpotPriceHistory", []):
                zone = rec["AvailabilityZone"]
                stamp = rec["Timestamp"]
                when = stamp.isoformat() if isinstance(stamp, datetime) else str(stamp)
                if zone not in zones or when > zones[zone]["time"]:
                    zones[zone] = {"usd_per_h": float(rec["SpotPrice"]), "time": when}
        return {"fetched": now.isoformat(), "zones": zones}

    def price(self, instance_type: str, zone: str | None = None) -> Price:
        """The spot price of ``instance_type`` in ``zone`` (None: the cheapest zone of the
        region), from the cache if younger than ``max_age_s``.

        Raises:
            UnknownPriceError: AWS has no spot price for the type (in that zone).
            botocore exceptions: the API call failed (credentials, endpoint).
        """
        data = self.cache.load()
        key = f"{self.region}/{instance_type}"
        entry = data.get(key)
        now = self.clock()
        age = None
        if isinstance(entry, dict):
            age = (now - datetime.fromisoformat(entry["fetched"])).total_seconds()
        if entry is None or age is None or age > self.max_age_s or age < 0:
            entry = self._fetch(instance_type)
            data[key] = entry
            self.cache.save(data)
            age = 0.0
        zones = entry["zones"]
        if zone is not None:
            zones = {z: v for z, v in zones.items() if z == zone}
        if not zones:
            where = zone or f"any zone of {self.region}"
            raise UnknownPriceError(
                f"no AWS spot price for instance type {instance_type} in {where} "
                "(DescribeSpotPriceHistory returned none); set cost.spot_usd_per_hour."
                f"{instance_type} in spot.yaml")
        best = min(zones, key=lambda z: zones[z]["usd_per_h"])
        return Price(zones[best]["usd_per_h"], "aws-spot-price-history", best, age)


def _botocore(exc: Exception) -> bool:
    """True for botocore's own errors (no credentials, no network, a refused call)."""
    return type(exc).__module__.startswith("botocore")


@dataclass
class AwsPrices(CataloguePrices):
    """The ``aws`` provider type's :class:`~slurm_spot.providers.prices.PriceSource`.

    Args:
        region: the cluster's region (its ``aws`` provider's), None: not known.
        spot: live spot prices, or None (then AWS spot needs a config or catalogue price).
        on_demand: live on-demand prices of ``region``, or None.
    """

    provider_type: str = "aws"
    load: Callable[[], Any] = lambda: catalogue()
    region: str | None = None
    spot: AwsSpotPrices | None = None
    on_demand: AwsOnDemandPrices | None = None

    def instance(self, market: Market, instance_type: str, zone: str | None,
                 region: str | None, today: date) -> Price:
        """Spot: DescribeSpotPriceHistory (:attr:`spot`), else the catalogue. On-demand: the
        catalogue when its entry is the region's and recent, else the Price List API
        (:attr:`on_demand`, for its region), else the catalogue with a warning.

        Raises:
            UnknownPriceError: no price anywhere (message names the type and zone and, for
                spot, why the live lookup gave none: not configured, or the botocore error such
                as missing credentials).
        """
        wanted = region or self.region
        found = self.catalogue_price(market, instance_type)
        why = ""
        if market == "on-demand":
            fits = found is not None and catalogue_warning(
                found, market, instance_type, wanted, today) is None
            live = self.on_demand
            if not fits and live is not None and wanted == live.region:
                try:
                    return replace(live.price(instance_type), zone=zone)
                except UnknownPriceError as exc:
                    why = f"; the AWS Price List API gave none ({exc})"
                except Exception as exc:  # botocore: no credentials, no network
                    if not _botocore(exc):
                        raise
                    why = (f"; the AWS Price List lookup (GetProducts) for {wanted} failed: "
                           f"{type(exc).__name__}: {exc}")
        if market == "spot":
            if self.spot is None:
                why = ("; AWS spot prices come from DescribeSpotPriceHistory, which was not "
                       "asked: no spot.yaml with an aws provider")
            else:
                try:
                    return self.spot.price(instance_type, zone)
                except UnknownPriceError:
                    if found is None:
                        raise
                except Exception as exc:  # botocore: no credentials, endpoint unreachable
                    if not _botocore(exc):
                        raise
                    why = (f"; the AWS spot price lookup (DescribeSpotPriceHistory) failed: "
                           f"{type(exc).__name__}: {exc}")
        return self.from_catalogue(market, instance_type, zone, region, today, why)


def price_source(config: SpotConfig | None, name: str | None, live: bool,
                 live_on_demand: bool) -> AwsPrices:
    """The prices of the ``aws`` provider ``name`` of ``config`` (its region); with ``live``
    spot prices from DescribeSpotPriceHistory (cached in ``<state_dir>/cost/spot-prices.json``
    for ``cost.spot_price_max_age_s``), with ``live_on_demand`` on-demand prices of its region
    from the Price List API (cached in ``<state_dir>/cost/on-demand-prices.json``). Both
    clients come from :func:`~slurm_spot.providers.aws.session.boto_session` (``profile``,
    ``credentials_file``; EC2 at ``endpoint_url``); boto3 is imported only when a price is
    first asked. Without ``config`` or ``name``: the catalogue only.

    Raises:
        ConfigError: ``name`` is not an ``aws`` provider of ``config``.
    """
    if config is None or name is None:
        return AwsPrices()
    from slurm_spot.providers.base import expect_settings

    settings = expect_settings(config.providers[name], AwsProviderConfig, name)
    spot = on_demand = None
    cache: Path = config.state_dir / "cost"
    if live:
        def ec2() -> Any:
            from slurm_spot.providers.aws.session import boto_session

            return boto_session(settings).client("ec2", endpoint_url=settings.endpoint_url or None)

        spot = AwsSpotPrices(ec2, settings.region, cache / "spot-prices.json",
                             config.cost.spot_price_max_age_s)
    if live_on_demand:
        def pricing() -> Any:
            from slurm_spot.providers.aws.session import boto_session

            return boto_session(settings).client("pricing", region_name=PRICE_LIST_REGION)

        on_demand = AwsOnDemandPrices(pricing, settings.region, cache / "on-demand-prices.json")
    return AwsPrices(region=settings.region, spot=spot, on_demand=on_demand)
