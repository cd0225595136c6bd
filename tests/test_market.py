"""The chaos market's seeded schedule (issue 24 part 5), without a cluster: what
``slurm-spot local market plan`` shows, its inputs, and the prediction it is compared with."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.jsonenvelope import read_envelope
from slurm_spot.localcluster.market import (
    CAPACITY,
    INTERRUPT,
    NodeSetMarket,
    parse_market,
    schedule,
)
from slurm_spot.localcluster.market_report import PredictionInputs, measured_goodput, predict

NODES = {"cheap": ["cheap-1", "cheap-2"], "other": ["other-1", "other-2"]}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "t", "providers": {"local": {"type": "local"}},
        "node_sets": [{"name": "cheap", "provider": "local", "count": 2, "cpus": 1},
                      {"name": "other", "provider": "local", "count": 2, "cpus": 1}],
        "partitions": [{"name": "spot", "node_sets": ["cheap", "other"], "default": True}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")}))
    monkeypatch.setenv("SLURM_SPOT_CONFIG", str(path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return path


def _plan(*args: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["local", "market", "plan", "--json", *args])
    assert result.exit_code == 0, result.output
    return list(read_envelope(result.stdout, "local market plan"))


SPECS = ("--node-set", "cheap:rate=60,notice=0.5,notice_s=20,up=120,down=30,cycle=random",
         "--node-set", "other:rate=30/h,notice=100%")


def test_the_same_seed_gives_the_same_events_and_another_seed_others(config: Path) -> None:
    first = _plan(*SPECS, "--seed", "7", "--duration", "1800")
    assert first == _plan(*SPECS, "--seed", "7", "--duration", "1800")
    assert first != _plan(*SPECS, "--seed", "8", "--duration", "1800")
    kinds = {e["kind"] for e in first}
    assert kinds == {INTERRUPT, CAPACITY}
    times = [e["at_s"] for e in first]
    assert times == sorted(times) and all(0 <= t < 1800 for t in times)
    # a longer plan starts with the shorter one: the duration only cuts the stream
    longer = _plan(*SPECS, "--seed", "7", "--duration", "3600")
    assert longer[:len(first)] == first and len(longer) > len(first)


def test_a_node_sets_events_do_not_depend_on_the_other_markets() -> None:
    cheap = parse_market("cheap:rate=60,notice=0.5,up=100,down=20")
    other = parse_market("other:rate=10")
    both = schedule([cheap, other], NODES, seed=3, until_s=3600)
    alone = schedule([cheap], NODES, seed=3, until_s=3600)
    assert [e for e in both if e.node_set == "cheap"] == alone


def test_interruptions_come_at_the_rate_per_node_hour_with_the_notice_share() -> None:
    market = NodeSetMarket("cheap", rate_per_h=20, notice_share=0.25, notice_s=45)
    hours = 50
    got = schedule([market], NODES, seed=1, until_s=hours * 3600)
    expected = 20 * 2 * hours  # per node-hour, two nodes
    assert abs(len(got) - expected) < 4 * expected ** 0.5  # Poisson: within 4 sigma
    with_notice = [e for e in got if e.notice_s]
    assert {e.notice_s for e in with_notice} == {45}
    assert abs(len(with_notice) / len(got) - 0.25) < 0.06
    assert {e.node for e in got} == set(NODES["cheap"])


def test_a_fixed_capacity_cycle_starting_down_goes_and_comes_back_on_time() -> None:
    market = parse_market("cheap:start=down,down=40s,up=100")
    got = schedule([market], NODES, seed=0, until_s=400)
    assert [(e.at_s, e.available) for e in got] == [
        (0.0, False), (40.0, True), (140.0, False), (180.0, True), (280.0, False),
        (320.0, True)]


def test_a_random_capacity_cycle_alternates_with_the_given_means() -> None:
    market = parse_market("cheap:up=300,down=60,cycle=random")
    got = schedule([market], NODES, seed=5, until_s=2000 * 360)
    assert [e.available for e in got[:4]] == [False, True, False, True]
    downs = [b.at_s - a.at_s for a, b in itertools.pairwise(got) if a.available is False]
    ups = [b.at_s - a.at_s for a, b in itertools.pairwise(got) if a.available is True]
    assert 50 < sum(downs) / len(downs) < 70 and 270 < sum(ups) / len(ups) < 330


@pytest.mark.parametrize(("spec", "message"), [
    ("cheap", "expected NODE_SET:key=value"),
    ("cheap:rate=ten", "rate: 'ten' is not a number"),
    ("cheap:speed=3", "'speed=3' is not key=value with a key of rate"),
    ("cheap:notice=1.5", "notice=1.5 must be a share"),
    ("cheap:rate=-1", "rate=-1.0 must be between 0"),
    ("cheap:down=30", "down=30 needs up > 0"),
    # a period this short made `plan` run without end and the daemon loop without sleeping
    ("cheap:up=1e-300,down=1e-300", "up=1e-300 must be 0 or at least 1 s"),
    ("cheap:up=300,down=0.001s,cycle=random", "down=0.001 must be 0 or at least 1 s"),
    ("cheap:rate=0,rate=3600", "rate: given twice"),
    ("cheap:start=sideways,up=1,down=1", "start='sideways' must be up or down"),
    ("nope:rate=1", "market of node set 'nope': no such node set (defined: cheap, other)"),
])
def test_a_bad_market_is_refused_with_exit_2_naming_it(config: Path, spec: str,
                                                        message: str) -> None:
    result = CliRunner().invoke(cli, ["local", "market", "plan", "--node-set", spec])
    assert result.exit_code == 2
    assert message in result.output


def test_the_same_node_set_twice_is_refused(config: Path) -> None:
    result = CliRunner().invoke(cli, ["local", "market", "plan", "--node-set", "cheap:rate=1",
                                      "--node-set", "cheap:rate=2"])
    assert result.exit_code == 2 and "node set 'cheap' has two markets" in result.output


def test_start_refuses_a_cluster_that_is_not_up(config: Path) -> None:
    result = CliRunner().invoke(cli, ["local", "market", "start", "--node-set", "cheap:rate=1"])
    assert result.exit_code == 2 and "is not up: run 'slurm-spot local up' first" in result.output


def test_the_prediction_falls_with_the_rate_and_without_notice() -> None:
    inputs = PredictionInputs(compute_s=600, nodes=2, checkpoint_s=1, interval_s=10,
                              restart_s=10, boot_s=5, detect_s=5, runs=50)
    calm = predict([NodeSetMarket("a", rate_per_h=5, notice_share=1, notice_s=20)], inputs)
    stormy = predict([NodeSetMarket("a", rate_per_h=60, notice_share=1, notice_s=20)], inputs)
    killed = predict([NodeSetMarket("a", rate_per_h=60, notice_share=0, notice_s=20)], inputs)
    assert 0 < float(killed["goodput"]) < float(stormy["goodput"]) < float(calm["goodput"]) < 1
    # the first start (boot + restart) is in the wall: even a calm market is below 600/615
    assert float(calm["goodput"]) <= 600 / 615
    assert "--mtbf-h 0.0166667" in str(stormy["with_notice"]["command"])  # type: ignore[index]


def test_measured_goodput_is_compute_over_submission_to_end() -> None:
    fields = {"SubmitTime": "2025-03-01T10:00:00", "EndTime": "2025-03-01T10:05:00",
              "JobState": "COMPLETED"}
    wall, goodput = measured_goodput(150.0, fields)
    assert wall == 300.0 and goodput == 0.5
    running = {**fields, "JobState": "RUNNING"}
    from datetime import datetime
    now = datetime.fromisoformat("2025-03-01T10:10:00").timestamp()
    assert measured_goodput(150.0, running, now=now) == (600.0, 0.25)
    assert measured_goodput(1.0, {}) == (None, None)
    # a requeue reset SubmitTime: the first event that named the job is the submission
    first = datetime.fromisoformat("2025-03-01T09:55:00").timestamp()
    assert measured_goodput(150.0, fields, first_seen=first) == (600.0, 0.25)


def test_plan_json_names_each_event_fully(config: Path) -> None:
    events = _plan("--node-set", "cheap:rate=120,notice=0", "--duration", "120", "--seed", "2")
    assert events and all(set(e) == {"at_s", "kind", "node_set", "node", "notice_s"}
                          and e["notice_s"] == 0 for e in events)
    json.dumps(events)


def test_stop_restores_capacity_once_after_a_killed_daemon(config: Path, tmp_path: Path) -> None:
    """A daemon that died without restoring (SIGKILL) leaves cheap at 0: ``local market stop``
    lifts it; a limit the admin sets afterwards survives a second stop (and ``local down``)."""
    from slurm_spot.config import load_config
    from slurm_spot.localcluster.marketd import MarketPaths
    from slurm_spot.providers.local.provider import provider_for_node

    spot = load_config(config)
    provider = provider_for_node(spot, "cheap-1")
    provider.set_capacity("cheap", 0)
    paths = MarketPaths.of(spot)
    paths.root.mkdir(parents=True)
    paths.plan.write_text(json.dumps({"seed": 0, "started": 0, "markets": [],
                                      "limits_before": {"cheap": None}, "pid": None}))
    stop = ["local", "market", "stop", "--conf-dir", str(tmp_path / "etc"), "--json"]
    result = CliRunner().invoke(cli, stop)
    assert result.exit_code == 0, result.output
    assert read_envelope(result.stdout, "local market stop") == {"stopped": False}
    assert "cheap" not in provider.capacity()
    provider.set_capacity("cheap", 1)
    assert CliRunner().invoke(cli, stop).exit_code == 0
    assert provider.capacity() == {"cheap": 1}


def test_the_daemon_waits_for_a_far_event_in_steps_not_one_sleep_that_overflows() -> None:
    """`rate=1e-6` draws interruptions billions of seconds away (`rate=1e-320`: at inf); the
    daemon slept the whole delay at once, time.sleep raised OverflowError and the daemon died
    at its first event. It now waits in steps of at most an hour (until SIGTERM)."""
    import math
    import time

    from slurm_spot.localcluster import marketd

    with pytest.raises(OverflowError):
        time.sleep(1e13)  # what the daemon did
    for when in (time.time() + 1e13, math.inf):
        slept: list[float] = []

        def sleep(seconds: float, slept: list[float] = slept) -> None:
            slept.append(seconds)
            if len(slept) == 3:
                raise SystemExit(0)  # the daemon's SIGTERM handler

        with pytest.raises(SystemExit):
            marketd.sleep_until(when, sleep)
        assert slept == [marketd.SLEEP_STEP_S] * 3
    marketd.sleep_until(time.time() - 1, lambda s: pytest.fail("slept for a past event"))
