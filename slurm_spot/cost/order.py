"""The order in which a partition's node sets are tried: cheapest expected cost first (pure).

Slurm's node ``Weight`` is the mechanism: "jobs will be allocated the nodes with the lowest
weight which satisfies their requirements", and if the lowest-weight nodes cannot satisfy a
job "the set of nodes with the next lowest weight is added" (slurm.conf(5), Weight; the 22.05
text is quoted in :mod:`slurm_spot.lifecycle.prewarm` and docs/admin.md). This module turns what is known
about each node set into one Weight per node set; :mod:`slurm_spot.lifecycle.weights` gathers the inputs
(prices, cooldowns) and keeps Slurm's weights in step.

**The rule.** Node sets are sorted by the key

    (spot.yaml ``weight``, cooling down, on-demand, expected USD per useful hour, spot.yaml order)

and given the Weights 1, 2, ... N in that order (N = the number of node sets; every node set
its own Weight, so Slurm adds them to a job's candidates one at a time). So:

1. **An admin's** ``weight:`` **is a tier that always wins**: a node set with a lower
   ``weight`` is tried before any with a higher one, whatever the prices. With the default
   (every node set ``weight: 1``) the order is the cost order alone.
2. Within a tier, node sets **cooling down** after a capacity error go last (their free nodes
   are DOWN while it lasts, so Slurm skips them anyway; the Weight then says so too), then
   **on-demand** node sets (a spot node set's own ``fallback: on-demand`` is a launch detail and
   does not move it), then the **expected cost**, then spot.yaml's order.
3. **Expected cost** (:func:`expected_usd_per_useful_h`) is the price divided by the share of
   paid time that is useful under the node set's interruption rate: Daly's (2006) waste at the
   optimum checkpoint interval (:mod:`slurm_spot.cost.planner`), with a checkpoint of
   :data:`CHECKPOINT_S` and a restart of :data:`RESTART_S`. A node set with no known price
   sorts after the priced ones of its tier (it is never assumed free).

At AWS Spot Advisor rates (a band is a share per *month*: ``>20%`` is about 4e-4 interruptions
per node-hour) the waste is a few tenths of a percent, so the price decides unless two prices
are within that much; at the rates of a chaos market (several per hour) risk outweighs price.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from slurm_spot.config.plain import band_fraction
from slurm_spot.cost.planner import (
    daly_interval_s,
    rate_from_monthly_fraction,
    waste_fraction,
)
from slurm_spot.errors import BadInputError

#: Seconds one checkpoint is assumed to take when comparing node sets (the order is the same
#: for every job, so it cannot use a job's own figure).
CHECKPOINT_S = 60.0
#: Seconds from an interruption to the job computing again (requeue, boot, restore).
RESTART_S = 300.0
#: The Spot Advisor band a spot node set without ``interruption_band`` is taken to have.
DEFAULT_SPOT_BAND = "5-10%"
#: The Weight of the first node set; 0 is kept for prewarmed replacements
#: (:data:`slurm_spot.lifecycle.weights.PREWARM_WEIGHT`).
FIRST_WEIGHT = 1

Market = Literal["spot", "on-demand"]


@dataclass(frozen=True)
class Offer:
    """What is known about one node set when ordering.

    Attributes:
        name: the node set.
        market: ``spot`` or ``on-demand`` (its primary market).
        usd_per_h: price of one node, USD per hour; None when no price is known.
        interruptions_per_h: interruptions per node-hour (0 for on-demand).
        tier: the admin's spot.yaml ``weight`` (lower is tried first, always).
        position: its index in spot.yaml's ``node_sets`` (the last tie-breaker).
        cooling: True while it cools down after a capacity error.
    """

    name: str
    market: Market
    usd_per_h: float | None
    interruptions_per_h: float = 0.0
    tier: int = 1
    position: int = 0
    cooling: bool = False


def band_rate_per_h(band: str) -> float:
    """Interruptions per node-hour of a Spot Advisor band (``<5%`` .. ``>20%``: its midpoint
    share per month under a constant hazard, :mod:`slurm_spot.cost.planner`).

    Raises:
        BadInputError: not one of the five bands.
    """
    return rate_from_monthly_fraction(band_fraction(band))


def expected_usd_per_useful_h(usd_per_h: float | None, interruptions_per_h: float,
                              checkpoint_s: float = CHECKPOINT_S,
                              restart_s: float = RESTART_S) -> float:
    """USD paid per useful node-hour: ``usd_per_h / (1 - waste)``, where ``waste`` is Daly's
    expected share of lost time at his optimum checkpoint interval for one node's mean time
    between interruptions (``3600 / interruptions_per_h`` seconds); ``inf`` when no price is
    known or interruptions come so often that nothing useful gets done.

    Raises:
        BadInputError: a negative or non-finite price or rate.
    """
    if usd_per_h is None:
        return math.inf
    if not (math.isfinite(usd_per_h) and usd_per_h >= 0):
        raise BadInputError(f"price {usd_per_h!r} USD/h: must be a finite number >= 0")
    if not (math.isfinite(interruptions_per_h) and interruptions_per_h >= 0):
        raise BadInputError(f"interruption rate {interruptions_per_h!r} per hour: must be a "
                            "finite number >= 0")
    if interruptions_per_h == 0:
        return usd_per_h
    mtbf_s = 3600.0 / interruptions_per_h
    waste = waste_fraction(daly_interval_s(checkpoint_s, mtbf_s), checkpoint_s, restart_s, mtbf_s)
    if waste >= 1.0:
        return math.inf
    return usd_per_h / (1.0 - waste)


def sort_key(offer: Offer) -> tuple[int, bool, bool, float, int, str]:
    """The rule's key of one node set (see the module docstring); lower is tried first."""
    return (offer.tier, offer.cooling, offer.market != "spot",
            expected_usd_per_useful_h(offer.usd_per_h, offer.interruptions_per_h),
            offer.position, offer.name)


def ranked(offers: Iterable[Offer]) -> list[Offer]:
    """``offers`` cheapest expected cost first, by :func:`sort_key`.

    Raises:
        BadInputError: two offers for one node set, or a bad price or rate (named)."""
    found = list(offers)
    names = [o.name for o in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInputError(f"node set(s) {', '.join(twice)} given twice to the cost order")
    keys = {}
    for offer in found:
        try:
            keys[offer.name] = sort_key(offer)
        except BadInputError as exc:
            raise BadInputError(f"node set {offer.name}: {exc}") from None
    return sorted(found, key=lambda o: keys[o.name])


def order_weights(offers: Sequence[Offer]) -> dict[str, int]:
    """``{node set: Weight}``: :data:`FIRST_WEIGHT`, +1, ... in :func:`ranked` order.

    Raises:
        BadInputError: as :func:`ranked`.
    """
    return {o.name: FIRST_WEIGHT + i for i, o in enumerate(ranked(offers))}
