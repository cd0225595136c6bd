"""Instance-hour prices as the providers give them: the record (:class:`Price`), the error
(:class:`UnknownPriceError`), what each provider type offers (:class:`PriceSource`, made by its
package's ``price_source``), the shipped catalogue reader every provider type's catalogue
uses (:class:`CataloguePrices`), and the precedence (:func:`price_of`).

Precedence for an instance-hour price: ``cost.*_usd_per_hour`` in ``spot.yaml``, then the
provider's own source: for ``aws`` spot ``DescribeSpotPriceHistory``, for ``aws`` on-demand
in a region the catalogue does not cover the Price List API's ``GetProducts``
(:mod:`slurm_spot.providers.aws.prices`), then the provider type's shipped catalogue
(``providers/<type>/prices.yaml``). Each catalogue entry names its source (URL, what it is,
the date it was read) and its file the region it is for, or is marked ``unverified``; a price
from an unverified entry has ``Price.verified`` False and its ``source`` says ``UNVERIFIED``.
A catalogue price used for another region than the cluster's, or read more than
:data:`STALE_AFTER_DAYS` ago, carries a ``Price.warning`` saying so (and why no live figure
was had), so ``plan`` and ``cost`` can tell the user. A price found nowhere raises
:class:`UnknownPriceError` naming the type and the zone; nothing is ever priced at zero by
default.

This module imports no cloud library and nothing of the cost package (which asks the
providers for prices, never the other way round).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from slurm_spot.config import CostConfig
from slurm_spot.errors import BadInputError

Market = Literal["spot", "on-demand"]
#: A catalogue figure read longer ago than this is flagged as old (prices.yaml's ``read_on``).
STALE_AFTER_DAYS = 180
#: The ``source`` of a catalogue entry no fetched source confirmed.
UNVERIFIED = "unverified"


class UnknownPriceError(BadInputError):
    """No price for an instance type (or provider) in a zone; the message names both and
    where a price can be given (``cost`` in spot.yaml)."""


@dataclass(frozen=True)
class Price:
    """One instance-hour price in USD, where it came from, and how old it is.

    ``source`` is ``config``, ``aws-spot-price-history``, ``aws-price-list <region>`` or
    ``catalogue <date read> <region> (<source key>)`` (``... UNVERIFIED`` for an entry no
    fetched source confirmed); ``zone`` the zone the price is for (None for a region-wide
    catalogue price); ``age_s`` the seconds since it was fetched (cached AWS prices), else None;
    ``verified`` False only for an unverified catalogue entry; ``region`` the region the figure
    is for (None: not known, e.g. a price given in spot.yaml); ``as_of`` the date it was read
    (``YYYY-MM-DD``) where known; ``warning`` why the figure may not be the cluster's (another
    region, an old date, a live lookup that failed), else None."""

    usd_per_h: float
    source: str
    zone: str | None = None
    age_s: float | None = None
    verified: bool = True
    region: str | None = None
    as_of: str | None = None
    warning: str | None = None


class PriceSource(Protocol):
    """The instance-hour prices of one provider type, as its package's ``price_source``
    makes them (:class:`~slurm_spot.providers.base.ProviderPackage`)."""

    #: the region prices are wanted for (the site's provider of this type), None: not known.
    region: str | None

    def catalogue_price(self, market: Market, instance_type: str) -> Price | None:
        """The shipped catalogue's price of ``instance_type`` (no warning, no zone), or None
        when the catalogue has none."""
        ...

    def instance(self, market: Market, instance_type: str, zone: str | None,
                 region: str | None, today: date) -> Price:
        """USD per instance-hour of ``instance_type`` in ``market`` (``zone``: None for the
        cheapest or a region-wide figure) for ``region`` (None: :attr:`region`); a catalogue
        price that may not be the region's carries ``warning`` (judged against ``today``).

        Raises:
            UnknownPriceError: no price anywhere; the message names the type, the zone, why a
                live lookup gave none, and the ``cost.*`` key of spot.yaml that sets it.
        """
        ...


#: The highest catalogue price taken (USD per instance-hour; spot.yaml's bound too).
MAX_CATALOGUE_USD_H = 10_000.0


class CatalogueError(BadInputError, ValueError):
    """A provider package's ``prices.yaml`` that cannot be used; the message names the file,
    the line and the entry."""


def read_catalogue(package: str) -> dict[str, Any]:
    """``prices.yaml`` of provider package ``package`` (``slurm_spot.providers.aws``) as a
    dict: ``as_of``, ``source``, ``region``, ``sources`` (key -> url, what, read_on),
    ``on_demand`` and ``spot`` (instance type -> ``{usd_per_h, source}``, or a bare number);
    an empty dict when the package ships none (the ``local`` provider: its prices are
    spot.yaml's).

    Raises:
        CatalogueError: the file is not UTF-8 YAML, not a mapping, repeats a key (YAML keeps
            the last one silently), or has an entry whose ``usd_per_h`` is not a number of
            USD per hour from 0 to :data:`MAX_CATALOGUE_USD_H`: a site's edit of the file
            (``usd_per_h: "1,006"``, ``-1``, a missing key) stopped ``plan``, ``render`` and
            the cost order with a KeyError/ValueError traceback, or priced a node set below 0.
    """
    from slurm_spot.config.yamlfile import YamlShapeError, read_yaml

    found = resources.files(package).joinpath("prices.yaml")
    if not found.is_file():
        return {}
    name = f"{package.replace('.', '/')}/prices.yaml"
    try:
        data, lines, problems = read_yaml(found.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, YamlShapeError) as exc:
        raise CatalogueError(f"{name}: not a UTF-8 YAML file: {exc}") from None
    duplicates = [p for p in problems if "duplicate key" in p]
    if duplicates:
        raise CatalogueError(f"{name}: {duplicates[0]}")
    if not isinstance(data, dict):
        raise CatalogueError(f"{name}: not a mapping")
    for market in ("on_demand", "spot"):
        table = data.get(market) or {}
        if not isinstance(table, dict):
            raise CatalogueError(f"{name}: line {lines.get((market,), '?')}: {market}: not a "
                                 "mapping of instance type -> price")
        for itype, entry in table.items():
            value = entry.get("usd_per_h") if isinstance(entry, dict) else entry
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and 0 <= value <= MAX_CATALOGUE_USD_H):
                raise CatalogueError(
                    f"{name}: line {lines.get((market, itype), '?')}: {market}.{itype}: "
                    f"usd_per_h {value!r} is not a price (a number of USD per hour, 0 to "
                    f"{MAX_CATALOGUE_USD_H:g})")
    return data


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


def no_price(provider_type: str, market: Market, instance_type: str, zone: str | None,
             why: str = "") -> UnknownPriceError:
    """The error for a price found nowhere: names the type, the zone, the provider type,
    ``why`` (a live lookup's failure, with its leading ``"; "``) and the spot.yaml key."""
    key = "spot_usd_per_hour" if market == "spot" else "on_demand_usd_per_hour"
    return UnknownPriceError(
        f"no {market} price for instance type {instance_type!r} in zone {zone or '(any)'} "
        f"({provider_type}){why}: set cost.{key}.{instance_type} in spot.yaml")


@dataclass
class CataloguePrices:
    """A provider type's prices from its shipped catalogue only (:func:`read_catalogue`).

    Args:
        provider_type: ``aws``, ``gcp``, ``local`` (named in errors).
        load: returns the catalogue dict (called on each lookup; the provider's module caches).
        region: the region prices are wanted for (None: not known, no region warning).
    """

    provider_type: str
    load: Callable[[], Mapping[str, Any]]
    region: str | None = None

    def catalogue_price(self, market: Market, instance_type: str) -> Price | None:
        """The catalogue's price of ``instance_type``; an entry is ``{usd_per_h, source}``
        where ``source`` is a key of the file's ``sources`` (or ``unverified``); a bare
        number, or a source the file does not list, counts as unverified."""
        cat = self.load()
        table = cat.get("on_demand" if market == "on-demand" else "spot") or {}
        if instance_type not in table:
            return None
        entry = table[instance_type]
        if not isinstance(entry, dict):
            entry = {"usd_per_h": entry, "source": UNVERIFIED}
        key = str(entry.get("source") or UNVERIFIED)
        known = (cat.get("sources") or {}).get(key)
        read_on = known.get("read_on") if isinstance(known, dict) else cat.get("as_of")
        verified = key != UNVERIFIED and isinstance(known, dict)
        label = f"({key})" if verified else "UNVERIFIED"
        region = cat.get("region")
        return Price(float(entry["usd_per_h"]), f"catalogue {read_on} {region} {label}",
                     verified=verified, region=str(region) if region else None,
                     as_of=str(read_on) if read_on else None)

    def instance(self, market: Market, instance_type: str, zone: str | None,
                 region: str | None, today: date) -> Price:
        """The catalogue's price (see :class:`PriceSource`).

        Raises:
            UnknownPriceError: the catalogue has no entry for the type.
        """
        return self.from_catalogue(market, instance_type, zone, region, today)

    def from_catalogue(self, market: Market, instance_type: str, zone: str | None,
                       region: str | None, today: date, why: str = "") -> Price:
        """The catalogue's price with its warning (``why``: what a live lookup said).

        Raises:
            UnknownPriceError: the catalogue has no entry for the type (names ``why``).
        """
        found = self.catalogue_price(market, instance_type)
        if found is None:
            raise no_price(self.provider_type, market, instance_type, zone, why)
        return replace(found, zone=zone, warning=catalogue_warning(
            found, market, instance_type, region or self.region, today, why))


def configured_price(cost: CostConfig, market: Market, instance_type: str,
                     zone: str | None = None) -> Price | None:
    """spot.yaml's own price of ``instance_type`` in ``market`` (``cost.spot_usd_per_hour``,
    ``cost.on_demand_usd_per_hour``), source ``config``; None when it sets none."""
    override = (cost.on_demand_usd_per_hour if market == "on-demand"
                else cost.spot_usd_per_hour).get(instance_type)
    return Price(override, "config", zone) if override is not None else None


def utc_today() -> date:
    """Today's date in UTC (what catalogue dates are judged against)."""
    return datetime.now(timezone.utc).date()


def price_of(cost: CostConfig, source: PriceSource, market: Market, instance_type: str,
             zone: str | None = None, region: str | None = None,
             today: date | None = None) -> Price:
    """USD per instance-hour of ``instance_type``: spot.yaml's price if it sets one
    (:func:`configured_price`), else ``source``'s (see the module docstring).

    Raises:
        UnknownPriceError: no price anywhere (from ``source``).
    """
    return configured_price(cost, market, instance_type, zone) or source.instance(
        market, instance_type, zone, region, today or utc_today())


class JsonCache:
    """A dict kept in a JSON file, replaced atomically; a missing, unreadable or unwritable
    file only costs another API call.

    Args:
        path: the file (its directory is created on save), or None for no cache.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The cached dict; empty when there is no file or it cannot be read as a dict."""
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, data: dict[str, Any]) -> None:
        """Write ``data`` (sorted keys) through a temporary file; errors are ignored."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass
