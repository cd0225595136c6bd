"""``slurm-spot plan``: how often to checkpoint, what interruptions cost, which type is cheapest."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import click

from slurm_spot.checkpoint.location import is_s3
from slurm_spot.commands.common import (
    AppContext,
    json_option,
    pass_app,
    print_json,
    require_events_file,
)
from slurm_spot.config import CostConfig, SpotConfig, config_path
from slurm_spot.cost import planner
from slurm_spot.cost.prices import PriceBook, UnknownPriceError, catalogue, site_prices
from slurm_spot.errors import BadInputError
from slurm_spot.events import read_events

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


def optional_config(app: AppContext) -> SpotConfig | None:
    """The site config if one is named or exists (plan and simulate work without one)."""
    if app.config_path is None and not config_path().exists():
        return None
    return app.config


def node_rate(app: AppContext, band: str | None, rate: str | None, mtbf_h: float | None
              ) -> tuple[float, str]:
    """Interruptions per node-hour from exactly one of the three options, and how it was got.

    Raises:
        BadInputError: none or several given, or a bad value."""
    given = [name for name, value in (("--interruption-band", band), ("--interruption-rate", rate),
                                      ("--mtbf-h", mtbf_h)) if value is not None]
    if len(given) != 1:
        raise BadInputError("give exactly one of --interruption-band, --interruption-rate, "
                            f"--mtbf-h (got {', '.join(given) or 'none'})")
    if band is not None:
        fraction = planner.band_fraction(band)
        return (planner.rate_from_monthly_fraction(fraction),
                f"AWS Spot Advisor band {band} taken as {fraction:.1%} of nodes interrupted a month")
    if mtbf_h is not None:
        check_number("--mtbf-h", mtbf_h, math.inf, MIN_MTBF_H, unit=" hours")
        return 1.0 / mtbf_h, f"one node's MTBF {mtbf_h:g} h"
    assert rate is not None
    if rate.strip().lower() == "observed":
        from slurm_spot.cost.accounting import observed_node_rate_per_h

        require_events_file(app.config)
        events = list(read_events(app.config.log_dir))
        return observed_node_rate_per_h(events, datetime.now(timezone.utc))
    try:
        fraction = float(rate.strip().rstrip("%")) / (100 if rate.strip().endswith("%") else 1)
    except ValueError:
        raise BadInputError(f"--interruption-rate {rate!r}: a fraction per month such as 0.08 "
                            "or 8%, or 'observed'") from None
    return planner.rate_from_monthly_fraction(fraction), f"{fraction:.1%} of nodes interrupted a month"


def provider_of_type(config: SpotConfig | None, instance_type: str) -> tuple[str, str | None]:
    """(provider type, region or None) of an instance type: the node set that lists it (its
    provider's region), else the catalogue section that prices it (``aws`` if none does; the
    region then comes from the site's first provider of that type, if any)."""
    if config is not None:
        for ns in config.node_sets:
            if instance_type in ns.instance_types or (ns.gcp and ns.gcp.machine_type == instance_type):
                settings = config.providers[ns.provider]
                return settings.type, getattr(settings, "region", None)
    for provider in ("aws", "gcp"):
        section = catalogue().get(provider) or {}
        if instance_type in (section.get("on_demand") or {}):
            return provider, None
    return "aws", None


@dataclass(frozen=True)
class InstancePrices:
    """What :func:`checked_prices` found for one instance type. USD per node-hour.

    ``sources`` names where each looked-up price came from (``given`` when both were given);
    ``unverified`` the prices taken from catalogue entries no fetched source confirmed
    (``"<market> <type>: <price> USD/h"``); ``warnings`` why a price may not be the region's
    (:attr:`slurm_spot.cost.prices.Price.warning`); ``region`` the region priced for (None:
    not known)."""

    spot: float
    on_demand: float
    sources: str
    unverified: list[str]
    warnings: list[str]
    region: str | None


def checked_prices(app: AppContext, instance_type: str, spot_usd_h: float | None,
                   on_demand_usd_h: float | None, spot_hint: str = "--spot-usd-h PRICE",
                   region: str | None = None) -> InstancePrices:
    """The prices of ``instance_type`` for ``region`` (default: the region of the site's
    provider of the type, else not known), the explicit ones as given, the rest looked up
    (:meth:`slurm_spot.cost.prices.PriceBook.instance`), with their sources, unverified
    catalogue entries and warnings.

    Raises:
        UnknownPriceError: a price is found nowhere; the message says why (for AWS spot: no
            aws provider configured, or the lookup's error) and names the option that gives
            it (``--spot-usd-h``, or ``spot_hint`` where the price is given elsewhere)."""
    config = optional_config(app)
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


UNVERIFIED_HINT = ("not confirmed by any source (slurm_spot/cost/prices.yaml marks them "
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
        rate = planner.rate_from_monthly_fraction(planner.band_fraction(band))
    elif default_rate is not None:
        rate = default_rate[0]
    else:
        raise BadInputError(f"--candidate {text!r}: give its band (TYPE:STEPS:BAND) or a "
                            "default --interruption-band/--interruption-rate/--mtbf-h")
    return parts[0], steps, rate, spot


def checkpoint_cost(app: AppContext, checkpoint_s: float | None, checkpoint_dir: str | None
                    ) -> tuple[float, dict[str, Any] | None]:
    """C in seconds from exactly one of ``--checkpoint-s`` and ``--checkpoint-dir`` and, for
    the latter, what was read: ``{"location", "median_save_s", "checkpoints": [{"step",
    "save_s", "size_bytes"}]}`` (:func:`slurm_spot.cost.saves.median_save_s`). An ``s3://``
    location is read with spot.yaml's ``checkpoint.s3`` settings where a config exists, else
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
    options: dict[str, Any] = {}
    config = optional_config(app) if is_s3(checkpoint_dir) else None
    if config is not None and config.checkpoint.s3.endpoint_url:
        options["endpoint_url"] = config.checkpoint.s3.endpoint_url
    if config is not None and config.checkpoint.s3.addressing_style != "auto":
        options["addressing_style"] = config.checkpoint.s3.addressing_style
    median, saves = median_save_s(checkpoint_dir, **options)
    return median, {"location": checkpoint_dir, "median_save_s": median,
                    "checkpoints": [asdict(s) for s in saves]}


@click.command("plan")
@click.option("--checkpoint-s", type=float, default=None,
              help="Seconds one checkpoint takes (C).")
@click.option("--checkpoint-dir", default=None,
              help="Instead of --checkpoint-s: a job's checkpoint directory (local, or "
                   "s3://bucket/prefix); C is the median save_s its checkpoints recorded.")
@click.option("--restart-s", type=float, default=300.0, show_default=True,
              help="Seconds from an interruption until the job computes again (R).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Spot nodes of the job (N).")
@click.option("--notice-s", type=float, default=120.0, show_default=True,
              help="Interruption notice (AWS: 120 s, GCP: 30 s).")
@click.option("--interruption-band", "band", default=None,
              help="AWS Spot Advisor band: <5%, 5-10%, 10-15%, 15-20%, >20%.")
@click.option("--interruption-rate", "rate", default=None,
              help="Fraction of nodes interrupted per month (0.08 or 8%), or 'observed' (events).")
@click.option("--mtbf-h", type=float, default=None, help="One node's mean hours between interruptions.")
@click.option("--job-hours", type=float, default=None, help="Compute hours of the job (L).")
@click.option("--instance-type", default=None, help="Price the job on this type.")
@click.option("--spot-usd-h", type=float, default=None, help="Spot USD per node-hour (else looked up).")
@click.option("--on-demand-usd-h", type=float, default=None,
              help="On-demand USD per node-hour (else looked up).")
@click.option("--region", default=None,
              help="Price for this region (default: the region of spot.yaml's provider of the "
                   "type); a price from another region or an old catalogue is warned about.")
@click.option("--compare", is_flag=True, help="Rank --candidate types by expected cost to finish.")
@click.option("--work-steps", type=float, default=None, help="With --compare: the job's steps.")
@click.option("--candidate", "candidates", multiple=True,
              help="With --compare: TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H] (repeat); without "
                   "SPOT_USD_H the spot price is looked up.")
@click.option("--deadline-h", type=float, default=None, help="With --compare: wall-time limit.")
@json_option
@pass_app
def plan_command(app: AppContext, checkpoint_s: float | None, checkpoint_dir: str | None,
                 restart_s: float, nodes: int,
                 notice_s: float, band: str | None, rate: str | None, mtbf_h: float | None,
                 job_hours: float | None, instance_type: str | None, spot_usd_h: float | None,
                 on_demand_usd_h: float | None, compare: bool, work_steps: float | None,
                 candidates: tuple[str, ...], deadline_h: float | None, region: str | None,
                 as_json: bool) -> None:
    """Checkpoint interval (Young, Daly 2006), expected waste, run time and cost under spot
    interruptions. Assumes a constant interruption hazard per node (the output says so; the
    JSON's assumption field). C comes from --checkpoint-s or, with --checkpoint-dir, from the
    job's own recorded saves (the output says which checkpoints were read)."""
    check_number("--restart-s", restart_s, MAX_SECONDS, unit=" seconds")
    check_number("--notice-s", notice_s, MAX_SECONDS, unit=" seconds")
    check_number("--nodes", nodes, MAX_NODES, 1)
    check_number("--job-hours", job_hours, MAX_JOB_HOURS, low_ok=False, unit=" hours")
    check_number("--spot-usd-h", spot_usd_h, MAX_USD_H, unit=" USD per node-hour")
    check_number("--on-demand-usd-h", on_demand_usd_h, MAX_USD_H, unit=" USD per node-hour")
    check_number("--work-steps", work_steps, MAX_STEPS, low_ok=False)
    check_number("--deadline-h", deadline_h, 1000 * MAX_JOB_HOURS, low_ok=False, unit=" hours")
    if not compare:
        given = [name for name, value in (("--candidate", candidates), ("--work-steps", work_steps),
                                          ("--deadline-h", deadline_h)) if value]
        if given:
            raise BadInputError(f"{', '.join(given)}: only with --compare (add --compare to "
                                "rank instance types)")
    else:
        given = [name for name, value in (("--instance-type", instance_type),
                                          ("--job-hours", job_hours), ("--spot-usd-h", spot_usd_h),
                                          ("--on-demand-usd-h", on_demand_usd_h))
                 if value is not None]
        if given:
            raise BadInputError(f"{', '.join(given)}: not with --compare (each --candidate "
                                "names its type, steps/s and spot price: "
                                "TYPE:STEPS_PER_S[:BAND][:SPOT_USD_H]; --work-steps the job)")
    checkpoint_s, measured = checkpoint_cost(app, checkpoint_s, checkpoint_dir)
    if compare:
        _compare(app, checkpoint_s, restart_s, nodes, band, rate, mtbf_h, work_steps, candidates,
                 deadline_h, as_json, measured, region)
        return
    node_rate_h, source = node_rate(app, band, rate, mtbf_h)
    result = planner.plan(planner.PlanInput(checkpoint_s, restart_s, nodes, notice_s, node_rate_h,
                                            source, job_hours))
    data: dict[str, Any] = {"checkpoint_s": checkpoint_s, "restart_s": restart_s,
                            **asdict(result)}
    if measured is not None:
        data["checkpoint_source"] = measured
    if instance_type is not None and job_hours is not None and result.expected_wall_h is not None:
        found = checked_prices(app, instance_type, spot_usd_h, on_demand_usd_h, region=region)
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
    config = optional_config(app)
    spares = spares_of(config) if config is not None else []
    if spares:
        data["spares"] = spares
        data["spares_usd_per_h"] = (None if any(s["usd_per_h"] is None for s in spares)
                                    else sum(s["usd_per_h"] for s in spares))
    if as_json:
        print_json(finite(data))
        return
    _print_plan(data, nodes)


def spares_of(config: SpotConfig) -> list[dict[str, Any]]:
    """The hot spares of ``config``'s node sets with their cost around the clock
    (:func:`slurm_spot.spares.spares_cost`, catalogue prices: no network); [] when none."""
    from slurm_spot.spares import spares_cost
    from slurm_spot.weights import price_lookup

    if not any(ns.spares for ns in config.node_sets):
        return []
    return spares_cost(config, price_lookup(config, live=False))


def spares_lines(spares: list[dict[str, Any]]) -> list[str]:
    """One line per node set with spares: ``hot spares: gpu 2 x $1.20/h = $2.40/h around
    the clock ($1,752.00/month)``."""
    lines = []
    for s in spares:
        if s["usd_per_h"] is None:
            cost = (f"{s['spares']} node(s), price unknown: no {s['market']} price for its "
                    f"instance types in the catalogue or spot.yaml (set cost."
                    f"{'spot' if s['market'] == 'spot' else 'on_demand'}_usd_per_hour)")
        else:
            cost = (f"{s['spares']} x {_usd(s['usd_per_node_h'])}/h = {_usd(s['usd_per_h'])}/h "
                    f"around the clock ({_usd(s['usd_per_month'])}/month)")
        lines.append(f"hot spares: {s['node_set']} ({s['market']}) {cost}, whether or not a "
                     "job runs")
    return lines


def _measured_line(measured: dict[str, Any]) -> str:
    steps = ", ".join(str(c["step"]) for c in measured["checkpoints"])
    count = len(measured["checkpoints"])
    return (f"checkpoint cost: {measured['median_save_s']:.3g} s, the median save_s of {count} "
            f"checkpoint(s) in {measured['location']} (steps {steps})")


def _hours(h: float) -> str:
    return f"{h:.2f} h" if math.isfinite(h) else "never (infinite)"


def _usd(usd: float) -> str:
    return f"${usd:,.2f}" if math.isfinite(usd) else "unbounded (never finishes)"


def _print_plan(d: dict[str, Any], nodes: int) -> None:
    echo = click.echo
    if d.get("checkpoint_source"):
        echo(_measured_line(d["checkpoint_source"]))
    echo(f"interruptions: {d['node_rate_per_h']:.3g} per node-hour ({d['assumption']})")
    echo(f"MTBF: one node {d['mtbf_node_h']:.1f} h, the {nodes}-node job {d['mtbf_job_h']:.1f} h")
    echo(f"checkpoint every: Young {d['young_interval_s'] / 60:.1f} min, "
         f"Daly {d['daly_interval_s'] / 60:.1f} min (use Daly's)")
    echo(f"expected waste at Daly's interval, no notice: {d['waste_fraction']:.2%}")
    if d["notice_checkpoint"]:
        gain = d["waste_fraction"] - d["waste_fraction_with_notice"]
        effect = (f"saves {gain:.2%} of wall time" if gain >= 0 else
                  f"costs {-gain:.2%} more wall time: the save at each notice costs more than "
                  "the recomputation it avoids")
        echo(f"with a checkpoint at each notice: {d['waste_fraction_with_notice']:.2%} ({effect})")
    else:
        echo("the notice is shorter than a checkpoint: no notice-time checkpoint")
    if d.get("never_finishes"):
        echo(f"the job never finishes in practice: a checkpoint ({d['checkpoint_s']:g} s) and "
             f"restart ({d['restart_s']:g} s) cost about as much as, or more than, the "
             f"{nodes}-node job's MTBF ({d['mtbf_job_h'] * 3600:.3g} s), so under "
             f"{1 - planner.NEVER_FINISHES_WASTE:.1%} of wall time is useful compute; use fewer "
             "nodes, a less interrupted type or a faster checkpoint")
    if d.get("expected_wall_h") is not None:
        echo(f"expected wall time: {_hours(d['expected_wall_h'])} without notice"
             + (f", {_hours(d['expected_wall_h_with_notice'])} with notice checkpoints"
                if d.get("expected_wall_h_with_notice") is not None else ""))
    if "expected_spot_cost_usd" in d:
        pct = d["saving_percent"]
        if pct is None:
            saving = "no saving known: on-demand price 0"
        elif not math.isfinite(pct):
            saving = "the job never finishes on spot"
        elif pct >= 0:
            saving = f"{pct:.1f} % saved"
        else:
            saving = f"spot costs {-pct:.1f} % more"
        echo(f"cost on {d['instance_type']}: spot {_usd(d['expected_spot_cost_usd'])} vs "
             f"on-demand {_usd(d['on_demand_cost_usd'])} ({saving}; {d['price_source']})")
    if d.get("unverified_prices"):
        echo(unverified_line(d["unverified_prices"]))
    for warning in d.get("price_warnings", []):
        echo(f"warning: {warning}")
    for line in spares_lines(d.get("spares", [])):
        echo(line)


def _compare(app: AppContext, checkpoint_s: float, restart_s: float, nodes: int,
             band: str | None, rate: str | None, mtbf_h: float | None, work_steps: float | None,
             candidates: tuple[str, ...], deadline_h: float | None, as_json: bool,
             measured: dict[str, Any] | None = None, region: str | None = None) -> None:
    if work_steps is None:
        raise BadInputError("--compare needs --work-steps (the job's total steps)")
    default = node_rate(app, band, rate, mtbf_h) if (band or rate or mtbf_h) else None
    cands = []
    unverified: dict[str, list[str]] = {}
    warnings: dict[str, list[str]] = {}
    for text in candidates:
        itype, steps, node_rate_h, given_spot = parse_candidate(text, default)
        found = checked_prices(
            app, itype, given_spot, None,
            spot_hint=f"it in the candidate: --candidate {itype}:STEPS_PER_S:BAND:SPOT_USD_H",
            region=region)
        unverified[itype], warnings[itype] = found.unverified, found.warnings
        cands.append(planner.Candidate(itype, steps, found.spot, found.on_demand, node_rate_h))
    ranked = planner.compare(cands, work_steps, nodes, checkpoint_s, restart_s, deadline_h)
    if as_json:
        print_json(finite([{**asdict(r),
                            **({"unverified_prices": unverified[r.instance_type]}
                               if unverified.get(r.instance_type) else {}),
                            **({"price_warnings": warnings[r.instance_type]}
                               if warnings.get(r.instance_type) else {})}
                           for r in ranked]))
        return
    flagged = [u for r in ranked for u in unverified.get(r.instance_type, [])]
    if flagged:
        click.echo(unverified_line(flagged))
    for r in ranked:
        for warning in warnings.get(r.instance_type, []):
            click.echo(f"warning: {warning}")
    if measured is not None:
        click.echo(_measured_line(measured))
    for i, r in enumerate(ranked, 1):
        late = "" if r.meets_deadline is not False else "  (misses the deadline)"
        if not math.isfinite(r.expected_wall_h):
            click.echo(f"{i}. {r.instance_type}: never finishes on spot (checkpoint and restart "
                       f"cost about as much as its MTBF; {r.compute_h:.2f} h compute), on-demand "
                       f"{_usd(r.on_demand_cost_usd)}{late}")
            continue
        click.echo(f"{i}. {r.instance_type}: {_usd(r.expected_cost_usd)} expected on spot, "
                   f"{r.expected_wall_h:.2f} h wall ({r.compute_h:.2f} h compute), on-demand "
                   f"{_usd(r.on_demand_cost_usd)}{late}")


COMMANDS = [plan_command]
