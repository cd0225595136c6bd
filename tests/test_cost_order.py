"""The cost order of a partition's node sets (issue 24, part 2; slurm_spot.cost.order): prices
and interruption risks in, Slurm Weights out."""

from __future__ import annotations

import math

import pytest

from slurm_spot.cost.order import (
    Offer,
    band_rate_per_h,
    expected_usd_per_useful_h,
    order_weights,
    ranked,
)
from slurm_spot.errors import BadInputError

SAFE = band_rate_per_h("<5%")
RISKY = band_rate_per_h(">20%")


def names(offers: list[Offer]) -> list[str]:
    return [o.name for o in ranked(offers)]


def test_the_cheapest_spot_node_set_gets_the_lowest_weight() -> None:
    offers = [Offer("a10g", "spot", 0.50, SAFE, position=0),
              Offer("l4", "spot", 0.28, SAFE, position=1),
              Offer("t4", "spot", 0.16, SAFE, position=2)]
    assert order_weights(offers) == {"t4": 1, "l4": 2, "a10g": 3}


def test_on_demand_comes_last_even_when_it_is_cheaper() -> None:
    offers = [Offer("od", "on-demand", 0.20, 0.0, position=0),
              Offer("spot", "spot", 0.90, RISKY, position=1)]
    assert names(offers) == ["spot", "od"]


def test_an_admins_weight_is_a_tier_that_prices_never_cross() -> None:
    # The admin wants "reserved" first whatever it costs, and the on-demand set of tier 1
    # still before any node set of tier 5.
    offers = [Offer("cheap", "spot", 0.10, SAFE, tier=5, position=0),
              Offer("reserved", "spot", 3.00, SAFE, tier=1, position=1),
              Offer("od", "on-demand", 4.00, 0.0, tier=1, position=2),
              Offer("dear", "spot", 2.00, SAFE, tier=5, position=3)]
    assert order_weights(offers) == {"reserved": 1, "od": 2, "cheap": 3, "dear": 4}


def test_a_node_set_cooling_down_goes_after_the_others_of_its_tier() -> None:
    offers = [Offer("cheap", "spot", 0.10, SAFE, position=0, cooling=True),
              Offer("other", "spot", 0.30, SAFE, position=1),
              Offer("od", "on-demand", 1.00, 0.0, position=2)]
    assert names(offers) == ["other", "od", "cheap"]
    # Once its cooldown is over, it is first again.
    assert names([Offer("cheap", "spot", 0.10, SAFE, position=0), *offers[1:]])[0] == "cheap"


def test_at_equal_prices_the_riskier_node_set_goes_second() -> None:
    offers = [Offer("risky", "spot", 0.40, RISKY, position=0),
              Offer("safe", "spot", 0.40, SAFE, position=1)]
    assert names(offers) == ["safe", "risky"]


def test_spot_advisor_risk_moves_the_order_only_between_near_equal_prices() -> None:
    # A >20% band costs well under 1 % of the price: 1 % cheaper still wins.
    risky = expected_usd_per_useful_h(1.00, RISKY)
    assert 1.0 < risky < 1.01
    assert names([Offer("safe", "spot", 1.00, SAFE, position=0),
                  Offer("risky", "spot", 0.99, RISKY, position=1)]) == ["risky", "safe"]


def test_a_market_interrupting_several_times_an_hour_loses_to_a_dearer_calm_one() -> None:
    # 6 interruptions per node-hour with a 300 s restart each: over half the time is lost.
    stormy = expected_usd_per_useful_h(0.30, 6.0)
    assert stormy > 0.60
    assert names([Offer("stormy", "spot", 0.30, 6.0, position=0),
                  Offer("calm", "spot", 0.50, SAFE, position=1)]) == ["calm", "stormy"]
    # Interrupted every 200 s, less than a restart takes: ten times the price and more.
    assert expected_usd_per_useful_h(0.30, 3600 / 200) > 3.0
    assert expected_usd_per_useful_h(0.30, 3600 / 5) == math.inf


def test_a_node_set_without_a_price_sorts_after_the_priced_ones_never_as_free() -> None:
    offers = [Offer("unknown", "spot", None, SAFE, position=0),
              Offer("priced", "spot", 9.00, SAFE, position=1)]
    assert order_weights(offers) == {"priced": 1, "unknown": 2}


def test_ties_keep_spot_yaml_order_and_weights_start_at_1() -> None:
    offers = [Offer(n, "spot", 0.5, SAFE, position=i) for i, n in enumerate(["b", "a", "c"])]
    assert order_weights(offers) == {"b": 1, "a": 2, "c": 3}


def test_spot_advisor_bands_are_monthly_shares() -> None:
    # >20% stands for 25 % a month: -ln(0.75) / 730 h.
    assert band_rate_per_h(">20%") == pytest.approx(-math.log(0.75) / 730)
    assert band_rate_per_h("<5%") < band_rate_per_h("10-15%") < RISKY
    with pytest.raises(BadInputError, match="interruption band '30%'"):
        band_rate_per_h("30%")


@pytest.mark.parametrize(("price", "rate", "what"), [
    (-1.0, 0.0, "price -1.0 USD/h"), (math.nan, 0.0, "price nan"),
    (1.0, -0.5, "interruption rate -0.5"), (1.0, math.inf, "interruption rate inf")])
def test_bad_prices_and_rates_are_refused_naming_the_node_set(price: float, rate: float,
                                                               what: str) -> None:
    with pytest.raises(BadInputError, match=f"node set gpu: {what}"):
        order_weights([Offer("gpu", "spot", price, rate)])


def test_one_node_set_given_twice_is_refused() -> None:
    with pytest.raises(BadInputError, match=r"node set.*gpu given twice"):
        order_weights([Offer("gpu", "spot", 1.0), Offer("gpu", "spot", 2.0, position=1)])
