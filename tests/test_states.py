"""Node and job state parsing: every case of tests/data/node-states.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_spot.slurm.client import parse_job_json
from slurm_spot.slurm.states import (
    NodeState,
    parse_gres_gpus,
    parse_node_state,
    parse_node_state_json,
    parse_oneline,
    parse_sinfo_short,
)

CASES = yaml.safe_load((Path(__file__).parent / "data" / "node-states.yaml").read_text())


@pytest.mark.parametrize("case", CASES["text"], ids=lambda c: c["in"])
def test_scontrol_text_state(case: dict) -> None:
    state = parse_node_state(case["in"])
    assert state == NodeState(case["base"], frozenset(case["flags"]))


@pytest.mark.parametrize("case", CASES["sinfo_short"], ids=lambda c: c["in"])
def test_sinfo_short_state(case: dict) -> None:
    state = parse_sinfo_short(case["in"])
    assert state.base == case["base"]
    assert state.flags == frozenset(case["flags"])
    assert parse_node_state(case["in"]) == state


@pytest.mark.parametrize("case", CASES["json"], ids=lambda c: c["in"]["name"])
def test_json_state_of_22_05_and_23_02(case: dict) -> None:
    state = parse_node_state_json(case["in"])
    assert state == NodeState(case["base"], frozenset(case["flags"]))


def test_oneline_values_with_spaces_and_equals() -> None:
    fields = parse_oneline(CASES["oneline"]["in"])
    expect = CASES["oneline"]["expect"]
    assert fields["CfgTRES"] == expect["CfgTRES"]
    assert fields["Reason"] == expect["Reason"]
    assert fields["State"] == "IDLE+CLOUD+POWERED_DOWN"
    assert parse_gres_gpus(fields["Gres"]) == (expect["gpus"]["type"], expect["gpus"]["count"])


@pytest.mark.parametrize("case", CASES["jobs_json"], ids=lambda c: str(c["in"]["job_state"]))
def test_job_state_string_or_list(case: dict) -> None:
    job = parse_job_json(case["in"])
    assert job.state.base == case["state"]
    assert job.state.flags == frozenset(case.get("flags", []))


def test_meanings_are_decided_on_flags() -> None:
    spare = parse_node_state("IDLE+CLOUD+POWERED_DOWN")
    assert spare.is_powered_down and not spare.wants_instance
    failed = parse_node_state("DOWN+CLOUD+POWERED_DOWN+NOT_RESPONDING")
    assert failed.is_down and failed.is_powered_down and not failed.wants_instance
    lost = parse_node_state("DOWN+CLOUD+NOT_RESPONDING")
    assert lost.is_down and not lost.is_powered_down and not lost.is_responding
    stale = parse_node_state("IDLE+CLOUD+POWER_DOWN+POWERED_DOWN")
    assert stale.is_powered_down and not stale.is_powering_down
    draining = parse_node_state("MIXED+DRAIN")
    assert draining.is_drained and draining.has_jobs and draining.wants_instance
    booting = parse_node_state("MIXED+CLOUD+NOT_RESPONDING+POWERING_UP")
    assert booting.is_powering_up and booting.wants_instance
    # A flag Slurm adds in a later release changes nothing about the decision.
    future = parse_node_state("IDLE+CLOUD+POWERED_DOWN+SOME_NEW_FLAG")
    assert future.is_powered_down and not future.wants_instance


@pytest.mark.parametrize("bad", ["", "SLEEPY", "zzz~"])
def test_unknown_state_is_an_error(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_node_state(bad)
