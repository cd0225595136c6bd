"""Prices: spot (AWS price history, cached), on-demand and GCP spot (shipped catalogue or
``spot.yaml``), checkpoint storage and egress (``spot.yaml``).

Precedence for an instance-hour price: ``cost.*_usd_per_hour`` in ``spot.yaml``, then (AWS spot)
``DescribeSpotPriceHistory``, then the catalogue ``slurm_spot/cost/prices.yaml``. Each catalogue
entry names its source (URL, what it is, the date it was read) or is marked ``unverified``; a
price from an unverified entry has ``Price.verified`` False and its ``source`` says
``UNVERIFIED``, so ``plan`` and ``cost`` can tell the user. A price found nowhere raises
:class:`UnknownPriceError` naming the type and the zone; nothing is ever priced at zero by
default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from slurm_spot.config import AwsProviderConfig, CostConfig, SpotConfig
from slurm_spot.errors import BadInputError

Market = Literal["spot", "on-demand"]
PRODUCT = "Linux/UNIX"


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
    catalogue entry."""

    usd_per_h: float
    source: str
    zone: str | None = None
    age_s: float | None = None
    verified: bool = True


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
    return Price(float(entry["usd_per_h"]),
                 f"catalogue {read_on} {section.get('region')} {label}", verified=verified)


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
    """

    cost: CostConfig
    aws_spot: AwsSpotPrices | None = None
    provider_types: dict[str, str] = field(default_factory=dict)
    checkpoint_keep: int = 2

    def instance(self, provider: str, market: Market, instance_type: str,
                 zone: str | None = None) -> Price:
        """USD per instance-hour of ``instance_type`` on ``provider`` (``aws``, ``gcp``,
        ``local``) in ``market``.

        Raises:
            UnknownPriceError: no price anywhere (message names the type and zone and, for AWS
                spot, why the live lookup gave none: not configured, or the botocore error
                such as missing credentials).
        """
        override = (self.cost.on_demand_usd_per_hour if market == "on-demand"
                    else self.cost.spot_usd_per_hour).get(instance_type)
        if override is not None:
            return Price(override, "config", zone)
        found = _catalogue_price(provider, market, instance_type)
        why = ""
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
            return Price(found.usd_per_h, found.source, zone, verified=found.verified)
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
    """The price book of a site: its ``cost`` settings, and live AWS spot prices (cached in
    ``<state_dir>/cost/spot-prices.json``) from its first ``aws`` provider when ``live_spot``.
    boto3 is imported only when a price is first asked of AWS."""
    aws = next((p for p in config.providers.values() if isinstance(p, AwsProviderConfig)), None)
    spot = None
    if aws is not None and live_spot:
        def factory(aws: AwsProviderConfig = aws) -> Any:
            import boto3

            session = boto3.Session(profile_name=aws.profile, region_name=aws.region)
            return session.client("ec2", endpoint_url=aws.endpoint_url)

        spot = AwsSpotPrices(factory, aws.region, config.state_dir / "cost" / "spot-prices.json",
                             config.cost.spot_price_max_age_s)
    return PriceBook(config.cost, spot, {name: p.type for name, p in config.providers.items()},
                     config.checkpoint.keep)
