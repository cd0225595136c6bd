"""The checkpoint formulas against published figures and hand calculations."""

from __future__ import annotations

import math

import pytest

from slurm_spot.config.plain import band_fraction
from slurm_spot.cost import planner
from slurm_spot.errors import BadInputError


@pytest.mark.parametrize(("mtbf_min", "published_min"), [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_matches_the_papers_figures(mtbf_min: float, published_min: float) -> None:
    # Daly 2006, figs. 3-5: delta = 5 min, R = 10 min; "the new model predicts tau_opt = ..."
    got = planner.daly_interval_s(5 * 60, mtbf_min * 60) / 60
    assert got == pytest.approx(published_min, abs=0.5 if published_min > 10 else 0.05)


def test_young_interval_by_hand() -> None:
    # sqrt(2 * 60 s * 10 h) = sqrt(2 * 60 * 36000) = sqrt(4_320_000) = 2078.46 s
    assert planner.young_interval_s(60, 36000) == pytest.approx(2078.46, abs=0.01)


def test_daly_falls_back_to_mtbf_when_the_checkpoint_is_too_long() -> None:
    assert planner.daly_interval_s(7200, 3000) == 3000


def test_band_conversion_under_constant_hazard() -> None:
    # 10-15% stands for 12.5 % a month: rate = -ln(0.875) / 730 h = 1.8292e-4 per hour
    rate = planner.rate_from_monthly_fraction(band_fraction("10-15%"))
    assert rate == pytest.approx(-math.log(0.875) / 730)
    assert rate == pytest.approx(1.8292e-4, rel=1e-4)
    # a month at that rate interrupts 12.5 % of nodes again
    assert 1 - math.exp(-rate * 730) == pytest.approx(0.125)
    assert band_fraction(" < 5 ") == 0.025
    assert band_fraction(">20%") == 0.25


@pytest.mark.parametrize("bad", ["3%", "", "10-20%"])
def test_unknown_band_is_named(bad: str) -> None:
    with pytest.raises(BadInputError, match="interruption band"):
        band_fraction(bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, math.nan])
def test_monthly_fraction_out_of_range(bad: float) -> None:
    with pytest.raises(BadInputError, match="fraction per month"):
        planner.rate_from_monthly_fraction(bad)


def test_job_mtbf_divides_by_nodes() -> None:
    # one node fails every 100 h; 20 nodes: every 5 h
    assert planner.job_mtbf_s(0.01, 20) == pytest.approx(5 * 3600)
    assert math.isinf(planner.job_mtbf_s(0.0, 8))


def test_waste_by_hand_and_first_order_limit() -> None:
    # tau = 1 h, C = 0.1 h, R = 0.2 h, M = 10 h:
    # T_seg = 10 e^0.02 (e^0.11 - 1) = 10 * 1.0202013 * 0.1162781 = 1.186271 h
    seg = planner.segment_wall_s(3600, 360, 720, 36000)
    assert seg / 3600 == pytest.approx(1.186271, rel=1e-5)
    assert planner.waste_fraction(3600, 360, 720, 36000) == pytest.approx(1 - 1 / 1.186271, rel=1e-5)
    # for M >> tau the waste tends to Young's first order C/tau + (tau/2 + R)/M
    w = planner.waste_fraction(600, 6, 60, 1e7)
    assert w == pytest.approx(6 / 606 + (303 + 60) / 1e7 * 600 / 606, rel=1e-3)


def test_daly_interval_minimises_the_expected_wall_time() -> None:
    c, r, m = 120.0, 300.0, 4 * 3600.0
    best = planner.daly_interval_s(c, m)
    at = planner.waste_fraction(best, c, r, m)
    for factor in (0.7, 0.85, 1.15, 1.4):
        assert planner.waste_fraction(best * factor, c, r, m) > at


def test_plan_reports_notice_savings() -> None:
    rate = planner.rate_from_monthly_fraction(0.25)
    p = planner.plan(planner.PlanInput(checkpoint_s=60, restart_s=300, nodes=32, notice_s=120,
                                       node_rate_per_h=rate, rate_source="band >20%",
                                       job_hours=48))
    assert p.mtbf_job_h == pytest.approx(730 / -math.log(0.75) / 32)
    assert p.notice_checkpoint
    assert p.waste_fraction_with_notice is not None
    assert p.waste_fraction_with_notice < p.waste_fraction
    assert p.expected_wall_h_with_notice is not None and p.expected_wall_h is not None
    assert 48 < p.expected_wall_h_with_notice < p.expected_wall_h
    short = planner.plan(planner.PlanInput(60, 300, 32, 30, rate, "x"))
    assert not short.notice_checkpoint and short.waste_fraction_with_notice is None


def test_compare_ranks_a_faster_pricier_type_first_when_it_finishes_cheaper() -> None:
    slow = planner.Candidate("g5.xlarge", steps_per_s=1.0, spot_usd_per_h=0.4,
                             on_demand_usd_per_h=1.0, node_rate_per_h=1e-4)
    fast = planner.Candidate("p4d.24xlarge", steps_per_s=20.0, spot_usd_per_h=6.0,
                             on_demand_usd_per_h=32.8, node_rate_per_h=5e-4)
    ranked = planner.compare([slow, fast], work_steps=360_000, nodes=4, checkpoint_s=60,
                             restart_s=300, deadline_h=10)
    assert [r.instance_type for r in ranked] == ["p4d.24xlarge", "g5.xlarge"]
    # slow: 100 h compute, misses a 10 h deadline; its cost is at least 100 h * 4 * 0.4
    assert ranked[1].meets_deadline is False and ranked[1].expected_cost_usd > 160
    assert ranked[0].compute_h == pytest.approx(5.0)
    with pytest.raises(BadInputError):
        planner.compare([], 1, 1, 1, 1)


def test_overflowing_waste_reads_as_a_job_that_never_finishes() -> None:
    # C + R hundreds of times the job's MTBF: e^((tau + C)/M) is beyond a float
    assert planner.segment_wall_s(36.0, 86400.0, 300.0, 36.0) == math.inf
    assert planner.waste_fraction(36.0, 86400.0, 300.0, 36.0) == 1.0
    assert planner.expected_wall_s(3600.0, 36.0, 86400.0, 300.0, 36.0) == math.inf
    result = planner.plan(planner.PlanInput(86400.0, 300.0, 100, 120.0, 1.0, "x", 1.0))
    assert result.never_finishes and result.expected_wall_h == math.inf
    fine = planner.plan(planner.PlanInput(60.0, 300.0, 8, 120.0, 0.001, "x", 10.0))
    assert not fine.never_finishes and math.isfinite(fine.expected_wall_h or math.nan)


def test_non_finite_inputs_are_refused_not_propagated() -> None:
    with pytest.raises(BadInputError):
        planner.expected_wall_s(math.nan, 60.0, 10.0, 0.0, 3600.0)
    with pytest.raises(BadInputError):
        planner.plan(planner.PlanInput(math.nan, 300.0, 1, 120.0, 0.01, "x"))
    with pytest.raises(BadInputError, match="--work-steps nan"):
        planner.compare([planner.Candidate("g5.xlarge", 1.0, 0.4, 1.0, 0.01)], math.nan, 1,
                        60.0, 0.0)
