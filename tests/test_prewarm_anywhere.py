"""Prewarm from anywhere (issue 24, part 3; slurm_spot.lifecycle.prewarm): the replacement for a node
under notice comes from any node set of the job's partition that has capacity, in the cost
order, and from the next node set when the chosen one fails to launch."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_spot.config import SpotConfig, parse_config
from slurm_spot.events import read_events
from slurm_spot.lifecycle.prewarm import Prewarm, choose_replacements
from slurm_spot.lifecycle.weights import PREWARM_WEIGHT
from slurm_spot.slurm.client import Node
from slurm_spot.slurm.reasons import cooldown_reason
from slurm_spot.slurm.states import parse_node_state
from tests.fakes.fake_slurm import FakeSlurm

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
COOLING = cooldown_reason("InsufficientInstanceCapacity", NOW + timedelta(minutes=10))


def _config(tmp_path: Path) -> SpotConfig:
    """Partition ``spot``: a10 (the noticed node's set), l4 and t4, same shape; partition
    ``other`` adds ``elsewhere``, which job partitions ``spot`` never reach."""
    return parse_config({
        "cluster": "c",
        "node_sets": [{"name": "a10", "provider": "local", "count": 3},
                      {"name": "l4", "provider": "local", "count": 2},
                      {"name": "t4", "provider": "local", "count": 2},
                      {"name": "elsewhere", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["a10", "l4", "t4"]},
                       {"name": "other", "node_sets": ["a10", "elsewhere"]}],
        "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "log")})


def _node(name: str, state: str = "IDLE+CLOUD+POWERED_DOWN", weight: int = 1,
          reason: str = "", jobs: tuple[int, ...] = ()) -> Node:
    return Node(name, parse_node_state(state), reason=reason, jobs=jobs, weight=weight)


def _cluster(weights: dict[str, int]) -> list[Node]:
    """a10-1 runs job 7 under notice; every other node powered down at its set's Weight."""
    nodes = [_node("a10-1", "MIXED+CLOUD+DRAIN", weights["a10"], jobs=(7,))]
    for name, count in (("a10", 3), ("l4", 2), ("t4", 2), ("elsewhere", 2)):
        nodes += [_node(f"{name}-{i}", weight=weights[name]) for i in range(1, count + 1)
                  if f"{name}-{i}" != "a10-1"]
    return nodes


def test_the_replacement_comes_from_the_cheapest_node_set_not_the_nodes_own(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = _cluster({"t4": 1, "l4": 2, "a10": 3, "elsewhere": 4})  # the cost order in Slurm
    assert choose_replacements(config, "a10-1", nodes, 1, ["spot"], NOW).power_up == ("t4-1",)
    # Three jobs: t4's two nodes, then l4's.
    assert choose_replacements(config, "a10-1", nodes, 3, ["spot"], NOW).power_up == (
        "t4-1", "t4-2", "l4-1")


def test_a_node_set_cooling_down_gives_no_replacement(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = _cluster({"a10": 1, "t4": 2, "l4": 3, "elsewhere": 4})
    # The own set is first in the order, but a launch there just failed for lack of capacity:
    # one of its nodes is DOWN with the cooldown; a10-3 is still idle~ (it was busy then).
    nodes = [_node("a10-2", "DOWN+CLOUD+POWERED_DOWN", 1, COOLING) if n.name == "a10-2" else n
             for n in nodes]
    assert choose_replacements(config, "a10-1", nodes, 1, ["spot"], NOW).power_up == ("t4-1",)
    # Once the cooldown has ended, the own set is first again.
    later = NOW + timedelta(minutes=11)
    assert choose_replacements(config, "a10-1", nodes, 1, ["spot"], later).power_up == ("a10-3",)


def test_a_node_set_whose_cooldown_an_admin_ended_gives_replacements_again(
        tmp_path: Path) -> None:
    """Ending a cooldown with ``state=RESUME`` (docs/admin.md) leaves ``idle~*``
    (NOT_RESPONDING: slurmctld waits for a registration a powered-down node never sends);
    slurmctld still boots such a node for a job, so prewarm takes it too, in the cost order.
    A node that is up and not responding is still never a replacement."""
    config = _config(tmp_path)
    nodes = _cluster({"a10": 1, "t4": 2, "l4": 3, "elsewhere": 4})
    nodes = [_node(n.name, "IDLE+CLOUD+POWERED_DOWN+NOT_RESPONDING", 1)
             if n.name in ("a10-2", "a10-3") else n for n in nodes]
    assert choose_replacements(config, "a10-1", nodes, 1, ["spot"], NOW).power_up == ("a10-2",)
    nodes = [_node(n.name, "IDLE+CLOUD+NOT_RESPONDING", 1) if n.name.startswith("a10-") and
             n.name != "a10-1" else n for n in nodes]
    chosen = choose_replacements(config, "a10-1", nodes, 1, ["spot"], NOW)
    assert (chosen.ready, chosen.power_up) == ((), ("t4-1",))


def test_only_node_sets_of_the_jobs_partition_are_used(tmp_path: Path) -> None:
    config = _config(tmp_path)
    nodes = _cluster({"elsewhere": 1, "a10": 2, "t4": 3, "l4": 4})
    assert choose_replacements(config, "a10-1", nodes, 1, ["spot"], NOW).power_up == ("a10-2",)
    assert choose_replacements(config, "a10-1", nodes, 1, ["other"], NOW).power_up == (
        "elsewhere-1",)


def test_a_replacement_that_fails_to_launch_is_chosen_again_from_the_next_node_set(
        tmp_path: Path) -> None:
    config = _config(tmp_path)
    slurm = FakeSlurm()
    for n in _cluster({"a10": 1, "t4": 2, "l4": 3, "elsewhere": 4}):
        fake = slurm.add_node(n.name, "+".join([n.state.base, *sorted(n.state.flags)]))
        fake.weight = n.weight
    clock = [NOW.timestamp()]
    retried: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    prewarm = Prewarm(config, slurm.client(), "a10-1", lambda: clock[0], partitions=["spot"],
                      on_retry=lambda failed, again: retried.append((failed, again.power_up)))
    assert prewarm.start(1).power_up == ("a10-2",)
    assert slurm.nodes["a10-2"].weight == PREWARM_WEIGHT
    assert "POWERING_UP" in slurm.nodes["a10-2"].flags
    assert prewarm.status() == "booting"
    # No capacity for a10: the resume hook marks the node DOWN and cools its set down.
    for name in ("a10-2", "a10-3"):
        slurm.nodes[name].base, slurm.nodes[name].reason = "DOWN", COOLING
    assert prewarm.status() == "booting"  # chosen again: t4-1 boots now
    assert retried == [(("a10-2",), ("t4-1",))]
    assert prewarm.chosen.power_up == ("t4-1",)
    assert slurm.nodes["t4-1"].weight == PREWARM_WEIGHT
    assert "POWERING_UP" in slurm.nodes["t4-1"].flags
    # The failed node gets its set's Weight back; the booting one keeps 0 until its job lands.
    prewarm.restore()
    assert slurm.nodes["a10-2"].weight == 1 and slurm.nodes["t4-1"].weight == PREWARM_WEIGHT
    # t4 fails as well, l4 next; then no retry is left and the failure is reported.
    slurm.nodes["t4-1"].base, slurm.nodes["t4-1"].reason = "DOWN", COOLING
    assert prewarm.status() == "booting" and prewarm.chosen.power_up == ("l4-1",)
    slurm.nodes["l4-1"].base, slurm.nodes["l4-1"].reason = "DOWN", COOLING
    assert prewarm.status() == "failed"
    assert list(read_events(config.log_dir)) == []  # events are the watcher's (on_retry)


def test_a_replacement_being_powered_down_after_its_failed_launch_is_not_up(
        tmp_path: Path) -> None:
    """Seen in CI on 22.05.8: the resume hook set the failed replacement DOWN and then
    POWER_DOWN; a second later slurmctld showed it ``idle%`` (IDLE+POWERING_DOWN), which the
    watcher took for "replacement up" and signalled the job before any replacement existed.
    It is a failed replacement: chosen again from the next node set."""
    config = _config(tmp_path)
    slurm = FakeSlurm()
    for n in _cluster({"a10": 1, "t4": 2, "l4": 3, "elsewhere": 4}):
        fake = slurm.add_node(n.name, "+".join([n.state.base, *sorted(n.state.flags)]))
        fake.weight = n.weight
    clock = [NOW.timestamp()]
    prewarm = Prewarm(config, slurm.client(), "a10-1", lambda: clock[0], partitions=["spot"])
    assert prewarm.start(1).power_up == ("a10-2",)
    node = slurm.nodes["a10-2"]
    node.base, node.flags = "IDLE", (node.flags - {"POWERING_UP"}) | {"POWERING_DOWN"}
    assert prewarm.status() == "booting" and prewarm.chosen.power_up == ("t4-1",)
    assert prewarm.failed_sets == {"a10"}
