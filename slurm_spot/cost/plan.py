"""The work behind ``slurm-spot plan`` and ``simulate``: their bounds, the interruption rate
and checkpoint cost they are given or measure, an instance type's prices with their sources
and warnings, ``plan``'s figures (:func:`plan_figures`), its ranking of candidate types
(:func:`compare_candidates`) and ``simulate``'s runs (:func:`simulation`). The commands
only parse options, call these and print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from slurm_spot.config import CostConfig, NodeSetConfig, SpotConfig
from slurm_spot.config.plain import band_fraction
from slurm_spot.contract.location import is_url
from slurm_spot.cost import planner
from slurm_spot.cost.prices import PriceBook, price_lookup, site_prices
from slurm_spot.cost.simulator import STRATEGIES, Baseline, SimParams, StrategyResult, simulate
from slurm_spot.errors import BadInputError
from slurm_spot.providers import PROVIDER_TYPES, instance_types, package_for_type
from slurm_spot.providers.prices import UnknownPriceError

#: The provider type an instance type that no node set lists and no catalogue prices is
#: priced as (its error then names the spot.yaml key that prices it).
DEFAULT_PRICED_TYPE = "aws"
#: Returns the site config, or None where there is none (read only when needed: ``plan`` and
#: ``simulate`` work without one, and a config with a problem matters only to what reads it).
SiteConfig = Callable[[], "SpotConfig | None"]

# Upper bounds of the numeric options: far above any real job, low enough that the formulas
# and the simulator stay in float range and in seconds of CPU.
MAX_NODES = 100_000
MAX_SECONDS = 7 * 86_400.0  # a checkpoint, restart, notice, boot ... of a week
MAX_JOB_HOURS = 100_000.0  # about 11 years of compute
MIN_MTBF_H = 0.001  # 3.6 s between interruptions of one node
MAX_USD_H = 10_000.0
MAX_STEPS = 1e15


def check_number(option: str, value: float | None, high: float, low: float = 0.0,
                 low_ok: bool = True, unit: str = "") -> None:
    """Raise :class:`BadInputError` naming ``option`` unless ``value`` (None: not given, fine)
    is finite and in ``[low, high]`` (``(low, high]`` when not ``low_ok``)."""
    if value is None:
        return
    if math.isfinite(value) and (value >= low if low_ok else value > low) and value <= high:
        return
    limit = f" and at most {high:g}" if math.isfinite(high) else ""
    raise BadInputError(f"{option} {value:g}: must be a finite number {'>=' if low_ok else '>'} "
                        f"{low:g}{limit}{unit}")


def node_rate(band: str | None, rate: str | None, mtbf_h: float | None,
              events: Callable[[], Iterable[dict[str, Any]]] | None = None) -> tuple[float, str]:
    """Interruptions per node-hour from exactly one of ``--interruption-band``,
    ``--interruption-rate`` (a fraction a month, or ``observed``: from ``events()``, the
    site's recorded events) and ``--mtbf-h``, and how it was got.

    Raises:
        BadInputError: none or several given, a bad value, or ``observed`` without events."""
    given = [name for name, value in (("--interruption-band", band), ("--interruption-rate", rate),
                                      ("--mtbf-h", mtbf_h)) if value is not None]
    if len(given) != 1:
        raise BadInputError("give exactly one of --interruption-band, --interruption-rate, "
                            f"--mtbf-h (got {', '.join(given) or 'none'})")
    if band is not None:
        fraction = band_fraction(band)
        return (planner.rate_from_monthly_fraction(fraction),
                f"AWS Spot Advisor band {band} taken as {fraction:.1%} of nodes interrupted a month")
    if mtbf_h is not None:
        check_number("--mtbf-h", mtbf_h, math.inf, MIN_MTBF_H, unit=" hours")
        return 1.0 / mtbf_h, f"one node's MTBF {mtbf_h:g} h"
    assert rate is not None
    if rate.strip().lower() == "observed":
        from slurm_spot.cost.accounting import observed_node_rate_per_h

        if events is None:
            raise BadInputError("--interruption-rate observed: needs the site's events "
                                "(a spot.yaml whose log_dir has events.jsonl)")
        return observed_node_rate_per_h(list(events()), datetime.now(timezone.utc))
    try:
        fraction = float(rate.strip().rstrip("%")) / (100 if rate.strip().endswith("%") else 1)
    except ValueError:
        raise BadInputError(f"--interruption-rate {rate!r}: a fraction per month such as 0.08 "
                            "or 8%, or 'observed'") from None
    return planner.rate_from_monthly_fraction(fraction), f"{fraction:.1%} of nodes interrupted a month"


def provider_of_type(config: SpotConfig | None, instance_type: str) -> tuple[str, str | None]:
    """(provider type, region or None) of an instance type: the node set that lists it (its
    provider's region), else the first registered provider type whose shipped catalogue prices
    it (:data:`DEFAULT_PRICED_TYPE` if none does; the region then comes from the site's first
    provider of that type, if any)."""
    if config is not None:
        for ns in config.node_sets:
            if instance_type in instance_types(config, ns):
                settings = config.providers[ns.provider]
                return settings.type, getattr(settings, "region", None)
    for provider_type in PROVIDER_TYPES:
        if package_for_type(provider_type).price_source(None, None).catalogue_price(
                "on-demand", instance_type) is not None:
            return provider_type, None
    return DEFAULT_PRICED_TYPE, None


@dataclass(frozen=True)
class InstancePrices:
    """What :func:`checked_prices` found for one instance type. USD per node-hour.

    ``sources`` names where each looked-up price came from (``given`` when both were given);
    ``unverified`` the prices taken from catalogue entries no fetched source confirmed
    (``"<market> <type>: <price> USD/h"``); ``warnings`` why a price may not be the region's
    (:attr:`slurm_spot.providers.prices.Price.warning`); ``region`` the region priced for (None:
    not known)."""

    spot: float
    on_demand: float
    sources: str
    unverified: list[str]
    warnings: list[str]
    region: str | None


def checked_prices(site: SiteConfig, instance_type: str, spot_usd_h: float | None,
                   on_demand_usd_h: float | None, spot_hint: str = "--spot-usd-h PRICE",
                   region: str | None = None) -> InstancePrices:
    """The prices of ``instance_type`` for ``region`` (default: the region of the site's
    provider of the type, else not known), the explicit ones as given, the rest looked up
    (:meth:`slurm_spot.cost.prices.PriceBook.instance`, of ``site()``'s config where one is),
    with their sources, unverified catalogue entries and warnings.

    Raises:
        UnknownPriceError: a price is found nowhere; the message says why (for AWS spot: no
            aws provider configured, or the lookup's error) and names the option that gives
            it (``--spot-usd-h``, or ``spot_hint`` where the price is given elsewhere)."""
    config = site()
    book = site_prices(config) if config is not None else PriceBook(CostConfig())
    provider, site_region = provider_of_type(config, instance_type)
    region = region or site_region or book.regions.get(provider)
    sources: list[str] = []
    unverified: list[str] = []
    warnings: list[str] = []
    found: dict[str, float] = {}
    for market, given, hint in (("spot", spot_usd_h, spot_hint),
                                ("on-demand", on_demand_usd_h, "--on-demand-usd-h PRICE")):
        if given is not None:
            found[market] = given
            continue
        try:
            price = book.instance(provider, market, instance_type,  # type: ignore[arg-type]
                                  region=region)
        except UnknownPriceError as exc:
            raise UnknownPriceError(f"{exc}, or give {hint}") from None
        found[market] = price.usd_per_h
        sources.append(f"{market}: {price.source}" + (f" ({price.zone})" if price.zone else ""))
        if not price.verified:
            unverified.append(f"{market} {instance_type}: {price.usd_per_h:g} USD/h")
        if price.warning:
            warnings.append(price.warning)
    return InstancePrices(found["spot"], found["on-demand"], "; ".join(sources) or "given",
                          unverified, warnings, region)


UNVERIFIED_HINT = ("not confirmed by any source (slurm_spot/providers/<type>/prices.yaml marks them "
                   "unverified); check them, or set cost.on_demand_usd_per_hour / "
                   "cost.spot_usd_per_hour in spot.yaml")


def unverified_line(unverified: list[str]) -> str:
    """The warning ``plan`` prints when it used unverified catalogue prices."""
    return f"warning: catalogue price(s) {'; '.join(unverified)} {UNVERIFIED_HINT}"


def finite(data: Any) -> Any:
    """``data`` with infinities and NaNs as None (JSON has neither)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def parse_candidate(text: str, default_rate: tuple[float, str] | None
                    ) -> tuple[str, float, float, float | None]:
    """``TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H]`` -> (type, steps/s, node rate per hour, spot USD
    per node-hour or None to look it up). A part after the steps that is a number is the
    price, else the band.

    Raises:
        BadInputError: malformed, or no band and no default rate."""
    parts = text.split(":")
    usage = "use TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H], e.g. g5.xlarge:9:<5%:0.45"
    if len(parts) not in (2, 3, 4) or not parts[0]:
        raise BadInputError(f"--candidate {text!r}: {usage}")
    try:
        steps = float(parts[1])
    except ValueError:
        raise BadInputError(f"--candidate {text!r}: {parts[1]!r} is not a number of steps/s") from None
    if not (math.isfinite(steps) and 0 < steps <= MAX_STEPS):
        raise BadInputError(f"--candidate {text!r}: steps/s {parts[1]!r} must be a finite number "
                            f"> 0 and at most {MAX_STEPS:g}")
    band: str | None = None
    spot: float | None = None
    for i, part in enumerate(parts[2:]):
        try:
            price = float(part)
        except ValueError:
            if band is not None or i > 0:
                raise BadInputError(f"--candidate {text!r}: {usage}") from None
            band = part
            continue
        if spot is not None or i != len(parts) - 3:
            raise BadInputError(f"--candidate {text!r}: {usage}")
        if not (math.isfinite(price) and 0 <= price <= MAX_USD_H):
            raise BadInputError(f"--candidate {text!r}: spot price {part!r} must be a finite "
                                f"number >= 0 and at most {MAX_USD_H:g} USD per node-hour")
        spot = price
    if band is not None:
        rate = planner.rate_from_monthly_fraction(band_fraction(band))
    elif default_rate is not None:
        rate = default_rate[0]
    else:
        raise BadInputError(f"--candidate {text!r}: give its band (TYPE:STEPS:BAND) or a "
                            "default --interruption-band/--interruption-rate/--mtbf-h")
    return parts[0], steps, rate, spot


def checkpoint_cost(site: SiteConfig, checkpoint_s: float | None,
                    checkpoint_dir: str | None) -> tuple[float, dict[str, Any] | None]:
    """C in seconds from exactly one of ``--checkpoint-s`` and ``--checkpoint-dir`` and, for
    the latter, what was read: ``{"location", "median_save_s", "checkpoints": [{"step",
    "save_s", "size_bytes"}]}`` (:func:`slurm_spot.cost.saves.median_save_s`). An ``s3://``
    location is read with ``site()``'s ``checkpoint.s3`` settings where it has a config, else
    ``SLURM_SPOT_S3_ENDPOINT_URL`` / ``SLURM_SPOT_S3_ADDRESSING_STYLE``.

    Raises:
        BadInputError: none or both given, a bad value, or no recorded save."""
    if (checkpoint_s is None) == (checkpoint_dir is None):
        raise BadInputError("give exactly one of --checkpoint-s (seconds one checkpoint takes) "
                            "and --checkpoint-dir (a job's checkpoints, local or s3://)")
    if checkpoint_s is not None:
        check_number("--checkpoint-s", checkpoint_s, MAX_SECONDS, unit=" seconds")
        return checkpoint_s, None
    from slurm_spot.cost.saves import median_save_s

    assert checkpoint_dir is not None
    # a store's URL is opened with spot.yaml's settings for it (an S3 endpoint, its addressing)
    config = site() if is_url(checkpoint_dir) else None
    settings = config.checkpoint if config is not None else None
    median, saves = median_save_s(checkpoint_dir, settings)
    return median, {"location": checkpoint_dir, "median_save_s": median,
                    "checkpoints": [asdict(s) for s in saves]}


@dataclass
class Comparison:
    """:func:`compare_candidates`' answer: the ranked candidates, and per instance type the
    unverified catalogue prices and price warnings its figures used."""

    ranked: list[planner.Ranked]
    unverified: dict[str, list[str]] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> list[dict[str, Any]]:
        """The ranking as ``plan --compare --json`` prints it (infinities as None)."""
        data = finite([{**asdict(r),
                        **({"unverified_prices": self.unverified[r.instance_type]}
                           if self.unverified.get(r.instance_type) else {}),
                        **({"price_warnings": self.warnings[r.instance_type]}
                           if self.warnings.get(r.instance_type) else {})}
                       for r in self.ranked])
        assert isinstance(data, list)
        return data


def compare_candidates(site: SiteConfig, checkpoint_s: float, restart_s: float,
                       nodes: int, default_rate: tuple[float, str] | None,
                       work_steps: float | None, candidates: Iterable[str],
                       deadline_h: float | None, region: str | None = None) -> Comparison:
    """Rank ``--candidate`` texts (:func:`parse_candidate`) by expected cost to finish
    ``work_steps`` (:func:`slurm_spot.cost.planner.compare`), each priced with
    :func:`checked_prices` where its spot price is not given.

    Raises:
        BadInputError: no ``work_steps``, a malformed candidate, or a price found nowhere."""
    if work_steps is None:
        raise BadInputError("--compare needs --work-steps (the job's total steps)")
    found_all = Comparison([])
    cands = []
    for text in candidates:
        itype, steps, node_rate_h, given_spot = parse_candidate(text, default_rate)
        found = checked_prices(
            site, itype, given_spot, None,
            spot_hint=f"it in the candidate: --candidate {itype}:STEPS_PER_S:BAND:SPOT_USD_H",
            region=region)
        found_all.unverified[itype], found_all.warnings[itype] = found.unverified, found.warnings
        cands.append(planner.Candidate(itype, steps, found.spot, found.on_demand, node_rate_h))
    found_all.ranked = planner.compare(cands, work_steps, nodes, checkpoint_s, restart_s,
                                       deadline_h)
    return found_all


def plan_figures(site: SiteConfig, checkpoint_s: float, restart_s: float, nodes: int,
                 notice_s: float, rate: tuple[float, str], job_hours: float | None,
                 instance_type: str | None, spot_usd_h: float | None,
                 on_demand_usd_h: float | None, region: str | None = None,
                 measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """``plan``'s answer as a dict (what ``--json`` prints, before :func:`finite`): the
    :func:`slurm_spot.cost.planner.plan` figures for ``rate`` (interruptions per node-hour and
    how it was got), ``measured`` (:func:`checkpoint_cost`'s record) as
    ``checkpoint_source``, and with ``instance_type`` and ``job_hours`` the expected spot cost
    against on-demand, the prices' sources, region, unverified entries and warnings.

    Raises:
        UnknownPriceError: a price is found nowhere (names the option that gives it)."""
    result = planner.plan(planner.PlanInput(checkpoint_s, restart_s, nodes, notice_s, rate[0],
                                            rate[1], job_hours))
    data: dict[str, Any] = {"checkpoint_s": checkpoint_s, "restart_s": restart_s,
                            **asdict(result)}
    if measured is not None:
        data["checkpoint_source"] = measured
    if instance_type is not None and job_hours is not None and result.expected_wall_h is not None:
        found = checked_prices(site, instance_type, spot_usd_h, on_demand_usd_h, region=region)
        spot, od, price_source = found.spot, found.on_demand, found.sources
        data["region"] = found.region
        if found.unverified:
            data["unverified_prices"] = found.unverified
        if found.warnings:
            data["price_warnings"] = found.warnings
        wall = (result.expected_wall_h_with_notice if result.expected_wall_h_with_notice is not None
                else result.expected_wall_h)
        spot_cost = wall * nodes * spot if math.isfinite(wall) else math.inf  # (inf * 0: NaN)
        data.update(instance_type=instance_type, price_source=price_source,
                    spot_usd_per_node_h=spot, on_demand_usd_per_node_h=od,
                    expected_spot_cost_usd=spot_cost,
                    on_demand_cost_usd=job_hours * nodes * od,
                    saving_percent=100 * (1 - spot_cost / (job_hours * nodes * od)) if od > 0
                    else None)
    return data


#: What ``simulate`` says of its comparison: every strategy sees the same interruptions.
SAME_TRACE = "each run's interruption times are the same for every strategy"


@dataclass
class Simulation:
    """:func:`simulation`'s answer: the parameters, the on-demand baseline, one result per
    strategy, where the rate and the prices came from, and which prices are known (an unknown
    one is not free: its costs are None in :meth:`to_json`)."""

    params: SimParams
    base: Baseline
    results: list[StrategyResult]
    rate_source: str
    price_source: str
    price_warnings: list[str]
    spot_known: bool
    od_known: bool
    runs: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        """What ``simulate --json`` prints (infinities and unknown costs as None)."""
        data: dict[str, Any] = {
            "params": asdict(self.params), "rate_source": self.rate_source,
            "comparison": {"interval": self.params.interval_policy(), "interruptions": SAME_TRACE},
            "price_source": self.price_source, "price_warnings": self.price_warnings,
            "runs": self.runs, "seed": self.seed,
            "on_demand": asdict(self.base), "strategies": [asdict(r) for r in self.results]}
        if not self.od_known:  # unknown, not free: null in the JSON
            data["on_demand"]["cost_usd"] = None
        for r_data in data["strategies"] if not (self.spot_known and self.od_known) else []:
            r_data["saving_vs_on_demand"] = None
            if not self.spot_known:
                r_data["cost_usd"] = None
        found = finite(data)
        assert isinstance(found, dict)
        return found


def simulation(site: SiteConfig, params: SimParams, rate_source: str,
               instance_type: str | None, spot_usd_h: float | None,
               on_demand_usd_h: float | None, region: str | None,
               strategies: tuple[str, ...], runs: int, seed: int) -> Simulation:
    """``simulate``'s work: the prices (looked up for ``instance_type`` with
    :func:`checked_prices`, else as given, else none), then
    :func:`slurm_spot.cost.simulator.simulate` of ``params`` (its prices replaced by those)
    for ``strategies`` (empty: all), ``runs`` runs each from ``seed``.

    Raises:
        UnknownPriceError: a price of ``instance_type`` is found nowhere.
        BadInputError: the simulator cannot make progress with these parameters.
    """
    price_source = "no prices (give --instance-type or --spot-usd-h/--on-demand-usd-h)"
    spot = od = 0.0
    spot_known = od_known = instance_type is not None  # (checked_prices raises if not found)
    price_warnings: list[str] = []
    if instance_type is not None:
        found = checked_prices(site, instance_type, spot_usd_h, on_demand_usd_h, region=region)
        spot, od, price_source = found.spot, found.on_demand, found.sources
        price_warnings = found.warnings
    elif spot_usd_h is not None or on_demand_usd_h is not None:
        spot, od, price_source = spot_usd_h or 0.0, on_demand_usd_h or 0.0, "given"
        spot_known, od_known = spot_usd_h is not None, on_demand_usd_h is not None
        if not (spot_known and od_known):
            price_source += (" (no on-demand price: give --on-demand-usd-h)" if spot_known
                             else " (no spot price: give --spot-usd-h)")
    params = replace(params, spot_usd_per_h=spot, on_demand_usd_per_h=od)
    base, results = simulate(params, strategies or STRATEGIES, runs, seed)
    return Simulation(params, base, list(results), rate_source, price_source, price_warnings,
                      spot_known, od_known, runs, seed)


def spares_of(config: SpotConfig) -> list[dict[str, Any]]:
    """The hot spares of ``config``'s node sets with their cost around the clock
    (:func:`spares_cost`, catalogue prices: no network); [] when none."""
    if not any(ns.spares for ns in config.node_sets):
        return []
    return spares_cost(config, price_lookup(config, live=False))


def spares_cost(config: SpotConfig, price_of: Callable[[NodeSetConfig], float | None]
                ) -> list[dict[str, object]]:
    """What each node set's spares cost, up around the clock whether or not a job runs: one
    entry per node set with ``spares``: ``node_set``, ``spares``, ``market``,
    ``usd_per_node_h`` (its hourly price, None when unknown), ``usd_per_h`` (``spares *
    usd_per_node_h``) and ``usd_per_month`` (times
    :data:`slurm_spot.cost.planner.HOURS_PER_MONTH`), both None when the price is unknown.

    Args:
        price_of: node set -> its hourly price per node in its market (USD), None when
            unknown (:func:`slurm_spot.cost.prices.price_lookup`).
    """
    found: list[dict[str, object]] = []
    for ns in config.node_sets:
        if ns.spares <= 0:
            continue
        price = price_of(ns)
        per_h = None if price is None else ns.spares * price
        found.append({"node_set": ns.name, "spares": ns.spares, "market": ns.market,
                      "usd_per_node_h": price, "usd_per_h": per_h,
                      "usd_per_month": None if per_h is None else per_h * planner.HOURS_PER_MONTH})
    return found
