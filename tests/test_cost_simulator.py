"""The simulator against the analytical model, and its strategies against each other."""

from __future__ import annotations

import pytest

from slurm_spot.cost import planner
from slurm_spot.cost.simulator import NoProgressError, SimParams, StepBudget, simulate, simulate_run
from slurm_spot.errors import BadInputError


def test_no_notice_results_agree_with_the_analytical_waste_formula() -> None:
    # one node, MTBF 2 h; downtime = detect + boot + restart = 600 s: Daly's complete model
    p = SimParams(nodes=1, job_hours=100, checkpoint_s=300, restart_s=400, detect_s=100,
                  boot_s=100, node_rate_per_h=0.5, interval_s=1800, notice_s=0)
    _, (res,) = simulate(p, ("periodic",), runs=400, seed=7)
    expected_h = planner.expected_wall_s(100 * 3600, 1800, 300, 600, 7200) / 3600
    assert abs(res.wall_h.mean - expected_h) <= 2.5 * res.wall_h.ci95
    assert res.wall_h.ci95 < 0.01 * expected_h  # the test has power: the CI is tight
    waste = planner.waste_fraction(1800, 300, 600, 7200)
    assert abs((1 - res.goodput.mean) - waste) <= 2.5 * res.goodput.ci95 + 0.002


def test_same_seed_same_numbers_and_different_seed_different() -> None:
    p = SimParams(nodes=8, job_hours=10, checkpoint_s=60, restart_s=120, node_rate_per_h=0.01)
    a = simulate(p, runs=20, seed=3)
    b = simulate(p, runs=20, seed=3)
    c = simulate(p, runs=20, seed=4)
    assert a == b
    assert a != c


def test_slurm_spot_beats_plain_slurm_under_frequent_interruptions() -> None:
    p = SimParams(nodes=32, job_hours=24, checkpoint_s=60, restart_s=120, notice_s=120,
                  boot_s=90, node_rate_per_h=0.01, spot_usd_per_h=10, on_demand_usd_per_h=30)
    base, results = simulate(p, runs=100, seed=1)
    by = {r.strategy: r for r in results}
    assert by["slurm-spot"].goodput.mean > by["periodic"].goodput.mean > by["plain"].goodput.mean
    assert by["plain"].interruptions.mean > 5  # MTBF of the job is 3.1 h
    assert by["slurm-spot"].cost_usd.mean < by["plain"].cost_usd.mean
    # no strategy can beat the uninterrupted compute time
    assert all(r.wall_h.mean > 24 for r in results)
    assert base.cost_usd == pytest.approx(base.wall_h * 32 * 30)


def test_on_demand_nodes_are_never_interrupted() -> None:
    p = SimParams(nodes=4, on_demand_nodes=4, job_hours=5, checkpoint_s=60, restart_s=60,
                  node_rate_per_h=1.0)
    _, results = simulate(p, runs=5)
    assert all(r.interruptions.mean == 0 for r in results)


@pytest.mark.parametrize("change", [{"nodes": 0}, {"job_hours": -1}, {"on_demand_nodes": 9},
                                    {"boot_s": float("nan")}])
def test_bad_parameters_are_named(change: dict[str, float]) -> None:
    params = {"nodes": 8, "job_hours": 1, "checkpoint_s": 60, "restart_s": 60,
              "node_rate_per_h": 0.01, **change}
    with pytest.raises(BadInputError):
        simulate(SimParams(**params), runs=3)  # type: ignore[arg-type]


def test_a_job_that_cannot_progress_is_refused_before_simulating() -> None:
    # C = 600 s against a 64-node job MTBF of 56 s: `plan` says waste 100 %
    p = SimParams(nodes=64, job_hours=1, checkpoint_s=600, restart_s=120, node_rate_per_h=1.0)
    with pytest.raises(NoProgressError, match="never finishes in practice with plain, periodic, "
                                              "slurm-spot, elastic"):
        simulate(p, runs=2)
    # the estimate agrees with `plan`'s model where both apply
    ok = SimParams(nodes=8, job_hours=10, checkpoint_s=60, restart_s=120, node_rate_per_h=0.01)
    assert ok.expected_wall_s("periodic") == pytest.approx(planner.expected_wall_s(
        36000, ok.interval_for("periodic"), 60, ok.downtime_s("periodic"), ok.job_mtbf_s))


