"""Field inputs of issue 11, section 1: odd node names, free-text reasons, JSON with warnings,
old power-saving flags (tests/data/field-inputs.yaml)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from slurm_spot.errors import HostlistError
from slurm_spot.hostlist import compress, expand
from slurm_spot.slurm.output import load_json, node_fields_text, nodes_json
from slurm_spot.slurm.states import parse_node_state, parse_node_state_json
from tests.fakes.fake_slurm import FakeSlurm

CASES = yaml.safe_load((Path(__file__).parent / "data" / "field-inputs.yaml").read_text())


@pytest.mark.parametrize("case", CASES["node_names"], ids=lambda c: c["in"])
def test_every_name_slurm_accepts_expands_and_round_trips(case: dict) -> None:
    assert expand(case["in"]) == case["out"]
    assert sorted(expand(compress(case["out"]))) == sorted(case["out"])


@pytest.mark.parametrize("case", CASES["duplicates"], ids=lambda c: c["in"])
def test_duplicates_are_reported_not_merged(case: dict) -> None:
    with pytest.raises(HostlistError) as err:
        expand(case["in"])
    for name in case["twice"]:
        assert name in str(err.value)
    assert repr(case["in"]) in str(err.value)
    # Reading Slurm's own output keeps what Slurm printed, twice included.
    names = expand(case["in"], allow_duplicates=True)
    assert sorted(set(n for n in names if names.count(n) > 1)) == sorted(case["twice"])


@pytest.mark.parametrize("expr", CASES["refused_names"])
def test_names_that_cannot_be_node_names_are_refused(expr: str) -> None:
    with pytest.raises(HostlistError, match=r"not a valid node name|bad hostlist"):
        expand(expr)


@pytest.mark.parametrize("case", CASES["reasons"], ids=lambda c: c["reason"][:20])
def test_text_reason_with_key_value_words_is_whole(case: dict) -> None:
    fields = node_fields_text(case["line"])
    assert fields["reason"] == case["reason"]
    assert str(fields["state"]) == case["state"]
    assert fields["addr"] == case["addr"]
    assert fields["partitions"] == ("spot",)


@pytest.mark.parametrize("case", CASES["old_power_flags"], ids=lambda c: c["in"])
def test_old_power_flag_spellings(case: dict) -> None:
    assert parse_node_state(case["in"]).flags == frozenset(case["flags"])


def test_old_power_flag_in_json_state_flags() -> None:
    state = parse_node_state_json({"state": "idle", "state_flags": ["CLOUD", "POWER"]})
    assert state.is_powered_down and state.base == "IDLE"


def test_json_after_warning_lines() -> None:
    out = ("sinfo: error: plugin_load_from_file: dlopen(x.so): not found {\n"
           "sinfo: warning: ignoring [bad]\n" + json.dumps({"nodes": [
               {"name": "gpu+a100_1", "state": "down", "state_flags": ["CLOUD"],
                "reason": "maint: State=bad disk", "address": "10.0.0.5", "hostname": "h",
                "partitions": ["spot"], "boot_time": 0}]}, indent=2))
    assert load_json(out)["nodes"][0]["name"] == "gpu+a100_1"
    (node,) = nodes_json(out) or []
    assert node["reason"] == "maint: State=bad disk" and node["boot_time"] == "None"


def test_json_23_02_shapes_and_a_bad_node_is_skipped() -> None:
    out = json.dumps({"nodes": [
        {"name": "n1", "state": ["IDLE", "CLOUD", "POWERED_DOWN"], "reason": "",
         "boot_time": {"set": True, "number": 1767225600}, "partitions": ["a", "b"]},
        {"name": "n2"},  # no state: skipped, n1 still read
        {"state": "idle"},
    ]})
    nodes = nodes_json(out)
    assert nodes is not None and [n["name"] for n in nodes] == ["n1"]
    assert nodes[0]["state"].is_powered_down and nodes[0]["partitions"] == ("a", "b")
    assert nodes[0]["boot_time"] == datetime.fromtimestamp(1767225600).isoformat(timespec="seconds")


def test_no_nodes_list_means_fallback() -> None:
    assert nodes_json(json.dumps({"sinfo": []})) is None
    assert nodes_json("scontrol: unrecognized option '--json'") is None


@pytest.mark.parametrize("mode", [True, "warn", False])
def test_client_reads_reasons_whole_from_json_or_text(mode: bool | str) -> None:
    slurm = FakeSlurm()
    slurm.json_nodes = mode
    slurm.add_node("gpu-1", "DOWN+CLOUD", reason="maint: State=bad disk")
    slurm.add_node("gpu-2", "IDLE+DRAIN", reason="epilog failed: Exit=1 on step 3")
    slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    slurm.add_job(7, ["spot-1"])
    nodes = {n.name: n for n in slurm.client().nodes()}
    assert nodes["gpu-1"].reason == "maint: State=bad disk"
    assert nodes["gpu-1"].state.is_down
    assert nodes["gpu-2"].reason == "epilog failed: Exit=1 on step 3"
    assert nodes["spot-1"].jobs == (7,)


def test_a_job_on_an_unreadable_node_list_does_not_hide_the_others() -> None:
    slurm = FakeSlurm()
    slurm.add_node("spot-1", "ALLOCATED+CLOUD")
    slurm.add_node("gpu+a100_1", "ALLOCATED")
    slurm.add_job(7, ["spot-1"])
    slurm.add_job(8, ["gpu+a100_1"])
    client = slurm.client()
    nodes = {n.name: n for n in client.nodes()}
    assert nodes["spot-1"].jobs == (7,) and nodes["gpu+a100_1"].jobs == (8,)
