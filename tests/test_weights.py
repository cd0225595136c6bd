"""Slurm's node Weights kept in the cost order (issue 24, part 2; slurm_spot.lifecycle.weights): what
render writes, what a reconciler pass changes when prices or capacity change, what it leaves
alone (an admin's Weight, a prewarm's 0); and the failover counter (part 6)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from slurm_spot.config import NodeSetConfig, SpotConfig
from slurm_spot.events import Action, Event, emit, read_events
from slurm_spot.lifecycle.weights import live_weights, static_weights
from slurm_spot.reconcile.reconciler import Reconciler
from slurm_spot.render import render
from slurm_spot.slurm.reasons import cooldown_reason
from tests.fakes.fake_provider import FakeProvider
from tests.fakes.fake_slurm import FakeSlurm

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def site(tmp_path: Path, **power: object) -> SpotConfig:
    """Three local node sets priced by spot.yaml: ``dear`` (spot, 0.50), ``cheap`` (spot,
    0.20) and ``od`` (on-demand, 0.15), listed in that order."""
    return SpotConfig.model_validate({
        "cluster": "test",
        "node_sets": [
            {"name": "dear", "provider": "local", "count": 2, "instance_types": ["dear"]},
            {"name": "cheap", "provider": "local", "count": 2, "instance_types": ["cheap"],
             "interruption_band": "10-15%"},
            {"name": "od", "provider": "local", "count": 1, "market": "on-demand",
             "instance_types": ["od"]}],
        "partitions": [{"name": "spot", "node_sets": ["dear", "cheap", "od"]}],
        "cost": {"spot_usd_per_hour": {"dear": 0.50, "cheap": 0.20},
                 "on_demand_usd_per_hour": {"od": 0.15}},
        "power": power,
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    })


def weight_lines(config: SpotConfig) -> dict[str, str]:
    text = render(config, version=(22, 5)).files["slurm-spot.conf"]
    return {line.split()[0].split("=")[1]: next(p for p in line.split() if p.startswith("Weight="))
            for line in text.splitlines() if line.startswith("NodeName=")}


def test_render_writes_the_cost_order_into_slurm_conf(tmp_path: Path) -> None:
    assert weight_lines(site(tmp_path)) == {
        "cheap-1": "Weight=1", "cheap-2": "Weight=1", "dear-1": "Weight=2", "dear-2": "Weight=2",
        "od-1": "Weight=3"}


def test_order_weight_keeps_spot_yaml_weights_as_written(tmp_path: Path) -> None:
    config = site(tmp_path, order="weight")
    assert set(weight_lines(config).values()) == {"Weight=1"}
    assert static_weights(config) == {"dear": 1, "cheap": 1, "od": 1}


def test_an_unknown_interruption_band_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interruption band '25%'"):
        NodeSetConfig.model_validate({"name": "x", "provider": "local", "count": 1,
                                      "interruption_band": "25%"})


class World:
    """:func:`site` under a fake Slurm (nodes at slurm.conf's Weights) and a reconciler
    whose prices come from ``self.prices`` (as a live lookup would)."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = site(tmp_path)
        self.slurm = FakeSlurm()
        for ns, weight in static_weights(self.config).items():
            for name in self.config.node_set(ns).node_names:
                self.slurm.add_node(name).weight = weight
        self.prices = {"dear": 0.50, "cheap": 0.20, "od": 0.15}
        self.reconciler = Reconciler(
            self.config, self.slurm.client(), providers=lambda config, name: FakeProvider(),
            clock=lambda: NOW, sleep=lambda s: None, expedite_wait_s=0)
        self.reconciler._price_of = lambda ns: self.prices[ns.name]

    def weights(self) -> dict[str, int | None]:
        return {n: node.weight for n, node in sorted(self.slurm.nodes.items())}

    def ordered(self) -> list[dict]:
        return [e for e in read_events(self.config.log_dir) if e["action"] == "weights_ordered"]


def test_a_pass_changes_nothing_while_the_order_holds(tmp_path: Path) -> None:
    world = World(tmp_path)
    before = world.weights()
    world.reconciler.run_pass()
    assert world.weights() == before
    assert world.ordered() == []


def test_a_price_change_reorders_the_node_sets_in_slurm(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.prices["dear"] = 0.10  # its spot price fell below cheap's
    result = world.reconciler.run_pass()
    assert world.weights() == {"cheap-1": 2, "cheap-2": 2, "dear-1": 1, "dear-2": 1, "od-1": 3}
    [event] = world.ordered()
    assert event["reason"] == "node sets tried in the order dear, cheap, od"
    assert event["extra"]["weights"] == {"dear": 1, "cheap": 2, "od": 3}
    assert not result.errors
    world.reconciler.run_pass()  # nothing more to do
    assert len(world.ordered()) == 1


def test_a_node_set_cooling_down_is_weighted_last_until_its_cooldown_ends(tmp_path: Path) -> None:
    world = World(tmp_path)
    reason = cooldown_reason("InsufficientInstanceCapacity", NOW + timedelta(minutes=5))
    world.slurm.nodes["cheap-2"].base, world.slurm.nodes["cheap-2"].reason = "DOWN", reason
    world.reconciler.run_pass()
    weights = world.weights()
    assert weights["cheap-1"] == weights["cheap-2"] == 3
    assert weights["dear-1"] == 1 and weights["od-1"] == 2
    # The cooldown is over (the reconciler ends it; here its end passes).
    assert live_weights(world.config, [], NOW, lambda ns: world.prices[ns.name]) == {
        "cheap": 1, "dear": 2, "od": 3}


def test_an_admins_hand_set_weight_and_a_prewarm_are_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.nodes["dear-2"].weight = 1000  # scontrol update nodename=dear-2 weight=1000
    world.slurm.nodes["cheap-2"].weight = 0  # a replacement being prewarmed: booting
    world.slurm.nodes["cheap-2"].flags = {"CLOUD", "POWERING_UP"}
    world.prices["dear"] = 0.10
    world.reconciler.run_pass()
    assert world.weights() == {"cheap-1": 2, "cheap-2": 0, "dear-1": 1, "dear-2": 1000,
                               "od-1": 3}


def test_the_last_known_price_stands_in_when_a_lookup_fails(tmp_path: Path) -> None:
    from slurm_spot.cost.prices import price_lookup

    config = site(tmp_path)
    known = {"dear": 0.05}
    lookup = price_lookup(config.model_copy(update={"cost": config.cost.model_copy(
        update={"spot_usd_per_hour": {"cheap": 0.20}})}), live=False, known=known)
    assert lookup(config.node_set("dear")) == 0.05  # no price now: the last one
    assert lookup(config.node_set("cheap")) == 0.20 and known["cheap"] == 0.20


def test_failovers_are_counted_by_node_set_and_reason(tmp_path: Path) -> None:
    world = World(tmp_path)
    for job, code in ((7, "InsufficientInstanceCapacity"), (8, "InsufficientInstanceCapacity"),
                      (9, "VcpuLimitExceeded")):
        emit(world.config.log_dir, Event(
            Action.FAILOVER, "resume", time=(NOW + timedelta(seconds=1)).isoformat(),
            job_ids=(job,), reason="slurm-spot: failover: no capacity on node set cheap",
            extra={"from_node_set": "cheap", "code": code, "expedited": True}))
    world.reconciler._failures_seen_after = NOW
    world.reconciler.run_pass()
    text = generate_latest(world.reconciler.metrics.registry).decode()
    assert ('slurm_spot_failovers_total{node_set="cheap",reason="InsufficientInstanceCapacity"} '
            '2.0') in text
    assert 'slurm_spot_failovers_total{node_set="cheap",reason="VcpuLimitExceeded"} 1.0' in text