def test_a_simulation_past_its_event_budget_is_refused_up_front() -> None:
    p = SimParams(nodes=8, job_hours=10_000, checkpoint_s=60, restart_s=120,
                  node_rate_per_h=0.01)
    with pytest.raises(BadInputError, match=r"limit 3,000,000\): lower --runs \(to about \d+\)"):
        simulate(p, runs=200)
    # so long that no number of runs fits: what else to change
    p = SimParams(nodes=8, job_hours=10_000, checkpoint_s=60, restart_s=120,
                  node_rate_per_h=0.01, interval_s=1)
    with pytest.raises(BadInputError, match="even 2 runs exceed it: lower --job-hours or raise "
                                            "--interval-s"):
        simulate(p, runs=2, strategies=("plain",))


def test_a_run_stops_at_its_step_budget_and_keeps_no_marks_when_asked() -> None:
    import random

    p = SimParams(nodes=1000, job_hours=24, checkpoint_s=60, restart_s=30, node_rate_per_h=0.01,
                  interval_s=600)
    with pytest.raises(NoProgressError, match="budget of 50 events"):
        simulate_run(p, "periodic", random.Random(1), StepBudget(50))
    run = simulate_run(p, "periodic", random.Random(1), keep_marks=False)
    assert run.interruptions > 100 and run.marks == []  # memory does not grow with them
    kept = simulate_run(p, "periodic", random.Random(1))
    assert kept.wall_s == run.wall_s and len(kept.marks) >= kept.interruptions


def test_by_default_every_strategy_checkpoints_at_dalys_interval_for_the_job() -> None:
    p = SimParams(nodes=20, on_demand_nodes=1, job_hours=72, checkpoint_s=60, restart_s=120,
                  node_rate_per_h=planner.rate_from_monthly_fraction(0.25))
    _, results = simulate(p, runs=20, seed=0)
    daly = planner.daly_interval_s(60, p.job_mtbf_s)
    assert [r.interval_s for r in results] == [pytest.approx(daly)] * 4
    assert "Daly's interval" in p.interval_policy()
    fixed = SimParams(**{**p.__dict__, "interval_s": 1200.0})
    _, results = simulate(fixed, runs=20, seed=0)
    assert {r.interval_s for r in results} == {1200.0}
    assert "every 20.0 min" in fixed.interval_policy()


def test_every_strategy_of_a_run_sees_the_same_interruption_times() -> None:
    import random

    from slurm_spot.cost.simulator import InterruptionTrace

    # long recoveries (plain) and none lost (slurm-spot) finish at different times, but the
    # interruptions that fall inside both runs are the same instants
    p = SimParams(nodes=16, job_hours=48, checkpoint_s=60, restart_s=120,
                  node_rate_per_h=0.01)
    trace = InterruptionTrace(p.spot_rate_per_s, random.Random("t"))
    runs = {st: simulate_run(p, st, trace) for st in ("plain", "periodic", "slurm-spot",
                                                       "elastic")}
    shortest = min(r.wall_s for r in runs.values())
    seen = {st: [t for t, kind in r.marks if kind == "interrupt" and t <= shortest]
            for st, r in runs.items()}
    assert len(seen["plain"]) >= 3
    assert all(times == seen["plain"] for times in seen.values())
    # and so a strategy that recovers faster never sees more interruptions than plain Slurm
    _, results = simulate(p, runs=50, seed=5)
    by = {r.strategy: r for r in results}
    assert by["slurm-spot"].interruptions.mean <= by["plain"].interruptions.mean
