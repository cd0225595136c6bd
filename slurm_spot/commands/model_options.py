"""The options ``plan`` and ``simulate`` share: how often a node is interrupted
(:func:`interruption_options`, turned into a rate by :func:`node_rate_of`) and what a node-hour
costs (:func:`price_options`, checked by :func:`check_prices`)."""

from __future__ import annotations

from collections.abc import Callable

import click

from slurm_spot.commands.common import AppContext, F, site_events
from slurm_spot.cost.plan import MAX_USD_H, check_number, node_rate


def _add(func: F, *options: Callable[[F], F]) -> F:
    """``func`` with click ``options`` (decorators), the first one listed first in ``--help``."""
    for option in reversed(options):
        func = option(func)
    return func


def interruption_options(func: F) -> F:
    """Add ``--interruption-band`` (``band``), ``--interruption-rate`` (``rate``) and
    ``--mtbf-h`` (``mtbf_h``), each None unless given; :func:`node_rate_of` reads them."""
    return _add(
        func,
        click.option("--interruption-band", "band", default=None,
                     help="AWS Spot Advisor band: <5%, 5-10%, 10-15%, 15-20%, >20%."),
        click.option("--interruption-rate", "rate", default=None,
                     help="Fraction of nodes interrupted per month (0.08 or 8%), or 'observed' "
                          "(events)."),
        click.option("--mtbf-h", type=float, default=None,
                     help="One node's mean hours between interruptions."),
    )


def node_rate_of(app: AppContext, band: str | None, rate: str | None,
                 mtbf_h: float | None) -> tuple[float, str]:
    """Interruptions per node-hour from the options of :func:`interruption_options`, and how
    it was got (:func:`slurm_spot.cost.plan.node_rate`; ``observed``: from the site's events).

    Raises:
        BadInputError: none or several given, a bad value, or ``observed`` without events.
    """
    return node_rate(band, rate, mtbf_h, site_events(app))


def price_options(func: F) -> F:
    """Add ``--instance-type``, ``--spot-usd-h``, ``--on-demand-usd-h`` (USD per node-hour) and
    ``--region``, each None unless given; :func:`check_prices` checks the prices."""
    return _add(
        func,
        click.option("--instance-type", default=None, help="Price the nodes as this type."),
        click.option("--spot-usd-h", type=float, default=None,
                     help="Spot USD per node-hour (else looked up for --instance-type)."),
        click.option("--on-demand-usd-h", type=float, default=None,
                     help="On-demand USD per node-hour (else looked up for --instance-type)."),
        click.option("--region", default=None,
                     help="Price for this region (default: the region of spot.yaml's provider "
                          "of the type); a price from another region or an old catalogue is "
                          "warned about."),
    )


def check_prices(spot_usd_h: float | None, on_demand_usd_h: float | None) -> None:
    """Check the prices of :func:`price_options` (USD per node-hour, None: not given).

    Raises:
        BadInputError: a price below 0, above :data:`~slurm_spot.cost.plan.MAX_USD_H` or not
            a number.
    """
    check_number("--spot-usd-h", spot_usd_h, MAX_USD_H, unit=" USD per node-hour")
    check_number("--on-demand-usd-h", on_demand_usd_h, MAX_USD_H, unit=" USD per node-hour")
