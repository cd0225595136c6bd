"""Hot spares (issue 26): ``spares: N`` on a node set. The rendered SuspendExcNodes, the
reconciler's power-ups on the fake Slurm (its state after each pass), the cost in ``plan``
and the config's checks. The e2e on a real slurmctld is tests/test_spares_e2e.py."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.config import parse_config
from slurm_spot.cost.plan import spares_cost
from slurm_spot.cost.planner import HOURS_PER_MONTH
from slurm_spot.errors import ConfigError
from slurm_spot.lifecycle.spares import (
    is_busy,
    is_spare,
    spares_to_power_up,
    suspend_exc_value,
)
from slurm_spot.reconcile.reconciler import Reconciler
from slurm_spot.render import render, suspend_exc_nodes
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.reasons import cooldown_reason
from slurm_spot.slurm.states import parse_node_state
from tests.test_reconcile_rules import NOW, World

AWS = {"launch_template": "lt-0abc", "subnets": ["subnet-0a1"]}


def aws_config(tmp_path: Path, spares: int = 2) -> dict:
    return {
        "cluster": "c",
        "providers": {"aws": {"type": "aws", "region": "us-east-1"}},
        "node_sets": [
            {"name": "gpu", "provider": "aws", "count": 8, "instance_types": ["g5.xlarge"],
             "spares": spares, "aws": AWS},
            {"name": "cpu", "provider": "aws", "count": 4, "instance_types": ["g4dn.xlarge"],
             "aws": AWS},
        ],
        "partitions": [{"name": "spot", "node_sets": ["gpu", "cpu"], "default": True}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log"),
    }


def node(name: str, state: str, jobs: tuple[int, ...] = (), reason: str = "") -> Node:
    return Node(name, parse_node_state(state), reason=reason, jobs=jobs)


# -- config and render --------------------------------------------------------------------
def test_spares_render_as_slurms_own_suspend_exclusion(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path))
    assert suspend_exc_nodes(config) == "gpu-[1-8]:2"
    fragment = render(config, version="22.05.8").files["slurm-spot.conf"]
    assert "\nSuspendExcNodes=gpu-[1-8]:2\n" in fragment
    assert "SuspendExcStates" not in fragment  # 23.02+: a 22.05 daemon refuses it


def test_no_spares_render_no_exclusion(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path, spares=0))
    assert suspend_exc_nodes(config) is None
    assert "SuspendExcNodes" not in render(config, version="24.11.5").files["slurm-spot.conf"]


@pytest.mark.parametrize("spares, message", [
    (9, "spares (9) cannot exceed count (8)"),
    (-1, "greater than or equal to 0"),
    ("yes", "valid integer"),
])
def test_bad_spares_are_refused_naming_the_field(tmp_path: Path, spares: object,
                                                 message: str) -> None:
    data = aws_config(tmp_path)
    data["node_sets"][0]["spares"] = spares
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert "node_sets.0" in str(err.value) and message in str(err.value)


def test_spares_of_a_node_set_in_no_partition_are_refused(tmp_path: Path) -> None:
    """Before, the reconciler kept such spares up (and SuspendExcNodes kept Slurm from
    powering them down) although no job could ever be given those nodes: a bill for nothing."""
    data = aws_config(tmp_path)
    data["partitions"][0]["node_sets"] = ["cpu"]
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert ("node_sets.0.spares: node set 'gpu' is in no partition: its 2 spare(s)"
            in str(err.value))
    data["node_sets"][0]["spares"] = 0
    parse_config(data)  # a node set in no partition without spares costs nothing


# -- which nodes the reconciler powers up ---------------------------------------------------
def test_a_booting_idle_node_counts_as_a_spare_and_a_busy_one_does_not() -> None:
    assert is_spare(node("gpu-1", "IDLE+CLOUD"))
    assert is_spare(node("gpu-1", "IDLE+CLOUD+POWERING_UP"))
    assert not is_spare(node("gpu-1", "ALLOCATED+CLOUD", jobs=(5,)))
    assert not is_spare(node("gpu-1", "IDLE+CLOUD+POWERED_DOWN"))
    assert not is_spare(node("gpu-1", "IDLE+CLOUD+DRAIN"))


def test_shortfall_powers_up_the_first_powered_down_nodes_in_name_order(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path, spares=2))
    nodes = [node("gpu-10", "IDLE+CLOUD+POWERED_DOWN"), node("gpu-1", "ALLOCATED+CLOUD", (4,)),
             node("gpu-2", "IDLE+CLOUD+POWERED_DOWN+DRAIN"),
             node("gpu-3", "IDLE+CLOUD+POWERED_DOWN"), node("gpu-4", "IDLE+CLOUD+POWERED_DOWN"),
             node("cpu-1", "IDLE+CLOUD+POWERED_DOWN")]
    [short] = spares_to_power_up(config, nodes, NOW)
    assert (short.node_set, short.wanted, short.have, short.power_up) == ("gpu", 2, 0,
                                                                          ("gpu-3", "gpu-4"))
    nodes[3] = node("gpu-3", "IDLE+CLOUD")
    [short] = spares_to_power_up(config, nodes, NOW)
    assert (short.have, short.power_up) == (1, ("gpu-4",))
    assert spares_to_power_up(config, nodes, NOW, unavailable={"gpu"}) == []


def test_a_node_set_cooling_down_gets_no_spares(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path, spares=1))
    until = NOW + timedelta(hours=1)
    nodes = [node("gpu-1", "DOWN+CLOUD+POWERED_DOWN",
                  reason=cooldown_reason("InsufficientInstanceCapacity", until)),
             node("gpu-2", "IDLE+CLOUD+POWERED_DOWN")]
    assert spares_to_power_up(config, nodes, NOW) == []


def with_spares(world: World, spares: int) -> World:
    world.config = world.config.model_copy(update={"node_sets": [
        world.config.node_sets[0].model_copy(update={"spares": spares})]})
    world.reconciler = Reconciler(
        world.config, world.slurm.client(), providers=lambda config, name: world.provider,
        clock=lambda: world.now, sleep=lambda s: None, expedite_wait_s=0)
    return world


def test_the_reconciler_keeps_one_spare_up_as_jobs_take_them(tmp_path: Path) -> None:
    world = with_spares(World(tmp_path), 1)
    world.run()
    assert [world.state(f"spot-{i}") for i in (1, 2)] == ["IDLE+CLOUD+POWERING_UP",
                                                          "IDLE+CLOUD+POWERED_DOWN"]
    [event] = world.events("spares_powered_up")
    assert event["extra"] == {"node_set": "spot", "wanted": 1, "had": 0, "nodes": ["spot-1"]}
    world.run()  # still booting: it is the spare, nothing more is powered up
    assert world.state("spot-2") == "IDLE+CLOUD+POWERED_DOWN"
    # it came up and a job took it: the next pass powers the next node up
    world.provider.add("spot-1", 30, NOW)
    world.slurm.nodes["spot-1"].flags = {"CLOUD"}
    world.slurm.nodes["spot-1"].base = "ALLOCATED"
    world.slurm.add_job(7, ["spot-1"])
    world.run()
    assert world.state("spot-2") == "IDLE+CLOUD+POWERING_UP"
    assert len(world.events("spares_powered_up")) == 2


# -- cost -----------------------------------------------------------------------------------
def test_spares_cost_their_hourly_price_around_the_clock(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path, spares=2))
    [entry] = spares_cost(config, lambda ns: {"gpu": 0.5, "cpu": 0.2}[ns.name])
    assert entry == {"node_set": "gpu", "spares": 2, "market": "spot", "usd_per_node_h": 0.5,
                     "usd_per_h": 1.0, "usd_per_month": 1.0 * HOURS_PER_MONTH}
    [unknown] = spares_cost(config, lambda ns: None)
    assert unknown["usd_per_h"] is None and unknown["usd_per_month"] is None


def test_plan_shows_what_the_spares_cost(tmp_path: Path) -> None:
    path = tmp_path / "spot.yaml"
    data = aws_config(tmp_path, spares=2)
    data["cost"] = {"spot_usd_per_hour": {"g5.xlarge": 0.45},
                    "on_demand_usd_per_hour": {"g5.xlarge": 1.006}}
    path.write_text(yaml.safe_dump(data))
    args = ["--config", str(path), "plan", "--checkpoint-s", "60", "--interruption-band", "<5%"]
    run = CliRunner().invoke(cli, [*args, "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.output)
    data_out = out.get("data", out)
    assert data_out["spares_usd_per_h"] == pytest.approx(0.9)
    assert data_out["spares"][0]["usd_per_month"] == pytest.approx(0.9 * HOURS_PER_MONTH)
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert ("hot spares: gpu (spot) 2 x $0.45/h = $0.90/h around the clock ($657.00/month)"
            in text.output)




@pytest.mark.parametrize("version, expected", [
    ("22.05.8", ""),  # N counts idle nodes only: slurm.conf's spot-[1-4]:1 is right as is
    ("24.11.5", "spot-[1-4]:3"),  # busy nodes count: 1 spare + 2 busy
])
def test_slurm_24_05_on_gets_the_busy_nodes_added_to_the_count(tmp_path: Path, version: str,
                                                                 expected: str) -> None:
    world = World(tmp_path)
    world.slurm.version = version
    world = with_spares(world, 1)
    for name, job in (("spot-1", 5), ("spot-2", 6)):
        world.provider.add(name, 300, NOW)
        world.slurm.nodes[name].flags, world.slurm.nodes[name].base = {"CLOUD"}, "ALLOCATED"
        world.slurm.add_job(job, [name])
    world.run()
    assert world.slurm.suspend_exc_nodes == expected
    assert world.state("spot-3") == "IDLE+CLOUD+POWERING_UP"


def test_suspend_exc_value_never_exceeds_the_node_set(tmp_path: Path) -> None:
    config = parse_config(aws_config(tmp_path, spares=2))
    busy = [node(f"gpu-{i}", "ALLOCATED+CLOUD", (i,)) for i in range(1, 8)]
    assert suspend_exc_value(config, busy, counts_busy=True) == "gpu-[1-8]:8"
    assert suspend_exc_value(config, busy) == "gpu-[1-8]:2"
    assert not is_busy(node("gpu-1", "ALLOCATED+CLOUD+POWERING_UP", (1,)))
    assert not is_busy(node("gpu-1", "IDLE+CLOUD"))


def test_plan_says_when_the_spares_price_is_unknown_and_how_to_give_it(tmp_path: Path) -> None:
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(aws_config(tmp_path, spares=1)))  # no spot price anywhere
    args = ["--config", str(path), "plan", "--checkpoint-s", "60", "--interruption-band", "<5%"]
    run = CliRunner().invoke(cli, [*args, "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.output)
    assert out.get("data", out)["spares_usd_per_h"] is None
    text = CliRunner().invoke(cli, args).output
    assert "hot spares: gpu (spot) 1 node(s), price unknown" in text
    assert "cost.spot_usd_per_hour" in text
