"""Prices: spot (AWS price history, cached), on-demand (AWS Price List API for the cluster's
region, cached; else the shipped catalogue), GCP spot (shipped catalogue or ``spot.yaml``),
checkpoint storage and egress (``spot.yaml``).

Precedence for an instance-hour price: ``cost.*_usd_per_hour`` in ``spot.yaml``, then (AWS spot)
``DescribeSpotPriceHistory``, then (AWS on-demand in a region the catalogue does not cover) the
Price List API's ``GetProducts``, then the catalogue ``slurm_spot/cost/prices.yaml``. Each
catalogue entry names its source (URL, what it is, the date it was read) and its section the
region it is for, or is marked ``unverified``; a price from an unverified entry has
``Price.verified`` False and its ``source`` says ``UNVERIFIED``. A catalogue price used for
another region than the cluster's, or read more than :data:`STALE_AFTER_DAYS` ago, carries a
``Price.warning`` saying so (and why no live figure was had), so ``plan`` and ``cost`` can tell
the user. A price found nowhere raises :class:`UnknownPriceError` naming the type and the zone;
nothing is ever priced at zero by default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import date, datetime, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from slurm_spot.config import AwsProviderConfig, CostConfig, SpotConfig
from slurm_spot.errors import BadInputError

Market = Literal["spot", "on-demand"]
PRODUCT = "Linux/UNIX"
#: A catalogue figure read longer ago than this is flagged as old (prices.yaml's ``read_on``).
STALE_AFTER_DAYS = 180
#: The AWS Price List API answers in us-east-1 for every region's prices (filter: regionCode).
PRICE_LIST_REGION = "us-east-1"
#: Cached on-demand prices are asked again after this long (they change rarely).
ON_DEMAND_MAX_AGE_S = 7 * 86_400.0


class UnknownPriceError(BadInputError):
    """No price for an instance type (or provider) in a zone; the message names both and
    where a price can be given (``cost`` in spot.yaml)."""


@dataclass(frozen=True)
class Price:
    """One instance-hour price in USD, where it came from, and how old it is.

    ``source`` is ``config``, ``aws-spot-price-history`` or ``catalogue <date read> <region>
    (<source key>)`` (``... UNVERIFIED`` for an entry no fetched source confirmed); ``zone`` the
    zone the price is for (None for a region-wide catalogue price); ``age_s`` the seconds since
    it was fetched (cached AWS prices), else None; ``verified`` False only for an unverified
    catalogue entry; ``region`` the region the figure is for (None: not known, e.g. a price
    given in spot.yaml); ``as_of`` the date it was read (``YYYY-MM-DD``) where known;
    ``warning`` why the figure may not be the cluster's (another region, an old date, a live
    lookup that failed), else None."""

    usd_per_h: float
    source: str
    zone: str | None = None
    age_s: float | None = None
    verified: bool = True
    region: str | None = None
    as_of: str | None = None
    warning: str | None = None


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The shipped price catalogue (``slurm_spot/cost/prices.yaml``) as a dict."""
    text = resources.files("slurm_spot.cost").joinpath("prices.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


UNVERIFIED = "unverified"


def _catalogue_price(provider: str, market: Market, instance_type: str) -> Price | None:
    """The catalogue's price of ``instance_type``; an entry is ``{usd_per_h, source}`` where
    ``source`` is a key of the section's ``sources`` (or ``unverified``); a bare number, or a
    source the section does not list, counts as unverified."""
    cat = catalogue()
    section = cat.get(provider) or {}
    table = section.get("on_demand" if market == "on-demand" else "spot") or {}
    if instance_type not in table:
        return None
    entry = table[instance_type]
    if not isinstance(entry, dict):
        entry = {"usd_per_h": entry, "source": UNVERIFIED}
    key = str(entry.get("source") or UNVERIFIED)
    known = (section.get("sources") or {}).get(key)
    read_on = known.get("read_on") if isinstance(known, dict) else cat.get("as_of")
    verified = key != UNVERIFIED and isinstance(known, dict)
    label = f"({key})" if verified else "UNVERIFIED"
    region = section.get("region")
    return Price(float(entry["usd_per_h"]), f"catalogue {read_on} {region} {label}",
                 verified=verified, region=str(region) if region else None,
                 as_of=str(read_on) if read_on else None)


def catalogue_warning(price: Price, market: Market, instance_type: str, wanted: str | None,
                      today: date, why: str = "") -> str | None:
    """Why a catalogue ``price`` may not be the cluster's, or None: it is for another region
    than ``wanted`` (the cluster's region; None: not known, no warning for it), or was read
    more than :data:`STALE_AFTER_DAYS` before ``today``. ``why`` (e.g. ``"the AWS Price List
    lookup failed: ..."``) is added to a warning."""
    problems = []
    if wanted and price.region and wanted != price.region:
        problems.append(f"it is {price.region}'s price, not {wanted}'s (prices differ by region)")
    if price.as_of:
        try:
            age_days = (today - date.fromisoformat(price.as_of)).days
        except ValueError:
            age_days = None
        if age_days is not None and age_days > STALE_AFTER_DAYS:
            problems.append(f"it was read on {price.as_of}, {age_days} days ago")
    if not problems:
        return None
    key = "on_demand_usd_per_hour" if market == "on-demand" else "spot_usd_per_hour"
    return (f"{market} {instance_type} {price.usd_per_h:g} USD/h from the shipped catalogue: "
            f"{'; '.join(problems)}{why}; set cost.{key}.{instance_type} in spot.yaml for "
            "your region's price")


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
        self.cache = _JsonCache(cache_file)
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


class _JsonCache:
    """A dict kept in a JSON file, replaced atomically; a missing, unreadable or unwritable
    file only costs another API call."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, data: dict[str, Any]) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass


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
        self.cache_file = cache_file
        self.max_age_s = max_age_s
        self.clock = clock

    def _load(self) -> dict[str, Any]:
        if self.cache_file is None:
            return {}
        try:
            data = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        if self.cache_file is None:
            return
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.cache_file)
        except OSError:
            pass  # a cache that cannot be written only costs another API call next time

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
        data = self._load()
        key = f"{self.region}/{instance_type}"
        entry = data.get(key)
        now = self.clock()
        age = None
        if isinstance(entry, dict):
            age = (now - datetime.fromisoformat(entry["fetched"])).total_seconds()
        if entry is None or age is None or age > self.max_age_s or age < 0:
            entry = self._fetch(instance_type)
            data[key] = entry
            self._save(data)
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


@dataclass
class PriceBook:
    """All prices a cost figure needs, for one site.

    Args:
        cost: the ``cost`` section of spot.yaml.
        aws_spot: live AWS spot prices, or None (then AWS spot needs a config price).
        provider_types: provider name (a key of ``providers``) -> type (aws, gcp, local).
        checkpoint_keep: how many checkpoints a job keeps (``checkpoint.keep``).
        regions: provider type -> the cluster's region (its first provider of that type), for
            which prices are wanted.
        aws_on_demand: live AWS on-demand prices of ``regions["aws"]``, or None.
        today: the date prices are judged old against (UTC), injectable for tests.
    """

    cost: CostConfig
    aws_spot: AwsSpotPrices | None = None
    provider_types: dict[str, str] = field(default_factory=dict)
    checkpoint_keep: int = 2
    regions: dict[str, str] = field(default_factory=dict)
    aws_on_demand: AwsOnDemandPrices | None = None
    today: Callable[[], date] = field(default=lambda: datetime.now(timezone.utc).date())

    def instance(self, provider: str, market: Market, instance_type: str,
                 zone: str | None = None, region: str | None = None) -> Price:
        """USD per instance-hour of ``instance_type`` on ``provider`` (``aws``, ``gcp``,
        ``local``) in ``market``, for ``region`` (default: the cluster's, :attr:`regions`).
        A catalogue price for another region or read long ago carries ``warning``
        (:func:`catalogue_warning`); AWS on-demand prices of a region the catalogue does not
        cover are asked of the Price List API first (:attr:`aws_on_demand`).

        Raises:
            UnknownPriceError: no price anywhere (message names the type and zone and, for AWS
                spot, why the live lookup gave none: not configured, or the botocore error
                such as missing credentials).
        """
        override = (self.cost.on_demand_usd_per_hour if market == "on-demand"
                    else self.cost.spot_usd_per_hour).get(instance_type)
        if override is not None:
            return Price(override, "config", zone)
        wanted = region or self.regions.get(provider)
        found = _catalogue_price(provider, market, instance_type)
        why = ""
        if provider == "aws" and market == "on-demand":
            fits = found is not None and catalogue_warning(
                found, market, instance_type, wanted, self.today()) is None
            live = self.aws_on_demand
            if not fits and live is not None and wanted == live.region:
                try:
                    return replace(live.price(instance_type), zone=zone)
                except UnknownPriceError as exc:
                    why = f"; the AWS Price List API gave none ({exc})"
                except Exception as exc:  # botocore: no credentials, no network
                    if not type(exc).__module__.startswith("botocore"):
                        raise
                    why = (f"; the AWS Price List lookup (GetProducts) for {wanted} failed: "
                           f"{type(exc).__name__}: {exc}")
        if provider == "aws" and market == "spot":
            if self.aws_spot is None:
                why = ("; AWS spot prices come from DescribeSpotPriceHistory, which was not "
                       "asked: no spot.yaml with an aws provider")
            else:
                try:
                    return self.aws_spot.price(instance_type, zone)
                except UnknownPriceError:
                    if found is None:
                        raise
                except Exception as exc:  # botocore: no credentials, endpoint unreachable
                    if not type(exc).__module__.startswith("botocore"):
                        raise
                    why = (f"; the AWS spot price lookup (DescribeSpotPriceHistory) failed: "
                           f"{type(exc).__name__}: {exc}")
        if found is not None:
            return replace(found, zone=zone, warning=catalogue_warning(
                found, market, instance_type, wanted, self.today(), why))
        key = "spot_usd_per_hour" if market == "spot" else "on_demand_usd_per_hour"
        raise UnknownPriceError(
            f"no {market} price for instance type {instance_type!r} in zone {zone or '(any)'} "
            f"({provider}){why}: set cost.{key}.{instance_type} in spot.yaml")

    def storage_usd_per_gb_month(self, provider_name: str) -> float:
        """Checkpoint storage price of a provider (config only).

        Raises:
            UnknownPriceError: not configured."""
        if provider_name not in self.cost.storage_usd_per_gb_month:
            raise UnknownPriceError(
                f"no storage price for provider {provider_name!r}: set "
                f"cost.storage_usd_per_gb_month.{provider_name} in spot.yaml")
        return self.cost.storage_usd_per_gb_month[provider_name]

    def egress_usd_per_gb(self, provider_name: str) -> float:
        """Egress price of a provider (config only).

        Raises:
            UnknownPriceError: not configured."""
        if provider_name not in self.cost.egress_usd_per_gb:
            raise UnknownPriceError(
                f"no egress price for provider {provider_name!r}: set "
                f"cost.egress_usd_per_gb.{provider_name} in spot.yaml")
        return self.cost.egress_usd_per_gb[provider_name]


def price_dict(price: Price) -> dict[str, Any]:
    """``price`` as a JSON-ready dict."""
    return asdict(price)


def site_prices(config: SpotConfig, live_spot: bool = True) -> PriceBook:
    """The price book of a site: its ``cost`` settings, its regions (the first provider of each
    type), and, from its first ``aws`` provider when ``live_spot``, live AWS spot prices
    (cached in ``<state_dir>/cost/spot-prices.json``) and on-demand prices of its region
    (Price List API, cached in ``<state_dir>/cost/on-demand-prices.json``). boto3 is imported
    only when a price is first asked of AWS."""
    aws = next((p for p in config.providers.values() if isinstance(p, AwsProviderConfig)), None)
    regions: dict[str, str] = {}
    for p in config.providers.values():
        found_region = getattr(p, "region", None)
        if isinstance(found_region, str):
            regions.setdefault(p.type, found_region)
    spot = on_demand = None
    if aws is not None and live_spot:
        def factory(aws: AwsProviderConfig = aws) -> Any:
            import boto3

            session = boto3.Session(profile_name=aws.profile, region_name=aws.region)
            return session.client("ec2", endpoint_url=aws.endpoint_url)

        def pricing_factory(aws: AwsProviderConfig = aws) -> Any:
            import boto3

            session = boto3.Session(profile_name=aws.profile, region_name=PRICE_LIST_REGION)
            return session.client("pricing")

        spot = AwsSpotPrices(factory, aws.region, config.state_dir / "cost" / "spot-prices.json",
                             config.cost.spot_price_max_age_s)
        on_demand = AwsOnDemandPrices(pricing_factory, aws.region,
                                      config.state_dir / "cost" / "on-demand-prices.json")
    return PriceBook(config.cost, spot, {name: p.type for name, p in config.providers.items()},
                     config.checkpoint.keep, regions, on_demand)
